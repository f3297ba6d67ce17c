"""Backends that live in this repository or in torch itself: `rlnorm`, `reference`, `torch_compile`."""

from __future__ import annotations

import torch
from torch import Tensor

from rlnorm.backends import Backend, describe_error
from rlnorm.options import OpOptions
from rlnorm.reference import rms_norm_gated_reference


class ReferenceBackend(Backend):
    """Eager PyTorch, fp32 math, one rounding at the end; dweight from torch autograd."""

    key = "reference"
    source = f"rlnorm.reference.rms_norm_gated_reference (eager torch {torch.__version__}, fp32 math)"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return rms_norm_gated_reference(x, z, w, opts)


class RlnormBackend(Backend):
    """This project's Triton kernel, `rlnorm.rms_norm_gated`."""

    key = "rlnorm"
    source = "rlnorm.rms_norm_gated (Triton)"

    def _import_reason(self) -> str | None:
        try:
            import triton

            from rlnorm import kernel  # noqa: F401
        except Exception as exc:
            return f"cannot import rlnorm.kernel: {describe_error(exc)}"
        try:
            import rlnorm

            self.source = f"rlnorm {rlnorm.__version__} rms_norm_gated (Triton {triton.__version__})"
        except Exception:
            pass
        return None

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from rlnorm import rms_norm_gated

        return rms_norm_gated(
            x,
            z,
            w,
            eps=opts.eps,
            group_size=opts.group_size,
            norm_before_gate=opts.norm_before_gate,
            activation=opts.activation,
        )


class TorchCompileBackend(Backend):
    """`torch.compile` of the reference: the first thing a user would try. Backward is AOT-autograd's."""

    key = "torch_compile"
    source = f"torch {torch.__version__} torch.compile(rlnorm.reference.rms_norm_gated_reference)"

    def __init__(self) -> None:
        super().__init__()
        self._compiled: dict[OpOptions, object] = {}

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        fn = self._compiled.get(opts)
        if fn is None:
            # options are closed over, so each option set is its own graph (no guard on a dataclass)
            def op(x: Tensor, z: Tensor | None, w: Tensor) -> Tensor:
                return rms_norm_gated_reference(x, z, w, opts)

            # dynamic=False: a shape-specialised graph per row count is what a user gets by default
            # for a fixed batch; dynamic shapes are a separate, later question.
            fn = torch.compile(op, dynamic=False)
            self._compiled[opts] = fn
        return fn(x, z, w)
