"""The rlnorm Triton kernel: batch-invariant, correctly rounded gated RMSNorm (issue 5)."""

from __future__ import annotations

from typing import Any

__all__ = ["RMSNormGated", "rms_norm_gated"]


def __getattr__(name: str) -> Any:
    # Lazy so that `rlnorm.kernel._rounding` (shared with the backward) imports without the API.
    if name in __all__:
        from rlnorm.kernel import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlnorm.kernel' has no attribute {name!r}")
