"""What the kernel's tests share: bitwise comparison, and the launchers called with OpOptions."""

from __future__ import annotations

import torch

from rlnorm.kernel._bwd import rms_norm_gated_bwd
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kernel.api import rms_norm_gated
from rlnorm.kit.checks.common import bits
from rlnorm.options import OpOptions

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DEFAULT = OpOptions()


def differing(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Rows (elements, for 1-D) of a and b (same shape and dtype) that differ in any bit. A NaN equals any NaN
    (its sign and payload differ between the interpreter and the GPU); -0.0 and +0.0 differ."""
    diff = (bits(a) != bits(b)) & ~(torch.isnan(a) & torch.isnan(b))
    return (diff.reshape(diff.shape[0], -1).any(-1) if diff.dim() > 1 else diff).nonzero().flatten().tolist()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, shapes and dtypes included (NaN as in `differing`)."""
    return a.shape == b.shape and a.dtype == b.dtype and not differing(a, b)


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert (a.shape, a.dtype) == (b.shape, b.dtype), f"{what}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    bad = differing(a, b)
    assert not bad, f"{what}: {len(bad)} rows differ, first {bad[:5]}"


def assert_grads_same(got, want, what: str) -> None:  # type: ignore[no-untyped-def]
    """Bitwise equal (dx, dz, dweight) triples."""
    for a, b, name in zip(got, want, ("dx", "dz", "dweight"), strict=True):
        assert_same(a, b, f"{name}, {what}")


def fwd(x, z, w, opts: OpOptions = DEFAULT, **kw):  # type: ignore[no-untyped-def]
    return rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


def bwd(x, z, w, dy, opts: OpOptions = DEFAULT, **kw):  # type: ignore[no-untyped-def]
    return rms_norm_gated_bwd(dy, x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


def grads(x, z, w, dy, **kw):  # type: ignore[no-untyped-def]
    """(dx, dz, dweight) of `rms_norm_gated` through autograd; None for a z or w that is None."""
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in (x, z, w)]
    rms_norm_gated(*leaves, **kw).backward(dy)
    return tuple(None if t is None else t.grad for t in leaves)
