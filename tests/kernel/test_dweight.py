"""The exact dweight accumulator (rlnorm/kernel/_dweight.py), driven with crafted fp32 values so the hard cases
are reached on purpose, against `fractions.Fraction` with its own rounding (cross-checked with `exact_sum`)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from kernel_helpers import assert_same

from rlnorm.kernel import _dweight
from rlnorm.kernel._dweight import (
    MAX_TILE_ROWS,
    MAX_TILES,
    MAX_TILES_DEFERRED,
    column_counters,
    exact_column_sum,
    finalize,
)
from rlnorm.numerics import exact_sum

# (precision with the implicit bit, smallest normal exponent, largest exponent)
_FMT = {torch.float32: (24, -126, 127), torch.bfloat16: (8, -126, 127), torch.float16: (11, -14, 15)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# cold values (outside a program's hot range) deferred to the scratch (0) or added inline (1)
CUTS = [dict(block_rows=16, tiles=1), dict(block_rows=4, tiles=3), dict(block_rows=4, tiles=3, cold_mode=1)]


def round_fraction(f: Fraction, dtype: torch.dtype) -> float:
    """Round an exact rational to `dtype` once, to nearest, ties to even (Python's round())."""
    if f == 0:
        return 0.0
    p, emin, emax = _FMT[dtype]
    mag = abs(f)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()  # floor(log2 mag) or one above
    if Fraction(2) ** e > mag:
        e -= 1
    quantum = Fraction(2) ** (max(e, emin) - (p - 1))
    n = round(mag / quantum)  # Fraction.__round__ rounds half to even
    value = n * quantum
    if value >= Fraction(2) ** (emax + 1):
        return math.copysign(math.inf, f)
    return math.copysign(float(value), f)


def oracle(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    cols = values.double().t().tolist()
    return torch.tensor([round_fraction(sum(map(Fraction, c), Fraction(0)), dtype) for c in cols]).to(dtype)


def check_exact(values: torch.Tensor, **cut) -> None:
    """The counters of `values` under this cut of the work, finalized to every dtype: the oracle's bits."""
    counters = column_counters(values, **cut)
    for dtype in DTYPES:
        assert_same(finalize(counters, dtype), oracle(values, dtype), f"{dtype}, {cut}")


def check_exact_sum(values: torch.Tensor) -> None:
    """The other yardstick, `rlnorm.numerics.exact_sum`, gives the oracle's bits too."""
    for dtype in DTYPES:
        assert_same(exact_sum(values, dtype), oracle(values, dtype), f"exact_sum, {dtype}")


def wide_values(rows: int, cols: int, seed: int, lo: int = -149, hi: int = 126) -> torch.Tensor:
    """fp32 values whose exponents are spread over [lo, hi] (subnormals included when lo < -126)."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(rows, cols, generator=g, dtype=torch.float64) + 1.0
    sign = torch.randint(0, 2, (rows, cols), generator=g) * 2 - 1
    exp = torch.randint(lo, hi + 1, (rows, cols), generator=g)
    return (sign * mant * torch.exp2(exp.double())).float()


def test_wide_exponent_range_is_exact():
    v = wide_values(45, 24, seed=1)
    check_exact_sum(v)
    for cut in CUTS:
        check_exact(v, **cut)


def test_subnormal_values_and_results():
    g = torch.Generator().manual_seed(2)
    bits = torch.randint(1, 0x800000, (33, 20), generator=g, dtype=torch.int32)  # every fp32 subnormal
    bits = torch.where(torch.rand(33, 20, generator=g) < 0.5, bits, bits | -(2**31))  # either sign
    v = bits.view(torch.float32)
    v[:, :4] = v[:, :4].abs()  # columns whose sum leaves the subnormal range
    v[:, 4] = 0.0
    v[0, 4] = torch.tensor(1, dtype=torch.int32).view(torch.float32)  # exactly the smallest subnormal
    v[:, 5] = torch.tensor([1e-39, -1e-39] * 16 + [2e-40], dtype=torch.float32)  # bf16-subnormal result
    assert (v.abs() < torch.finfo(torch.float32).tiny).all()
    check_exact(v)
    check_exact_sum(v)


def test_heavy_cancellation_is_exact_and_defeats_float_sums():
    g = torch.Generator().manual_seed(3)
    big = wide_values(30, 16, seed=4, lo=60, hi=100)
    small = wide_values(1, 16, seed=5, lo=-140, hi=-100)
    v = torch.cat([big, small, -big])[torch.randperm(61, generator=g)]  # the big ones cancel exactly
    assert_same(oracle(v, torch.float32), small[0])
    check_exact(v)
    check_exact_sum(v)
    # planted fault: a float sum in the same data loses the residual, so this data can catch one
    assert not torch.equal(v.sum(0), small[0])


def test_overflow_only_when_the_exact_sum_overflows():
    fmax = torch.finfo(torch.float32).max
    v = torch.tensor([[fmax, fmax, fmax], [fmax, fmax, -fmax], [0.0, -fmax, 0.0]], dtype=torch.float32)
    # column 0: 2*max -> inf; column 1: max + max - max == max (an fp32 running sum is inf); column 2: 0
    assert exact_column_sum(v, torch.float32).tolist() == [math.inf, fmax, 0.0]
    bmax = float(torch.finfo(torch.bfloat16).max)
    half_ulp = 2.0 ** (127 - 8)
    w = torch.tensor([[bmax, bmax, 65504.0, 65504.0], [half_ulp, half_ulp / 2, 16.0, 15.0]], dtype=torch.float32)
    assert exact_column_sum(w, torch.bfloat16)[:2].tolist() == [math.inf, bmax]
    assert exact_column_sum(w, torch.float16)[2:].tolist() == [math.inf, 65504.0]
    check_exact(w)
    check_exact_sum(v)
    check_exact_sum(w)


def test_nan_and_inf_give_the_ieee_answer_and_stay_in_their_column():
    v = wide_values(9, 6, seed=6)
    v[3, 0] = math.nan
    v[2, 1] = math.inf
    v[2, 2], v[5, 2] = math.inf, -math.inf
    v[7, 3] = -math.inf
    got = exact_column_sum(v, torch.float32)
    assert math.isnan(got[0]) and got[1] == math.inf and math.isnan(got[2]) and got[3] == -math.inf
    assert_same(got[4:], oracle(v[:, 4:], torch.float32))


def test_order_padding_cut_and_counter_copies_never_change_the_bits():
    v = wide_values(70, 13, seed=7, lo=-30, hi=10)
    g = torch.Generator().manual_seed(8)
    padded = torch.cat([v, torch.zeros(11, 13), -torch.zeros(5, 13)])[torch.randperm(86, generator=g)]
    for cut in [*CUTS, dict(block_rows=MAX_TILE_ROWS, tiles=1), dict(block_rows=1, tiles=2)]:
        check_exact(padded, **cut)
    for stripes in (1, 2, 8):
        check_exact(v, block_rows=2, tiles=2, stripes=stripes)
    assert_same(exact_column_sum(v), exact_column_sum(v))  # repeatable


def test_many_rows_of_maximal_magnitude_stay_exact():
    # 600 values from the top window, alternating sign, plus a residual: exercises carries
    # between limbs and the int64 headroom of tile sums with 256-row tiles
    n = 600
    big = torch.full((n, 3), 2.0**127 * (2 - 2.0**-23))
    big[1::2] *= -1
    big[:, 1] = 2.0**126  # one column grows past fp32 max before nothing cancels it
    v = torch.cat([big, torch.tensor([[2.0**-149, 1.0, -3.0]])])
    for cut in [dict(block_rows=256, tiles=1), dict(block_rows=256, tiles=2)]:
        got = exact_column_sum(v, torch.float32, **cut)
        assert got.tolist() == [2.0**-149, math.inf, -3.0]


def test_the_hot_register_and_the_top_window_stay_exact_at_the_most_tiles(monkeypatch):
    # one row per tile: the first sets the hot range (that of 1.0), each later one is the largest it still holds
    # (the top of its 3-shift headroom, all mantissa bits set): the int64 register is filled to its bound
    tiles = MAX_TILES_DEFERRED
    v = torch.full((tiles, 1), 16.0 * (1 - 2.0**-24))
    v[0, 0] = 1.0
    check_exact(v, block_rows=1, tiles=tiles)
    check_exact(v, block_rows=1, tiles=tiles, cold_mode=1)
    # at MAX_TILES the hot range's start is at most 223, so a flush's three limbs stay in windows 6..7
    for value in (-(2.0**127), 2.0**127, -torch.finfo(torch.float32).max):
        top = torch.tensor([[value], [1.0], [-3.0]])
        assert exact_sum(top).item() == value  # the small values vanish in the rounding: the sum is the top value
        check_exact(top, tiles=MAX_TILES, cold_mode=1, block_rows=1)
        check_exact(top, tiles=MAX_TILES_DEFERRED, cold_mode=0, block_rows=1)
    # planted fault: a hot range 2 shifts wider than the bound allows overflows the register
    w = _dweight.hot_width(tiles)
    monkeypatch.setattr(_dweight, "hot_width", lambda t: w + 2)
    assert not torch.equal(exact_column_sum(v, block_rows=1, tiles=tiles), oracle(v, torch.float32))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # v * scale of a cold value, discarded
def test_scaled_hot_range_edges():
    # values exactly at lo (hot), just below lo (cold), at hi (cold), subnormals, a first tile of
    # subnormals (start clamped to its minimum) followed by large values
    one = 1.0
    lo_edge = 2.0 ** (126 + 3 + 1 - _dweight.hot_width(2) - 126)  # smallest hot value for a first tile at 1.0
    cols = [
        [one, lo_edge],
        [one, lo_edge * (1 - 2.0**-24)],
        [one, 16.0],
        [one, -(2.0**-149)],
        [2.0**-149, 2.0**-140],
        [2.0**-149, 3.0e38],
        [0.0, 1.0],
        [-0.0, -(2.0**-126)],
    ]
    v = torch.tensor(cols, dtype=torch.float32).t().contiguous()  # [2 rows = 2 tiles, columns]
    # the hot range is the program's (all columns); alone, the subnormal columns set a clamped one
    for case in (v, v[:, 4:6].contiguous()):
        for cold_mode in (0, 1):
            check_exact(case, block_rows=1, tiles=2, cold_mode=cold_mode)


def test_zero_rows_and_signed_zeros_give_positive_zero():
    assert_same(exact_column_sum(torch.zeros(0, 5), torch.bfloat16), torch.zeros(5, dtype=torch.bfloat16))
    assert_same(exact_column_sum(-torch.zeros(4, 3), torch.float32), torch.zeros(3))
    assert exact_column_sum(torch.zeros(3, 0), torch.float32).shape == (0,)


@pytest.mark.parametrize(
    ("values", "kw", "exc", "match"),
    [
        (torch.zeros(2, 2, dtype=torch.float64), {}, TypeError, "values"),
        (torch.zeros(4), {}, ValueError, "values"),
        (torch.zeros(2, 2), {"dtype": torch.int32}, TypeError, "dtype"),
        (torch.zeros(2, 2), {"block_rows": 512}, ValueError, "block_rows"),
        (torch.zeros(2, 2), {"stripes": 16}, ValueError, "stripes"),
        (torch.ones(1, 1), {"tiles": 65, "cold_mode": 1}, ValueError, r"tiles: expected 1\.\.64 .*NaN / Inf slots"),
        (torch.ones(1, 1), {"tiles": 64, "cold_mode": 0}, ValueError, r"tiles: expected 1\.\.63 with COLD_MODE 0"),
        (torch.ones(1, 1), {"tiles": 0}, ValueError, "tiles: expected"),
        (torch.ones(1, 1), {"tiles": 2, "cold_mode": 2}, ValueError, "cold_mode: expected 0 or 1"),
    ],
)
def test_bad_input_is_named(values, kw, exc, match):
    assert (MAX_TILES, MAX_TILES_DEFERRED) == (64, 63)
    with pytest.raises(exc, match=match):
        exact_column_sum(values, **kw)


def test_hot_windows_chosen_from_a_misleading_first_tile():
    # the first tile holds tiny values, later tiles huge ones (and the reverse): whichever
    # windows a program keeps in registers, every value must be counted exactly
    tiny = wide_values(8, 10, seed=9, lo=-140, hi=-120)
    huge = wide_values(24, 10, seed=10, lo=90, hi=126)
    cuts = [dict(block_rows=8, tiles=4), dict(block_rows=2, tiles=16), dict(block_rows=2, tiles=16, cold_mode=1)]
    for v in (torch.cat([tiny, huge]), torch.cat([huge, tiny])):
        for cut in cuts:
            check_exact(v, **cut)


def _tie_columns() -> torch.Tensor:
    """Columns built so the rounding decision rests on bits far below the top digit: a value on an
    output-format tie plus a tiny term (sticky), the same minus it, tiny totals, both signs."""
    tiny = 2.0**-149
    cols = [
        [1.0, 2.0**-8, tiny],  # bf16 tie + sticky 277 bits below: rounds up
        [1.0, 2.0**-8, -tiny],  # just below the bf16 tie: rounds down
        [1.0, 2.0**-11, tiny],  # fp16 tie + sticky
        [1.0, 2.0**-24, tiny],  # fp32 tie + sticky
        [1.0, 2.0**-24, -tiny],
        [-1.0, -(2.0**-8), -tiny],  # negative total
        [tiny, tiny, tiny],  # total in the lowest digit only
        [2.0**-100, 2.0**-130, -(2.0**-140)],
        [2.0**100, 2.0**60, 2.0**20],  # digits far apart, no tie
        [3.0 * 2.0**-127, -(2.0**-149), 2.0**-149],  # subnormal-range totals
        [1.0, 2.0**-8, 0.0],  # a bf16 tie: even stays
        [1.0, 3 * 2.0**-8, 0.0],  # a bf16 tie: odd rounds up
        [2.0**-24, 2.0**-25, 0.0],  # an fp16 subnormal tie
    ]
    cols += [[-v for v in c] for c in cols]  # the mirror images: negative totals read their digits as ~D + 1
    return torch.tensor(cols, dtype=torch.float64).t().float().contiguous()


def test_rounding_reads_sticky_bits_and_the_finalize_cut_into_programs_changes_no_bit():
    # the finalize keeps only the two top digits of the total and an "any bit below" flag: a tie decided by a
    # term 2**-149 must still round the way the exact sum says, however the finalize is cut into programs
    ties = _tie_columns()
    ties = torch.cat([ties, torch.zeros(40 - ties.shape[0], ties.shape[1])])  # zero rows add nothing
    v = torch.cat([wide_values(40, 9, seed=13, lo=-140, hi=100), ties], dim=1)
    counters = column_counters(v, block_rows=2, tiles=2, stripes=2)
    for dtype in DTYPES:
        want = oracle(v, dtype)
        for block in [(1, 1), (4, 1), (32, 1), (64, 2)]:  # (64, 2): the CPU default's one program
            assert_same(finalize(counters, dtype, _block=block), want, f"{dtype}, {block}")


def test_programmatic_dependent_launch_never_off_the_gpu():
    # the finalize's early launch needs Hopper's griddepcontrol; CPU tensors (the interpreter) never ask for it
    assert not _dweight.pdl_for(torch.zeros(1))
