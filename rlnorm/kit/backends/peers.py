"""Adapters for the peers the reference report checked: transformers and the two FLA kernels.

Each calls the peer's real code path and lets the peer's own autograd produce dx, dz and dweight;
nothing here re-implements a peer. Option support is read off the peers' sources (transformers
5.17 `Qwen3NextRMSNormGated.forward`; FLA 0.5.2 `layernorm_gated.py`, `fused_norm_gate.py`).
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from rlnorm.kit.backends import Backend, BackendUnavailable, describe_error, dist_version
from rlnorm.options import OpOptions


def _need_gate(key: str, z: Tensor | None) -> None:
    if z is None:
        raise BackendUnavailable(f"{key}: needs a gate z (the peer has no ungated path)")


class TransformersBackend(Backend):
    """`Qwen3NextRMSNormGated(D, eps)`, weight swapped in by `torch.func.functional_call`.

    Its forward rounds the normalised x to the input dtype before the weight multiply (the reason
    it is correctly rounded on only ~65% of elements), norms before the gate, and hard-codes silu.
    """

    key = "transformers"
    has_backward = True

    def __init__(self) -> None:
        super().__init__()
        self.source = f"transformers {dist_version('transformers')} Qwen3NextRMSNormGated"
        self._modules: dict[tuple[int, float, str], object] = {}

    def _import_reason(self) -> str | None:
        try:
            from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: F401
        except Exception as exc:
            return f"cannot import transformers' Qwen3-Next model: {describe_error(exc)}"
        return None

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        if opts.group_size is not None:
            return False, "Qwen3NextRMSNormGated has no group_size (it normalises the whole row)"
        if not opts.norm_before_gate:
            return False, "Qwen3NextRMSNormGated only norms before the gate (norm_before_gate=True)"
        if opts.activation != "silu":
            return False, f"Qwen3NextRMSNormGated hard-codes silu, not {opts.activation}"
        return True, ""

    def _module(self, d: int, eps: float, device: str) -> object:
        key = (d, eps, device)
        mod = self._modules.get(key)
        if mod is None:
            from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

            mod = Qwen3NextRMSNormGated(d, eps=eps).to(device)
            self._modules[key] = mod
        return mod

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        ok, why = self.supports(opts)
        if not ok:
            raise BackendUnavailable(f"{self.key}: {why}")
        _need_gate(self.key, z)
        from torch.func import functional_call

        mod = self._module(x.shape[-1], opts.eps, str(x.device))
        return functional_call(mod, {"weight": w}, (x, z))


class FlaLayernormGatedBackend(Backend):
    """FLA `layernorm_gated.rmsnorm_fn`: one program per (row, group); silu only."""

    key = "fla_layernorm_gated"
    has_backward = True

    def __init__(self) -> None:
        super().__init__()
        self.source = f"FLA {dist_version('fla-core')} layernorm_gated.rmsnorm_fn"

    def _import_reason(self) -> str | None:
        try:
            from fla.modules import layernorm_gated  # noqa: F401
        except Exception as exc:
            return f"cannot import fla.modules.layernorm_gated: {describe_error(exc)}"
        return None

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        if opts.activation != "silu":
            return False, f"layernorm_gated hard-codes silu (z * sigmoid(z)), not {opts.activation}"
        return True, ""

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        ok, why = self.supports(opts)
        if not ok:
            raise BackendUnavailable(f"{self.key}: {why}")
        from fla.modules.layernorm_gated import rmsnorm_fn

        return rmsnorm_fn(
            x, w, None, z=z, eps=opts.eps, group_size=opts.group_size, norm_before_gate=opts.norm_before_gate
        )


class FlaFusedNormGateBackend(Backend):
    """FLA `fused_norm_gate.rms_norm_gated`: autotuned rows-per-program; norm before gate, no groups."""

    key = "fla_fused_norm_gate"
    has_backward = True
    _ACTIVATION: ClassVar[dict[str, str]] = {"silu": "swish", "sigmoid": "sigmoid"}

    def __init__(self) -> None:
        super().__init__()
        self.source = f"FLA {dist_version('fla-core')} fused_norm_gate.rms_norm_gated"

    def _import_reason(self) -> str | None:
        try:
            from fla.modules import fused_norm_gate  # noqa: F401
        except Exception as exc:
            return f"cannot import fla.modules.fused_norm_gate: {describe_error(exc)}"
        return None

    def _probe(self, device: str) -> tuple[bool, str]:
        ok, reason = super()._probe(device)
        if not ok and "active drivers" in reason:
            # triton.runtime.autotuner.do_bench asks for the active driver's benchmarker, which
            # the interpreter does not provide: an autotuned kernel cannot run without a GPU
            reason += " (fused_norm_gate is @triton.autotune'd; the autotuner benchmarks on a GPU driver)"
        return ok, reason

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        if opts.group_size is not None:
            return False, "fused_norm_gate has no group_size"
        if not opts.norm_before_gate:
            return False, "fused_norm_gate only norms before the gate (norm_before_gate=True)"
        if opts.activation not in self._ACTIVATION:
            return False, f"fused_norm_gate has no activation {opts.activation}"
        return True, ""

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        ok, why = self.supports(opts)
        if not ok:
            raise BackendUnavailable(f"{self.key}: {why}")
        _need_gate(self.key, z)
        from fla.modules.fused_norm_gate import rms_norm_gated

        return rms_norm_gated(x, z, w, None, activation=self._ACTIVATION[opts.activation], eps=opts.eps)
