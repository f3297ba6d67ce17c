"""The forward's per-element tier: an element near a rounding midpoint recomputed alone in fp64.

Why: a flagged element is rare, but a flagged row is not, and recomputing whole rows in fp64 stalls the
programs that hold one (a reload, a serial row loop, cross-warp sums). Here the program only sums its
rows' squares once more in fp64 (x read again from L1) and refines rstd by two Newton steps; then each
flagged element alone goes through an fp64 gate and product. On the GPU that per-element work is inline
PTX behind a per-lane branch, so only the lanes holding a flagged element run it; the interpreter runs
the same math tile-wide.

A tier value is used only when it is provably on one side of the midpoint: its error (below 2**-43
relative: the fp64 exp, whose reduced argument carries up to |t| * 2**-53 for |t| <= 1000, two fp64
Newton steps, a handful of fp64 roundings) is inside MARGIN_ULPS fp64 ulps (2**-38 relative).
Otherwise it reports "undecided" and the caller sends the row to the whole-row fp64 path, so the output
is the correctly rounded value in every case.
"""

from __future__ import annotations

import math
import struct

import triton
import triton.language as tl

from rlnorm.kernel._rounding import widen_to_fp32

# Undecided when the fp64 value lies within this many fp64 ulps of a bf16 midpoint (2**14 ulps is
# 2**-38 to 2**-39 relative; the tier's own error is below 2**-43, 2**-50 for |z| < 8: 16x or more)
MARGIN_ULPS = 1 << 14
# |z * log2(e)| above this leaves the exp's range reduction (2**n must stay a normal fp64): undecided
MAX_EXP_ARG = tl.constexpr(1000.0)
_EXP2_DEGREE = 12  # Taylor series of 2**f on |f| <= 1/2: truncation error 2**-52.4
# the value an undecided element comes back as: a NaN no fast path produces in a row it sends here
# (a NaN or Inf fast value makes its row risky, and risky rows never come here)
UNDECIDED_BITS = tl.constexpr(0x7FC0DEAD)


def _f64(v: float) -> str:
    """A PTX fp64 immediate (0d + the 16 hex digits of its bits)."""
    bits = struct.unpack("<Q", struct.pack("<d", v))[0]
    return f"0d{bits:016X}"


_W_LOAD = {  # w's element as fp32 in dw32, from its address in ba
    "bf16": "ld.global.nc.u16 hw, [ba];\ncvt.u32.u16 rw, hw;\nshl.b32 rw, rw, 16;\nmov.b32 dw32, rw;\n",
    "fp16": "ld.global.nc.b16 hw, [ba];\ncvt.f32.f16 dw32, hw;\n",
    "fp32": "ld.global.nc.f32 dw32, [ba];\n",
}
_W_LOG2_BYTES = {"bf16": 1, "fp16": 1, "fp32": 2}  # log2 of the element size


def _exp2_poly(coef: list[float]) -> str:
    """2**f on |f| <= 1/2 into dp, from df: the series by Horner's rule (Estrin's shallower tree was no
    faster on the H200)."""
    return f"mov.f64 dp, {_f64(coef[-1])};\n" + "".join(
        f"fma.rn.f64 dp, dp, df, {_f64(coef[k])};\n" for k in range(len(coef) - 2, -1, -1)
    )


def _ptx(gate: str, w_dtype: str) -> str:
    """The per-element tier in PTX; gate is "silu", "sigmoid" or "none", w_dtype "bf16"/"fp16"/"fp32".

    Operands: $0 value (fp32 out: the correctly rounded bf16 value; UNDECIDED when the tier cannot
    tell; $2 itself when the element is not near a midpoint or its row is not selected), $1 the
    element's column, $2 fast value, $3 / $4 the row's first x / z element (bf16; $3 = 0: row not
    selected), $5 w's first element, $6 rstd (fp64 bits), $7 margin (fp64 ulps), $8 fault (fp64
    ulps added to the value; a planted fault, else 0), $9 the fast path's bound T (fp32 ulps). The near test and
    the loads run here, by the selected lanes only: nothing of it stays in registers outside.
    Labels live inside the braces: each inlined copy has its own scope.
    """
    coef = [math.log(2) ** k / math.factorial(k) for k in range(_EXP2_DEGREE + 1)]
    body = (
        "mul.wide.u32 bo, $1, 2;\n"
        "add.s64 ba, $3, bo;\n"
        "ld.global.nc.u16 hw, [ba];\n"  # x (bf16) -> fp64, exactly
        "cvt.u32.u16 rw, hw;\n"
        "shl.b32 rw, rw, 16;\n"
        "mov.b32 dw32, rw;\n"
        "cvt.f64.f32 dy, dw32;\n"
        f"mul.wide.u32 bo, $1, {1 << _W_LOG2_BYTES[w_dtype]};\n"
        "add.s64 ba, $5, bo;\n" + _W_LOAD[w_dtype] + "cvt.f64.f32 dw, dw32;\n"
        "mul.rn.f64 dy, dy, dw;\n"  # x * w: exact in fp64
        "mul.rn.f64 dy, dy, $6;\n"
    )
    if gate != "none":
        body += (
            "mul.wide.u32 bo, $1, 2;\n"
            "add.s64 ba, $4, bo;\n"
            "ld.global.nc.u16 hw, [ba];\n"  # z (bf16)
            "cvt.u32.u16 rw, hw;\n"
            "shl.b32 rw, rw, 16;\n"
            "mov.b32 dw32, rw;\n"
            "cvt.f64.f32 dz, dw32;\n"
            f"mul.rn.f64 dt, dz, {_f64(-1.0 / math.log(2))};\n"  # exp(-z) = 2**t
            "abs.f64 dn, dt;\n"
            f"setp.gt.f64 pbad, dn, {_f64(MAX_EXP_ARG.value)};\n"
            "@pbad bra T2_UNDECIDED;\n"
            "cvt.rni.f64.f64 dn, dt;\n"
            # f = t - round(t), exact, in [-1/2, 1/2]; 2**f by the series; n = round(t)
            "sub.rn.f64 df, dt, dn;\n" + _exp2_poly(coef) + "cvt.rni.s64.f64 bn, dn;\n"
            "add.s64 bn, bn, 1023;\n"
            "shl.b64 bn, bn, 52;\n"  # 2**n, |n| <= 1000: a normal fp64
            "mov.b64 dn, bn;\n"
            "mul.rn.f64 dp, dp, dn;\n"
            "add.rn.f64 dp, dp, 0d3FF0000000000000;\n"
            "rcp.rn.f64 dp, dp;\n"  # sigmoid(z), IEEE reciprocal
        )
        if gate == "silu":
            body += "mul.rn.f64 dp, dp, dz;\n"
        body += "mul.rn.f64 dy, dy, dp;\n"
    body += (
        "mov.b64 by, dy;\n"
        "add.s64 by, by, $8;\n"
        # distance to the bf16 midpoint: fp64 keeps 45 bits below bf16's last; the midpoint is bit 44
        "and.b64 bl, by, 0x00001FFFFFFFFFFF;\n"
        "sub.s64 bl, bl, 0x0000100000000000;\n"
        "abs.s64 bl, bl;\n"
        "setp.le.s64 pbad, bl, $7;\n"
        "@pbad bra T2_UNDECIDED;\n"
        # round to nearest even at bit 45 with integers: the one rounding of the fp64 value
        "shr.u64 bl, by, 45;\n"
        "and.b64 bl, bl, 1;\n"
        "add.s64 by, by, 0x00000FFFFFFFFFFF;\n"
        "add.s64 by, by, bl;\n"
        "and.b64 by, by, 0xFFFFE00000000000;\n"
        "mov.b64 dy, by;\n"
        "cvt.rn.f32.f64 $0, dy;\n"  # exact: the value is a bf16
        "bra T2_DONE;\n"
    )
    return (
        "{\n"
        ".reg .pred pbad;\n"
        ".reg .f64 dz, dt, dn, df, dp, dy, dw;\n"
        ".reg .f32 dw32;\n"
        ".reg .b64 bn, by, bl, bo, ba;\n"
        ".reg .b32 rw, rn;\n"
        ".reg .b16 hw;\n"
        "mov.b32 $0, $2;\n"
        "setp.eq.u64 pbad, $3, 0;\n"  # row not selected
        "@pbad bra T2_DONE;\n"
        # near: |low 16 bits of the fast value - 0x8000| <= T, as the fast path tests it
        "add.s32 rn, $9, 0xFFFF8000;\n"
        "add.s32 rn, rn, $2;\n"
        "shl.b32 rn, rn, 16;\n"
        "shl.b32 rw, $9, 17;\n"
        "add.s32 rw, rw, 0x10000;\n"
        "setp.ge.u32 pbad, rn, rw;\n"
        "@pbad bra T2_DONE;\n" + body + "T2_UNDECIDED:\n"
        f"mov.b32 $0, {UNDECIDED_BITS.value:#x};\n"
        "T2_DONE:\n"
        "}"
    )


_PTX = {(g, wd): tl.constexpr(_ptx(g, wd)) for g in ("silu", "sigmoid", "none") for wd in _W_LOAD}
PTX_SILU_BF16 = _PTX["silu", "bf16"]
PTX_SILU_FP16 = _PTX["silu", "fp16"]
PTX_SILU_FP32 = _PTX["silu", "fp32"]
PTX_SIGMOID_BF16 = _PTX["sigmoid", "bf16"]
PTX_SIGMOID_FP16 = _PTX["sigmoid", "fp16"]
PTX_SIGMOID_FP32 = _PTX["sigmoid", "fp32"]
PTX_NONE_BF16 = _PTX["none", "bf16"]
PTX_NONE_FP16 = _PTX["none", "fp16"]
PTX_NONE_FP32 = _PTX["none", "fp32"]


@triton.jit
def _run_ptx(
    ptx_bf16: tl.constexpr,
    ptx_fp16: tl.constexpr,
    ptx_fp32: tl.constexpr,
    W_DTYPE: tl.constexpr,
    cols,
    y,
    x_rows,
    z_rows,
    w_ptr,
    rstd64,
    margin,
    fault,
    near_t,
):
    """One inline-PTX call per element (pack 1: each element's lane branches on its own), in the text
    for w's dtype (a jit function cannot return a string on Triton 3.6: it is chosen here)."""
    if W_DTYPE == tl.bfloat16:
        asm: tl.constexpr = ptx_bf16
    elif W_DTYPE == tl.float16:
        asm: tl.constexpr = ptx_fp16
    else:
        asm: tl.constexpr = ptx_fp32
    return tl.inline_asm_elementwise(
        asm,
        "=r,r,r,l,l,l,l,l,l,r",
        [cols, y, x_rows, z_rows, w_ptr, rstd64, margin, fault, near_t],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


@triton.jit
def exact_element(
    y,
    cols,
    rows_sel,
    x_rows,
    z_rows,
    w_ptr,
    rstd64,
    near_t,
    margin,
    fault,
    HAS_Z: tl.constexpr,
    SIGMOID: tl.constexpr,
    ASM: tl.constexpr,
):
    """The [BLOCK_R, BLOCK_C, SPLIT] tile y with its near-midpoint elements settled: fp32 values whose bf16
    cast is the correctly rounded result, UNDECIDED_BITS where the tier cannot tell, y elsewhere.
    rows_sel: [BLOCK_R, 1, 1], the rows to settle; x_rows / z_rows: [BLOCK_R, 1, 1] pointers to each row's
    first element; cols: [1, BLOCK_C, SPLIT] columns; rstd64: [BLOCK_R, 1, 1] fp64 rstd; near_t: the fast
    path's bound T in fp32 ulps."""
    if ASM:
        args = (
            cols,
            y,
            tl.where(rows_sel, x_rows.to(tl.int64, bitcast=True), 0),  # 0: a row not to touch
            z_rows.to(tl.int64, bitcast=True),
            w_ptr.to(tl.int64, bitcast=True),
            rstd64.to(tl.int64, bitcast=True),
            margin,
            fault,
            near_t,
        )
        W_DTYPE: tl.constexpr = w_ptr.dtype.element_ty
        if not HAS_Z:
            value = _run_ptx(PTX_NONE_BF16, PTX_NONE_FP16, PTX_NONE_FP32, W_DTYPE, *args)
        elif SIGMOID:
            value = _run_ptx(PTX_SIGMOID_BF16, PTX_SIGMOID_FP16, PTX_SIGMOID_FP32, W_DTYPE, *args)
        else:
            value = _run_ptx(PTX_SILU_BF16, PTX_SILU_FP16, PTX_SILU_FP32, W_DTYPE, *args)
    else:
        # the interpreter: the same decision on the whole tile (numpy's fp64 exp for the PTX series)
        near_key = (y.to(tl.int32, bitcast=True) * 65536 + ((near_t - 0x8000) * 65536)).to(tl.uint32, bitcast=True)
        flag = (near_key < (2 * near_t + 1) * 65536) & rows_sel
        x = widen_to_fp32(tl.load(x_rows + cols, mask=flag, other=0.0))
        w = tl.load(w_ptr + cols, mask=flag, other=0.0)
        if w.dtype == tl.bfloat16:
            w = widen_to_fp32(w)
        y64 = x.to(tl.float64) * w.to(tl.float64) * rstd64
        far = flag & ~flag  # all False, in the tile's shape
        if HAS_Z:
            z64 = widen_to_fp32(tl.load(z_rows + cols, mask=flag, other=0.0)).to(tl.float64)
            far = tl.abs(z64 * 1.4426950408889634) > MAX_EXP_ARG
            sig = 1.0 / (1.0 + tl.exp(-tl.where(far, 0.0, z64)))
            if SIGMOID:
                y64 = y64 * sig
            else:
                y64 = y64 * (z64 * sig)
        b = y64.to(tl.int64, bitcast=True) + fault
        dist = tl.abs((b & 0x00001FFFFFFFFFFF) - 0x0000100000000000)
        rounded = (b + 0x00000FFFFFFFFFFF + ((b >> 45) & 1)) & -0x0000200000000000
        undecided = flag & (far | (dist <= margin))
        value = tl.where(flag, rounded.to(tl.float64, bitcast=True).to(tl.float32), y)
        value = tl.where(undecided, tl.full(y.shape, UNDECIDED_BITS, tl.int32).to(tl.float32, bitcast=True), value)
    return value


@triton.jit
def rows_rstd64(ssum64, rstd, eps, GROUP: tl.constexpr):
    """[BLOCK_R] fp64 rstd of each row from its squares summed in fp64 (ssum64: exact bf16/fp16 values'
    squares, zeros in padding): two Newton steps from the fast path's fp32 rstd, whose error is below
    2**-19 even for 8192 columns (16 terms per thread, then a tree); each step squares the error (2**-37,
    then below fp64's own rounding): no fp64 sqrt or divide."""
    ms = ssum64 * (1.0 / GROUP) + eps  # [BLOCK_R]; 1/GROUP rounded once: 2**-53, and no fp64 divide
    r = rstd.to(tl.float64)  # [BLOCK_R]
    h = tl.fma(-(ms * r), r, 1.0)
    r = tl.fma(r * 0.5, h, r)
    h = tl.fma(-(ms * r), r, 1.0)
    return tl.fma(r * 0.5, h, r)
