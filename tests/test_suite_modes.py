"""The suite's two modes (tests/conftest.py): the CPU suite everywhere, `--gpu` for compiled Triton on a GPU, which
refuses to run where it cannot rather than skip everything and report success."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT


def _pytest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_cpu_suite_runs_in_the_interpreter_with_no_gpu_visible() -> None:
    # what every CPU test assumes, on a GPU machine too: a visible GPU would turn the interpreter off
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert not torch.cuda.is_available()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("interpret", "message"),
    [(None, "--gpu: no CUDA GPU is visible"), ("1", "--gpu runs compiled Triton kernels: unset TRITON_INTERPRET")],
)
def test_gpu_mode_refuses_to_run_where_it_cannot(interpret: str | None, message: str) -> None:
    # in this (CPU) process no GPU is visible, and the subprocess inherits that: --gpu must refuse, not skip
    # everything and report success
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    out = _pytest("--gpu", "tests/test_suite_modes.py", env=env)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert message in out.stderr, out.stderr
