"""The tools in tools/ load on the CPU (their imports of the package and of benchmarks/ resolve) and print their
usage; their GPU work is not run here."""

from __future__ import annotations

import runpy
import sys

import pytest
from conftest import REPO_ROOT

TOOLS = REPO_ROOT / "tools"


@pytest.mark.parametrize(
    "name", ["compile_sm90.py", "ncu_fwd.py", "kernel_gpu_check.py", "dweight_gpu_check.py", "lab_check.py"]
)
def test_a_tool_prints_its_help_on_the_cpu(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the tool puts the checkout first; undone after
    monkeypatch.setattr(sys, "argv", [str(TOOLS / name), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(TOOLS / name), run_name="__main__")
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python tools/{name}")
