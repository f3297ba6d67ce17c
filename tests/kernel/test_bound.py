"""The midpoint test's threshold T per width: an error T admits keeps every output correct, one past it does not.

`plant(fast_ulps=k)` moves the fast path's fp32 result k ulps up in magnitude, on rows holding an element less than
one fp32 ulp below a bf16 midpoint; the interpreter's own fast-path error on those rows is counted in."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, oracle
from kernel_helpers import BF16, FP32, fwd, same

from rlnorm.inputs import make_case
from rlnorm.kernel._bound import near_threshold, ptx_sum_depth, sum_depth
from rlnorm.kernel._fwd import DECODE_ROWS, fwd_config
from rlnorm.kernel.testing import plant
from rlnorm.kit.checks.common import bits
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math


def _ulp32(v: torch.Tensor) -> torch.Tensor:
    """fp32 ulp of each fp64 value's binade (|v| in [2**(e-1), 2**e) -> 2**(e-24))."""
    _, e = torch.frexp(v)
    return torch.ldexp(torch.ones_like(v), e - 24)


def _selected_rows(d: int, opts: OpOptions, has_z: bool, wdtype: torch.dtype, seed: int, want: int = 3):
    """Rows of standard data holding an element just below a midpoint (about one element in 65536)."""
    rows = max(8, (1 << 19) // d)
    c = make_case(rows, d, seed=seed, weight_dtype=wdtype)
    z = c.z if has_z else None
    ref64 = gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64)
    below = 32768 - torch.remainder(ref64.abs() / _ulp32(ref64), 65536)  # fp32 ulps up to the next bf16 midpoint
    hit = (below > 0) & (below <= 1) & torch.isfinite(ref64) & (ref64 != 0)  # within one fp32 ulp below a midpoint
    idx = hit.any(dim=1).nonzero().flatten()[:want]
    assert idx.numel() > 0, "no row with an element just below a midpoint: draw more rows"
    return c.x[idx], None if z is None else z[idx], c.w, ref64[idx], hit[idx]


CASES = [  # (D, options, gate, weight dtype)
    *[(d, OpOptions(), True, BF16) for d in (64, 128, 256, 1024, 8192)],
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
    _, fast, _ = fwd(x, z, w, opts, debug=True)
    # the interpreter's own fast-path error on these rows, in ulps of the fast value
    ok = torch.isfinite(ref64) & (ref64 != 0)
    own = math.ceil(((fast.double() - ref64).abs() / _ulp32(fast.double()))[ok].max().item())
    assert own < t
    # each target's fast value as ulps above its midpoint (exact values lie just below it)
    offset = (bits(fast.abs())[target] & 0xFFFF) - 0x8000

    # inside, in total: planted + own error <= T everywhere; the targets are flagged, every output correct
    with plant(fast_ulps=t - own):
        y, _, flags = fwd(x, z, w, opts, debug=True)
    assert flags.bool()[target].all()
    assert same(y, ref)
    with plant(fwd={"EXACT": 0}, fast_ulps=t - own):  # without the exact path the same planted error shows
        assert not same(fwd(x, z, w, opts), ref)
    # inside, at the edge: the highest target lands T ulps above the midpoint, still flagged and repaired
    with plant(fast_ulps=t - offset.max().item()):
        y, _, flags = fwd(x, z, w, opts, debug=True)
    assert flags.bool()[target].all()
    assert (bits(y) == bits(ref))[target].all()
    # past: the lowest target lands T + 1 ulps above the midpoint: every target passes the test unflagged
    # and rounds up where the exact value rounds down
    with plant(fast_ulps=t + 1 - offset.min().item()):
        y, _, flags = fwd(x, z, w, opts, debug=True)
    assert not flags.bool()[target].any()
    assert (bits(y) != bits(ref))[target].all()


# Compiles (never runs) the default forward for sm_90 out of the interpreter, in one process of its own (a fake
# driver reports an sm_90 target: no GPU needed), at these widths, switches and row counts (a decode-sized launch,
# one row per program, and one past every width's one-row switch); prints its PTX and TTGIR.
WIDE = max(DECODE_ROWS.values()) + 1
_COMPILED = [(d, {}, rows) for d in (64, 128, 256, 1024, 8192) for rows in (8, WIDE)] + [(128, {"SPLIT": 1}, WIDE)]
_COMPILE_PROGRAM = """
import json, sys
sys.path.insert(0, "tools")
import compile_sm90
compiled = compile_sm90.compile_only()
import torch
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kernel.testing import plant
out = []
for d, switches, rows in json.loads(sys.argv[1]):
    x = torch.randn(rows, d).bfloat16()
    with plant(fwd=switches):
        rms_norm_gated_fwd(x, x, torch.ones(d).bfloat16(), 1e-6, None, True, "silu")
    out.append({"ptx": compiled[-1].asm["ptx"], "ttgir": compiled[-1].asm["ttgir"]})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sm90() -> dict[tuple[int, str, int], dict[str, str]]:
    """(width, switches as JSON, rows) -> the forward's PTX and TTGIR for sm_90, compiled by the installed Triton."""
    arg = json.dumps(_COMPILED)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE_PROGRAM, arg], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=True)  # fmt: skip
    return {(d, json.dumps(sw), r): asm for (d, sw, r), asm in zip(_COMPILED, json.loads(proc.stdout), strict=True)}


def test_the_bound_counts_the_summation_depth_of_the_compiled_code(sm90):
    # The bound's sum term is the depth of the reduction Triton emits; read it from the PTX of the installed
    # Triton. A reduction with a longer chain (e.g. one chunk of 16 columns per thread) would raise the bound.
    for d in (64, 128, 256, 1024, 8192):
        assert ptx_sum_depth(sm90[d, "{}", WIDE]["ptx"]) == sum_depth(d), d
        # one row per program (64 to 256 columns): a thread holds fewer of the row's columns, the sum is shorter,
        # and T, counted for 16 per thread, still covers it
        one_row = ptx_sum_depth(sm90[d, "{}", 8]["ptx"])
        assert one_row is not None and one_row <= sum_depth(d), (d, one_row)


def _layouts(ttgir: str) -> list[dict[str, list[int]]]:
    """The 3-D blocked layouts of a TTGIR."""
    layouts = []
    for line in re.findall(r"#ttg\.blocked<\{[^}]*\}>", ttgir):
        fields = {k: [int(v) for v in vals.split(",")] for k, vals in re.findall(r"(\w+) = \[([\d, ]+)\]", line)}
        if len(fields.get("sizePerThread", [])) == 3:
            layouts.append(fields)
    return layouts


def _rows_per_thread(layout: dict[str, list[int]], block_r: int) -> int:
    covered = layout["sizePerThread"][0] * layout["threadsPerWarp"][0] * layout["warpsPerCTA"][0]
    return layout["sizePerThread"][0] * max(1, block_r // covered)


def test_a_thread_holds_sixteen_elements_of_one_row_on_the_installed_triton(sm90):
    # the forward's speed rests on each thread holding 16 columns of ONE row (a 3-D tile gives two on Triton 3.7):
    # the joined 2-D chunks must give one on the installed Triton; the one-chunk layout (SPLIT 1) is the fault
    # (the wide tile: a one-row program spreads its row thinner, and sums it in fewer steps: the test above)
    block_r = fwd_config(128, torch.bfloat16, WIDE)[0]
    joined = [lay for lay in _layouts(sm90[128, "{}", WIDE]["ttgir"]) if lay["sizePerThread"][1:] == [8, 2]]
    assert joined and all(_rows_per_thread(lay, block_r) == 1 for lay in joined), joined
    one_chunk = _layouts(sm90[128, json.dumps({"SPLIT": 1}), WIDE]["ttgir"])
    assert not [lay for lay in one_chunk if lay["sizePerThread"][1:] == [8, 2]]
    assert any(_rows_per_thread(lay, block_r) > 1 for lay in one_chunk if lay["sizePerThread"][1] == 8)
