"""Forward kernel of the gated RMSNorm: batch invariant by construction, correctly rounded.

Design (docs/kernel-notes.md has the numbers behind it):
- One program handles BLOCK_R rows x one group of the row (2-D grid: row block, group). Every
  launch parameter depends only on the group width and dtype, never on the number of rows, so a
  row's instructions are the same whatever else is in the batch (SPEC §2).
- Per row: the sum of squares and rstd in fp64 (one per row: cheap); bf16/fp16 squares are exact
  in fp64 and fp32 squares nearly so.
- Per element, fast path in fp32, then an integer test on the fp32 result's bits: if it lies
  within the fast path's error bound of a rounding midpoint of the output format (or is
  non-finite, or tiny enough to have lost precision), the row is "flagged" and recomputed in
  fp64 on its own (scalar branch per row), rounded once. Unflagged outputs are provably the
  correctly rounded value, so flagged or not, every output equals round_once(fp64 result), which
  is also why the CPU interpreter and the GPU agree bitwise despite different exp/div
  approximations.
- fp32 outputs (x in fp32) have no spare bits to test, so they take the fp64 path everywhere.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from rlnorm.kernel._rounding import _round_fp32_to_out, _round_fp64_to_out, _widen_to_fp32

MAX_D = 8192  # largest row width (and so group width) one program holds in registers
# elements per program on the fast path: enough bytes in flight per program to stream at HBM
# speed, small enough that a flagged row is a small fraction of the program's work
TILE_ELEMENTS = 2048
MAX_BLOCK_R = 64  # flagged rows are tracked in one int64 bitmask per program

# Error bound of the fp32 fast path, in fp32 ulps of the result: NEAR_T0 + NEAR_TZ * |z|.
# Units of 2**-24 relative error (each < 1 ulp): 6 IEEE roundings (rstd to fp32, 3 products,
# 1 + e, z * sigmoid) = 6; exp2 approximation (ex2.approx.f32, < 2**-22 relative) = 4; fp32
# divide (div.full.f32, <= 2 ulp) = 4; the argument z * log2(e) rounded to fp32 shifts exp by
# |z| * 2**-24 relative = |z| units. norm_before_gate=False: the gate's error A = 9 + |z| enters
# x*act, rstd (through the mean of squares) and the product again: 3A + 3.
# Measured on the H200 (docs/kernel-notes.md): the true worst error is well inside these.
NEAR_T0_GATED = 16
NEAR_TZ_GATED = 1
NEAR_T0_GATED_PRE = 32
NEAR_TZ_GATED_PRE = 3
NEAR_T0_PLAIN = 4  # no gate: 3 roundings (rstd to fp32, x*rstd, *w)


def _eps_bits(eps: float) -> int:
    """eps as its fp64 bit pattern: Triton passes Python floats as fp32, which would change eps."""
    return struct.unpack("<q", struct.pack("<d", float(eps)))[0]


@triton.jit
def _act(z, SIGMOID: tl.constexpr):
    """sigmoid(z) or silu(z) = z * sigmoid(z), in z's precision (fp32 fast path or fp64 exact path)."""
    sig = 1.0 / (1.0 + tl.exp(-z))
    if SIGMOID:
        a = sig
    else:
        a = z * sig
    return a


@triton.jit
def _gated_fp64(
    x, z, w, eps, GROUP: tl.constexpr, HAS_Z: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr, SIGMOID: tl.constexpr
):
    """The op on a [R, BLOCK_G] fp64 tile (zeros in masked columns): the exact path."""
    if HAS_Z and not NORM_BEFORE_GATE:
        xg = x * _act(z, SIGMOID)  # [R, BLOCK_G]
    else:
        xg = x
    ms = tl.sum(xg * xg, axis=1) / GROUP  # [R]
    rstd = 1.0 / tl.sqrt(ms + eps)  # [R]: fp64 sqrt and divide are IEEE (sqrt.rn.f64, div.rn.f64)
    y = xg * rstd[:, None] * w  # [R, BLOCK_G]
    if HAS_Z and NORM_BEFORE_GATE:
        y = y * _act(z, SIGMOID)
    return y


@triton.jit
def _rms_norm_gated_fwd_kernel(
    x_ptr,
    z_ptr,
    w_ptr,
    y_ptr,
    dbg_ptr,  # fp32 [rows, D] fast-path values (DEBUG only)
    flag_ptr,  # int8 [rows, D] near-midpoint flags (DEBUG only)
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
    NEAR_T0: tl.constexpr,
    NEAR_TZ: tl.constexpr,
    DEBUG: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_g = tl.program_id(1)
    OUT: tl.constexpr = y_ptr.dtype.element_ty
    eps = eps_bits.to(tl.float64, bitcast=True)

    r_local = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    rows = pid_r * BLOCK_R + r_local  # [BLOCK_R]
    g_cols = tl.arange(0, BLOCK_G)  # [BLOCK_G]
    cols = pid_g * GROUP + g_cols  # [BLOCK_G]
    row_ok = rows < n_rows
    col_ok = g_cols < GROUP  # masks make any GROUP work; masked lanes load 0 and add 0 to sums
    mask = row_ok[:, None] & col_ok[None, :]  # [BLOCK_R, BLOCK_G]
    rows64 = rows.to(tl.int64)  # int64 offsets: rows * stride can pass 2**31

    x = _widen_to_fp32(tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0))
    w = _widen_to_fp32(tl.load(w_ptr + cols, mask=col_ok, other=0.0))  # [BLOCK_G]
    if HAS_Z:
        z = _widen_to_fp32(tl.load(z_ptr + rows64[:, None] * stride_z + cols[None, :], mask=mask, other=0.0))
    else:
        z = x  # unused
    y_off = rows64[:, None] * stride_y + cols[None, :]  # [BLOCK_R, BLOCK_G]

    if ALL_FP64:
        z64 = z.to(tl.float64)
        y64 = _gated_fp64(
            x.to(tl.float64), z64, w.to(tl.float64)[None, :], eps, GROUP, HAS_Z, NORM_BEFORE_GATE, SIGMOID
        )
        tl.store(y_ptr + y_off, _round_fp64_to_out(y64, OUT), mask=mask)
    else:
        # ---- fast path: fp32 elementwise, fp64 per-row statistics ----
        if HAS_Z:
            a = _act(z, SIGMOID)  # [BLOCK_R, BLOCK_G]
        else:
            a = x  # unused
        if HAS_Z and not NORM_BEFORE_GATE:
            xg = x * a
        else:
            xg = x
        xg64 = xg.to(tl.float64)
        ms = tl.sum(xg64 * xg64, axis=1) / GROUP  # [BLOCK_R] fp64: same tree for every row slot
        rstd64 = 1.0 / tl.sqrt(ms + eps)  # [BLOCK_R] fp64, IEEE
        rstd = rstd64.to(tl.float32)
        y = xg * rstd[:, None] * w[None, :]  # [BLOCK_R, BLOCK_G]
        if HAS_Z and NORM_BEFORE_GATE:
            y = y * a

        # ---- is the fp32 value provably on the correct side of every rounding midpoint? ----
        bits = y.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        if OUT == tl.bfloat16:
            dist = tl.abs((bits & 0xFFFF) - 0x8000)  # fp32 ulps to the nearest bf16 midpoint
            risky = mag < 0x0F800000  # |y| < 2**-96: products may have lost bits to underflow
        else:
            dist = tl.abs((bits & 0x1FFF) - 0x1000)  # fp16 normal range midpoints
            # fp16 subnormals (|y| < 2**-14) and the overflow boundary: let fp64 decide
            risky = (mag < 0x38800000) | (mag >= 0x477FE000)
        if HAS_Z:
            bound = NEAR_T0 + NEAR_TZ * tl.abs(z)
            exact_zero = (x == 0.0) | (w[None, :] == 0.0)
            if not SIGMOID:
                exact_zero = exact_zero | (z == 0.0)  # silu(0) == 0 exactly
        else:
            bound = tl.full(y.shape, NEAR_T0, tl.float32)
            exact_zero = (x == 0.0) | (w[None, :] == 0.0)
        near = dist.to(tl.float32) <= bound
        nonfinite = mag >= 0x7F800000  # overflow in fp32, or inf/nan inputs: fp64 decides
        flag = (near | nonfinite | (risky & ~exact_zero)) & mask
        # rstd outside fp32's safe normal range loses relative precision: the row goes exact
        row_flag = (tl.max(flag.to(tl.int32), axis=1) > 0) | ((rstd64 < 1e-30) & row_ok)  # [BLOCK_R]

        tl.store(y_ptr + y_off, _round_fp32_to_out(y, OUT), mask=mask & ~row_flag[:, None])
        if DEBUG:
            tl.store(dbg_ptr + rows64[:, None] * GROUP * tl.num_programs(1) + cols[None, :], y, mask=mask)
            tl.store(
                flag_ptr + rows64[:, None] * GROUP * tl.num_programs(1) + cols[None, :], flag.to(tl.int8), mask=mask
            )

        # ---- exact path for flagged rows: a scalar branch per program, then per row ----
        row_bits = tl.sum(tl.where(row_flag, tl.full([BLOCK_R], 1, tl.int64) << r_local.to(tl.int64), 0))
        if row_bits != 0:
            w64 = w.to(tl.float64)[None, :]  # [1, BLOCK_G]
            one = tl.arange(0, 1)  # [1]
            for i in range(BLOCK_R):
                if ((row_bits >> i) & 1) != 0:
                    row = (pid_r * BLOCK_R + i + one).to(tl.int64)  # [1]
                    m1 = col_ok[None, :] & (one < 1)[:, None]  # [1, BLOCK_G]
                    xr = tl.load(x_ptr + row[:, None] * stride_x + cols[None, :], mask=m1, other=0.0)
                    xr = _widen_to_fp32(xr).to(tl.float64)
                    if HAS_Z:
                        zr = tl.load(z_ptr + row[:, None] * stride_z + cols[None, :], mask=m1, other=0.0)
                        zr = _widen_to_fp32(zr).to(tl.float64)
                    else:
                        zr = xr  # unused
                    yr = _gated_fp64(xr, zr, w64, eps, GROUP, HAS_Z, NORM_BEFORE_GATE, SIGMOID)  # [1, BLOCK_G]
                    tl.store(y_ptr + row[:, None] * stride_y + cols[None, :], _round_fp64_to_out(yr, OUT), mask=m1)


def _fwd_config(group: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_G, num_warps) from the group width alone: never from the number of rows."""
    block_g = triton.next_power_of_2(group)
    block_r = max(1, min(MAX_BLOCK_R, TILE_ELEMENTS // block_g))
    num_warps = 4 if block_g <= 1024 else (8 if block_g <= 4096 else 16)
    return block_r, block_g, num_warps


def rms_norm_gated_fwd(
    x: torch.Tensor,
    z: torch.Tensor | None,
    w: torch.Tensor,
    eps: float,
    group_size: int | None,
    norm_before_gate: bool,
    activation: str,
    *,
    _debug: bool = False,
    _config: tuple[int, int, int] | None = None,
    _near: tuple[float, float] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = gated RMSNorm of 2-D x [rows, D] (last dim contiguous, any row stride); y contiguous.

    Inputs are assumed validated (api.py does that). `_debug` also returns the fp32 fast-path
    values and the near-midpoint flags (GPU error measurements); `_config` overrides the launch
    shape for timing variants (it is still independent of the row count); `_near` overrides the
    error bound (t0, tz) in fp32 ulps (tests plant a too-small bound to prove it is needed).
    """
    rows, d = x.shape
    group = group_size or d
    if d > MAX_D:
        raise ValueError(f"x: last dimension {d} exceeds the kernel's limit of {MAX_D}")
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    block_r, block_g, num_warps = _config or _fwd_config(group, x.dtype)
    has_z = z is not None
    if _debug:
        dbg = torch.full((rows, d), float("nan"), dtype=torch.float32, device=x.device)
        flags = torch.zeros((rows, d), dtype=torch.int8, device=x.device)
    else:
        dbg, flags = y, y  # unused pointers
    if rows == 0:
        return (y, dbg, flags) if _debug else y
    if has_z and norm_before_gate:
        t0, tz = NEAR_T0_GATED, NEAR_TZ_GATED
    elif has_z:
        t0, tz = NEAR_T0_GATED_PRE, NEAR_TZ_GATED_PRE
    else:
        t0, tz = NEAR_T0_PLAIN, 0
    if _near is not None:
        t0, tz = _near
    grid = (triton.cdiv(rows, block_r), d // group)
    _rms_norm_gated_fwd_kernel[grid](
        x,
        z if has_z else x,
        w,
        y,
        dbg,
        flags,
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
        NEAR_T0=t0,
        NEAR_TZ=tz,
        DEBUG=_debug,
        num_warps=num_warps,
    )
    return (y, dbg, flags) if _debug else y
