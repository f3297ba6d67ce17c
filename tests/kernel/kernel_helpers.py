"""What the kernel's tests share: bitwise comparison, and the launchers called with OpOptions.
(A module of its own, not a conftest: the tests' shared conftest keeps its name.)"""

from __future__ import annotations

import torch

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU)
from rlnorm.kernel._bwd import rms_norm_gated_bwd
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kit.checks.common import bits
from rlnorm.options import OpOptions

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


def fwd(x, z, w, opts: OpOptions = DEFAULT, **kw):  # type: ignore[no-untyped-def]
    return rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


def bwd(x, z, w, dy, opts: OpOptions = DEFAULT, **kw):  # type: ignore[no-untyped-def]
    return rms_norm_gated_bwd(dy, x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)
