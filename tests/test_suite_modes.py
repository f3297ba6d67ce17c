"""The suite's two modes (tests/conftest.py): the CPU suite everywhere, `--gpu` for compiled Triton on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, holds_gpu_tests  # tests/ is on sys.path (no __init__.py: pytest prepends it)


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
def test_gpu_tests_are_skipped_in_the_cpu_suite_with_the_command_that_runs_them() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = _pytest("tests/kernel/test_fwd.py", "-k", "widen_fast", "-rs", "-q", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed, 2 skipped" in out.stdout, out.stdout
    assert out.stdout.count("run `python3 -m pytest --gpu`") == 1, out.stdout  # -rs folds the two skips


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


def test_gpu_mode_collects_only_the_modules_that_hold_gpu_tests() -> None:
    # --gpu reads each test module as text and imports only those marking a test gpu: the notebook tests'
    # modules (jupytext, nbformat) are not needed on a GPU machine to run the GPU tests
    tests = REPO_ROOT / "tests"
    held = sorted(p.relative_to(tests).as_posix() for p in tests.rglob("test_*.py") if holds_gpu_tests(p))
    assert held == [
        "integrations/test_ops.py",
        "integrations/test_trainer_sampler.py",
        "kernel/test_bwd.py",
        "kernel/test_exact_element.py",
        "kernel/test_fwd.py",
        "kit/test_checks.py",
        "kit/test_isolation.py",
        "kit/test_vllm_files.py",
        "kit/test_vllm_native.py",
    ]
