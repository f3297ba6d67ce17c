"""Batch invariance of the forward and the backward, the exact dweight, the backward's accuracy (CPU interpreter).

Rows computed alone are the yardstick: each row of each batch gives their y, dx and dz bitwise, and dweight is the
exact sum of the single-row dweights (with an fp32 weight, a row's contributions) rounded once."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from kernel_helpers import BF16, DEFAULT, FP16, FP32, assert_grads_same, assert_same, bwd, fwd, same

import rlnorm
from rlnorm.inputs import make_case
from rlnorm.kernel import _fwd
from rlnorm.kernel._bwd import tiles_per_program, workspace_numel
from rlnorm.kernel.testing import plant
from rlnorm.kit.checks.common import bits
from rlnorm.numerics import exact_sum, round_once, ulp_distance
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math

BATCH_SIZES = (1, 2, 7, 63, 257)  # 257 rows already take the most tiles per program (31) in the interpreter


def bwd_under(switches: dict, *args, **kw):
    with plant(bwd=switches):
        return bwd(*args, **kw)


def forward_backward(x, z, w, dy, opts: OpOptions):
    return (fwd(x, z, w, opts), *bwd(x, z, w, dy, opts))


class Pool:
    """Distinct rows and their results computed one row per launch (the yardstick)."""

    def __init__(self, n: int, d: int, seed: int, opts: OpOptions, dtype=BF16, has_z: bool = True):
        c = make_case(n, d, seed=seed, dtype=dtype)
        self.x, self.z, self.dy = c.x, (c.z if has_z else None), c.dy
        self.w32 = c.w.float()  # fp32 weight: a single row's dweight is its exact fp32 contribution
        self.opts = opts
        alone = [self.run(torch.tensor([i])) for i in range(n)]
        self.y, self.dx = torch.cat([a[0] for a in alone]), torch.cat([a[1] for a in alone])
        self.dz = None if self.z is None else torch.cat([a[2] for a in alone])
        self.contrib = torch.stack([a[3] for a in alone])  # [n, d] fp32

    def run(self, idx: torch.Tensor, w: torch.Tensor | None = None, launch=forward_backward):
        z = None if self.z is None else self.z[idx]
        return launch(self.x[idx], z, self.w32 if w is None else w, self.dy[idx], self.opts)


def check_invariance(pool: Pool, sizes, seed: int, launch=forward_backward) -> None:
    """Batches drawn from the pool (every pool row used, permuted): each row's y, dx, dz equal its alone result,
    and dweight is the exact sum of the single-row dweights, rounded once."""
    g = torch.Generator().manual_seed(seed)
    n = pool.x.shape[0]
    for m in sizes:
        idx = torch.randperm(n, generator=g).repeat(m // n + 1)[:m]
        idx = idx[torch.randperm(m, generator=g)]
        y, dx, dz, dw = pool.run(idx, launch=launch)
        assert_same(y, pool.y[idx], f"y, batch of {m}")
        assert_same(dx, pool.dx[idx], f"dx, batch of {m}")
        if pool.z is not None:
            assert_same(dz, pool.dz[idx], f"dz, batch of {m}")
        assert_same(dw, exact_sum(pool.contrib[idx], FP32), f"dweight fp32, batch of {m}")


@pytest.fixture(scope="module")
def pool() -> Pool:
    return Pool(24, 128, seed=7, opts=DEFAULT)


def test_rows_alone_equal_rows_in_batches_of_every_size(pool):
    check_invariance(pool, BATCH_SIZES, seed=1)


def test_the_forward_changes_its_tile_past_decode_rows_and_no_bit(pool):
    # on a GPU one row per program up to decode_rows rows, past it the width's tile (4 rows at D = 128, 2 at 256);
    # the interpreter keeps the wide tile: rows alone in it against batches in one-row launches, bitwise
    for d, wide in ((64, 8), (128, 4), (192, 2), (256, 2)):
        rows = (1, _fwd.decode_rows(d), _fwd.decode_rows(d) + 1)
        assert [_fwd.fwd_config(d, BF16, n, serial=False)[0] for n in rows] == [1, 1, wide], d
    rows = (1, 4096, 8192, 8193)
    assert {_fwd.fwd_config(512, BF16, n, serial=False) for n in rows} == {(2, 512, 2)}  # one shape past 256
    assert {_fwd.fwd_config(128, BF16, n)[0] for n in rows} == {4}
    with plant(fwd={"BLOCK_R": 1}):
        check_invariance(pool, BATCH_SIZES, seed=1)


def test_invariance_checker_catches_batch_dependent_rows(pool):
    def eps_by_rows(x, z, w, dy, opts):  # planted fault: eps follows the batch size, as a rows-dependent launch
        return (fwd(x, z, w, OpOptions(eps=1e-2) if x.shape[0] > 1 else opts), *bwd(x, z, w, dy, opts))

    def leaky(x, z, w, dy, opts):
        y, dx, dz, dw = forward_backward(x, z, w, dy, opts)
        if x.shape[0] > 1:  # planted fault: the last row's dx depends on the batch size
            dx[-1].view(torch.int16)[0] ^= 1
        return y, dx, dz, dw

    def float_dweight(x, z, w, dy, opts):  # planted fault: dweight summed in float, in batch order
        y, dx, dz, _ = forward_backward(x, z, w, dy, opts)
        xf, zf, dyf = x.float(), z.float(), dy.float()
        xh = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + opts.eps)
        return y, dx, dz, (dyf * xh * zf * torch.sigmoid(zf)).sum(0)

    faults = [
        (eps_by_rows, (1, 2), "y, batch of 2"),
        (leaky, (1, 2), "dx, batch of 2"),
        (float_dweight, (257,), "dweight"),
    ]
    for launch, sizes, caught in faults:
        with pytest.raises(AssertionError, match=caught):
            check_invariance(pool, sizes, seed=1, launch=launch)


def test_half_dweight_is_the_exact_sum_rounded_once_whatever_the_order_zero_gradient_rows_and_repeats(pool):
    idx = torch.arange(24).repeat(3)
    for wdtype in (BF16, FP16):
        dw = pool.run(idx, w=pool.w32.to(wdtype))[3]
        assert_same(dw, exact_sum(pool.contrib[idx], wdtype), f"dweight {wdtype}")
    x, z, dy, w = pool.x, pool.z, pool.dy, pool.w32.bfloat16()
    ref = bwd(x, z, w, dy)
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(3))
    assert_same(bwd(x[perm], z[perm], w, dy[perm])[2], ref[2], "dweight after permutation")
    # zero-gradient rows: real x, z but dy = 0; and all-zero padding rows
    extra = make_case(40, 128, seed=99)
    zeros = torch.zeros(20, 128, dtype=x.dtype)
    padded = bwd(torch.cat([extra.x[:20], x, zeros]), torch.cat([extra.z[:20], z, zeros]), w,
                 torch.cat([zeros, dy, zeros]))  # fmt: skip
    assert_same(padded[2], ref[2], "dweight with zero-gradient rows")
    assert_same(padded[0][20:44], ref[0], "dx with zero-gradient rows around")
    assert (padded[0][:20] == 0).all() and (padded[0][44:] == 0).all(), "dy = 0 gives dx = 0 (either sign)"
    assert_grads_same(bwd(x, z, w, dy), ref, "repeated")


OPTION_CASES = [  # (d, opts, x dtype, has z, w dtype for the accuracy check)
    (128, OpOptions(norm_before_gate=False), BF16, True, BF16),
    (128, OpOptions(activation="sigmoid"), BF16, True, FP32),
    (128, OpOptions(norm_before_gate=False, activation="sigmoid"), FP16, True, FP16),
    (128, DEFAULT, BF16, False, BF16),
    (256, OpOptions(group_size=64), BF16, True, FP32),
    (200, OpOptions(group_size=40, norm_before_gate=False), BF16, True, FP16),
    (96, OpOptions(group_size=32, norm_before_gate=False), FP32, True, BF16),  # fp32 squares: the sum's order counts
    (160, OpOptions(activation="swish"), FP16, True, FP32),
    (2048, DEFAULT, BF16, True, None),  # wide rows: one tile per program, direct atomics
]


@pytest.mark.parametrize("d,opts,dtype,has_z,wdtype", OPTION_CASES)
def test_invariance_and_accuracy_for_every_option(d, opts, dtype, has_z, wdtype):
    pool = Pool(6 if d <= 256 else 3, d, seed=11, opts=opts, dtype=dtype, has_z=has_z)
    check_invariance(pool, (1, 7, 63) if d <= 256 else (2, 7), seed=5)
    if d <= 256:  # a GPU's decode-sized launches, one row per program, against rows alone in the wide tile
        with plant(fwd={"BLOCK_R": 1}):
            check_invariance(pool, (7, 63), seed=6)
    if wdtype is None:
        return
    c = make_case(33, d, seed=11, dtype=dtype, weight_dtype=wdtype)
    z = c.z if has_z else None
    dx, dz, dw = bwd(c.x, z, c.w, c.dy, opts)
    rx, rz, rw = reference_grads(c.x, z, c.w, c.dy, opts)
    assert dx.dtype == dtype and dw.dtype == wdtype and (dz is None) == (z is None)
    check_accuracy(dx, rx, "dx")
    if z is not None:
        assert dz.dtype == dtype
        check_accuracy(dz, rz, "dz")
    check_accuracy(dw, rw, "dweight")


def reference_grads(x, z, w, dy, opts: OpOptions):
    leaves = [None if t is None else t.double().requires_grad_() for t in (x, z, w)]
    gated_rmsnorm_math(*leaves, opts, torch.float64).backward(dy.double())
    return tuple(None if t is None else t.grad for t in leaves)


def check_accuracy(got: torch.Tensor, ref64: torch.Tensor, what: str) -> None:
    """Against fp64 autograd: half-precision outputs within 1 ulp of the correctly rounded value,
    at least 99.9% equal to it; fp32 outputs within 1e-5 relative (fp32 math)."""
    if got.dtype == torch.float32:
        rel = ((got.double() - ref64).abs().max() / ref64.abs().max()).item()
        assert rel < 1e-5, f"{what}: relative error {rel:.3g}"
        return
    ulp = ulp_distance(got, round_once(ref64, got.dtype))
    assert ulp.max().item() <= 1, f"{what}: max ulp {ulp.max().item()}"
    exact = (ulp == 0).double().mean().item()
    assert exact >= 0.999, f"{what}: correctly rounded on {exact:.5f}"


def test_accuracy_checker_catches_truncation():
    c = make_case(64, 128, seed=11)
    dx, _, _ = bwd(c.x, c.z, c.w, c.dy)
    rx, _, _ = reference_grads(c.x, c.z, c.w, c.dy, DEFAULT)
    truncated = (rx.float().view(torch.int32) & -65536).view(torch.float32).bfloat16()  # toward zero
    check_accuracy(dx, rx, "dx")
    with pytest.raises(AssertionError, match="correctly rounded"):
        check_accuracy(truncated, rx, "planted truncation")


def test_row_strides_padding_and_nan_neighbours_give_the_same_bits(pool):
    # 5 zero rows before the pool's, 3 NaN rows after, each row at a misaligned start in a wider buffer
    n, d = 24, 128
    xb = torch.zeros(n + 8, 3 * d, dtype=BF16)
    zb = torch.zeros(n + 8, 2 * d + 8, dtype=BF16)
    dyb = torch.zeros(2 * n, d, dtype=BF16)
    xb[5 : 5 + n, 3 : 3 + d], xb[5 + n :] = pool.x, float("nan")
    zb[5 : 5 + n, 8 : 8 + d] = pool.z
    dyb[::2] = pool.dy
    x, z, dy = xb[:, 3 : 3 + d], zb[:, 8 : 8 + d], dyb[::2]
    assert x.stride(0) == 3 * d and z.stride(0) == 2 * d + 8 and dy.stride(0) == 2 * d
    assert_same(fwd(x, z, pool.w32)[5 : 5 + n], pool.y, "y strided, padded")
    want = (pool.dx, pool.dz, exact_sum(pool.contrib, FP32))
    assert_grads_same(bwd(x[5 : 5 + n], z[5 : 5 + n], pool.w32, dy), want, "strided")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy NaNs
def test_nan_and_inf_stay_in_their_row(pool):
    x, z, dy = pool.x.clone(), pool.z.clone(), pool.dy.clone()
    x[3, 5] = math.nan
    dy[9, 0] = math.inf
    z[15, 7] = -math.inf
    dx, dz, dw = bwd(x, z, pool.w32, dy)
    clean = [i for i in range(24) if i not in (3, 9, 15)]
    assert_same(dx[clean], pool.dx[clean], "dx of clean rows")
    assert_same(dz[clean], pool.dz[clean], "dz of clean rows")
    assert torch.isnan(dx[3]).all() and not torch.isfinite(dx[9]).all()
    assert torch.isnan(dw).any()


@pytest.mark.parametrize(
    "dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu(reason="cp.async stages take effect on a GPU only"))]
)
def test_launch_choices_and_a_workspace_zeroed_by_the_forward_change_no_bit(dev):
    # tiles per program (taken from the row count), cp.async stages, the register prefetch and cold values inline
    # or deferred only partition the same math: the same bits (rows scaled far apart: cold values exist)
    c = make_case(63, 128, seed=12, device=dev)
    dy = (c.dy.float() * torch.exp2(torch.arange(63, device=dev).float() * 4 - 125)[:, None]).bfloat16()
    args = (c.x, c.z, c.w.float(), dy)
    want = bwd(*args)
    cfgs = [{"TILES": 1}, {"TILES": 31}, {"PREFETCH": 1}, {"COLD_MODE": 0}]
    cfgs += [{"STAGES": 1, "PREFETCH": 1}, {"COLD_MODE": 0, "STAGES": 1}] if dev == "cuda" else []
    for cfg in cfgs:
        assert_grads_same(bwd_under(cfg, *args), want, f"{cfg} vs the default")
    # the forward zeroes the backward's counters in its own launch; the planted fault: a workspace left dirty
    ws = torch.full((workspace_numel(63, 128, None),), 12345, dtype=torch.int64, device=dev)
    assert same(fwd(*args[:3], zero=ws), fwd(*args[:3]))
    assert not ws.any(), "the forward left part of the workspace unzeroed"
    assert_grads_same(bwd(*args, workspace=ws), want, "workspace zeroed by the forward")
    assert not same(bwd(*args, workspace=torch.full_like(ws, 1 << 30))[2], want[2])  # counters of another call
    with pytest.raises(ValueError, match="workspace"):
        bwd(*args, workspace=ws[1:])


@triton.constexpr_function
def _int32_tile_bits(tiles: int) -> tl.dtype:
    return tl.int32


def test_deferred_values_past_31_tiles_are_counted(monkeypatch):
    # past 31 tiles per program the deferred values keep one bit per tile in an int64: cold contributions in
    # tiles 35 and 39 must reach dweight as in one-tile programs
    c = make_case(80, 128, seed=8)
    dy = c.dy.clone()
    dy[70:72] *= 2.0**-100  # tile 35 of program 0 (2-row tiles): far below its hot range, so deferred
    dy[79, 5] *= 2.0**-90  # tile 39
    dy[66, 7] = float("inf")  # tile 33: +-Inf / NaN have their own slots
    args = (c.x, c.z, c.w.float(), dy)
    deferred = {"COLD_MODE": 0}  # the path that keeps tile bits (widths past 256 columns take it)
    want = bwd_under(dict(deferred, TILES=1), *args)
    got = {t: bwd_under(dict(deferred, TILES=t), *args) for t in (31, 32, 63)}
    for t, out in got.items():
        assert_same(out[2], want[2], f"dweight, {t} tiles per program vs 1")
    # planted fault: int32 tile bits at 63 tiles lose the bits of tiles 32 and up
    from rlnorm.kernel import _dweight

    monkeypatch.setattr(_dweight, "tile_bits_dtype", _int32_tile_bits)
    bad = bwd_under(dict(deferred, TILES=63), *args)[2]
    assert not torch.equal(bits(bad), bits(want[2]))


def test_tiles_per_program_on_the_gpu_is_a_capped_power_of_two_growing_with_rows(monkeypatch):
    # TILES is tuning (no bit depends on it): held here is its shape, not the split one GPU measured fastest
    monkeypatch.setattr(rlnorm.kernel._bwd, "_INTERPRET", False)
    rows = (1, 2, 3, 31, 32, 33, 512, 4096, 65536, 262144, 1 << 24)
    for block_r, max_tiles in ((2, 31), (1, 31), (2, 63), (1, 8)):
        got = [tiles_per_program(r, block_r, max_tiles) for r in rows]
        assert all(1 <= t <= max_tiles and (t == max_tiles or t & (t - 1) == 0) for t in got), got
        assert got == sorted(got), got
        assert got[0] == 1 and got[-1] == max_tiles, got


def test_subnormal_inputs_are_read_exactly(monkeypatch):
    # bf16 subnormals in x make dz tiny, often subnormal: a widening or rounding that mishandles them shows
    c = make_case(8, 128, seed=21)
    x = c.x.clone()
    x[:, ::3] = (x[:, ::3].float() * 2.0**-130).bfloat16()
    assert (x[:, ::3].float().abs() < torch.finfo(torch.float32).tiny).any()
    want = round_once(reference_grads(x, c.z, c.w, c.dy, DEFAULT)[1], BF16)
    assert ulp_distance(bwd(x, c.z, c.w, c.dy)[1], want).max() <= 1
    # planted fault: the native casts under the interpreter (subnormal-mangling widen, truncation)
    monkeypatch.setattr(rlnorm.kernel._bwd, "_INTERPRET", False)
    assert ulp_distance(bwd(x, c.z, c.w, c.dy)[1], want).max() > 1


@pytest.mark.parametrize("cold_mode", [0, 1])
def test_dweight_exact_when_rows_span_the_exponent_range(cold_mode):
    # rows scaled by 2**-100 .. 2**60: contributions far outside any program's hot range take the cold path
    n = 10
    c = make_case(n, 128, seed=31, weight_dtype=torch.float32)
    scale = torch.exp2(torch.randint(-100, 61, (n, 1), generator=torch.Generator().manual_seed(5)).float())
    dy = (c.dy.float() * scale).bfloat16()
    cfg = {"COLD_MODE": cold_mode, "BLOCK_R": 2, "TILES": 4}  # two programs
    want = bwd_under(cfg, c.x, c.z, c.w, dy)
    singles = [bwd_under(cfg, c.x[i : i + 1], c.z[i : i + 1], c.w, dy[i : i + 1]) for i in range(n)]
    contrib = torch.stack([s[2] for s in singles])
    assert_same(want[2], exact_sum(contrib, torch.float32), f"dweight, cold mode {cold_mode}")
    assert_same(want[0], torch.cat([s[0] for s in singles]), "dx")
    # the contributions the kernel hands out for checks are the single rows' dweights
    handed = torch.empty(n, 128, dtype=torch.float32)
    assert_grads_same(bwd_under(cfg, c.x, c.z, c.w, dy, contributions=handed), want, "with contributions=")
    assert_same(handed, contrib, "contributions=")
