"""Public API of the rlnorm kernel: validation, autograd, functional and module forms.

Nothing here falls back to another implementation: an input the kernel cannot take raises a
ValueError/TypeError that names the argument.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from rlnorm.kernel._bwd import rms_norm_gated_bwd, workspace_numel
from rlnorm.kernel._fwd import MAX_D, rms_norm_gated_fwd
from rlnorm.kernel._switches import bwd_switches
from rlnorm.options import OpOptions

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.lru_cache(maxsize=64, typed=True)  # typed: 1 must not hit the entry for True
def _options_cached(eps: float, group_size: int | None, norm_before_gate: bool, activation: str) -> OpOptions:
    return OpOptions(eps=eps, group_size=group_size, norm_before_gate=norm_before_gate, activation=activation)


def _options(eps: float, group_size: int | None, norm_before_gate: bool, activation: str) -> OpOptions:
    """Validated options, cached per value (a decode-sized call's latency is mostly CPU time);
    unhashable input validates uncached."""
    try:
        return _options_cached(eps, group_size, norm_before_gate, activation)
    except TypeError:  # unhashable argument: let OpOptions name it
        return OpOptions(eps=eps, group_size=group_size, norm_before_gate=norm_before_gate, activation=activation)


def _check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype bfloat16, float16 or float32, got {t.dtype}")


def _validate(x: torch.Tensor, z: torch.Tensor | None, weight: torch.Tensor | None, opts: OpOptions) -> None:
    """Raise ValueError/TypeError naming the offending argument; return silently if the kernel can run."""
    _check_float("x", x)
    if weight is not None:
        _check_float("weight", weight)
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dimension [..., D], got a 0-d tensor")
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"x: expected a CUDA tensor (CPU tensors need TRITON_INTERPRET=1), got device {x.device}")
    d = x.shape[-1]
    if d == 0:
        raise ValueError("x: last dimension D must be > 0")
    if d > MAX_D:
        raise ValueError(f"x: last dimension {d} exceeds the kernel's limit of {MAX_D}")
    if weight is not None:
        if weight.dim() != 1 or weight.shape[0] != d:
            raise ValueError(f"weight: expected shape [{d}] (x's last dimension), got {tuple(weight.shape)}")
        if weight.device != x.device:
            raise ValueError(f"weight: expected device {x.device} like x, got {weight.device}")
    if z is not None:
        _check_float("z", z)
        if z.shape != x.shape:
            raise ValueError(f"z: expected shape {tuple(x.shape)} like x, got {tuple(z.shape)}")
        if z.dtype != x.dtype:
            raise TypeError(f"z: expected dtype {x.dtype} like x, got {z.dtype}")
        if z.device != x.device:
            raise ValueError(f"z: expected device {x.device} like x, got {z.device}")
    opts.check_width(d)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [rows, D] with a contiguous last dimension: a view where one exists (any row stride),
    else one copy (same values, so the same output bits)."""
    rows = t
    if t.dim() != 2:
        try:
            rows = t.view(-1, t.shape[-1])
        except RuntimeError:
            return t.reshape(-1, t.shape[-1])  # leading dims not viewable: reshape copies, contiguously
    if rows.stride(-1) != 1 and rows.shape[-1] > 1:
        rows = rows.contiguous()  # the kernels read a row's columns as contiguous vectors
    return rows


def _dense(weight: torch.Tensor | None) -> torch.Tensor | None:
    """weight with stride 1 (the kernels read it as a contiguous vector); one copy if it is strided."""
    if weight is None or weight.stride(0) == 1 or weight.shape[0] <= 1:
        return weight
    return weight.contiguous()


class _RMSNormGatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, weight, opts: OpOptions):  # type: ignore[override]
        shape = x.shape
        x2 = _as_rows(x)
        z2 = None if z is None else _as_rows(z)
        w = _dense(weight)
        ws = None
        if w is not None:
            # the backward's dweight counters, zeroed by the forward's own launch: the backward then needs no
            # memset launch. Sized under the backward switches now in force; held until the backward.
            ws = torch.empty(
                workspace_numel(x2.shape[0], x2.shape[1], opts.group_size), dtype=torch.int64, device=x.device
            )
        y = rms_norm_gated_fwd(x2, z2, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, zero=ws)
        ctx.workspace = ws  # used once: a second backward (retain_graph) gets a fresh zeroed one
        ctx.switches = bwd_switches()  # a backward under other switches may need other counters
        ctx.save_for_backward(x2, z2, w)
        ctx.opts = opts
        ctx.shape = shape
        ctx.has_z = z is not None
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x2, z2, w = ctx.saved_tensors
        opts: OpOptions = ctx.opts
        d = x2.shape[-1]
        dy2 = _as_rows(dy)
        if x2.shape[0] == 0:
            dx = torch.zeros(ctx.shape, dtype=x2.dtype, device=x2.device)
            dz = torch.zeros(ctx.shape, dtype=x2.dtype, device=x2.device) if ctx.has_z else None
            dw = None if w is None else torch.zeros(d, dtype=w.dtype, device=w.device)
            return dx, dz, dw, None
        ws, ctx.workspace = ctx.workspace, None
        if ctx.switches is not bwd_switches():
            ws = None  # the forward ran under other backward switches: its counters may not fit
        dx, dz, dw = rms_norm_gated_bwd(
            dy2, x2, z2, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, workspace=ws
        )
        return dx.view(ctx.shape), (None if dz is None else dz.view(ctx.shape)), dw, None


def rms_norm_gated(
    x: torch.Tensor,
    z: torch.Tensor | None,
    weight: torch.Tensor | None,
    *,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    activation: str = "silu",
) -> torch.Tensor:
    """Gated RMSNorm, batch invariant and correctly rounded; differentiable in x, z and weight.

    y = rmsnorm(x) * weight * act(z) (norm_before_gate=True), or rmsnorm(x * act(z)) * weight
    (norm_before_gate=False); per group of `group_size` columns when given; act is silu ("swish") or
    sigmoid. Every output is the fp64 result rounded once to x's dtype, and a row's bits never depend on
    the other rows of the batch.

    x, z: [..., D], the same shape and dtype (bf16, fp16 or fp32); z=None gives plain RMSNorm. Any
    strides: rows are read where they lie, and a last dimension that is not contiguous is copied once
    (as FLA and vLLM do), which changes no bit. weight: [D] (bf16/fp16/fp32; dweight comes back in its
    dtype), or None for no weight (FLA's and vLLM's elementwise_affine=False): bitwise the outputs of a
    weight of ones, and no dweight.
    eps >= 0. With eps = 0 a row of all zeros has rstd = inf, and its outputs are NaN (0 * inf, as with
    FLA); in the backward its NaN gradients make every dweight column NaN, and a row whose mean square
    underflows fp32 can get inf/NaN gradients too. Every other row keeps its guarantees: use eps > 0 when
    batches hold zero (padding) rows.
    """
    opts = _options(eps, group_size, norm_before_gate, activation)
    _validate(x, z, weight, opts)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or (weight is not None and weight.requires_grad) or (z is not None and z.requires_grad)
    )
    if not needs_grad:
        # the same kernel without autograd's bookkeeping (most of a decode-sized call's latency is CPU time)
        y = rms_norm_gated_fwd(
            _as_rows(x),
            None if z is None else _as_rows(z),
            _dense(weight),
            opts.eps,
            opts.group_size,
            opts.norm_before_gate,
            opts.activation,
        )
        return y.view(x.shape)
    return _RMSNormGatedFunction.apply(x, z, weight, opts)


class RMSNormGated(nn.Module):
    """nn.Module form of `rms_norm_gated`: weight [hidden_size] initialised to ones (not zero-centred),
    or no weight at all with elementwise_affine=False (as if ones; no parameter, no dweight)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        activation: str = "silu",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size: expected a positive int, got {hidden_size!r}")
        if hidden_size > MAX_D:
            raise ValueError(f"hidden_size: {hidden_size} exceeds the kernel's limit of {MAX_D}")
        if not isinstance(elementwise_affine, bool):
            raise TypeError(f"elementwise_affine: expected a bool, got {elementwise_affine!r}")
        self.opts = OpOptions(eps=eps, group_size=group_size, norm_before_gate=norm_before_gate, activation=activation)
        self.opts.check_width(hidden_size)
        self.hidden_size = hidden_size
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        o = self.opts
        return rms_norm_gated(
            x,
            z,
            self.weight,
            eps=o.eps,
            group_size=o.group_size,
            norm_before_gate=o.norm_before_gate,
            activation=o.activation,
        )

    def extra_repr(self) -> str:
        o = self.opts
        affine = "" if self.elementwise_affine else ", elementwise_affine=False"
        return (
            f"{self.hidden_size}, eps={o.eps}, group_size={o.group_size}, "
            f"norm_before_gate={o.norm_before_gate}, activation={o.activation!r}{affine}"
        )
