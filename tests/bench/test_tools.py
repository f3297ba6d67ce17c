"""The tools in tools/ load on the CPU and say how they are used, and import nothing but the package (no probe
scripts); their GPU work is not run here."""

from __future__ import annotations

import ast
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

TOOLS = REPO_ROOT / "tools"
PYTHON_TOOLS = ["compile_sm90.py", "ncu_fwd.py", "kernel_gpu_check.py", "dweight_gpu_check.py", "vllm_sources.py"]
ALLOWED = {"rlnorm", "torch", "triton", "__future__"} | set(sys.stdlib_module_names)


@pytest.mark.parametrize("name", PYTHON_TOOLS)
def test_a_tool_prints_its_help_on_the_cpu(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the tool puts the checkout first; undone after
    monkeypatch.setattr(sys, "argv", [str(TOOLS / name), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(TOOLS / name), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python tools/{name}") and len(out.splitlines()) > 3


@pytest.mark.parametrize("name", PYTHON_TOOLS)
def test_a_tool_imports_only_the_package(name):
    tree = ast.parse((TOOLS / name).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m.split(".")[0] for m in modules} <= ALLOWED, modules


def test_the_ncu_script_prints_its_usage():
    ok = subprocess.run(["bash", str(TOOLS / "ncu_fwd.sh"), "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "bash tools/ncu_fwd.sh D ROWS NAME=SWITCHES" in ok.stdout
    bare = subprocess.run(["bash", str(TOOLS / "ncu_fwd.sh")], capture_output=True, text=True)
    assert bare.returncode == 2 and "NAME=SWITCHES" in bare.stderr


def test_compile_sm90_keeps_its_layouts_option():
    mod = runpy.run_path(str(TOOLS / "compile_sm90.py"))
    a = mod["build_parser"]().parse_args(["--layouts", "128", '{"SPLIT": 1}'])
    assert a.layouts == 128 and a.switches == '{"SPLIT": 1}'
    assert mod["build_parser"]().parse_args(["--counts", "128", "256"]).counts == [128, 256]


def test_the_tools_are_these_and_name_no_probe_script():
    assert sorted(p.name for p in TOOLS.iterdir() if p.suffix in (".py", ".sh")) == sorted(
        [*PYTHON_TOOLS, "ncu_fwd.sh"]
    )
    assert not [p for p in Path(TOOLS).iterdir() if p.is_file() and "scripts/" in p.read_text()]
