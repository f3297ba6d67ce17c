"""Forward kernel: explicit rounding, correct rounding, options, edge cases, batch invariance (CPU interpreter)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from conftest import REPO_ROOT, oracle

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU)
from rlnorm.inputs import UNDERFLOW_KINDS, make_case, make_underflow_case
from rlnorm.kernel._fwd import MAX_D, fwd_config, rms_norm_gated_fwd
from rlnorm.kernel._rounding import round_fp32_to_out, round_fp64_to_out, widen_fast
from rlnorm.kernel.testing import plant
from rlnorm.kit.checks.common import bits
from rlnorm.numerics import round_once, ulp_distance
from rlnorm.options import OpOptions


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise bitwise equality, any NaN equal to any NaN."""
    return (bits(a) == bits(b)) | (torch.isnan(a) & torch.isnan(b))


DEFAULT = OpOptions()


def fwd(x, z, w, opts: OpOptions = DEFAULT, **kw):
    return rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


# ---------------------------------------------------------------- rounding helpers


@triton.jit
def _round32_kernel(x_ptr, y_ptr, n, PLAIN_CAST: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x_ptr + offs, mask=m)
    if PLAIN_CAST:
        out = v.to(y_ptr.dtype.element_ty)  # the interpreter truncates this one
    else:
        out = round_fp32_to_out(v, y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs, out, mask=m)


@triton.jit
def _round64_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, round_fp64_to_out(tl.load(x_ptr + offs, mask=m), y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _widen_kernel(x_ptr, y_ptr, n, INTERP: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, widen_fast(tl.load(x_ptr + offs, mask=m), INTERP, ASM), mask=m)


def _check_widen(dtype: torch.dtype, on_gpu: bool) -> None:
    # every bf16 / fp16 value (infinities, subnormals, signed zeros) widened to fp32 bit for bit as torch
    # does, NaN to NaN (payloads of signalling fp16 NaNs differ between conversions)
    dev = "cuda" if on_gpu else "cpu"
    v = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).to(dev)
    y = torch.empty(v.shape, dtype=torch.float32, device=dev)
    _widen_kernel[(triton.cdiv(v.numel(), 4096),)](v, y, v.numel(), INTERP=not on_gpu, ASM=on_gpu, BLOCK=4096)
    assert same_bits(y, v.float()).all()


ON_THE_GPU = pytest.param(True, marks=pytest.mark.gpu(reason="the GPU's own path (inline PTX) runs on a GPU only"))


@pytest.mark.parametrize("on_gpu", [False, ON_THE_GPU])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_widen_fast_is_exact_for_every_16_bit_pattern(dtype, on_gpu):
    _check_widen(dtype, on_gpu)


def _run32(v: torch.Tensor, dtype: torch.dtype, plain: bool = False) -> torch.Tensor:
    y = torch.empty(v.shape, dtype=dtype)
    _round32_kernel[(triton.cdiv(v.numel(), 4096),)](v, y, v.numel(), PLAIN_CAST=plain, BLOCK=4096)
    return y


def _fp32_values() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    random_bits = torch.randint(-(2**31), 2**31 - 1, (60000,), generator=g, dtype=torch.int64).to(torch.int32)
    inf, nan = float("inf"), float("nan")
    specials = [0.0, -0.0, inf, -inf, nan, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-25, 2.0**-25 * 1.0000001]
    specials = torch.tensor([*specials, 6e-8, 3.0e-5, 3.3e38, -3.39e38, 1e-40, -1e-45])
    ties = torch.randn(4000, generator=g).to(torch.bfloat16).float()  # exact bf16 values ...
    ties = ties.view(torch.int32) | 0x8000  # ... moved onto the midpoint above them
    return torch.cat(
        [
            random_bits.view(torch.float32),
            torch.randn(20000, generator=g) * 1e-5,
            torch.randn(20000, generator=g) * 6e4,
            ties.view(torch.float32),
            specials,
        ]
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_fp32_matches_torch_round_to_nearest_even(dtype):
    v = _fp32_values()
    assert same_bits(_run32(v, dtype), v.to(dtype)).all()


def test_plain_cast_in_interpreter_truncates_so_the_check_catches_it():
    # the planted fault: a plain cast, which the interpreter rounds toward zero
    v = _fp32_values()
    assert not same_bits(_run32(v, torch.bfloat16, plain=True), v.to(torch.bfloat16)).all()


def test_round_fp64_once_matches_numerics_round_once():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(40000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-40, 40, (40000,), generator=g).double()
    )
    b = torch.randn(4000, generator=g).to(torch.bfloat16).float()
    mid = (b.view(torch.int32) | 0x8000).view(torch.float32).double()  # exact bf16 midpoints
    # just above / below a midpoint by far less than an fp32 ulp: rounding through fp32 would err
    near_mid = torch.cat([mid * (1 + 2.0**-40), mid * (1 - 2.0**-40), mid])
    specials = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e300, -1e-300, 0.0, -0.0, 3.4e38])
    v = torch.cat([v, near_mid, specials, torch.randn(4000, generator=g, dtype=torch.float64) * 1e-39])
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        y = torch.empty(v.shape, dtype=dtype)
        _round64_kernel[(triton.cdiv(v.numel(), 4096),)](v, y, v.numel(), BLOCK=4096)
        assert same_bits(y, round_once(v, dtype)).all(), dtype
    # the planted fault: rounding through fp32 (twice) differs on the near-midpoint values
    assert not same_bits(near_mid.float().to(torch.bfloat16), round_once(near_mid, torch.bfloat16)).all()


# ---------------------------------------------------------------- accuracy


@pytest.fixture(scope="module")
def case11():
    return make_case(1024, 128, seed=11)


def test_correctly_rounded_on_standard_data(case11):
    c = case11.rows(slice(0, 512))
    y, fast, flags = fwd(c.x, c.z, c.w, debug=True)
    assert same_bits(y, oracle(c.x, c.z, c.w)).float().mean().item() == 1.0
    assert not torch.isnan(fast).any()  # debug buffer fully written: every element went through the fast path
    assert 0 < flags.float().mean().item() < 0.01  # some elements near a midpoint took the exact path


def test_error_bound_is_needed(case11):
    # row 350 of the standard data has an element the fp32 path alone rounds wrongly on the CPU
    c = case11.rows(slice(344, 352))
    ref = oracle(c.x, c.z, c.w)
    assert same_bits(fwd(c.x, c.z, c.w), ref).all()
    # the planted fault: no error bound, so no element is ever sent to the exact path
    with plant(no_midpoint_test=True):
        assert not same_bits(fwd(c.x, c.z, c.w), ref).all()


@pytest.mark.parametrize("d", [96, 128, 200])
def test_row_chunk_layouts_give_the_same_bits(d):
    # SPLIT chunks of a row per thread only regroup the columns: a mis-indexed chunk, mask or broadcast shows
    # as a wrong output. The widened bound sends many elements through the tier (same layout); other widths
    # pad the last chunk; the NaN row takes the whole-row path, so every store site is seen.
    c = make_case(63, d, seed=7)
    x = c.x.clone()
    x[5, 3] = float("nan")  # a risky row (whole-row path) among the tier's rows
    ref = oracle(x, c.z, c.w)
    for split in (1, 2):
        with plant(fwd={"NEAR_T": 200, "SPLIT": split}):
            y = fwd(x, c.z, c.w)
        assert same_bits(y, ref).all(), f"SPLIT {split}, d={d}"


@pytest.mark.parametrize("opts", [DEFAULT, OpOptions(activation="sigmoid"), OpOptions(norm_before_gate=False)])
def test_exact_path_repairs_a_fast_path_planted_wrong(case11, opts):
    # the fast path planted 6 fp32 ulps off (the threshold, 21 here, absorbs it): the rows it makes near a
    # midpoint are recomputed in fp64, so every output is still the correctly rounded one
    c = case11.rows(slice(0, 96))
    ref = oracle(c.x, c.z, c.w, opts)
    with plant(fast_ulps=6):
        y, _, flags = fwd(c.x, c.z, c.w, opts, debug=True)
    assert flags.any(dim=1).float().mean().item() > 0.02  # the exact path did run
    assert same_bits(y, ref).all()
    # without the exact path the same planted fault shows: the repair above is what made it right
    with plant(fwd={"EXACT": 0}, fast_ulps=6):
        assert not same_bits(fwd(c.x, c.z, c.w, opts), ref).all()


OPTION_CASES = [
    # (opts, has_z, x dtype, w dtype)
    (OpOptions(), True, torch.bfloat16, torch.bfloat16),
    (OpOptions(), True, torch.bfloat16, torch.float32),
    (OpOptions(), True, torch.bfloat16, torch.float16),
    (OpOptions(), False, torch.bfloat16, torch.bfloat16),
    (OpOptions(norm_before_gate=False), True, torch.bfloat16, torch.bfloat16),
    (OpOptions(activation="sigmoid"), True, torch.bfloat16, torch.bfloat16),
    (OpOptions(activation="swish", norm_before_gate=False), True, torch.bfloat16, torch.float32),
    (OpOptions(activation="sigmoid", norm_before_gate=False), True, torch.bfloat16, torch.bfloat16),
    (OpOptions(group_size=32), True, torch.bfloat16, torch.bfloat16),
    (OpOptions(group_size=64, norm_before_gate=False), True, torch.bfloat16, torch.bfloat16),
    (OpOptions(group_size=16), False, torch.bfloat16, torch.bfloat16),
    (OpOptions(), True, torch.float16, torch.float16),
    (OpOptions(norm_before_gate=False), True, torch.float16, torch.float32),
    (OpOptions(), True, torch.float32, torch.float32),
    (OpOptions(group_size=32, activation="sigmoid"), True, torch.float32, torch.bfloat16),
    (OpOptions(eps=1e-3), True, torch.bfloat16, torch.bfloat16),
]


@pytest.mark.parametrize(("opts", "has_z", "dtype", "wdtype"), OPTION_CASES)
def test_options_match_fp64_rounded_once(opts, has_z, dtype, wdtype):
    c = make_case(33, 128, seed=5, dtype=dtype, weight_dtype=wdtype)
    z = c.z if has_z else None
    y = fwd(c.x, z, c.w, opts)
    assert y.dtype == dtype and y.shape == c.x.shape
    assert (ulp_distance(y, oracle(c.x, z, c.w, opts)) == 0).all()


@pytest.mark.parametrize("d", [96, 160, 200, 1, 3, MAX_D])  # one past MAX_D is refused: tests/kernel/test_api.py
def test_widths_not_a_power_of_two_and_at_the_limit(d):
    c = make_case(33 if d < MAX_D else 2, d, seed=6)
    assert same_bits(fwd(c.x, c.z, c.w), oracle(c.x, c.z, c.w)).all()


def test_extreme_values_take_the_exact_path():
    c = make_case(16, 128, seed=9)
    x, z = c.x.clone(), c.z.clone()
    x[0] *= 1e37  # mean of squares beyond fp32: rstd below fp32's normal range
    x[1] *= 1e-38  # subnormal inputs
    z[2] = -100.0  # sigmoid underflows in fp32
    z[3, :5] = 3e38  # huge gate
    w = c.w.clone()
    w[7] = 0.0
    opts = OpOptions()
    assert same_bits(fwd(x, z, w), oracle(x, z, w, opts)).all()


@pytest.mark.parametrize("on_gpu", [False, ON_THE_GPU])
@pytest.mark.parametrize("kind", UNDERFLOW_KINDS)
def test_an_underflowed_intermediate_sends_its_row_to_the_exact_path(kind, on_gpu):
    # x*w ~ 1e-40 under a gate ~ 1e30: with plain products the outputs came out far off, unflagged (the GPU's
    # products flush in mul.rn.ftz.f32; the interpreter emulates them)
    x, z, w, opts = make_underflow_case(kind, **({"rows": 64, "device": "cuda"} if on_gpu else {}))
    ref = oracle(x, z, w, opts)
    y, fast, _ = fwd(x, z, w, opts, debug=True)
    assert same_bits(y, ref).all()
    assert on_gpu or (fast[:, 1:] == 0).all()  # flushed to zero: what the range test catches
    # the planted fault: plain products keep the subnormal, and nothing sends the row to the exact path
    with plant(plain_products=True):
        assert not same_bits(fwd(x, z, w, opts), ref).all()


def test_nan_and_inf_stay_in_their_row():
    c = make_case(24, 128, seed=10)
    clean = fwd(c.x, c.z, c.w)
    x, z = c.x.clone(), c.z.clone()
    x[3, 5] = float("nan")
    x[9, 0] = float("inf")
    z[17, 100] = -float("inf")
    y = fwd(x, z, c.w)
    bad = torch.tensor([3, 9, 17])
    keep = torch.ones(24, dtype=torch.bool)
    keep[bad] = False
    assert same_bits(y[keep], clean[keep]).all()
    assert torch.isnan(y[3]).all()  # NaN poisons the row's rstd
    assert same_bits(y[bad], oracle(x, z, c.w)[bad]).all()  # and agrees with the fp64 oracle


# ---------------------------------------------------------------- batch invariance


def rows_differing(fn, x, z, w, sizes) -> list[tuple[str, int]]:
    """(layout, row) for every row whose output inside a batch differs bitwise from the row alone.

    The row alone (a batch of one) is computed for every row; the other layouts put it among others.
    """
    n = x.shape[0]
    alone = torch.cat([fn(x[i : i + 1], z[i : i + 1], w) for i in range(n)])
    bad: list[tuple[str, int]] = []

    def compare(layout: str, idx: torch.Tensor, out: torch.Tensor) -> None:
        for k in torch.nonzero(~same_bits(out, alone[idx]).all(dim=1)).flatten().tolist():
            bad.append((layout, int(idx[k])))

    for m in sizes:
        # contiguous chunks: row i sits at position i % m, so every position is covered; small sizes stop
        # after 20 chunks
        for start in range(0, min(n, max(20 * m, 64)) if m > 1 else 0, m):
            idx = torch.arange(start, min(start + m, n))
            compare(f"chunk{m}", idx, fn(x[idx], z[idx], w))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    compare("permuted", perm, fn(x[perm], z[perm], w))
    k = min(n, 257)  # padding and strides on the first rows
    pad_x = torch.cat([torch.zeros(5, x.shape[1], dtype=x.dtype), x[:k], torch.full_like(x[:3], float("nan"))])
    pad_z = torch.cat([torch.zeros(5, x.shape[1], dtype=x.dtype), z[:k], torch.ones_like(z[:3])])
    compare("padded", torch.arange(k), fn(pad_x, pad_z, w)[5 : 5 + k])
    wide_x = torch.zeros(k, 2 * x.shape[1], dtype=x.dtype)
    wide_x[:, 3 : 3 + x.shape[1]] = x[:k]  # a row stride, and a misaligned start
    compare("strided", torch.arange(k), fn(wide_x[:, 3 : 3 + x.shape[1]], z[:k], w))
    return bad


@pytest.mark.slow
def test_batch_invariance_every_row_every_position():
    c = make_case(129, 128, seed=3)  # one program per BLOCK_R rows: 129 rows end in a partial tile, as 257 would
    assert rows_differing(fwd, c.x, c.z, c.w, sizes=[1, 2, 7, 63, 129]) == []


@pytest.mark.slow
def test_batch_invariance_options_and_fp32_inputs():
    # fp32 squares are not exact in fp64, so here the sum's order matters: it must not depend on the batch
    c = make_case(70, 96, seed=4, dtype=torch.float32)
    opts = OpOptions(group_size=32, norm_before_gate=False)
    f = lambda x, z, w: fwd(x, z, w, opts)
    assert rows_differing(f, c.x, c.z, c.w, sizes=[7, 63]) == []


def test_invariance_check_catches_a_batch_dependent_kernel():
    c = make_case(20, 128, seed=3)

    def faulty(x, z, w):  # the planted fault: eps depends on the batch size, as a rows-dependent launch would
        return rms_norm_gated_fwd(x, z, w, 1e-6 * (1 + 1e4 * (x.shape[0] > 1)), None, True, "silu")

    bad = rows_differing(faulty, c.x, c.z, c.w, sizes=[7])
    assert len({r for _, r in bad}) > 0


# Compiles (never runs) the default forward for sm_90 in a process of its own, out of the interpreter, under
# the switches given as JSON, and prints the blocked layouts of its TTGIR: a fake driver reports an sm_90
# target and the launch becomes a compile-only warmup, so no GPU is needed.
_LAYOUTS_PROGRAM = """
import json, re, sys
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

class Sm90CompileOnly:
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0

driver.set_active(Sm90CompileOnly())
compiled = []
run = JITFunction.run
JITFunction.run = lambda self, *a, grid, warmup, **kw: compiled.append(run(self, *a, grid=grid, warmup=True, **kw))
from rlnorm.kernel.testing import plant
from rlnorm.kernel._fwd import rms_norm_gated_fwd
d, switches = int(sys.argv[1]), json.loads(sys.argv[2])
x = torch.randn(8, d).bfloat16()
with plant(fwd=switches):
    rms_norm_gated_fwd(x, x, torch.ones(d).bfloat16(), 1e-6, None, True, "silu")
print("\\n".join(re.findall(r"#ttg\\.blocked<\\{[^}]*\\}>", compiled[-1].asm["ttgir"])))
"""


def _sm90_layouts(d: int, switches: dict) -> list[dict[str, list[int]]]:
    """The 3-D blocked layouts of the forward compiled for sm_90 by the installed Triton (no GPU needed)."""
    out = subprocess.run(
        [sys.executable, "-c", _LAYOUTS_PROGRAM, str(d), json.dumps(switches)],
        cwd=REPO_ROOT,
        env={**os.environ, "TRITON_INTERPRET": "0"},
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    ).stdout
    layouts = []
    for line in out.splitlines():
        fields = {k: [int(v) for v in vals.split(",")] for k, vals in re.findall(r"(\w+) = \[([\d, ]+)\]", line)}
        if len(fields.get("sizePerThread", [])) == 3:
            layouts.append(fields)
    return layouts


def _rows_per_thread(layout: dict[str, list[int]], block_r: int) -> int:
    covered = layout["sizePerThread"][0] * layout["threadsPerWarp"][0] * layout["warpsPerCTA"][0]
    return layout["sizePerThread"][0] * max(1, block_r // covered)


def test_a_thread_holds_sixteen_elements_of_one_row_on_the_installed_triton():
    # The forward's speed rests on each thread holding 16 columns of ONE row (one rstd per thread). The layout of
    # a 3-D tile depends on Triton's version (3.7: two rows per thread); the joined 2-D chunks must give one row
    # per thread on the Triton installed here. The one-chunk layout (SPLIT 1) is the planted fault.
    d = 128
    block_r = fwd_config(d, torch.bfloat16)[0]
    joined = [lay for lay in _sm90_layouts(d, {}) if lay["sizePerThread"][1:] == [8, 2]]
    assert joined and all(_rows_per_thread(lay, block_r) == 1 for lay in joined), joined
    one_chunk = _sm90_layouts(d, {"SPLIT": 1})
    assert not [lay for lay in one_chunk if lay["sizePerThread"][1:] == [8, 2]]
    assert any(_rows_per_thread(lay, block_r) > 1 for lay in one_chunk if lay["sizePerThread"][1] == 8)
