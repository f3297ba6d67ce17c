"""Backends that live in this repository or in torch itself: `rlnorm`, `reference`, `torch_compile`."""

from __future__ import annotations

import torch
from torch import Tensor

from rlnorm.kit.backends import Backend, Grads, describe_error
from rlnorm.numerics import exact_sum
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math, rms_norm_gated_reference


class ReferenceBackend(Backend):
    """Eager PyTorch, fp32 math, one rounding at the end; dweight from torch autograd."""

    key = "reference"
    source = f"rlnorm.reference.rms_norm_gated_reference (eager torch {torch.__version__}, fp32 math)"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return rms_norm_gated_reference(x, z, w, opts)


def per_row_grads(x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
    """The reference's y, dx, dz, and per-row fp32 weight contributions c[r, j] in `Grads.dw` ([rows, D]).

    The weight is expanded to one fp32 leaf per row, so autograd hands back each row's own
    contribution (what a single-row run of the reference gives with an fp32 weight) unsummed.
    """
    xl = x.detach().requires_grad_(True)
    zl = None if z is None else z.detach().requires_grad_(True)
    w_rows = w.detach().to(torch.float32).expand(x.shape[0], -1).clone().requires_grad_(True)
    with torch.enable_grad():
        y = gated_rmsnorm_math(xl, zl, w_rows, opts, torch.float32).to(x.dtype)
        leaves = [t for t in (xl, zl, w_rows) if t is not None]
        grads = torch.autograd.grad(y, leaves, grad_outputs=dy)
    return Grads(y=y.detach(), dx=grads[0], dz=grads[1] if zl is not None else None, dw=grads[-1])


class ExactReferenceBackend(Backend):
    """The reference with the docs/spec.md §2 dweight: exact sum of per-row fp32 contributions, rounded once.

    Not a registered key: eager autograd (`reference`) sums dweight in fp32 in whatever order the
    reduction takes, so it is NOT order-independent and fails the singleton-aggregate and permuted
    gate lines. This backend is the positive control that shows those lines can pass, and the
    base the planted faults build on so each breaks exactly one guarantee.
    """

    key = "rlnorm.kit.backends.local:ExactReferenceBackend"
    source = "rlnorm.reference (fp32 math, one rounding) + exact dweight (rlnorm.numerics.exact_sum)"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return rms_norm_gated_reference(x, z, w, opts)

    def forward_backward(self, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
        g = per_row_grads(x, z, w, dy, opts)
        g.dw = self._reduce_dweight(g.dw, w.dtype).to(w.device)
        return g

    def _reduce_dweight(self, contributions: Tensor, dtype: torch.dtype) -> Tensor:
        """Per-row contributions [rows, D] fp32 -> dweight [D] in `dtype`. Exact here; faults override."""
        return exact_sum(contributions.detach().cpu(), dtype)


class RlnormBackend(Backend):
    """This project's Triton kernel, `rlnorm.rms_norm_gated`."""

    key = "rlnorm"
    source = "rlnorm.rms_norm_gated (Triton)"

    def __init__(self) -> None:
        super().__init__()
        try:
            import importlib.metadata

            from rlnorm import __version__

            self.source = f"rlnorm {__version__} rms_norm_gated (Triton {importlib.metadata.version('triton')})"
        except Exception:  # keep the plain name; availability says what is wrong
            pass

    def _import_reason(self) -> str | None:
        try:
            from rlnorm import kernel  # noqa: F401
        except Exception as exc:
            return f"cannot import rlnorm.kernel: {describe_error(exc)}"
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

            # torch.compile's defaults, as a user would call it: static shapes first, then an
            # automatically dynamic graph once the row count changes (a fixed dynamic=False would hit
            # the recompile limit across the batch-size sweep and silently fall back to eager).
            fn = torch.compile(op)
            self._compiled[opts] = fn
        return fn(x, z, w)
