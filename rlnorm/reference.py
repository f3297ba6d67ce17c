"""Eager PyTorch reference of the gated RMSNorm: math in one compute dtype, one rounding at the end."""

from __future__ import annotations

import torch

from rlnorm.options import OpOptions


def _act(z: torch.Tensor, activation: str) -> torch.Tensor:
    return torch.sigmoid(z) if activation == "sigmoid" else z * torch.sigmoid(z)


def gated_rmsnorm_math(
    x: torch.Tensor,
    z: torch.Tensor | None,
    w: torch.Tensor,
    opts: OpOptions | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The op in `compute_dtype`, unrounded: the fp64 call of this is the accuracy oracle."""
    opts = opts or OpOptions()
    d = x.shape[-1]
    opts.check_width(d)
    xf = x.to(compute_dtype)
    zf = None if z is None else z.to(compute_dtype)
    if zf is not None and not opts.norm_before_gate:
        xf = xf * _act(zf, opts.activation)
    g = opts.group_size or d
    xg = xf.reshape(*xf.shape[:-1], d // g, g)
    rstd = torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + opts.eps)
    y = (xg * rstd).reshape(xf.shape) * w.to(compute_dtype)
    if zf is not None and opts.norm_before_gate:
        y = y * _act(zf, opts.activation)
    return y


def rms_norm_gated_reference(
    x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions | None = None
) -> torch.Tensor:
    """fp32 math, rounded once to x's dtype: the `reference` backend (autograd gives dx, dz, dw)."""
    return gated_rmsnorm_math(x, z, w, opts or OpOptions(), torch.float32).to(x.dtype)
