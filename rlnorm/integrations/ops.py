"""rlnorm's forward as an opaque PyTorch operator, `torch.ops.rlnorm.rms_norm_gated`.

A compiler that traces a model (torch.compile, and through it vLLM's Inductor pipeline) decomposes the Python
body of a layer into its own kernels, which round and reduce as it chooses: the batch-invariant, once-rounded
result would be gone. Registered through `torch.library`, the call stays one node of the graph that Inductor
launches as it is (an extern call), and a fake implementation gives it the output's shape without running it.

Forward only: the sampler (vLLM) is inference-only, and the trainer calls `rlnorm.RMSNormGated`, whose
autograd computes the exact dweight.
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
        return rms_norm_gated(
            x,
            z,
            weight,
            eps=eps,
            group_size=group_size,
            norm_before_gate=norm_before_gate,
            activation=activation,
        )


@rms_norm_gated_op.register_fake
def _rms_norm_gated_fake(
    x: torch.Tensor,
    z: torch.Tensor | None,
    weight: torch.Tensor | None,
    eps: float,
    group_size: int | None,
    norm_before_gate: bool,
    activation: str,
) -> torch.Tensor:
    # the kernel writes a fresh contiguous tensor of x's shape and dtype, whatever x's strides
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
