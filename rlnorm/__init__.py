"""rlnorm: a batch-invariant gated RMSNorm kernel and the kit that checks kernels like it for reuse in RL."""

from __future__ import annotations

import os
from typing import Any

import torch

# Triton decides at decoration time whether to interpret; with no GPU, interpreting is the only
# way Triton kernels (ours and the peers') run at all, so choose it before anything imports them.
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

__version__ = "0.1.0"
__all__ = ["RMSNormGated", "__version__", "rms_norm_gated"]


def __getattr__(name: str) -> Any:
    # The kernel imports Triton; load it on first use so `import rlnorm` stays cheap for the kit.
    if name in ("rms_norm_gated", "RMSNormGated"):
        from rlnorm import kernel

        return getattr(kernel, name)
    raise AttributeError(f"module 'rlnorm' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily loaded names too, as rlnorm.kernel lists its own
    return sorted(set(globals()) | set(__all__))
