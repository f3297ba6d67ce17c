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
