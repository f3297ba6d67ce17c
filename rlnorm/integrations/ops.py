"""rlnorm's forward as an opaque operator, `torch.ops.rlnorm.rms_norm_gated`: a compiler tracing a model would
decompose a Python body into its own kernels; the operator stays one extern node. Forward only (the sampler's).
"""

from __future__ import annotations

import torch

from rlnorm.kernel.api import rms_norm_gated

OP_NAME = "rlnorm::rms_norm_gated"
_SCHEMA = (
    "(Tensor x, Tensor? z, Tensor? weight, float eps, SymInt? group_size, bool norm_before_gate, str activation)"
    " -> Tensor"
)


@torch.library.custom_op(OP_NAME, mutates_args=(), schema=_SCHEMA)
def rms_norm_gated_op(
    x: torch.Tensor,
    z: torch.Tensor | None,
    weight: torch.Tensor | None,
    eps: float,
    group_size: int | None,
    norm_before_gate: bool,
    activation: str,
) -> torch.Tensor:
    with torch.no_grad():  # an inference op: never an autograd graph
        opts = {"eps": eps, "group_size": group_size, "norm_before_gate": norm_before_gate, "activation": activation}
        return rms_norm_gated(x, z, weight, **opts)


@rms_norm_gated_op.register_fake
def _rms_norm_gated_fake(x: torch.Tensor, *options: object) -> torch.Tensor:
    # the kernel writes a fresh contiguous tensor of x's shape and dtype, whatever x's strides
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
