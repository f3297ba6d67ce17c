"""Exact, order-independent column sums of fp32 values: the dweight accumulator.

Why integers: a float sum depends on the order of its adds, so a parallel dweight made of float
atomics or per-program partials changes with the batch's size, order and padding. Here every fp32
value is an exact integer count of 2**-149 (the smallest subnormal), and integer adds are
associative: programs may add their partials in any order and the total is the same exact number.
One finalize step rounds that number once to the weight's dtype.

Fixed-point form. A finite fp32 value is m * 2**(s - 149) with an integer |m| < 2**24 and a shift s
in 0..253 (the exponent field minus one; subnormals share s = 0). The shifts are cut into
NUM_WINDOWS windows of 32: window k holds the values with s >> 5 == k as the int64 count
m << (s & 31) (|.| < 2**55) of 2**(32k - 149).

Accumulation, per program of TILES tiles of BLOCK_R rows. From its first tile a program picks a hot
range of W shifts (`hot_range`); a hot value v is a multiple of its ulp 2**(start - 149), so
n = v * 2**(149 - start) is an exact integer, added into one per-thread int64 register per element
slot (W = 40 - ceil(log2(TILES)) keeps the register below 2**63): no communication between threads
per tile. A value outside the range ("cold": NaN/Inf, or far from the first tile's largest) is added
inline after a tile-wide "any cold?" test (COLD_MODE 1), or kept aside in a scratch copy with one bit
per tile and added after the loop (COLD_MODE 0, `add_deferred`). At the end each register is cut on the
counters' 2**32 grid into limbs, summed over the program's rows and added with int64 atomics (`flush`).
Per window the low part has weight 2**(32k) and the high part 2**(32(k+1)), so the counters are the
limbs of one base-2**32 number. Which range is hot and which mode adds the cold values only change the
speed: every value is counted exactly either way.

Counters: int64 [stripes, NUM_SLOTS, D] (1..STRIPES copies, by the number of programs: `stripes_for`);
slot 2k is window k's low part, slot 2k+1 its high part, then three slots count NaN, +Inf and -Inf
(those have no integer form; they give the IEEE answer). A program adds into copy pid % stripes, which
only spreads same-address atomics; the finalize adds the copies (exactly), normalises per column and
rounds once.

Bounds: a register slot gains < 2**(23 + W) per tile, so it stays below 2**63; every limb piece is below
2**33, so the counters stay exact for fewer than MAX_ROWS = 2**27 rows. A program's three flushed limbs
k..k+2 (k = start >> 5) must stay below the NaN / Inf slots: k <= 6, which holds for start <= 223, i.e.
W >= 34, i.e. at most MAX_TILES = 64 tiles per program.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from rlnorm.kernel._interpreter import INTERPRETED
from rlnorm.kernel._rounding import exact_cast

NUM_WINDOWS = 8  # 8 windows x 32 shifts cover every finite fp32 exponent (s = 0..253)
NUM_SLOTS = 2 * NUM_WINDOWS + 3  # (low, high) per window, then NaN, +Inf, -Inf counts
NUM_LIMBS = NUM_WINDOWS + 2  # base-2**32 limbs of the total: windows' low parts, last high part, headroom
STRIPES = 8  # most copies of the counters, chosen by pid: spreads atomic contention, never changes the sum
PROGRAMS_PER_STRIPE = 64  # fewer programs share fewer copies: the finalize reads every copy of every slot
MAX_TILE_ROWS = 256  # a flush sums BLOCK_R low parts < 2**32: far inside int64
# Most tiles per program. More would keep the registers exact (W = hot_width(tiles) shrinks with them) but
# narrow the hot range so far that a first tile near fp32's top (|v| >= 2**127 at 65 tiles) starts it at
# shift 224 (k = 7): the flush's third limb, k + 2 = 9, goes to slot 2k + 3 = 17, the +Inf count.
MAX_TILES = 64  # W = hot_width(64) = 34: start <= 253 + 4 - 34 = 223, so k = start >> 5 <= 6
INT32_TILE_BITS = 31  # tiles whose deferred-value bits fit an int32 per slot (fewer registers than int64)
MAX_TILES_DEFERRED = 63  # deferred cold values: one bit per tile, in an int64 per slot past INT32_TILE_BITS
MAX_ROWS = 2**27  # counters: every slot < 3 * rows * 2**33 = 1.5 * 2**62, a limb (two slots) < 2**63
# hot range [start, start + W) with start >= 22, so the scale 2**(149 - start) is an fp32
SCALED_START_MIN: tl.constexpr = tl.constexpr(22)
SCALED_HEADROOM: tl.constexpr = tl.constexpr(3)  # shifts above the first tile's largest that stay hot


@triton.constexpr_function
def tile_bits_dtype(tiles: int) -> tl.dtype:
    """dtype of the deferred path's per-slot tile bits: int32 up to 31 tiles (fewer registers), else int64."""
    return tl.int32 if tiles <= INT32_TILE_BITS else tl.int64


def hot_width(tiles: int) -> int:
    """Shifts W of the hot range for a program of `tiles` tiles.

    A hot value counts n = v * 2**(149 - start) units with |n| < 2**(23 + W); a register slot adds
    one per tile, so tiles * 2**(23 + W) <= 2**63 keeps it exact: W = 40 - ceil(log2(tiles)).
    """
    return 40 - (tiles - 1).bit_length()


# (precision bits with the implicit one, smallest normal exponent + 149, largest exponent)
_FORMATS = {
    torch.float32: (24, -126 + 149, 127),
    torch.bfloat16: (8, -126 + 149, 127),
    torch.float16: (11, -14 + 149, 15),
}


@triton.jit
def split_fp32(v):
    """fp32 tile -> (signed mantissa m as int32, shift s, non-finite mask): v == m * 2**(s - 149) exactly.

    |m| < 2**24 and 0 <= s <= 253; NaN/Inf give m = 0 (they are counted in their own slots).
    """
    bits = v.to(tl.int32, bitcast=True)
    exp_field = (bits >> 23) & 0xFF
    nonfinite = exp_field == 255
    mant = (bits & 0x7FFFFF) | tl.where(exp_field > 0, 0x800000, 0)  # implicit one of normals
    shift = tl.maximum(exp_field, 1) - 1  # subnormals have the scale of exponent field 1
    mant = tl.where(bits < 0, -mant, mant)
    mant = tl.where(nonfinite, 0, mant)
    return mant, shift, nonfinite


@triton.jit
def _tile_max(t):
    """Largest element of an int32 tile: one reduction over a flat view (element order is free)."""
    return tl.max(tl.reshape(t, [t.numel], can_reorder=True), axis=0)


@triton.jit
def _pow2_fp32(e):
    """2**e as fp32 for an int32 e in -126..128, built from its bits (e = 128 gives +Inf)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def hot_range(v, HOT_WIDTH: tl.constexpr):
    """A program's hot range from its first tile `v` (fp32): (start, lo, hi, scale).

    Shifts [start, start + HOT_WIDTH), the top SCALED_HEADROOM shifts above the tile's largest value;
    a value v is hot iff lo <= |v| < hi (lo = 2**(start - 126), the smallest value of shift start;
    hi = 2**(start - 126 + W), +Inf past fp32's range). A hot value is a multiple of 2**(start - 149)
    (its ulp), so n = v * scale (scale = 2**(149 - start), exact: a power of two, no overflow) is an
    integer with |n| < 2**(23 + W), converted to int64 exactly. Only a speed choice: every value is
    counted exactly whichever range is hot.
    """
    bits = v.to(tl.int32, bitcast=True)
    exp_field = (bits >> 23) & 0xFF
    counted = (exp_field != 255) & ((bits & 0x7FFFFFFF) != 0)  # finite, non-zero
    top = _tile_max(tl.where(counted, tl.maximum(exp_field, 1) - 1, -1))
    top = tl.where(top < 0, 128, top)  # an all-zero tile: values near 1 hot
    start = tl.minimum(tl.maximum(top + SCALED_HEADROOM + 1 - HOT_WIDTH, SCALED_START_MIN), 253)
    lo = _pow2_fp32(start - 126)
    hi = _pow2_fp32(tl.minimum(start - 126 + HOT_WIDTH, 128))
    scale = _pow2_fp32(149 - start)
    return start, lo, hi, scale


@triton.jit
def _add_cold(v, count, win, nonfinite, cnt_ptr, col, col_mask, d, NUM_WIN: tl.constexpr):
    """Rare path: add a tile's cold counts (zero elsewhere) window by window, and count NaN/Inf.

    Column sums over the tile's rows first (exact: < BLOCK_R * 2**55), so the atomics and the
    registers they need are per column, not per element.
    """
    nonzero = count != 0
    k_first = -_tile_max(tl.where(nonzero, -win, -NUM_WIN))
    k_last = _tile_max(tl.where(nonzero, win, -1))
    # Masks are the column mask alone (adding a zero count is harmless): a `& (lo != 0)` mask here
    # broke Triton 3.6's layout pass for sm_90 ("operand does not dominate this use").
    # in the interpreter (`_interpreter.py`) every window is walked, those outside [k_first, k_last] adding zeros
    for k in range(0 if INTERPRETED else k_first, NUM_WIN if INTERPRETED else k_last + 1):
        part = tl.sum(tl.where(win == k, count, 0), axis=0, keep_dims=True)  # [1, BLOCK_G, BLOCK_C]
        hi = part >> 32  # arithmetic shift: 0 <= lo < 2**32, so the counters' bounds hold
        lo = part - (hi << 32)
        # integer atomics are associative: their order cannot change the counters' final values
        tl.atomic_add(cnt_ptr + (2 * k) * d + col, lo, mask=col_mask, sem="relaxed")
        tl.atomic_add(cnt_ptr + (2 * k + 1) * d + col, hi, mask=col_mask, sem="relaxed")
    n_nan = tl.sum((nonfinite & (v != v)).to(tl.int64), axis=0, keep_dims=True)  # [1, BLOCK_G, BLOCK_C]
    n_pos = tl.sum((nonfinite & (v > 0)).to(tl.int64), axis=0, keep_dims=True)
    n_neg = tl.sum((nonfinite & (v < 0)).to(tl.int64), axis=0, keep_dims=True)
    tl.atomic_add(cnt_ptr + (2 * NUM_WIN) * d + col, n_nan, mask=col_mask, sem="relaxed")
    tl.atomic_add(cnt_ptr + (2 * NUM_WIN + 1) * d + col, n_pos, mask=col_mask, sem="relaxed")
    tl.atomic_add(cnt_ptr + (2 * NUM_WIN + 2) * d + col, n_neg, mask=col_mask, sem="relaxed")


@triton.jit
def accumulate(
    v,
    acc,
    cold_bits,
    t,
    lo,
    hi,
    scale,
    scratch,
    cnt_ptr,
    col,
    col_mask,
    d,
    NUM_WIN: tl.constexpr,
    COLD_MODE: tl.constexpr,
):
    """Add tile t's [BLOCK_R, BLOCK_G, BLOCK_C] fp32 values exactly: the hot range's into the per-thread
    int64 registers `acc` (no communication), the rest ("cold": rare) by COLD_MODE.

    Hot: acc += int64(v * scale) where lo <= |v| < hi (see `hot_range`): two float compares, a
    multiply, a select and one exact conversion per value.
    COLD_MODE 0 (deferred): the value is stored to its place in `scratch` (pointers of this tile) and
      bit t of its slot in `cold_bits` is set; `add_deferred` adds them after the tile loop, so the
      rare path's code and registers stay out of the loop.
    COLD_MODE 1 (inline): one tile-wide "any cold?" max, then a window loop over the cold values.
    Both count every value exactly; they differ only in speed.
    """
    av = tl.abs(v)
    hot = (av >= lo) & (av < hi)  # False for NaN and +-Inf
    # v * scale is exact (power of two) and an integer below 2**(23 + W): the cast is exact
    acc += tl.where(hot, v * scale, 0.0).to(tl.int64)
    cold = (~hot) & (v != 0)  # NaN != 0 is True: NaN is cold
    if COLD_MODE == 0:
        tl.store(scratch, v, mask=cold)
        one = tl.full([], 1, cold_bits.dtype)  # int32, or int64 past 31 tiles
        cold_bits = tl.where(cold, cold_bits | (one << (one * 0 + t)), cold_bits)  # t: int32 tensor or int
    else:
        # the tile's only cross-thread step: is there any cold value at all?
        if _tile_max(cold.to(tl.int32)) > 0:
            c_mant, c_shift, c_nonfinite = split_fp32(tl.where(cold, v, 0.0))
            count = c_mant.to(tl.int64) << (c_shift & 31).to(tl.int64)  # < 2**55
            _add_cold(v, count, c_shift >> 5, c_nonfinite & cold, cnt_ptr, col, col_mask, d, NUM_WIN)
    return acc, cold_bits


@triton.jit
def add_deferred(
    scratch_rows, stride_rows, cold_bits, cnt_ptr, col, col_mask, d, NUM_WIN: tl.constexpr, TILES: tl.constexpr
):
    """After the tile loop (COLD_MODE 0): add the cold values kept in the scratch copy, exactly.

    `scratch_rows` [BR, 1, 1] points at tile 0's rows; tile t is stride_rows further. Bit t of a
    slot's `cold_bits` says its value in tile t was stored; nothing else of the scratch is read.
    """
    if _tile_max(cold_bits) != 0:  # one cross-thread step per program; rare data only goes on
        for t in range(TILES):
            sel = ((cold_bits >> t) & 1) != 0
            if _tile_max(sel.to(tl.int32)) > 0:
                v = tl.load(scratch_rows + t * stride_rows + col, mask=sel, other=0.0)
                mant, shift, nonfinite = split_fp32(v)
                count = mant.to(tl.int64) << (shift & 31).to(tl.int64)  # < 2**55 (0 where not stored)
                _add_cold(v, count, shift >> 5, nonfinite, cnt_ptr, col, col_mask, d, NUM_WIN)


@triton.jit
def _digits(acc, o):
    """acc * 2**o (o < 32) as three pieces of weights 1, 2**32, 2**64: two in [0, 2**32), one signed."""
    hi = acc >> 32
    lo = acc - (hi << 32)  # [0, 2**32)
    lo_sh = lo << o  # < 2**63
    hi_sh = hi << o  # |.| < 2**62
    p2 = hi_sh >> 32
    p1 = lo_sh >> 32
    p0 = lo_sh - (p1 << 32)  # [0, 2**32)
    p1 += hi_sh - (p2 << 32)  # < 2**31 + 2**32
    return p0, p1, p2


@triton.jit
def flush(acc, start, cnt_ptr, col, col_mask, d):
    """Add a program's hot registers [BLOCK_R, BLOCK_G, BLOCK_C] to its stripe of the counters, exactly.

    acc * 2**(start - 149) is cut on the counters' 2**32 grid (k = start >> 5, o = start & 31) into
    limbs k..k+2, each piece below 2**33 in magnitude, summed over the program's rows (exact) and added
    (any order: integer adds). The atomics go out one column per lane, consecutive lanes on consecutive
    columns, which halves the 32-byte sectors a warp's adds touch (the L2's atomic work is what costs:
    docs/kernel.md §7, per-element atomics); `col ^ (d >> 30)` (d < 2**30: the same columns) hides the
    columns' contiguity from Triton's layout choice.
    """
    k = start >> 5
    o = (start & 31).to(tl.int64)
    col = col ^ (d >> 30)
    a0, a1, a2 = _digits(acc, o)
    l0 = tl.sum(a0, axis=0, keep_dims=True)  # [1, BLOCK_G, BLOCK_C]
    l1 = tl.sum(a1, axis=0, keep_dims=True)
    l2 = tl.sum(a2, axis=0, keep_dims=True)
    # limb k is window k's low slot; limb k+i (i >= 1) is the high slot of window k+i-1
    tl.atomic_add(cnt_ptr + (2 * k) * d + col, l0, mask=col_mask & (l0 != 0), sem="relaxed")
    tl.atomic_add(cnt_ptr + (2 * k + 1) * d + col, l1, mask=col_mask & (l1 != 0), sem="relaxed")
    tl.atomic_add(cnt_ptr + (2 * k + 3) * d + col, l2, mask=col_mask & (l2 != 0), sem="relaxed")


@triton.jit
def _column_sum_kernel(
    V,
    SCR,
    CNT,
    n_rows,
    d,
    stride_v,
    NUM_WIN: tl.constexpr,
    NUM_SLOTS: tl.constexpr,
    STRIPES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    TILES: tl.constexpr,
    COLD_MODE: tl.constexpr,
    HOT_WIDTH: tl.constexpr,
):
    """Accumulate raw fp32 values [n_rows, d] into the counters: the same path the backward uses."""
    pid = tl.program_id(0)
    pid_c = tl.program_id(1)
    cnt_ptr = CNT + (pid % STRIPES) * NUM_SLOTS * d  # stripe: spreads atomics only
    offs_r = tl.arange(0, BLOCK_R)
    col = (pid_c * BLOCK_C + tl.arange(0, BLOCK_C))[None, None, :]  # [1, 1, BC]: one group of the full width
    col_mask = col < d
    acc = tl.zeros([BLOCK_R, 1, BLOCK_C], tl.int64)
    cold_bits = tl.zeros([BLOCK_R, 1, BLOCK_C], tile_bits_dtype(TILES))
    start = pid * 0
    lo = start.to(tl.float32)
    hi = lo
    scale = lo
    row0 = pid.to(tl.int64) * (TILES * BLOCK_R) + offs_r  # [BR] int64 row offsets of tile 0
    for t in range(TILES):
        rows = row0 + t * BLOCK_R
        mask = (rows < n_rows)[:, None, None] & col_mask
        v = tl.load(V + rows[:, None, None] * stride_v + col, mask=mask, other=0.0)  # [BR, 1, BC]
        if t == 0:
            start, lo, hi, scale = hot_range(v, HOT_WIDTH)
        acc, cold_bits = accumulate(
            v,
            acc,
            cold_bits,
            t,
            lo,
            hi,
            scale,
            SCR + rows[:, None, None] * d + col,
            cnt_ptr,
            col,
            col_mask,
            d,
            NUM_WIN,
            COLD_MODE,
        )
    flush(acc, start, cnt_ptr, col, col_mask, d)
    if COLD_MODE == 0:
        add_deferred(SCR + row0[:, None, None] * d, BLOCK_R * d, cold_bits, cnt_ptr, col, col_mask, d, NUM_WIN, TILES)


@triton.jit
def _limb(CNT, i: tl.constexpr, cols, cmask, d, NUM_WIN: tl.constexpr, NUM_SLOTS: tl.constexpr, STRIPES: tl.constexpr):
    """Limb i of the total (weight 2**(32 i)): window i's low part plus window i-1's high part, all
    stripes added (int64 adds: exact, any order). Loaded per column as a [BLOCK] vector, so the
    finalize never reduces across lanes (a long chain of cross-warp sums is slow)."""
    v = tl.zeros(cols.shape, tl.int64)
    for s in tl.static_range(STRIPES):
        if i < NUM_WIN:
            v += tl.load(CNT + (s * NUM_SLOTS + 2 * i) * d + cols, mask=cmask, other=0)
        if i >= 1 and i <= NUM_WIN:
            v += tl.load(CNT + (s * NUM_SLOTS + 2 * i - 1) * d + cols, mask=cmask, other=0)
    return v


@triton.jit
def _slot_total(CNT, slot: tl.constexpr, cols, cmask, d, NUM_SLOTS: tl.constexpr, STRIPES: tl.constexpr):
    """One slot's count over the stripes, per column."""
    v = tl.zeros(cols.shape, tl.int64)
    for s in tl.static_range(STRIPES):
        v += tl.load(CNT + (s * NUM_SLOTS + slot) * d + cols, mask=cmask, other=0)
    return v


@triton.jit
def _track_digit(i: tl.constexpr, digit, top, top_digit, second, low_nz, prev, below2):
    """Digit i (from the lowest) of a magnitude: keep the top nonzero digit, the one below it, and
    whether any digit further down is nonzero (all the rounding needs, see the finalize)."""
    nz = digit != 0
    top = tl.where(nz, i, top)
    top_digit = tl.where(nz, digit, top_digit)
    second = tl.where(nz, prev, second)
    low_nz = tl.where(nz, below2, low_nz)
    below2 = below2 | (prev != 0)
    return top, top_digit, second, low_nz, digit, below2


@triton.jit
def _dweight_finalize_kernel(
    CNT,
    OUT,
    d,
    NUM_WIN: tl.constexpr,
    NUM_SLOTS: tl.constexpr,
    NUM_LIMBS: tl.constexpr,
    STRIPES: tl.constexpr,
    PREC: tl.constexpr,
    EMIN_U: tl.constexpr,
    EMAX: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent of the kernel that filled the counters
):
    """Per column: add the stripes, normalise the limbs (exact), round ONCE to OUT's dtype.

    Every step is per column (one lane each), in ONE pass over the limbs: a second pass, whose carry
    chain had to wait for the first one's sign, made the dependent chain twice as long."""
    if PDL:  # before any access: waits until the previous kernel has finished and its writes are visible
        gdc_wait()
    pid = tl.program_id(0)
    cols = pid * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    cmask = cols < d
    # Carry propagation in base 2**32 with floor shifts gives digits in [0, 2**32) of the total T and
    # a final carry of -1 exactly when T is negative; then |T| = 2**(32 N) - D for the digit string D,
    # whose digits come from the same pass as ~D + 1 (complement each digit, carry a one upward).
    # Both readings are tracked; the final carry picks one. Only the top nonzero digit and the one below
    # it can hold kept bits (the rounding point r is at least 32 * (top - 1) + 8 for every output format,
    # PREC <= 24); every lower digit only feeds the sticky bit.
    carry = tl.zeros([BLOCK], tl.int64)
    ncarry = tl.full([BLOCK], 1, tl.int64)
    all_ones = tl.full([BLOCK], 0xFFFFFFFF, tl.int64)  # 2**32 - 1
    p_top = tl.full([BLOCK], -1, tl.int32)
    n_top = p_top
    p_top_digit = tl.zeros([BLOCK], tl.int64)
    p_second = p_top_digit  # the digit just below the top one (0 when top == 0)
    p_prev = p_top_digit  # digit i - 1
    n_top_digit = p_top_digit
    n_second = p_top_digit
    n_prev = p_top_digit
    p_low_nz = tl.zeros([BLOCK], tl.int1)  # a nonzero digit two or more places below the top one
    p_below2 = p_low_nz  # a nonzero digit among 0 .. i - 2
    n_low_nz = p_low_nz
    n_below2 = p_low_nz
    for i in tl.static_range(NUM_LIMBS):
        raw = _limb(CNT, i, cols, cmask, d, NUM_WIN, NUM_SLOTS, STRIPES) + carry
        carry = raw >> 32
        digit = raw - (carry << 32)
        p_top, p_top_digit, p_second, p_low_nz, p_prev, p_below2 = _track_digit(
            i, digit, p_top, p_top_digit, p_second, p_low_nz, p_prev, p_below2
        )
        neg = (all_ones - digit) + ncarry  # digit i of ~D + 1
        ncarry = neg >> 32
        ndigit = neg - (ncarry << 32)
        n_top, n_top_digit, n_second, n_low_nz, n_prev, n_below2 = _track_digit(
            i, ndigit, n_top, n_top_digit, n_second, n_low_nz, n_prev, n_below2
        )
    negative = carry < 0
    top = tl.where(negative, n_top, p_top)
    top_digit = tl.where(negative, n_top_digit, p_top_digit)
    second = tl.where(negative, n_second, p_second)
    low_nz = tl.where(negative, n_low_nz, p_low_nz)
    # leading bit: floor(log2) of the top digit read from its exact fp64 exponent field
    lead_in_digit = ((top_digit.to(tl.float64).to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    lead = 32 * top + lead_in_digit.to(tl.int32)  # absolute bit position, unit 2**-149
    # quantum of the result (unit 2**-149): PREC bits below the leading bit, never below subnormals
    q = tl.maximum(lead, EMIN_U) - (PREC - 1)
    r = tl.maximum(q - 1, 0)  # keep one guard bit when rounding happens
    # kept = floor(magnitude / 2**r) < 2**(PREC + 1) from the two top digits: the window
    # top_digit * 2**32 + second, shifted right by s = r - 32 * (top - 1) >= 8 (disjoint bit fields,
    # so the floors add up); shifts clamped to 63 (a larger one leaves nothing above r)
    s = (r - 32 * (top - 1)).to(tl.int64)
    s_hi = s - 32  # the top digit's shift: right when >= 0, else left by at most 24
    kept_hi = tl.where(s_hi >= 0, top_digit >> tl.minimum(s_hi, 63), top_digit << tl.minimum(-s_hi, 63))
    kept = kept_hi + (second >> tl.minimum(s, 63))
    one = tl.full([BLOCK], 1, tl.int64)
    sticky_lo = (second & ((one << tl.minimum(s, 32)) - 1)) != 0
    sticky_hi = (top_digit & ((one << tl.minimum(tl.maximum(s_hi, 0), 32)) - 1)) != 0
    sticky = sticky_lo | sticky_hi | low_nz
    rounding = q >= 1
    guard = (kept & 1) != 0
    mant = tl.where(rounding, kept >> 1, kept)
    round_up = rounding & guard & (sticky | ((mant & 1) != 0))  # to nearest, ties to even
    mant = mant + round_up.to(tl.int64)
    scale = ((q - 149 + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)  # 2**(q - 149), exact
    value = mant.to(tl.float64) * scale  # exact: mant has at most PREC + 1 bits
    # exponent of the rounded result's leading bit (mant == 2**PREC after a carry): beyond EMAX -> Inf
    overflow = (q - 149 + (PREC - 1) + (mant >> PREC).to(tl.int32)) > EMAX
    value = tl.where(overflow, float("inf"), value)
    value = tl.where(top < 0, 0.0, value)
    # multiply, not negate: Triton's unary minus is 0 - x, which loses the sign of an underflow to -0
    value = value * tl.where(negative, -1.0, 1.0).to(tl.float64)
    n_nan = _slot_total(CNT, 2 * NUM_WIN, cols, cmask, d, NUM_SLOTS, STRIPES)
    n_pos = _slot_total(CNT, 2 * NUM_WIN + 1, cols, cmask, d, NUM_SLOTS, STRIPES)
    n_neg = _slot_total(CNT, 2 * NUM_WIN + 2, cols, cmask, d, NUM_SLOTS, STRIPES)
    value = tl.where(n_neg > 0, float("-inf"), value)
    value = tl.where(n_pos > 0, float("inf"), value)
    value = tl.where((n_nan > 0) | ((n_pos > 0) & (n_neg > 0)), float("nan"), value)
    # value is representable in OUT's dtype: fp64 -> fp32 is exact, then an exact (bitwise) cast
    tl.store(OUT + cols, exact_cast(value.to(tl.float32), OUT.dtype.element_ty), mask=cmask)


def check_tiles(name: str, tiles: int, cold_mode: int) -> None:
    """Raise ValueError naming `name` unless a program may walk `tiles` tiles under this COLD_MODE."""
    if cold_mode == 0 and not 1 <= tiles <= MAX_TILES_DEFERRED:
        raise ValueError(
            f"{name}: expected 1..{MAX_TILES_DEFERRED} with COLD_MODE 0 (one deferred-value bit per tile in an "
            f"int64), got {tiles}"
        )
    if not 1 <= tiles <= MAX_TILES:
        raise ValueError(
            f"{name}: expected 1..{MAX_TILES} (more narrow the hot range until a flush near fp32's top reaches "
            f"the counters' NaN / Inf slots), got {tiles}"
        )


def stripes_for(programs: int) -> int:
    """Copies of the counters for `programs` adding into them: a power of two up to STRIPES.

    Copies only spread same-address atomics (programs add into copy pid % stripes; integer sums are
    exact in any order), so the count changes no bit; at decode sizes one copy leaves the finalize an
    eighth of the reads that eight copies would.
    """
    return min(STRIPES, triton.next_power_of_2(triton.cdiv(max(programs, 1), PROGRAMS_PER_STRIPE)))


def new_counters(d: int, device: torch.device | str, stripes: int = STRIPES) -> torch.Tensor:
    """Zeroed int64 counters [stripes, NUM_SLOTS, d] for one dweight accumulation."""
    return torch.zeros((stripes, NUM_SLOTS, d), dtype=torch.int64, device=device)


# Columns per finalize program on the GPU, one lane each: every column reads all its counters (19 int64
# slots per copy), and one SM pulls only so many bytes per cycle from L2, so the copies' bytes are spread
# over several SMs (one warp each) rather than read by one.
FINALIZE_BLOCK = 32
FINALIZE_WARPS = 1


def pdl_for(t: torch.Tensor) -> bool:
    """Programmatic dependent launch (Hopper on) for kernels on t's device: a kernel may be launched while
    the one before it in the stream still runs, and waits (`griddepcontrol.wait`) for it before touching
    memory. Never in the interpreter; RLNORM_PDL=0 (read once per device and process) turns it off."""
    return t.is_cuda and _pdl_supported(t.device.index if t.device.index is not None else torch.cuda.current_device())


@functools.cache
def _pdl_supported(device_index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("RLNORM_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


@triton.jit
def allow_dependent_launch(PDL: tl.constexpr):
    """Let the stream's next kernel, if launched as a programmatic dependent, start now: its CTAs are
    placed and wait for this kernel's end themselves, so the launch latency overlaps this kernel."""
    if PDL:
        gdc_launch_dependents()


def finalize(
    counters: torch.Tensor, dtype: torch.dtype, *, _block: tuple[int, int] | None = None, pdl: bool = False
) -> torch.Tensor:
    """The exact total of the counters, rounded once (to nearest even) to `dtype`: a [d] tensor.

    `_block` (benchmarks): (columns per program, warps) instead of the defaults; the bits do not change.
    `pdl`: launch as a programmatic dependent of the kernel that filled the counters (which then calls
    `allow_dependent_launch`); only where `pdl_for(counters)`."""
    if dtype not in _FORMATS:
        raise TypeError(f"dtype: expected float32, bfloat16 or float16, got {dtype}")
    if (
        counters.dtype != torch.int64
        or counters.dim() != 3
        or not 1 <= counters.shape[0] <= STRIPES
        or counters.shape[1] != NUM_SLOTS
    ):
        raise ValueError(f"counters: expected int64 [1..{STRIPES}, {NUM_SLOTS}, d], got {tuple(counters.shape)}")
    d = counters.shape[2]
    out = torch.empty(d, dtype=dtype, device=counters.device)
    if d == 0:
        return out
    prec, emin_u, emax = _FORMATS[dtype]
    if _block is not None:
        block, warps = _block
    elif counters.is_cuda:
        block, warps = FINALIZE_BLOCK, FINALIZE_WARPS
    else:  # the CPU interpreter pays per program instead
        block, warps = min(triton.next_power_of_2(d), 1024), 4
    _dweight_finalize_kernel[(triton.cdiv(d, block),)](
        counters.contiguous(),
        out,
        d,
        NUM_WIN=NUM_WINDOWS,
        NUM_SLOTS=NUM_SLOTS,
        NUM_LIMBS=NUM_LIMBS,
        STRIPES=counters.shape[0],
        PREC=prec,
        EMIN_U=emin_u,
        EMAX=emax,
        BLOCK=block,
        PDL=pdl,
        num_warps=warps,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


def exact_column_sum(
    values: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    block_rows: int = 16,
    tiles: int = 1,
    cold_mode: int = 0,
    stripes: int | None = None,
) -> torch.Tensor:
    """Column sums of fp32 `values` [n, d], exact, rounded once to `dtype`, on values' device.

    The same accumulation and finalize the backward uses, callable on any fp32 data (tests
    craft wide exponent ranges, subnormals and cancellation here). `block_rows`, `tiles`, `cold_mode`
    (as the backward's COLD_MODE) and `stripes` (copies of the counters; by default as the backward
    picks them) only change how the work is cut: the result is the same bits for every choice.
    `tiles` is at most MAX_TILES_DEFERRED (cold_mode 0) or MAX_TILES (cold_mode 1): the counters' layout.
    """
    return finalize(column_counters(values, block_rows, tiles, cold_mode, stripes), dtype)


def column_counters(
    values: torch.Tensor,
    block_rows: int = 16,
    tiles: int = 1,
    cold_mode: int = 0,
    stripes: int | None = None,
) -> torch.Tensor:
    """The exact counters [stripes, NUM_SLOTS, d] of `values`' column sums, before the finalize."""
    if values.dtype != torch.float32:
        raise TypeError(f"values: expected float32, got {values.dtype}")
    if values.dim() != 2:
        raise ValueError(f"values: expected a 2-D [rows, columns] tensor, got shape {tuple(values.shape)}")
    if not 1 <= block_rows <= MAX_TILE_ROWS or block_rows & (block_rows - 1):
        raise ValueError(f"block_rows: expected a power of two in 1..{MAX_TILE_ROWS}, got {block_rows}")
    if cold_mode not in (0, 1):
        raise ValueError(f"cold_mode: expected 0 or 1, got {cold_mode}")
    check_tiles("tiles", tiles, cold_mode)
    n, d = values.shape
    if n >= MAX_ROWS:
        raise ValueError(f"values: at most {MAX_ROWS - 1} rows keep the int64 counters exact, got {n}")
    if d and values.stride(1) != 1:
        values = values.contiguous()
    if stripes is not None and not 1 <= stripes <= STRIPES:
        raise ValueError(f"stripes: expected 1..{STRIPES}, got {stripes}")
    counters = new_counters(d, values.device, stripes or stripes_for(triton.cdiv(n, block_rows * tiles)))
    if n and d:
        scratch = torch.empty((n, d), dtype=torch.float32, device=values.device) if cold_mode == 0 else values
        block_c = min(triton.next_power_of_2(d), 256)
        grid = (triton.cdiv(n, block_rows * tiles), triton.cdiv(d, block_c))
        _column_sum_kernel[grid](
            values,
            scratch,
            counters,
            n,
            d,
            values.stride(0),
            NUM_WIN=NUM_WINDOWS,
            NUM_SLOTS=NUM_SLOTS,
            STRIPES=counters.shape[0],
            BLOCK_R=block_rows,
            BLOCK_C=block_c,
            TILES=tiles,
            COLD_MODE=cold_mode,
            HOT_WIDTH=hot_width(tiles),
        )
    return counters
