"""The rlnorm Triton kernel: a batch-invariant, correctly rounded gated RMSNorm.

rms_norm_gated, RMSNormGated: the op (functional and module forms, autograd included).
rms_norm_gated_fwd, rms_norm_gated_bwd: the launchers on [rows, D] tensors, for benchmarks and checks.
rlnorm.kernel.testing.plant: the launches' experiment switches and planted faults (tests and benchmarks only).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "RMSNormGated",
    "rms_norm_gated",
    "rms_norm_gated_bwd",
    "rms_norm_gated_fwd",
]

# Loaded on first use: `import rlnorm.kernel` stays cheap.
_HOMES = {
    "rms_norm_gated": "api",
    "RMSNormGated": "api",
    "rms_norm_gated_fwd": "_fwd",
    "rms_norm_gated_bwd": "_bwd",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rlnorm.kernel' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rlnorm.kernel.{home}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
