"""rlnorm's forward as an opaque PyTorch operator, `torch.ops.rlnorm.rms_norm_gated`.

A compiler tracing a model (torch.compile, vLLM's Inductor pipeline) would decompose a layer's Python body into
its own kernels and lose the batch-invariant, once-rounded result; registered through `torch.library`, the call
stays one extern node, and a fake implementation gives its shape. Forward only: the sampler is inference-only.
"""

from __future__ import annotations

import torch

from rlnorm.kernel.api import rms_norm_gated

__all__ = ["OP_NAME", "rms_norm_gated_op"]

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
    """`rlnorm.rms_norm_gated` with every option positional (the operator's schema); no autograd."""
    with torch.no_grad():  # an inference op: the kernel's forward alone, never an autograd graph
        opts = {"eps": eps, "group_size": group_size, "norm_before_gate": norm_before_gate, "activation": activation}
        return rms_norm_gated(x, z, weight, **opts)


@rms_norm_gated_op.register_fake
def _rms_norm_gated_fake(x: torch.Tensor, *options: object) -> torch.Tensor:
    # the kernel writes a fresh contiguous tensor of x's shape and dtype, whatever x's strides
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
