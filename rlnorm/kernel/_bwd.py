"""Backward of the gated RMSNorm: dx, dz per row (batch invariant) and the exact dweight.

Math (per group of G columns; a = act(z), a' its derivative; rstd recomputed from x, z):
  norm_before_gate: xh = x*rstd,   y = xh*w*a   -> g = dy*w*a,  dx = rstd*(g - xh*mean(g*xh)),
                    dz = dy*w*xh*a',   dweight contribution c = dy*xh*a
  gate first:       u = x*a, uh = u*rstd, y = uh*w -> g = dy*w, du = rstd*(g - uh*mean(g*uh)),
                    dx = du*a, dz = du*x*a',   c = dy*uh
  z None:           a = 1 (plain RMSNorm)

Batch invariance: a program owns TILES tiles of BLOCK_R whole rows; every reduction that feeds
dx/dz runs along one row's own columns, and every launch parameter that shapes a row's arithmetic
comes from D alone (TILES, from the row count, only partitions the rows), so a row's dx/dz bits
cannot depend on its neighbours. dweight: each row's contribution c (fp32) goes through the exact
fixed-point accumulator of `_dweight.py`; only integers are added across rows (no float atomics),
so the result is order independent.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from rlnorm.kernel import _dweight
from rlnorm.kernel._dweight import accumulate, add_deferred, allow_dependent_launch, flush, hot_range
from rlnorm.kernel._fwd import MAX_D, unit_weight
from rlnorm.kernel._interpreter import INTERPRETED
from rlnorm.kernel._rounding import round_fp32_to_out, widen_fast
from rlnorm.kernel._switches import bwd_switches

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # read as Triton reads it, once per process
_INLINE_ASM = not _INTERPRET  # inline PTX (the fast gate): the GPU only, never the interpreter


@triton.jit
def _load_fp32(ptr, mask, INTERP: tl.constexpr, ASM: tl.constexpr):
    """Load and widen to fp32 exactly."""
    return widen_fast(tl.load(ptr, mask=mask, other=0.0), INTERP, ASM)


@triton.jit
def _rounded(v, OUT: tl.constexpr, INTERP: tl.constexpr):
    """fp32 -> OUT rounded once to nearest even: the GPU's cvt.rn does it natively; the
    interpreter truncates, so there the rounding is done with integer bit operations."""
    if INTERP:
        out = round_fp32_to_out(v, OUT)
    else:
        out = v.to(OUT)
    return out


@triton.jit
def _ex2_ftz(v):
    """2**v as one ex2.approx.ftz.f32: tl.exp's own approximation, without the guard for subnormal results."""
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _rcp_ftz(v):
    """1/v as one rcp.approx.ftz.f32: what the division 1.0 / v computes for 1 <= v <= 2**126."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _activation(z, ACTIVATION: tl.constexpr, ASM: tl.constexpr):
    """(act(z), act'(z)) in fp32; ACTIVATION 0 = silu, 1 = sigmoid.

    On the GPU (ASM): the same approximations as 1.0 / (1.0 + tl.exp(-z)) (ex2.approx of z * -log2(e),
    rcp.approx) without their range guards, fewer instructions per element. Equal bits wherever z > -87
    (1 + exp(-z) <= 2**126); below, sigmoid(z) < 2**-126 becomes 0 instead of a subnormal.
    """
    if ASM:
        s = _rcp_ftz(1.0 + _ex2_ftz(z * -1.4426950408889634))
    else:
        s = 1.0 / (1.0 + tl.exp(-z))
    if ACTIVATION == 0:
        act = z * s
        dact = s * (1.0 + z * (1.0 - s))
    else:
        act = s
        dact = s * (1.0 - s)
    return act, dact


@triton.jit
def _rms_norm_gated_bwd_kernel(
    DY,
    X,
    Z,
    W,
    DX,
    DZ,
    CNT,
    SCR,
    n_rows,
    d,
    group,
    n_groups,
    stride_dy,
    stride_x,
    stride_z,
    stride_dx,
    stride_dz,
    eps,
    HAS_Z: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr,
    ACTIVATION: tl.constexpr,
    NUM_WIN: tl.constexpr,
    NUM_SLOTS: tl.constexpr,
    STRIPES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_C: tl.constexpr,
    TILES: tl.constexpr,
    DWEIGHT: tl.constexpr,  # False: no dweight (no weight, or timing dx/dz alone)
    COLD_MODE: tl.constexpr,  # rare dweight values: 0 kept aside and added after the loop, 1 added inline
    HOT_WIDTH: tl.constexpr,
    PREFETCH: tl.constexpr,  # tile t + 1's loads issued before tile t's math: memory latency overlaps it
    DEBUG: tl.constexpr,  # every row's fp32 dweight contributions stored to SCR (checks)
    INTERP: tl.constexpr,
    ASM: tl.constexpr,
    PDL: tl.constexpr,  # the finalize is launched as a programmatic dependent of this kernel
    RSTD_FAST: tl.constexpr,  # rstd by rsqrt.approx + a Newton step (else 1 / sqrt_rn)
    STAGES: tl.constexpr,  # > 1: the loop's loads software-pipelined through shared memory (cp.async)
):
    """One program: TILES x BLOCK_R rows, each row seen as [groups, group size] = [BLOCK_G, BLOCK_C]."""
    allow_dependent_launch(PDL)  # the finalize's CTAs may be placed now; they wait for this kernel's end
    pid = tl.program_id(0)
    cnt_ptr = CNT + (pid % STRIPES) * NUM_SLOTS * d  # a stripe spreads atomics, never changes the exact sum
    offs_r = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    offs_g = tl.arange(0, BLOCK_G)  # [BLOCK_G]
    offs_c = tl.arange(0, BLOCK_C)  # [BLOCK_C]
    col = offs_g[:, None] * group + offs_c[None, :]  # [BLOCK_G, BLOCK_C]
    col_mask = (offs_g[:, None] < n_groups) & (offs_c[None, :] < group)
    w = _load_fp32(W + col, col_mask, INTERP, ASM)[None, :, :]  # [1, BLOCK_G, BLOCK_C]
    # x / group on the GPU is x * rcp.approx(group) (div.full): the same product, one rcp per program
    inv_group = 1.0 / group.to(tl.float32)
    c3 = col[None, :, :]  # [1, BLOCK_G, BLOCK_C]: made once, in the tile's layout
    cm3 = col_mask[None, :, :]
    acc = tl.zeros([BLOCK_R, BLOCK_G, BLOCK_C], tl.int64)  # per-thread exact sums of the hot range
    # tiles whose value went to the scratch: one bit per tile (int32; int64 past 31 tiles)
    cold_bits = tl.zeros([BLOCK_R, BLOCK_G, BLOCK_C], _dweight.tile_bits_dtype(TILES))
    # the hot range, chosen from the first tile (speed only, never the result)
    start = pid * 0
    lo = start.to(tl.float32)
    hi = lo
    scale = lo
    row0 = pid.to(tl.int64) * (TILES * BLOCK_R) + offs_r  # [BLOCK_R]; int64: row * stride can pass 2**31
    # tiles that hold rows (the last program of a short batch stops early): all-padding tiles add
    # nothing, so skipping them changes no bit, only a decode-sized batch's latency
    rows_left = tl.minimum(n_rows - pid.to(tl.int64) * (TILES * BLOCK_R), TILES * BLOCK_R).to(tl.int32)
    n_tiles = (rows_left + BLOCK_R - 1) // BLOCK_R
    if PREFETCH:
        r3n = row0[:, None, None]
        mask_n = (r3n < n_rows) & cm3
        x_next = tl.load(X + r3n * stride_x + c3, mask=mask_n, other=0.0)
        dy_next = tl.load(DY + r3n * stride_dy + c3, mask=mask_n, other=0.0)
        if HAS_Z:
            z_next = tl.load(Z + r3n * stride_z + c3, mask=mask_n, other=0.0)
    # in the interpreter (`_interpreter.py`) every program walks its TILES tiles, the all-padding ones masked
    # like a short tile's padding rows, so no bit changes
    for t in tl.range(TILES if INTERPRETED else n_tiles, num_stages=STAGES):
        rows = row0 + t * BLOCK_R
        mask = (rows < n_rows)[:, None, None] & cm3  # [BLOCK_R, BLOCK_G, BLOCK_C]
        r3 = rows[:, None, None]
        if PREFETCH:
            x_raw = x_next
            dy_raw = dy_next
            if HAS_Z:
                z_raw = z_next
            r3n = r3 + BLOCK_R
            mask_n = (r3n < n_rows) & cm3 & (t + 1 < n_tiles)
            x_next = tl.load(X + r3n * stride_x + c3, mask=mask_n, other=0.0)
            dy_next = tl.load(DY + r3n * stride_dy + c3, mask=mask_n, other=0.0)
            if HAS_Z:
                z_next = tl.load(Z + r3n * stride_z + c3, mask=mask_n, other=0.0)
        else:
            x_raw = tl.load(X + r3 * stride_x + c3, mask=mask, other=0.0)
            dy_raw = tl.load(DY + r3 * stride_dy + c3, mask=mask, other=0.0)
            if HAS_Z:
                z_raw = tl.load(Z + r3 * stride_z + c3, mask=mask, other=0.0)
        x = widen_fast(x_raw, INTERP, ASM)  # [BLOCK_R, BLOCK_G, BLOCK_C]
        dy = widen_fast(dy_raw, INTERP, ASM)
        if HAS_Z:
            z = widen_fast(z_raw, INTERP, ASM)
            act, dact = _activation(z, ACTIVATION, ASM)
        if HAS_Z and not NORM_BEFORE_GATE:
            u = x * act
        else:
            u = x
        # per-row, per-group statistics: reductions over this row's own columns only
        mean_sq = tl.sum(u * u, axis=2) * inv_group  # [BLOCK_R, BLOCK_G]
        ms = mean_sq + eps
        if RSTD_FAST and ASM:
            # rsqrt.approx and one Newton step with an FMA residual (~0.75 ulp; the forward's rstd): a
            # handful of instructions per row against sqrt.rn's slow-path test and div.full's range fixes
            r0 = libdevice.rsqrt(ms)
            rstd = tl.fma(r0 * 0.5, tl.fma(-(ms * r0), r0, 1.0), r0)[:, :, None]  # [BLOCK_R, BLOCK_G, 1]
        else:
            rstd = (1.0 / tl.sqrt_rn(ms))[:, :, None]  # [BLOCK_R, BLOCK_G, 1], correctly rounded sqrt
        uh = u * rstd
        if HAS_Z and NORM_BEFORE_GATE:
            g = dy * w * act
            contrib = dy * uh * act
        else:
            g = dy * w
            contrib = dy * uh
        c1 = (tl.sum(g * uh, axis=2) * inv_group)[:, :, None]  # [BLOCK_R, BLOCK_G, 1]
        du = rstd * (g - uh * c1)
        if HAS_Z and not NORM_BEFORE_GATE:
            dx = du * act
            dz = du * x * dact
        else:
            dx = du
            if HAS_Z:
                dz = dy * w * uh * dact
        # one round-to-nearest-even per output
        tl.store(DX + r3 * stride_dx + c3, _rounded(dx, DX.dtype.element_ty, INTERP), mask=mask)
        if HAS_Z:
            tl.store(DZ + r3 * stride_dz + c3, _rounded(dz, DZ.dtype.element_ty, INTERP), mask=mask)
        if DWEIGHT:
            # this tile's fp32 contributions enter the exact integer accumulator
            contrib = tl.where(mask, contrib, 0.0)
            if DEBUG:
                tl.store(SCR + r3 * d + c3, contrib, mask=mask)
            if t == 0:
                start, lo, hi, scale = hot_range(contrib, HOT_WIDTH)
            acc, cold_bits = accumulate(
                contrib,
                acc,
                cold_bits,
                t,
                lo,
                hi,
                scale,
                SCR + r3 * d + c3,
                cnt_ptr,
                c3,
                cm3,
                d,
                NUM_WIN,
                COLD_MODE,
            )
    if DWEIGHT:
        flush(acc, start, cnt_ptr, c3, cm3, d)
        if COLD_MODE == 0:  # the rare values kept aside: after the loop, out of its registers
            add_deferred(SCR + row0[:, None, None] * d, BLOCK_R * d, cold_bits, cnt_ptr, c3, cm3, d, NUM_WIN, TILES)


def bwd_config(d: int, group: int) -> dict[str, int]:
    """The default launch from the row width alone, never from the number of rows (batch invariance):
    the BWD_SWITCHES names (TILES: the most tiles per program; fewer where rows are few) plus BLOCK_G
    and BLOCK_C, a row as [groups, group size]."""
    block_c = triton.next_power_of_2(group)
    block_g = triton.next_power_of_2(d // group)
    width = block_c * block_g
    cfg = {
        "BLOCK_R": 1,
        "BLOCK_G": block_g,
        "BLOCK_C": block_c,
        "TILES": _dweight.INT32_TILE_BITS,
        "NUM_WARPS": 1,
        "STAGES": 1,  # 1: no cp.async pipelining of the loop's loads
        "PREFETCH": 0,
        "MAXNREG": 0,  # 0: the compiler's choice
        "COLD_MODE": 0,
        # rstd by rsqrt.approx and a Newton step where it was faster on the H200, 1 / sqrt_rn elsewhere
        "RSTD_FAST": 1 if width > 128 else 0,
        "DWEIGHT": 1,
    }
    if width <= 256:
        # One warp per program, 8 elements per thread: its barriers wait on one warp. The loads run
        # several tiles ahead through shared memory (cp.async: bytes in flight without holding
        # registers); cold dweight values are added inline; more tiles per program mean fewer flushes.
        # Stages, tiles and the register cap were chosen by timing on the H200. Rows without groups compile
        # without spills at 168 registers on Triton 3.6 and 3.7.1; grouped 256-wide rows get 200 (faster on
        # the H200), and grouped rows still spill a few registers on 3.7.1 (docs/kernel.md §6).
        cfg.update(BLOCK_R=256 // width, COLD_MODE=1, STAGES=4 if width <= 128 else 6, MAXNREG=168)
        cfg["TILES"] = 63 if width > 128 else 31
        if width > 128 and block_g > 1:
            cfg["MAXNREG"] = 200
    else:
        # 4 elements per thread (more only past 2048 columns) in CTAs of as few warps as the row allows:
        # every per-program step (the hot range's max, the flush's sums and atomics) waits for all of a
        # CTA's warps. PREFETCH overlaps tile t + 1's loads with tile t's math (wider rows keep their
        # registers for the row instead).
        cfg["NUM_WARPS"] = max(2, min(16, width // 128))
        cfg["BLOCK_R"] = max(1, 4 * 32 * cfg["NUM_WARPS"] // width)
        cfg["PREFETCH"] = 1 if width <= 2048 else 0
    return cfg


# Tiles per program. TILES only partitions the rows: a row's dx/dz bits depend on BLOCK_R and NUM_WARPS
# alone, and dweight is an exact sum whatever the partition, so no output bit depends on it. More tiles
# per program amortise each program's flush and leave fewer programs adding into the counters; fewer
# shorten the programs' serial walk; on the H200 the best split grew about as the square root of the
# tile count. The interpreter pays per program, so on the CPU about 8 programs suffice to exercise the loop.
SQRT_TILES_PER_TILE = 8


def tiles_per_program(rows: int, block_r: int, max_tiles: int) -> int:
    """Tiles per program for `rows` rows: a power of two near sqrt(tiles) / 8, at most max_tiles."""
    tiles = triton.cdiv(max(rows, 1), block_r)
    if _INTERPRET:
        want = triton.cdiv(tiles, 8)
    else:
        want = math.ceil(math.sqrt(tiles) / SQRT_TILES_PER_TILE)
    return min(max_tiles, triton.next_power_of_2(want))


def _launch_plan(rows: int, d: int, group: int) -> tuple[dict[str, int], int, int]:
    """(launch, programs, counter copies) for a backward of `rows` rows under the active switches.

    Only TILES and the copies follow the row count, and neither can change a bit: both only cut the work (the
    kit's `configurations` check runs each value of both through `testing.plant` to show it)."""
    cfg = bwd_config(d, group)
    switches = bwd_switches()
    cfg.update((name, value) for name, value in switches.items() if value is not None)
    max_tiles = _dweight.MAX_TILES_DEFERRED if cfg["COLD_MODE"] == 0 else _dweight.MAX_TILES
    if switches["TILES"] is None:
        cfg["TILES"] = tiles_per_program(rows, cfg["BLOCK_R"], min(cfg["TILES"], max_tiles))
    elif cfg["TILES"] > max_tiles:
        raise ValueError(f"plant: TILES {cfg['TILES']} exceeds {max_tiles}, the most with COLD_MODE 0")
    programs = triton.cdiv(rows, cfg["BLOCK_R"] * cfg["TILES"])
    stripes = switches["STRIPES"] or _dweight.stripes_for(programs)  # fewer copies for few programs
    return cfg, programs, stripes


def workspace_numel(rows: int, d: int, group_size: int | None) -> int:
    """int64 elements of the zeroed dweight counters a backward of `rows` rows uses (under the active switches).

    The forward can zero it inside its own launch (api.py), which saves the backward a memset launch."""
    _, _, stripes = _launch_plan(rows, d, group_size or d)
    return stripes * _dweight.NUM_SLOTS * d


def rms_norm_gated_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    z: torch.Tensor | None,
    w: torch.Tensor | None,
    eps: float,
    group_size: int | None,
    norm_before_gate: bool,
    activation: str,
    *,
    contributions: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dx, dz (x's / z's dtype; dz None when z is None) and the exact dweight (w's dtype; None when w is None).

    Inputs are validated by the caller (api.py): dy, x, z are [rows, D] with a contiguous last
    dimension, w is [D] and contiguous, or None for no weight (as if all ones, and no dweight);
    `activation` is already normalised ("silu" or "sigmoid"). The launch follows the switches of an
    active `rlnorm.kernel.testing.plant` (benchmarks, tests); a launch with the same BLOCK_R, NUM_WARPS and RSTD_FAST
    gives the same bits of dx, dz and dweight.
    `contributions` (checks only): a contiguous fp32 [rows, D] tensor that receives every row's fp32
    dweight contributions, so the accumulator can be checked against `exact_sum` of them.
    `workspace`: an int64 tensor of `workspace_numel` elements, ALL ZERO (the forward zeroed it);
    None allocates a zeroed one here.
    """
    rows, d = x.shape
    group = group_size or d
    if activation not in ("silu", "sigmoid"):
        raise ValueError(f"activation: expected 'silu' or 'sigmoid', got {activation!r}")
    if d > MAX_D:  # the forward's limit: one program holds a whole row
        raise ValueError(f"x: last dimension {d} exceeds the kernel's limit of {MAX_D}")
    if group <= 0 or d % group:
        raise ValueError(f"group_size: {group} does not divide the last dimension {d}")
    if rows >= _dweight.MAX_ROWS:
        raise ValueError(f"x: at most {_dweight.MAX_ROWS - 1} rows keep the exact dweight counters exact, got {rows}")
    cfg, programs, stripes = _launch_plan(rows, d, group)
    has_w = w is not None
    dx = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    dz = None if z is None else torch.empty((rows, d), dtype=z.dtype, device=z.device)
    if not has_w:
        if contributions is not None or workspace is not None:
            raise ValueError("w: None (no weight) has no dweight: pass neither contributions nor workspace")
        w = unit_weight(d, x.dtype, x.device)
        counters = scratch = dx  # unused: no dweight
    else:
        if workspace is None:
            counters = _dweight.new_counters(d, x.device, stripes)
        else:
            numel = stripes * _dweight.NUM_SLOTS * d
            if workspace.dtype != torch.int64 or workspace.numel() != numel or not workspace.is_contiguous():
                raise ValueError(f"workspace: expected a contiguous zeroed int64 tensor of {numel} elements")
            counters = workspace.view(stripes, _dweight.NUM_SLOTS, d)
        # COLD_MODE 0 keeps rare dweight values aside here (written only where rare, read only there)
        deferred = cfg["DWEIGHT"] and cfg["COLD_MODE"] == 0 and rows > 0
        scratch = torch.empty((rows, d), dtype=torch.float32, device=x.device) if deferred else counters
    if contributions is not None:
        if (
            contributions.shape != (rows, d)
            or contributions.dtype != torch.float32
            or not contributions.is_contiguous()
        ):
            raise ValueError(f"contributions: expected a contiguous float32 [{rows}, {d}] tensor")
        if not cfg["DWEIGHT"]:
            raise ValueError("contributions: only with DWEIGHT enabled")
        scratch = contributions  # holds every contribution; the cold ones are the same values
    pdl = has_w and rows > 0 and _dweight.pdl_for(x)
    if rows > 0:
        grid = (programs,)
        _rms_norm_gated_bwd_kernel[grid](
            dy,
            x,
            x if z is None else z,  # unused when HAS_Z is False
            w,
            dx,
            dx if dz is None else dz,
            counters,
            scratch,
            rows,
            d,
            group,
            d // group,
            dy.stride(0),
            x.stride(0),
            0 if z is None else z.stride(0),
            dx.stride(0),
            0 if dz is None else dz.stride(0),
            eps,
            HAS_Z=z is not None,
            NORM_BEFORE_GATE=bool(norm_before_gate),
            ACTIVATION=0 if activation == "silu" else 1,
            NUM_WIN=_dweight.NUM_WINDOWS,
            NUM_SLOTS=_dweight.NUM_SLOTS,
            STRIPES=counters.shape[0] if has_w else 1,
            BLOCK_R=cfg["BLOCK_R"],
            BLOCK_G=cfg["BLOCK_G"],
            BLOCK_C=cfg["BLOCK_C"],
            TILES=cfg["TILES"],
            DWEIGHT=has_w and bool(cfg["DWEIGHT"]),
            COLD_MODE=cfg["COLD_MODE"],
            HOT_WIDTH=_dweight.hot_width(cfg["TILES"]),
            PREFETCH=cfg["PREFETCH"],
            DEBUG=contributions is not None,
            INTERP=_INTERPRET,
            ASM=_INLINE_ASM,
            PDL=pdl,
            RSTD_FAST=cfg["RSTD_FAST"],
            STAGES=cfg["STAGES"],
            num_warps=cfg["NUM_WARPS"],
            **({"maxnreg": cfg["MAXNREG"]} if cfg["MAXNREG"] else {}),
        )
    dw = _dweight.finalize(counters, w.dtype, pdl=pdl) if has_w else None
    return dx, dz, dw
