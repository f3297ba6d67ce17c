"""Forward kernel of the gated RMSNorm: batch invariant by construction, every output rounded once.

- Batch invariance: one program takes BLOCK_R rows x one group of the row; the tile comes from the group
  width, and BLOCK_R is 1 in a GPU's decode-sized launches. No bit depends on that choice: every output is the
  fp64 result rounded once (below), whatever the launch shape, and the threshold T is derived for the
  shape launched. Each output is stored once, by the program that owns its row: no atomics, no sums
  across programs.
- Fast path (fp32): the sum of squares (bf16/fp16 squares are exact in fp32), rstd by rsqrt and one
  Newton step, the gate with an exactly split exp argument, the products; then a test on the result's
  bits folded into two row minima. An output within T fp32 ulps of a rounding midpoint of the output
  format, where T is the error bound the fast path is held to, flags its row; away from midpoints the
  fast value then rounds to the same output as the exact result. T is the floor of a proven bound on
  the fast path's error, per group width and options (`_bound.py`, docs/kernel.md §3).
- Exact paths (fp64): a flagged element of a bf16 row whose rstd comes from x alone is settled alone
  (`_exact_element.py`); a row with a non-finite, zero or tiny value, or an element that tier cannot
  place, is recomputed whole from its own inputs. Every output therefore equals the fp64 result
  rounded once, which is also why the CPU interpreter and the GPU agree bitwise.
- fp32 outputs have no spare bits to test: they take the fp64 path everywhere.
"""

from __future__ import annotations

import os
import struct

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from rlnorm.kernel._bound import near_threshold
from rlnorm.kernel._exact_element import MARGIN_ULPS, UNDECIDED_BITS, exact_element, rows_rstd64
from rlnorm.kernel._interpreter import INTERPRETED
from rlnorm.kernel._rounding import round_fp32_to_out, round_fp64_to_out, widen_fast, widen_to_fp32
from rlnorm.kernel._switches import fwd_fault_keywords, fwd_switches

MAX_D = 8192  # widest row (and group) one program holds in registers
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # read as Triton reads it, once per process

# Launch shape, from the group width (timed on the H200; docs/kernel.md §7 lists the alternatives
# measured against it): 16 elements per thread in one-warp programs (every reduction of the tier's
# branch is then a warp shuffle), tiles of 512 elements up to 256 columns, 1024 above.
TILE_ELEMENTS = 1024
TILE_ELEMENTS_NARROW = 512  # rows of at most 256 columns
ELEMENTS_PER_THREAD = 16
# Register cap of a one-warp program where the tier applies, by BLOCK_G: uncapped, ptxas sizes the
# registers for the rare tier and row paths and the fast path loses occupancy; a lower cap delays one
# of z's loads (docs/kernel.md §7; no spills at these caps, §6).
TIER_MAXNREG = {128: 64, 256: 64}
# A thread's 16 elements as two 16-byte vectors of ONE row rather than one vector of each of two rows:
# a row's sums, minima and rstd then cost each thread one row and one shuffle level fewer.
SPLIT_CHUNKS = 2
MAX_BLOCK_R = 64  # the rows of a program that go to the whole-row path are one int64 bitmask
# Launches of at most this many rows, by BLOCK_G, take one row per program on a GPU: a program in which one element
# takes the exact tier then holds up one row, not BLOCK_R, and that wait is most of a decode-sized launch's time.
# Larger launches keep the wide tile, whose loads stream at the memory's speed. Each count is where the two shapes
# crossed on an H100 (docs/kernel.md §4); wider groups keep one shape.
DECODE_ROWS = {64: 4096, 128: 4096, 256: 8192}


def decode_rows(group: int) -> int:
    """The most rows a GPU launch at this group width takes one row per program in (0: never)."""
    return DECODE_ROWS.get(triton.next_power_of_2(group), 0)


def near_bound(
    group: int, has_z: bool, norm_before_gate: bool, sigmoid: bool, weight_fp32: bool, split: int, per_thread: int
) -> int:
    """The midpoint test's threshold T (fp32 ulps) for this launch, the NEAR_T switch's default: the floor of the
    fast path's proven error bound (`_bound.fast_error_ulps`, docs/kernel.md §3), per group width and options."""
    return near_threshold(group, has_z, norm_before_gate, sigmoid, weight_fp32, split, per_thread)


def _eps_bits(eps: float) -> int:
    """eps (>= 0) as its fp64 bit pattern: Triton passes Python floats as fp32, which would change eps."""
    return struct.unpack("<q", struct.pack("<d", float(eps)))[0]


@triton.jit
def _act(z, SIGMOID: tl.constexpr):
    """sigmoid(z) or silu(z) = z * sigmoid(z), in z's precision (the interpreter's gate and the fp64 paths)."""
    sig = 1.0 / (1.0 + tl.exp(-z))
    if SIGMOID:
        a = sig
    else:
        a = z * sig
    return a


@triton.jit
def _rcp_approx(v):
    """1/v as one rcp.approx.ftz.f32 (1 ulp at most, inside T)."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1)


FP32_MIN_NORMAL = tl.constexpr(2.0**-126)


@triton.jit
def _mul_ftz(a, b, FTZ: tl.constexpr, INTERP: tl.constexpr):
    """a * b rounded to nearest, subnormal inputs and results flushed to (signed) zero.

    A product whose true value is subnormal has lost relative precision that T does not cover; as a
    zero it makes y zero, which the range test sends to the exact path. mul.rn also keeps ptxas from
    contracting it into an FMA. FTZ is False only under a planted fault (`rlnorm.kernel.testing.plant`)."""
    if not FTZ:
        p = a * b
    elif INTERP:  # numpy keeps subnormals: flush inputs and result as the GPU does
        a = tl.where(tl.abs(a) < FP32_MIN_NORMAL, a * 0.0, a)
        b = tl.where(tl.abs(b) < FP32_MIN_NORMAL, b * 0.0, b)
        p = a * b
        p = tl.where(tl.abs(p) < FP32_MIN_NORMAL, p * 0.0, p)
    else:
        p = tl.inline_asm_elementwise(
            "mul.rn.ftz.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    return p


@triton.jit
def _act_fast(z, SIGMOID: tl.constexpr, Z_BF16: tl.constexpr, FTZ: tl.constexpr):
    """The fp32 gate on the GPU, exp(-z) = 2**t with t = -z * log2(e) split exactly: rounding t would
    add an error proportional to |z| that no fixed T covers.

    bf16 z: log2(e) cut to 16 significant bits (L_HI), so z * L_HI is exact (8 + 16 bits), and the rest,
    2**(-z * L_LO), folded in as 1 + e * (1 + z * K) by two FMAs (its second-order term stays inside T
    up to |z| = 87, where exp leaves fp32). fp16 z: the rounded product's exact error, from one FMA,
    folded back in the same way."""
    if Z_BF16:
        t_hi = z * 1.44268798828125  # L_HI = 47274 * 2**-15
        e = tl.exp2(-t_hi)
        one_plus_e = tl.fma(e, tl.fma(z, -4.888495368504664e-06, 1.0), 1.0)  # K = -(log2 e - L_HI) * ln 2
    else:
        t_hi = z * 1.4426950216293335  # fp32(log2 e) * z, rounded
        t_err = tl.fma(z, 1.4426950216293335, -t_hi)  # its rounding error, exact
        # -(t_err + z * (log2 e - fp32(log2 e))) * ln 2: the relative correction of 2**-t_hi
        corr = tl.fma(t_err, -0.6931471805599453, z * -1.3349758157512938e-08)
        e = tl.exp2(-t_hi)
        e = tl.fma(e, corr, e)
        one_plus_e = 1.0 + e
    sig = _rcp_approx(one_plus_e)  # .ftz: a subnormal sigmoid is already flushed to zero
    if SIGMOID:
        a = sig
    else:
        a = _mul_ftz(z, sig, FTZ, False)  # a subnormal gate -> 0 -> y = 0: the row goes exact
    return a


@triton.jit
def _gated_fp64(
    x, z, w, eps, GROUP: tl.constexpr, HAS_Z: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr, SIGMOID: tl.constexpr
):
    """The op on a [BLOCK_R, BLOCK_C, SPLIT] fp64 tile (zeros in masked columns): fp32 inputs' path."""
    if HAS_Z and not NORM_BEFORE_GATE:
        xg = x * _act(z, SIGMOID)  # [BLOCK_R, BLOCK_C, SPLIT]
    else:
        xg = x
    ms = _row_sum(xg * xg) / GROUP  # [BLOCK_R]
    rstd = 1.0 / tl.sqrt(ms + eps)  # [BLOCK_R]: fp64 sqrt and divide are IEEE (sqrt.rn.f64, div.rn.f64)
    y = xg * rstd[:, None, None] * w  # [BLOCK_R, BLOCK_C, SPLIT]
    if HAS_Z and NORM_BEFORE_GATE:
        y = y * _act(z, SIGMOID)
    return y


@triton.jit
def _row_sum(v):
    """[BLOCK_R, BLOCK_C, SPLIT] -> [BLOCK_R]: each row's own columns (a thread's chunks, then across lanes)."""
    return tl.sum(tl.sum(v, axis=2), axis=1)


@triton.jit
def _row_min(v):
    """[BLOCK_R, BLOCK_C, SPLIT] -> [BLOCK_R], as _row_sum."""
    return tl.min(tl.min(v, axis=2), axis=1)


@triton.jit
def _row_any(v):
    """[BLOCK_R, BLOCK_C, SPLIT] bool -> [BLOCK_R]: does any column of the row hold True."""
    return tl.max(tl.max(v.to(tl.int32), axis=2), axis=1) > 0


@triton.jit
def _load_chunks(ptrs, row_ok, g, GROUP: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT: tl.constexpr):
    """A row block's SPLIT chunks as loaded, each its own [BLOCK_R, BLOCK_C] tile (chunk s: columns
    g + s * BLOCK_C). Two 2-D loads give a thread one row's chunks on every Triton version (a 3-D tile
    does not on 3.7); `_widen_chunks` joins them after every load of the tile is issued.
    ptrs: [BLOCK_R, BLOCK_C] pointers of chunk 0; row_ok: [BLOCK_R, 1]; g: [1, BLOCK_C] columns within
    the group. One chunk: a 3-D [BLOCK_R, BLOCK_C, 1] load, returned twice (a 2-D load expanded
    afterwards leaves the tile in another layout)."""
    if SPLIT == 2:
        a = tl.load(ptrs, mask=row_ok & (g < GROUP), other=0.0)
        b = tl.load(ptrs + BLOCK_C, mask=row_ok & (g + BLOCK_C < GROUP), other=0.0)
    else:
        a = tl.load(ptrs[:, :, None], mask=(row_ok & (g < GROUP))[:, :, None], other=0.0)
        b = a
    return a, b


@triton.jit
def _widen_chunks(a, b, SPLIT: tl.constexpr, INTERP: tl.constexpr):
    """`_load_chunks`' chunks as one [BLOCK_R, BLOCK_C, SPLIT] fp32 tile, joined along a last axis that
    stays in each thread; widened before the join, so each loaded bf16 pair stays in its register."""
    if SPLIT == 2:
        t = tl.join(widen_fast(a, INTERP, not INTERP), widen_fast(b, INTERP, not INTERP))  # [BLOCK_R, BLOCK_C, 2]
    else:
        t = widen_fast(a, INTERP, not INTERP)  # [BLOCK_R, BLOCK_C, 1]
    return t


@triton.jit
def _store_chunks(
    ptrs, v, row_ok, g, GROUP: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT: tl.constexpr, ROUND: tl.constexpr, INTERP
):
    """Store a [BLOCK_R, BLOCK_C, SPLIT] tile chunk by chunk, as `_load_chunks` loaded it (ptrs:
    [BLOCK_R, BLOCK_C], chunk 0; row_ok: [BLOCK_R, 1]; g: [1, BLOCK_C]). Masks built per chunk stay
    constant along the columns to Triton, which keeps the 16-byte stores. ROUND: v is the fast path's
    fp32 tile, rounded to nearest even per chunk after the split (each chunk's pairs pack into
    registers); else v is stored as it is."""
    if SPLIT == 2:
        a, b = tl.split(v)
        if ROUND:
            a = _fast_out(a, ptrs.dtype.element_ty, INTERP)
            b = _fast_out(b, ptrs.dtype.element_ty, INTERP)
        tl.store(ptrs, a, mask=row_ok & (g < GROUP))
        tl.store(ptrs + BLOCK_C, b, mask=row_ok & (g + BLOCK_C < GROUP))
    else:
        if ROUND:
            v = _fast_out(v, ptrs.dtype.element_ty, INTERP)
        tl.store(ptrs[:, :, None], v, mask=(row_ok & (g < GROUP))[:, :, None])


@triton.jit
def _fast_out(y, OUT: tl.constexpr, INTERP: tl.constexpr):
    """fp32 values rounded to nearest even in OUT, ready to store."""
    if INTERP:
        out = round_fp32_to_out(y, OUT)  # the interpreter's cast truncates
    else:
        out = y.to(OUT)  # the GPU's cvt.rn rounds to nearest even: the same value
    return out


@triton.jit
def _row_bits(row_flag):
    """The flagged rows of a [BLOCK_R] mask as one int64 bitmask (a scalar: one cross-thread step)."""
    r = tl.arange(0, row_flag.shape[0]).to(tl.int64)
    return tl.sum(tl.where(row_flag, tl.full(row_flag.shape, 1, tl.int64) << r, 0))


@triton.jit
def _exact_rows(
    row_bits,
    t,  # the row block
    x_ptr,
    z_ptr,
    w_ptr,
    y_ptr,
    stride_x,
    stride_z,
    stride_y,
    eps,
    col0,  # the group's first column
    GROUP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per step (one per thread, or the whole row)
    HAS_Z: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr,
    SIGMOID: tl.constexpr,
):
    """The rows of row_bits recomputed wholly in fp64 from their own inputs, each output rounded once.

    CHUNK columns per step, two passes (squares, then outputs): where the tier applies this path is rare,
    and a whole fp64 row held at once would set every program's register count."""
    OUT: tl.constexpr = y_ptr.dtype.element_ty
    offs = tl.arange(0, CHUNK)  # [CHUNK]
    for i in range(BLOCK_R):
        if ((row_bits >> i) & 1) != 0:
            row = (t * BLOCK_R + i).to(tl.int64)  # int64: row * stride can pass 2**31
            x_row = x_ptr + row * stride_x + col0
            z_row = z_ptr + row * stride_z + col0
            acc = tl.zeros([CHUNK], tl.float64)
            for c in range(0, BLOCK_G, CHUNK):
                ok = c + offs < GROUP
                xg = widen_to_fp32(tl.load(x_row + c + offs, mask=ok, other=0.0)).to(tl.float64)
                if HAS_Z and not NORM_BEFORE_GATE:
                    zc = widen_to_fp32(tl.load(z_row + c + offs, mask=ok, other=0.0)).to(tl.float64)
                    xg = xg * _act(zc, SIGMOID)
                acc += xg * xg
            ms = tl.sum(acc, axis=0) / GROUP
            rstd = 1.0 / tl.sqrt(ms + eps)  # fp64 sqrt and divide are IEEE (sqrt.rn.f64, div.rn.f64)
            for c in range(0, BLOCK_G, CHUNK):
                ok = c + offs < GROUP
                xg = widen_to_fp32(tl.load(x_row + c + offs, mask=ok, other=0.0)).to(tl.float64)
                w = widen_to_fp32(tl.load(w_ptr + col0 + c + offs, mask=ok, other=0.0)).to(tl.float64)
                if HAS_Z:
                    zc = widen_to_fp32(tl.load(z_row + c + offs, mask=ok, other=0.0)).to(tl.float64)
                    a = _act(zc, SIGMOID)
                    if not NORM_BEFORE_GATE:
                        xg = xg * a
                y = xg * rstd * w  # [CHUNK]
                if HAS_Z and NORM_BEFORE_GATE:
                    y = y * a
                tl.store(y_ptr + row * stride_y + col0 + c + offs, round_fp64_to_out(y, OUT), mask=ok)


@triton.jit(do_not_specialize=["eps_bits"])  # eps_bits == 1 must stay an argument, not a constant
def _rms_norm_gated_fwd_kernel(
    x_ptr,
    z_ptr,
    w_ptr,
    y_ptr,
    dbg_ptr,  # fp32 [rows, D] fast-path values (DEBUG only)
    flag_ptr,  # int8 [rows, D] near-midpoint flags (DEBUG only)
    zero_ptr,  # int64 [n_zero]: the backward's workspace, zeroed here (ZERO only)
    n_zero,
    n_rows,
    stride_x,
    stride_z,
    stride_y,
    eps_bits,  # eps as int64 bits: see _eps_bits
    GROUP: tl.constexpr,  # group width (D when there are no groups)
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,  # next power of two >= GROUP
    HAS_Z: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr,
    SIGMOID: tl.constexpr,
    ALL_FP64: tl.constexpr,  # fp32 output: no fast path
    NEAR_T: tl.constexpr,  # the fast path's error bound T in fp32 ulps (negative: no midpoint test, a planted fault)
    EXACT: tl.constexpr,  # 1: flagged rows recomputed in fp64; 0: never (timing only: NOT correctly rounded)
    TIER2: tl.constexpr,  # near elements of safe rows settled one by one (_exact_element.py) before the row path
    INTERP: tl.constexpr,  # running in the Triton interpreter (CPU)
    DEBUG: tl.constexpr,
    ZERO: tl.constexpr,  # also zero the backward's workspace (saves the backward a memset launch)
    ZERO_BLOCK: tl.constexpr,
    ROW_CHUNK: tl.constexpr,  # the whole-row path's columns per step
    SPLIT: tl.constexpr,  # column chunks per thread (the tile is [BLOCK_R, BLOCK_G // SPLIT, SPLIT])
    # the launcher never passes these: the defaults are the op; `rlnorm.kernel.testing.plant` overrides them
    TIER2_MARGIN: tl.constexpr = MARGIN_ULPS,  # fp64 ulps from a midpoint below which the tier leaves it undecided
    TIER2_FAULT: tl.constexpr = 0,  # planted fault: the tier's fp64 value moved by this many fp64 ulps
    FAULT_ULPS: tl.constexpr = 0,  # planted fault: the fast path's result moved by this many fp32 ulps
    FTZ: tl.constexpr = True,  # fast-path products flush subnormals (False only as a planted fault)
):
    pid_r = tl.program_id(0)
    pid_g = tl.program_id(1)
    if ZERO:  # a grid-stride loop: the workspace's size does not depend on this launch's shape
        n_prog = tl.num_programs(0) * tl.num_programs(1)
        zoffs = tl.arange(0, ZERO_BLOCK)  # [ZERO_BLOCK]
        z_first = (pid_r * tl.num_programs(1) + pid_g) * ZERO_BLOCK
        if INTERPRETED:  # no tensor loop bounds in the interpreter (`_interpreter.py`)
            z0 = z_first
            while z0 < n_zero:
                tl.store(zero_ptr + z0 + zoffs, tl.zeros([ZERO_BLOCK], tl.int64), mask=z0 + zoffs < n_zero)
                z0 += n_prog * ZERO_BLOCK
        else:
            for z0 in range(z_first, n_zero, n_prog * ZERO_BLOCK):
                tl.store(zero_ptr + z0 + zoffs, tl.zeros([ZERO_BLOCK], tl.int64), mask=z0 + zoffs < n_zero)
    eps = eps_bits.to(tl.int64).to(tl.float64, bitcast=True)  # bits below 2**31 (eps = 0) come as int32
    # The tile is [BLOCK_R, BLOCK_C, SPLIT]: a row's BLOCK_G columns as SPLIT chunks of BLOCK_C joined
    # along a last axis that stays in the thread (`_load_chunks`), so a thread holds SPLIT vectors of
    # ONE row and computes one row's scalars.
    BLOCK_C: tl.constexpr = BLOCK_G // SPLIT
    r_local = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    g2 = tl.arange(0, BLOCK_C)[None, :]  # [1, BLOCK_C]: chunk 0's columns within the group
    if SPLIT == 2:
        g_cols = tl.join(g2, g2 + BLOCK_C)  # [1, BLOCK_C, SPLIT]
    else:
        g_cols = g2[:, :, None]  # [1, BLOCK_C, 1]
    cols = pid_g * GROUP + g_cols  # [1, BLOCK_C, SPLIT]
    col_ok = g_cols < GROUP  # masks make any GROUP work
    # w repeated per row (L1 hits), born in x's layout: a [BLOCK_G] vector would need a layout
    # conversion through shared memory (a barrier per program)
    r2 = r_local[:, None]  # [BLOCK_R, 1]
    wa, wb = _load_chunks(w_ptr + pid_g * GROUP + g2 + 0 * r2, r2 >= 0, g2, GROUP, BLOCK_C, SPLIT)
    w = _widen_chunks(wa, wb, SPLIT, INTERP)  # [BLOCK_R, BLOCK_C, SPLIT]
    OUT: tl.constexpr = y_ptr.dtype.element_ty
    rows64 = (pid_r * BLOCK_R + r_local).to(tl.int64)  # [BLOCK_R]; int64: row * stride can pass 2**31
    row_ok = rows64 < n_rows
    rows2 = rows64[:, None]  # [BLOCK_R, 1]
    mask = row_ok[:, None, None] & col_ok  # [BLOCK_R, BLOCK_C, SPLIT]: masked lanes load 0 and add 0
    x_rows = x_ptr + rows2 * stride_x + pid_g * GROUP + g2  # [BLOCK_R, BLOCK_C]: chunk 0
    xa, xb = _load_chunks(x_rows, row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT)
    if HAS_Z:
        za, zb = _load_chunks(z_ptr + rows2 * stride_z + pid_g * GROUP + g2, row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT)
    if HAS_Z:
        z = _widen_chunks(za, zb, SPLIT, INTERP)  # [BLOCK_R, BLOCK_C, SPLIT]
    x = _widen_chunks(xa, xb, SPLIT, INTERP)  # [BLOCK_R, BLOCK_C, SPLIT]
    if not HAS_Z:
        z = x  # unused
    y_rows = y_ptr + rows2 * stride_y + pid_g * GROUP + g2  # [BLOCK_R, BLOCK_C]: chunk 0

    if ALL_FP64:
        y64 = _gated_fp64(
            x.to(tl.float64), z.to(tl.float64), w.to(tl.float64), eps, GROUP, HAS_Z, NORM_BEFORE_GATE, SIGMOID
        )
        _store_chunks(y_rows, round_fp64_to_out(y64, OUT), row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT, False, INTERP)
    else:
        # ---- fast path: all fp32, per-row scalars included (eps is rounded to fp32 too) ----
        if HAS_Z:
            if INTERP:
                # numpy has no fused multiply-add: the gate in fp64, rounded once and flushed as the
                # GPU's is (a subnormal gate must give y = 0 here too)
                a = _mul_ftz(_act(z.to(tl.float64), SIGMOID).to(tl.float32), 1.0, FTZ, INTERP)
            else:
                a = _act_fast(z, SIGMOID, z_ptr.dtype.element_ty == tl.bfloat16, FTZ)
        else:
            a = x  # unused
        if HAS_Z and not NORM_BEFORE_GATE:
            xg = _mul_ftz(x, a, FTZ, INTERP)
        else:
            xg = x
        # the fp32 sum's rounding is inside T; the same reduction tree for every row slot
        ssum = _row_sum(xg * xg)  # [BLOCK_R]
        eps32 = eps.to(tl.float32)
        ms = ssum * (1.0 / GROUP) + eps32
        if not INTERP:
            r0 = libdevice.rsqrt(ms)  # rsqrt.approx.ftz.f32
            # one Newton step on the FMA residual h = 1 - ms * r0**2, rounded once
            h = tl.fma(-(ms * r0), r0, 1.0)
            rstd = tl.fma(r0 * 0.5, h, r0)
        else:
            rstd = tl.div_rn(1.0, tl.sqrt_rn(ms))  # IEEE, 2 roundings
        # rstd ~0 (x**2 overflowed), or a sum too small for fp32 to keep its relative precision while eps
        # does not dominate it: the row goes exact
        row_risky = (rstd < 1e-30) | ((ssum < 1.2621774e-29) & ((tl.zeros_like(ssum) + eps32) < 8.4703295e-22))
        # (x * w) first: exact for bf16/fp16 x and w, one rounding fewer; every product flushes, so an
        # intermediate that underflows shows as y = 0 whatever the later factors scale it by
        y = _mul_ftz(_mul_ftz(xg, w, FTZ, INTERP), rstd[:, None, None], FTZ, INTERP)  # [BLOCK_R, BLOCK_C, SPLIT]
        if HAS_Z and NORM_BEFORE_GATE:
            y = _mul_ftz(y, a, FTZ, INTERP)
        if FAULT_ULPS != 0:
            y = (y.to(tl.int32, bitcast=True) + FAULT_ULPS).to(tl.float32, bitcast=True)
        y_fast = y

        # ---- is the fp32 value farther than T ulps from every rounding midpoint (and in the safe range)? ----
        bits = y.to(tl.int32, bitcast=True)
        row_bits = (pid_r * 0).to(tl.int64)  # rows for the whole-row path, one bit each
        if OUT == tl.bfloat16:
            # Two unsigned row minima instead of per-element flags (one multiply-add and one min each).
            # near: |low 16 bits - 0x8000| <= T <=> ((bits + T - 0x8000) << 16) < (2T + 1) << 16.
            # risky: |y| < 2**-96 or inf/nan, as ~((bits << 1) - 2 * 0x0F800000) < 0x20000000. An exact 0
            # is risky: it is how an underflowed product shows (`_mul_ftz`); its row goes exact.
            risk_key = (bits * -2 + 0x1EFFFFFF).to(tl.uint32, bitcast=True)
            if GROUP != BLOCK_G:  # padding columns (y = 0) must not flag their row
                risk_key = tl.where(col_ok, risk_key, 0xFFFFFFFF)
            flag = risk_key < 0x20000000  # [BLOCK_R, BLOCK_C, SPLIT] (DEBUG only)
            risky_row = ((_row_min(risk_key) < 0x20000000) | row_risky) & row_ok  # [BLOCK_R]
            row_flag = risky_row
            if NEAR_T >= 0:
                near_key = (bits * 65536 + ((NEAR_T - 0x8000) * 65536)).to(tl.uint32, bitcast=True)
                row_flag = row_flag | ((_row_min(near_key) < (2 * NEAR_T + 1) * 65536) & row_ok)
                flag = flag | (near_key < (2 * NEAR_T + 1) * 65536)
            flag = flag & mask
            if TIER2:
                # Near elements of safe rows go to the per-element tier; risky rows, and rows with an
                # element the tier leaves undecided, go to the whole-row path. Each row is stored where
                # it becomes final, so nothing of y stays live across the branch.
                _store_chunks(y_rows, y, (row_ok & ~row_flag)[:, None], g2, GROUP, BLOCK_C, SPLIT, True, INTERP)
                if tl.max(row_flag.to(tl.int32), axis=0) != 0:  # one scalar branch per program
                    tier_row = row_flag & ~risky_row  # [BLOCK_R]
                    # x again (L1): keeping the tile's x, z, w live to here would double the registers
                    xr = _widen_chunks(*_load_chunks(x_rows, row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT), SPLIT, INTERP)
                    xr64 = xr.to(tl.float64)
                    rstd64 = rows_rstd64(_row_sum(xr64 * xr64), rstd, eps, GROUP)  # [BLOCK_R]
                    y = exact_element(
                        y,
                        cols,
                        tier_row[:, None, None],
                        (x_ptr + rows64 * stride_x)[:, None, None],
                        (z_ptr + rows64 * stride_z)[:, None, None],
                        w_ptr,
                        rstd64[:, None, None],
                        NEAR_T,
                        TIER2_MARGIN,
                        TIER2_FAULT,
                        HAS_Z,
                        SIGMOID,
                        not INTERP,
                    )  # [BLOCK_R, BLOCK_C, SPLIT]
                    undecided_row = _row_any(y.to(tl.int32, bitcast=True) == UNDECIDED_BITS)  # [BLOCK_R]
                    tier_done = (tier_row & ~undecided_row)[:, None]
                    _store_chunks(y_rows, y, tier_done, g2, GROUP, BLOCK_C, SPLIT, True, INTERP)
                    row_flag = risky_row | undecided_row
                    row_bits = _row_bits(row_flag)
            elif EXACT == 1:
                row_bits = _row_bits(row_flag)
        else:
            mag = bits & 0x7FFFFFFF
            dist = tl.abs((bits & 0x1FFF) - 0x1000)  # fp16 normal range: distance to the midpoint
            near = dist <= NEAR_T
            # fp16 subnormals (|y| < 2**-14), the overflow boundary and non-finite values: fp64 decides
            risky = (mag < 0x38800000) | (mag >= 0x477FE000)
            flag = (near | risky) & mask
            # rstd outside fp32's safe normal range loses relative precision: the row goes exact
            row_flag = _row_any(flag) | (row_risky & row_ok)  # [BLOCK_R]
            if EXACT == 1:
                row_bits = _row_bits(row_flag)

        if TIER2:
            pass  # stored above, where each row became final
        elif EXACT == 1:  # flagged rows: stored by the whole-row path
            _store_chunks(y_rows, y, (row_ok & ~row_flag)[:, None], g2, GROUP, BLOCK_C, SPLIT, True, INTERP)
        else:
            _store_chunks(y_rows, y, row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT, True, INTERP)
        if DEBUG:  # y is contiguous: the debug buffers share its offsets
            debug_rows = rows2 * stride_y + pid_g * GROUP + g2  # [BLOCK_R, BLOCK_C]
            _store_chunks(dbg_ptr + debug_rows, y_fast, row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT, False, INTERP)
            _store_chunks(
                flag_ptr + debug_rows, flag.to(tl.int8), row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT, False, INTERP
            )

        # ---- whole-row fp64 path for flagged rows: a scalar branch per program, then per row ----
        if EXACT == 1:
            if row_bits != 0:
                _exact_rows(
                    row_bits,
                    pid_r,
                    x_ptr,
                    z_ptr,
                    w_ptr,
                    y_ptr,
                    stride_x,
                    stride_z,
                    stride_y,
                    eps,
                    pid_g * GROUP,
                    GROUP,
                    BLOCK_R,
                    BLOCK_G,
                    ROW_CHUNK,
                    HAS_Z,
                    NORM_BEFORE_GATE,
                    SIGMOID,
                )


def fwd_config(group: int, dtype: torch.dtype, rows: int, serial: bool = _INTERPRET) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_G, num_warps): the tile from the group width, and one row per program in launches of at most
    `decode_rows(group)` rows (groups of 64 to 256 columns, rounded up to a power of two). There the program stays
    one warp, and T, counted for 16 elements of a row per thread, covers the shorter sums the one-row code compiles
    to (tests/kernel/test_bound.py reads their depth from the PTX). `serial`: the programs run one after another
    (the interpreter), where more of them only cost time: the wide tile at every row count, the same bits."""
    block_g = triton.next_power_of_2(group)
    tile = TILE_ELEMENTS if block_g > 256 else TILE_ELEMENTS_NARROW
    one_row = not serial and rows <= decode_rows(group)
    block_r = 1 if one_row else max(1, min(MAX_BLOCK_R, tile // block_g))
    num_warps = max(1, min(16, block_r * block_g // (32 * ELEMENTS_PER_THREAD)))
    return block_r, block_g, num_warps


def default_split(block_g: int) -> int:
    """The SPLIT switch's default: SPLIT_CHUNKS chunks of a row per thread where the group is wide enough."""
    return SPLIT_CHUNKS if block_g >= 16 * SPLIT_CHUNKS else 1


def row_elements_per_thread(block_r: int, block_g: int, num_warps: int, split: int) -> int:
    """A row's elements in one thread, as the bound counts them: at least one 16-byte vector per chunk (Triton
    vectorizes the loads), more where the tile has more elements than threads; a row under 32 columns is taken whole
    (any order)."""
    return max(8 * split, block_r * block_g // (32 * num_warps)) if block_g >= 32 else block_g


_UNIT_WEIGHTS: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def unit_weight(d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A [d] tensor of ones: the weight of the weight-less mode, so its outputs are those of torch.ones
    bit for bit. Cached per (d, dtype, device), so no call pays a fill launch, except while a CUDA graph
    is captured: a tensor filled inside a capture holds its ones only once the graph replays."""
    key = (d, dtype, device)
    w = _UNIT_WEIGHTS.get(key)
    if w is None:
        with torch.inference_mode(False):  # an inference tensor could not be read where autograd records
            w = torch.ones(d, dtype=dtype, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _UNIT_WEIGHTS[key] = w
    return w


def rms_norm_gated_fwd(
    x: torch.Tensor,
    z: torch.Tensor | None,
    w: torch.Tensor | None,
    eps: float,
    group_size: int | None,
    norm_before_gate: bool,
    activation: str,
    *,
    zero: torch.Tensor | None = None,
    debug: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = gated RMSNorm of 2-D x [rows, D] (last dimension contiguous, any row stride); y contiguous.

    Inputs are assumed validated (api.py does that): w is [D] and contiguous, or None for no weight (as
    if all ones). `activation` ("silu" or "sigmoid") and `group_size` (None or a divisor of D) are
    checked here too, as the backward launcher checks them. The launch follows the switches of an
    active `rlnorm.kernel.testing.plant` (benchmarks, tests). `zero`: a contiguous int64 tensor this launch also
    fills with zeros (the backward's workspace, `_bwd.workspace_numel`); no output bit depends on it.
    `debug` also returns the fp32 fast-path values and the near-midpoint flags (fp32 [rows, D] and
    int8 [rows, D]) for error measurements.
    """
    rows, d = x.shape
    group = group_size or d
    if activation not in ("silu", "sigmoid"):
        raise ValueError(f"activation: expected 'silu' or 'sigmoid', got {activation!r}")
    if d == 0:
        raise ValueError("x: last dimension D must be > 0")
    if d > MAX_D:
        raise ValueError(f"x: last dimension {d} exceeds the kernel's limit of {MAX_D}")
    if group <= 0 or d % group:
        raise ValueError(f"group_size: {group} does not divide the last dimension {d}")
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    has_z = z is not None
    if w is None:
        w = unit_weight(d, x.dtype, x.device)
    if debug:
        dbg = torch.full((rows, d), float("nan"), dtype=torch.float32, device=x.device)
        flags = torch.zeros((rows, d), dtype=torch.int8, device=x.device)
    else:
        dbg, flags = y, y  # unused pointers
    if zero is not None and (zero.dtype != torch.int64 or not zero.is_contiguous() or zero.device != x.device):
        raise ValueError(f"zero: expected a contiguous int64 tensor on {x.device}")
    if rows == 0:
        if zero is not None:
            zero.zero_()
        return (y, dbg, flags) if debug else y
    sw = fwd_switches()
    block_r, block_g, num_warps = fwd_config(group, x.dtype, rows)
    if sw["BLOCK_R"] is not None:
        block_r = sw["BLOCK_R"]
    if sw["NUM_WARPS"] is not None:
        num_warps = sw["NUM_WARPS"]
    split = sw["SPLIT"] or default_split(block_g)
    if block_g % split:
        raise ValueError(f"plant: SPLIT {split} does not divide the block width {block_g}")
    if sw["NEAR_T"] is None:  # from the launch's shape: the summation depth is part of the bound
        per_thread = row_elements_per_thread(block_r, block_g, num_warps, split)
        sigmoid = activation == "sigmoid"
        near_t = near_bound(group, has_z, norm_before_gate, sigmoid, w.dtype == torch.float32, split, per_thread)
    else:
        near_t = sw["NEAR_T"]
    exact = sw["EXACT"] if x.dtype != torch.float32 else 0  # fp32 output: all fp64 already
    # the per-element tier covers bf16 outputs whose rstd comes from x alone (gate after the norm, or
    # none); elsewhere flagged rows go whole to fp64
    tier2 = (
        sw["TIER2"] == 1
        and exact == 1
        and x.dtype == torch.bfloat16
        and near_t >= 0
        and (norm_before_gate or not has_z)
    )
    maxnreg = sw["MAXNREG"]
    if maxnreg is None:
        maxnreg = TIER_MAXNREG.get(block_g, 0) if tier2 and num_warps == 1 else 0
    grid = (triton.cdiv(rows, block_r), d // group)
    _rms_norm_gated_fwd_kernel[grid](
        x,
        z if has_z else x,
        w,
        y,
        dbg,
        flags,
        y if zero is None else zero,
        0 if zero is None else zero.numel(),
        rows,
        x.stride(0),
        z.stride(0) if has_z else 0,
        y.stride(0),
        _eps_bits(eps),
        GROUP=group,
        BLOCK_R=block_r,
        BLOCK_G=block_g,
        HAS_Z=has_z,
        NORM_BEFORE_GATE=norm_before_gate,
        SIGMOID=activation == "sigmoid",
        ALL_FP64=x.dtype == torch.float32,
        NEAR_T=near_t,
        EXACT=exact,
        TIER2=tier2,
        INTERP=_INTERPRET,
        DEBUG=debug,
        ZERO=zero is not None,
        ZERO_BLOCK=32 * num_warps,
        # with the tier the row path is rare: a column per thread keeps its registers out of every
        # program's count; without it the row path takes a whole row at once
        ROW_CHUNK=min(block_g, 32 * num_warps) if tier2 else block_g,
        SPLIT=split,
        num_warps=num_warps,
        **({"maxnreg": maxnreg} if maxnreg else {}),
        **fwd_fault_keywords(),  # empty outside the tests' `plant`
    )
    return (y, dbg, flags) if debug else y
