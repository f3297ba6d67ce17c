"""The midpoint test's threshold T per width: an error T admits keeps every output correct, one past it does not.

The fast path's error is planted (`plant(fast_ulps=k)` moves the fp32 result k ulps up in magnitude) on rows
chosen to hold an element whose exact value lies less than one fp32 ulp below a bf16 midpoint: the element
a planted error pushes across it. The interpreter's own fast-path error (measured on the same rows) is
counted in, so "inside" is a total error of at most T and "past" at least T + 1 on that element.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, oracle

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU)
from rlnorm.inputs import make_case
from rlnorm.kernel._bound import near_threshold, ptx_sum_depth, sum_depth
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


def _selected_rows(d: int, opts: OpOptions, has_z: bool, wdtype: torch.dtype, seed: int, want: int = 3):
    """Rows of standard data holding an element just below a midpoint (about one element in 65536)."""
    rows = max(8, (1 << 19) // d)
    c = make_case(rows, d, seed=seed, weight_dtype=wdtype)
    z = c.z if has_z else None
    ref64 = gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64)
    hit = _just_below_midpoint(ref64)
    idx = hit.any(dim=1).nonzero().flatten()[:want]
    assert idx.numel() > 0, "no row with an element just below a midpoint: draw more rows"
    return c.x[idx], None if z is None else z[idx], c.w, ref64[idx], hit[idx]


def _fwd(x, z, w, opts: OpOptions, **kw):
    return rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


BF16, FP32 = torch.bfloat16, torch.float32
CASES = [  # (D, options, gate, weight dtype)
    (64, OpOptions(), True, BF16),
    (128, OpOptions(), True, BF16),
    (256, OpOptions(), True, BF16),
    (1024, OpOptions(), True, BF16),
    (8192, OpOptions(), True, BF16),
    (192, OpOptions(group_size=96), True, BF16),  # a group width that is not a power of two: 1/96 is rounded
    (128, OpOptions(activation="sigmoid"), True, BF16),
    (128, OpOptions(norm_before_gate=False), True, BF16),  # no per-element tier: flagged rows go whole to fp64
    (128, OpOptions(), False, BF16),
    (128, OpOptions(), True, FP32),  # x * w rounded: one unit more
]


@pytest.mark.parametrize(
    ("d", "opts", "has_z", "wdtype"),
    CASES,
    ids=[f"d{d}-g{o.group_size}-{o.activation}-{o.norm_before_gate}-z{z}-{str(w)[6:]}" for d, o, z, w in CASES],
)
def test_planted_error_inside_the_threshold_is_repaired_and_past_it_shows(d, opts, has_z, wdtype):
    x, z, w, ref64, target = _selected_rows(d, opts, has_z, wdtype, seed=d)
    ref = oracle(x, z, w, opts)
    t = near_threshold(opts.group_size or d, has_z, opts.norm_before_gate, opts.activation == "sigmoid", wdtype == FP32)
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


_PTX_PROGRAM = """
import sys
sys.path.insert(0, "tools")
import compile_sm90
compiled = compile_sm90.compile_only()
import torch
from rlnorm.kernel._fwd import rms_norm_gated_fwd
d = int(sys.argv[1])
x = torch.randn(8, d).bfloat16()
rms_norm_gated_fwd(x, x, torch.ones(d).bfloat16(), 1e-6, None, True, "silu")
print(compiled[-1].asm["ptx"])
"""


def _sm90_ptx(d: int) -> str:
    """The default forward's PTX for sm_90 at width d, compiled by the installed Triton (no GPU needed)."""
    return subprocess.run(
        [sys.executable, "-c", _PTX_PROGRAM, str(d)],
        cwd=REPO_ROOT,
        env={**os.environ, "TRITON_INTERPRET": "0"},
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    ).stdout


@pytest.mark.parametrize("d", [64, 128, 1024, 8192])
def test_the_bound_counts_the_summation_depth_of_the_compiled_code(d):
    # The bound's sum term is the depth of the reduction Triton emits; read it from the PTX of the installed
    # Triton. A reduction with a longer chain (e.g. one chunk per thread, SPLIT 1) would raise the bound.
    assert ptx_sum_depth(_sm90_ptx(d)) == sum_depth(d)
