"""The layer vLLM instantiates for its `RMSNormGated` once rlnorm's plugin is on (importing this imports vLLM).

Every dispatch path calls the opaque operator, so eager or compiled (where vLLM re-derives forward_native's body)
each runs rlnorm's kernel with the layer's own options.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.layernorm import RMSNormGated

from rlnorm.integrations.ops import rms_norm_gated_op
from rlnorm.options import OpOptions


class RlnormRMSNormGated(RMSNormGated):
    """vLLM's RMSNormGated, constructed exactly as vLLM's, with rlnorm's kernel on every dispatch path."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        try:  # refuse at model construction what the kernel would refuse at the first forward
            OpOptions(self.eps, self.group_size, self.norm_before_gate, self.activation).check_width(
                self.weight.shape[0]
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"vLLM RMSNormGated with rlnorm's kernel (RLNORM_VLLM=1): {exc}") from exc

    def _rlnorm(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if self.bias is not None:
            raise ValueError("vLLM RMSNormGated with rlnorm's kernel: bias is set, and rlnorm's norm has no bias")
        return rms_norm_gated_op(x, z, self.weight, self.eps, self.group_size, self.norm_before_gate, self.activation)

    def forward_native(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return self._rlnorm(x, z)

    def forward_cuda(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return self._rlnorm(x, z)

    # the other platforms' methods default to one of the two above in vLLM; named here so none can escape
    forward_hip = forward_cuda
    forward_xpu = forward_cuda
    forward_cpu = forward_native
    forward_tpu = forward_native
    forward_oot = forward_native
