"""Backends that live in this repository or in torch itself: `rlnorm`, `reference`, `torch_compile`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from rlnorm import __version__
from rlnorm.kit.backends import Backend, Grads, dist_version
from rlnorm.kit.backends.pins import Setting, kernel_name
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
    """The reference's y, dx, dz, and in `Grads.dw` each row's fp32 weight contribution [rows, D], unsummed
    (the weight is expanded to one fp32 leaf per row)."""
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

    Not a registered key: the positive control that shows the order-free gate lines can pass (eager autograd's
    fp32 sum, `reference`, fails them), and the base the planted faults build on to break one guarantee each.
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
    requires = "rlnorm.kernel"
    source = f"rlnorm {__version__} rms_norm_gated (Triton {dist_version('triton')})"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from rlnorm import rms_norm_gated

        return rms_norm_gated(x, z, w, **opts.as_dict())

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        """The backward's row-count choices, each forced through `rlnorm.kernel.testing.plant`: TILES (which fixes
        HOT_WIDTH) and STRIPES, at every value the launcher can pick at this width (the forward picks nothing
        from the row count)."""
        from rlnorm.kernel import _bwd, _dweight
        from rlnorm.kernel.testing import plant

        cfg = _bwd.bwd_config(d, opts.group_size or d)
        cap = min(cfg["TILES"], _dweight.MAX_TILES_DEFERRED if cfg["COLD_MODE"] == 0 else _dweight.MAX_TILES)
        tiles = sorted({min(cap, 1 << k) for k in range(cap.bit_length() + 1)})
        stripes = [1 << k for k in range(_dweight.STRIPES.bit_length()) if 1 << k <= _dweight.STRIPES]
        kernel = kernel_name(_bwd._rms_norm_gated_bwd_kernel)
        out = [
            Setting(kernel, "TILES", str(t), lambda t=t: plant(bwd={"TILES": t}),
                    implies={"HOT_WIDTH": str(_dweight.hot_width(t))})
            for t in tiles
        ]  # fmt: skip
        out += [Setting(kernel, "STRIPES", str(n), lambda n=n: plant(bwd={"STRIPES": n})) for n in stripes]
        return out


class TorchCompileBackend(Backend):
    """`torch.compile` of the reference: the first thing a user would try. Backward is AOT-autograd's."""

    key = "torch_compile"
    source = f"torch {torch.__version__} torch.compile(rlnorm.reference.rms_norm_gated_reference)"
    GRAPH = "torch.compile(rlnorm.reference.rms_norm_gated_reference)"  # the `configurations` check's kernel

    def __init__(self) -> None:
        super().__init__()
        self._compiled: dict[tuple[OpOptions, str], object] = {}
        self._graph = "default"  # "dynamic" / "static": forced by the `configurations` check

    @contextlib.contextmanager
    def _forced(self, graph: str) -> Iterator[None]:
        saved, self._graph = self._graph, graph
        # one static graph per row count: past the default recompile limit it would fall back to eager
        try:
            with torch._dynamo.config.patch(recompile_limit=64):
                yield
        finally:
            self._graph = saved

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        """The graph a trainer gets (dynamic rows) and the graphs a CUDA-graph sampler gets (one static row
        count each): dynamic=True against dynamic=False."""
        return [
            Setting(self.GRAPH, "graph", "dynamic=True", lambda: self._forced("dynamic")),
            Setting(
                self.GRAPH, "graph", "dynamic=False (one static graph per row count)", lambda: self._forced("static")
            ),
        ]

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        if self._graph != "default":
            return self._fn_forced(x, z, w, opts)
        fn = self._compiled.get((opts, "default"))
        if fn is None:
            # options are closed over, so each option set is its own graph (no guard on a dataclass)
            def op(x: Tensor, z: Tensor | None, w: Tensor) -> Tensor:
                return rms_norm_gated_reference(x, z, w, opts)

            # torch.compile's defaults, as a user calls it: static shapes, then a dynamic graph once the row count
            # changes (dynamic=False would hit the recompile limit across the sweep and fall back to eager)
            fn = torch.compile(op)
            self._compiled[(opts, "default")] = fn
        return fn(x, z, w)

    def _fn_forced(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        fn = self._compiled.get((opts, self._graph))
        if fn is None:
            # a function of its own per mode: dynamo keeps its graphs per code object, so one mode's graphs are
            # never picked up by the other's calls
            if self._graph == "dynamic":

                def op_dynamic(x: Tensor, z: Tensor | None, w: Tensor) -> Tensor:
                    return rms_norm_gated_reference(x, z, w, opts)

                fn = torch.compile(op_dynamic, dynamic=True)
            else:

                def op_static(x: Tensor, z: Tensor | None, w: Tensor) -> Tensor:
                    return rms_norm_gated_reference(x, z, w, opts)

                fn = torch.compile(op_static, dynamic=False)
            self._compiled[(opts, self._graph)] = fn
        return fn(x, z, w)
