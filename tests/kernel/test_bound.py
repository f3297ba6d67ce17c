"""The midpoint test's threshold T per width: an error T admits keeps every output correct, one past it does not.

The fast path's error is planted (`plant(fast_ulps=k)` moves the fp32 result k ulps up in magnitude) on rows
chosen to hold an element whose exact value lies less than one fp32 ulp below a bf16 midpoint: the element
a planted error pushes across it. The interpreter's own fast-path error (measured on the same rows) is
counted in, so "inside" is a total error of at most T and "past" at least T + 1 on that element.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import oracle

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU)
from rlnorm.inputs import make_case
from rlnorm.kernel._bound import fast_error_ulps, near_threshold, sum_depth
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kernel.testing import plant
from rlnorm.kit.checks.common import bits
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math


def _ulp32(v: torch.Tensor) -> torch.Tensor:
    """fp32 ulp of each fp64 value's binade (|v| in [2**(e-1), 2**e) -> 2**(e-24))."""
    _, e = torch.frexp(v)
    return torch.ldexp(torch.ones_like(v), e - 24)


def _just_below_midpoint(ref64: torch.Tensor) -> torch.Tensor:
    """Elements whose exact magnitude lies within one fp32 ulp below a bf16 rounding midpoint."""
    t = ref64.abs() / _ulp32(ref64)  # the exact value in fp32 ulps, in [2**23, 2**24)
    below = 32768 - torch.remainder(t, 65536)
    return (below > 0) & (below <= 1) & torch.isfinite(ref64) & (ref64 != 0)


def _selected_rows(d: int, opts: OpOptions, seed: int, want: int = 3):
    """Rows of standard data holding an element just below a midpoint (about one element in 65536)."""
    rows = max(8, (1 << 19) // d)
    c = make_case(rows, d, seed=seed)
    ref64 = gated_rmsnorm_math(c.x, c.z, c.w, opts, torch.float64)
    hit = _just_below_midpoint(ref64)
    idx = hit.any(dim=1).nonzero().flatten()[:want]
    assert idx.numel() > 0, "no row with an element just below a midpoint: draw more rows"
    return c.x[idx], c.z[idx], c.w, ref64[idx], hit[idx]


def _fwd(x, z, w, opts: OpOptions, **kw):
    return rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


CASES = [
    (64, OpOptions()),
    (128, OpOptions()),
    (256, OpOptions()),
    (1024, OpOptions()),
    (8192, OpOptions()),
    (192, OpOptions(group_size=96)),  # a group width that is not a power of two: 1/96 is rounded
    (128, OpOptions(activation="sigmoid")),
    (128, OpOptions(norm_before_gate=False)),  # no per-element tier: flagged rows go whole to fp64
]


@pytest.mark.parametrize(
    ("d", "opts"), CASES, ids=[f"d{d}-g{o.group_size}-{o.activation}-{o.norm_before_gate}" for d, o in CASES]
)
def test_planted_error_inside_the_threshold_is_repaired_and_past_it_shows(d, opts):
    x, z, w, ref64, target = _selected_rows(d, opts, seed=d)
    ref = oracle(x, z, w, opts)
    t = near_threshold(opts.group_size or d, True, opts.norm_before_gate, opts.activation == "sigmoid")
    _, fast, _ = _fwd(x, z, w, opts, debug=True)
    # the interpreter's own fast-path error on these rows, in ulps of the fast value
    ok = torch.isfinite(ref64) & (ref64 != 0)
    own = math.ceil(((fast.double() - ref64).abs() / _ulp32(fast.double()))[ok].max().item())
    assert own < t
    # each target's fast value as ulps above its midpoint (exact values lie just below it)
    offset = (bits(fast.abs())[target] & 0xFFFF) - 0x8000

    # inside, in total: planted + own error <= T everywhere; the targets are flagged, every output correct
    with plant(fast_ulps=t - own):
        y, _, flags = _fwd(x, z, w, opts, debug=True)
    assert flags.bool()[target].all()
    assert (bits(y) == bits(ref)).all()
    # inside, at the edge: the highest target lands T ulps above the midpoint, still flagged and repaired
    with plant(fast_ulps=t - offset.max().item()):
        y, _, flags = _fwd(x, z, w, opts, debug=True)
    assert flags.bool()[target].all()
    assert (bits(y) == bits(ref))[target].all()
    # past: the lowest target lands T + 1 ulps above the midpoint: every target passes the test unflagged
    # and rounds up where the exact value rounds down
    with plant(fast_ulps=t + 1 - offset.min().item()):
        y, _, flags = _fwd(x, z, w, opts, debug=True)
    assert not flags.bool()[target].any()
    assert (bits(y) != bits(ref))[target].all()


def test_the_bound_grows_with_the_summation_depth_and_the_options():
    # the compiled sum (16 columns per thread: a pair add and a chain of 8, then log2(threads) butterfly levels)
    assert [sum_depth(1 << k) for k in (5, 6, 7, 8, 13)] == [9, 10, 11, 12, 17]
    assert sum_depth(16, split=1) == 15 and sum_depth(8, split=1) == 7  # short rows: any order in one thread
    # each option's extra roundings: a fp32 weight, the silu product, the gate's error twice when it comes first
    assert fast_error_ulps(128, weight_fp32=True) == pytest.approx(fast_error_ulps(128) + 1)
    assert fast_error_ulps(128) == pytest.approx(fast_error_ulps(128, sigmoid=True) + 1)
    assert fast_error_ulps(128, norm_before_gate=False) > fast_error_ulps(128) + 13
    assert [near_threshold(g) for g in (64, 128, 256, 1024, 8192)] == [20, 21, 21, 22, 24]
    assert near_threshold(128, has_z=False) == 8
