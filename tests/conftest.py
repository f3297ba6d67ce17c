"""Shared fixtures. `import rlnorm` sets TRITON_INTERPRET=1 when there is no GPU, before any test
imports Triton, so Triton kernels run on the CPU in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET before Triton is imported)

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def outputs_dir(tmp_path: Path) -> Path:
    """An empty folder standing in for outputs/ (run folders go under it)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out


# Check sizes small enough for the Triton interpreter, shared by every test that runs the kit end to end.
TINY_SIZES: dict = {
    "all_rows_sizes": [7],
    "all_rows_seeds": [3],
    "dweight_rows": 7,
    "sub_batches_rows": 15,
    "sub_batch_sizes": [1, 7],
    "sub_batches_seeds": [3],
    "sweep_n": 9,
    "sweep_sizes": [1, 2, 9],
    "sweep_probe_rows": [0, 8],
    "sweep_seeds": [3],
    "accuracy_rows": 63,
    "timing_warmup": 0,
    "timing_iters": 1,
    "agreement_rows": 15,
}


@pytest.fixture
def tiny_params() -> dict:
    """The smallest run that still exercises every check on the CPU backends: seconds per backend."""
    return {
        "name": "tiny",
        "device": "cpu",
        "progress": False,
        "backends": ["reference", "rlnorm"],
        **TINY_SIZES,
        "timing": True,
        "gate_timeout_s": 300.0,
    }
