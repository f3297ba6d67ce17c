"""The suite's two modes (tests/conftest.py): the CPU suite everywhere, `--gpu` for compiled Triton on a GPU, which
refuses to run where it cannot rather than skip everything and report success."""

from __future__ import annotations

import os
from types import SimpleNamespace

import conftest
import pytest
import torch


def test_the_cpu_suite_runs_in_the_interpreter_with_no_gpu_visible() -> None:
    # what every CPU test assumes, on a GPU machine too: a visible GPU would turn the interpreter off
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert not torch.cuda.is_available()


@pytest.mark.parametrize(
    ("interpret", "message"),
    [(None, "--gpu: no CUDA GPU is visible"), ("1", "--gpu runs compiled Triton kernels: unset TRITON_INTERPRET")],
)
def test_gpu_mode_refuses_to_run_where_it_cannot(interpret: str | None, message: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # no GPU is visible in this (CPU) process: --gpu must stop the session with a usage error (pytest's exit code 4),
    # not skip everything and report success
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    with pytest.raises(pytest.UsageError, match=message):
        gpu_option = SimpleNamespace(getoption=lambda name: name == "--gpu")  # a config as `--gpu` makes it
        conftest.pytest_configure(gpu_option)  # type: ignore[arg-type]
