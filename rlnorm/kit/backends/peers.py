"""Adapters calling the peers' real code (transformers and the two FLA kernels), whose own autograd gives the grads.
Option support is read off their sources (transformers 5.17, FLA 0.5.2)."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import Tensor

from rlnorm.kit.backends import Backend, dist_version, pins
from rlnorm.options import OpOptions


class TransformersBackend(Backend):
    """`Qwen3NextRMSNormGated(D, eps)` holding w through `functional_call`. It rounds the normalised x before the
    weight multiply (correctly rounded on only ~65% of elements) and hard-codes silu."""

    key = "transformers"
    requires = "transformers.models.qwen3_next.modeling_qwen3_next"
    qwen_only = "Qwen3NextRMSNormGated"
    source = f"transformers {dist_version('transformers')} Qwen3NextRMSNormGated"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

        d, device = x.shape[-1], x.device
        mod = self._memo((d, opts.eps, str(device)), lambda: Qwen3NextRMSNormGated(d, eps=opts.eps).to(device))
        return torch.func.functional_call(mod, {"weight": w}, (x, z))


class FlaLayernormGatedBackend(Backend):
    """FLA `layernorm_gated.rmsnorm_fn`: one program per (row, group); silu only."""

    key = "fla_layernorm_gated"
    requires = "fla.modules.layernorm_gated"
    source = f"FLA {dist_version('fla-core')} layernorm_gated.rmsnorm_fn"

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        if opts.activation != "silu":
            return False, f"layernorm_gated hard-codes silu (z * sigmoid(z)), not {opts.activation}"
        return True, ""

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from fla.modules.layernorm_gated import rmsnorm_fn

        return rmsnorm_fn(
            x, w, None, z=z, eps=opts.eps, group_size=opts.group_size, norm_before_gate=opts.norm_before_gate
        )


class FlaFusedNormGateBackend(Backend):
    """FLA `fused_norm_gate.rms_norm_gated`: autotuned rows-per-program; norm before gate, no groups. Its autotuners
    need an active driver to time: on a CPU each runs its first config (the `configurations` check runs the others)."""

    key = "fla_fused_norm_gate"
    requires = "fla.modules.fused_norm_gate"
    source = f"FLA {dist_version('fla-core')} fused_norm_gate.rms_norm_gated"
    qwen_only = "fused_norm_gate"
    _ACTIVATION: ClassVar[dict[str, str]] = {"silu": "swish", "sigmoid": "sigmoid"}
    activations = tuple(_ACTIVATION)

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from fla.modules.fused_norm_gate import rms_norm_gated

        return rms_norm_gated(x, z, w, None, activation=self._ACTIVATION[opts.activation], eps=opts.eps)

    @staticmethod
    def _autotuners(d: int | None = None) -> list[Any]:
        """The autotuned kernels a call of width d launches (all four without d)."""
        from fla.modules import fused_norm_gate as fng

        narrow = [fng.layer_norm_gated_fwd_kernel, fng.layer_norm_gated_bwd_kernel]
        wide = [fng.layer_norm_gated_fwd_kernel1, fng.layer_norm_gated_bwd_kernel1]
        # the launchers' split: one row per program past 512 columns (layer_norm_gated_fwd / _bwd)
        kernels = narrow + wide if d is None else narrow if d <= 512 else wide
        return [pins.autotuner(k) for k in kernels]

    def _untimed(self, x: Tensor) -> AbstractContextManager[Any]:
        return pins.pin_first_configs(self._autotuners()) if x.device.type == "cpu" else contextlib.nullcontext()

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[pins.Setting]:
        """Every config of the forward's and the backward's autotuner (any may win the timing at a row count)."""
        tuners = self._autotuners(d)
        interp = torch.device(device).type == "cpu"
        out = pins.autotuner_settings(tuners, distinct_kwargs_only=interp)
        if interp:
            why = "the Triton interpreter ignores num_warps and num_stages: only a GPU runs them"
            out += [pins.Setting(pins.kernel_name(at), "config", pins.config_words(c), why=why)
                    for at in tuners for c in at.configs if c.num_warps != at.configs[0].num_warps]  # fmt: skip
        return out
