"""The forward's second tier: one element near a rounding midpoint recomputed alone in fp64.

Why it exists: the fp32 fast path flags an element when its result lies within the error bound T of
a bf16 rounding midpoint (~0.03% of elements, but ~4% of 128-wide rows). Recomputing whole rows in
fp64 stalled the ~28% of 8-row programs holding one (reload, a serial row loop, cross-warp sums).
Here the program that holds a flagged element only sums its rows' squares once more in fp64 (x read
again from L1) and refines rstd by two Newton steps; then each flagged element alone goes through an
fp64 gate and product, and its correctly rounded value is stored over the fast value. On the GPU that
per-element work is one inline-PTX block per thread, a loop over the thread's flagged elements (almost
always none or one), so only the lanes that hold one run it; the interpreter runs the same math
tile-wide.

A tier-2 value is used only when it is provably on one side of the midpoint: its error (< 2**-43
relative: the fp64 exp below, whose reduced argument carries up to |t| * 2**-53 for |t| <= 1000, two
fp64 Newton steps, a handful of fp64 roundings) is inside MARGIN_ULPS fp64 ulps (2**-38 relative).
Otherwise it reports "undecided" and the caller sends the row to the whole-row fp64 path, so the
output is the correctly rounded value in every case.
"""

from __future__ import annotations

import math
import struct

import triton
import triton.language as tl

from rlnorm.kernel._rounding import _exact_cast, _widen_to_fp32

# Undecided when the fp64 value lies within this many fp64 ulps of a bf16 midpoint (2**14 ulps is
# 2**-38 to 2**-39 relative; the tier's own error is below 2**-43, 2**-50 for |z| < 8: 16x or more)
MARGIN_ULPS = 1 << 14
# |z * log2(e)| above this leaves the exp's range reduction (2**n must stay a normal fp64): undecided
MAX_EXP_ARG = tl.constexpr(1000.0)
_EXP2_DEGREE = 12  # Taylor series of 2**f on |f| <= 1/2: truncation error 2**-52.4


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
    """2**f on |f| <= 1/2 into dp, from df, by Estrin's scheme: the degree-12 series as a tree of depth 4
    (Horner's chain is 12 dependent FMAs, and this runs on the one flagged lane that a launch waits for).
    15 fp64 operations against Horner's 12; error 2**-50.8 (checked against 120-bit arithmetic), far
    inside the tier's budget."""
    c = [_f64(v) for v in coef]
    assert len(c) == 13, "the tree below is written for degree 12"
    return (
        "mul.rn.f64 df2, df, df;\n"
        "mul.rn.f64 df4, df2, df2;\n"
        "mul.rn.f64 df8, df4, df4;\n"
        + "".join(f"fma.rn.f64 dq{k}, df, {c[2 * k + 1]}, {c[2 * k]};\n" for k in range(6))
        + "fma.rn.f64 dq0, dq1, df2, dq0;\n"  # terms 0-3
        "fma.rn.f64 dq2, dq3, df2, dq2;\n"  # terms 4-7
        "fma.rn.f64 dq4, dq5, df2, dq4;\n"  # terms 8-11
        f"fma.rn.f64 dq4, df4, {c[12]}, dq4;\n"  # terms 8-12, over f**8
        "fma.rn.f64 dq0, dq2, df4, dq0;\n"  # terms 0-7
        "fma.rn.f64 dp, dq4, df8, dq0;\n"
    )


# 1/d for d = 1 + exp(-z) in [1, 2**1001): MUFU's approximation, a cubic step (error e**3) and a Newton
# step (e**2): the IEEE rcp.rn.f64 does the same FMAs plus a test and a branch to a slow path for
# operands this d never is (zero, subnormal, huge); its correct rounding is not needed (budget 2**-43)
_RCP = (
    "rcp.approx.ftz.f64 dr, dp;\n"
    "neg.f64 dm, dp;\n"  # (a sign modifier in SASS)
    "fma.rn.f64 de, dm, dr, 0d3FF0000000000000;\n"  # e = 1 - d * r
    "fma.rn.f64 de, de, de, de;\n"  # e + e**2
    "fma.rn.f64 dr, dr, de, dr;\n"  # r (1 + e + e**2)
    "fma.rn.f64 de, dm, dr, 0d3FF0000000000000;\n"
    "fma.rn.f64 dp, dr, de, dr;\n"
)


# Operands of the tier's PTX, by argument (see `tier_ptx`): each comes once per packed element
_ARGS = ("keycol", "xrow", "zrow", "yrow", "rstd", "w", "margin", "fault", "lim")
_ARG_TYPES = "rlllllllr"  # keycol and lim 32-bit, the rest 64-bit


def tier_constraints(pack: int) -> str:
    """The inline-asm constraint string for `tier_ptx(..., pack)`."""
    return ",".join(["=r"] * pack + [t for t in _ARG_TYPES for _ in range(pack)])


def tier_ptx(gate: str, w_dtype: str, pack: int) -> str:
    """The per-element tier in PTX for `pack` elements of one thread; gate "silu", "sigmoid" or "none",
    w_dtype "bf16"/"fp16"/"fp32".

    One copy of the fp64 work, in a loop over the thread's selected elements (almost always none or
    one): sixteen inlined copies, one per element, made the tier's code ~25 KB, and a launch that
    needs it ran ~1.2 us longer (scripts/kernel_gpu_v20.py: the time went with the code's size more
    than with the instructions run). Per element i, operands $(pack + j * pack + i) for argument j of
    `_ARGS`: keycol (column << 16 | the fast value's near key), the row's first x / z element (x = 0:
    row not selected), rstd (fp64 bits), w's first element, margin and fault (fp64 ulps; the fault is
    added to the value, tests only) and the near limit (near: key <= limit); the scalars are read from
    element 0. Each settled element's correctly rounded bf16 value is stored here; the caller stores
    the selected rows' other elements (not these: a second store to an address the thread has just
    stored measured 1.5-4x slower at 262144 rows, call 25). Outputs $0..$(pack - 1): 1 when this
    thread left an element undecided (its row must go to the whole-row path), else 0.
    """

    def op(arg: str, i: int = 0) -> str:
        return f"${pack + _ARGS.index(arg) * pack + i}"

    coef = [math.log(2) ** k / math.factorial(k) for k in range(_EXP2_DEGREE + 1)]
    text = (
        "{\n"
        ".reg .pred p, q;\n"
        ".reg .f64 dz, dt, dn, df, dp, dy, dw, df2, df4, df8, dq0, dq1, dq2, dq3, dq4, dq5, dr, de, dm;\n"
        ".reg .f32 dw32;\n"
        ".reg .b64 bn, by, bl, bo, ba, xr, zr, yr, rs;\n"
        ".reg .b32 rw, m, lb, kc, col, und;\n"
        ".reg .b16 hw;\n"
        "mov.b32 und, 0;\n"
        "mov.b32 m, 0;\n"
    )
    for i in range(pack):  # the selected elements as a bitmask
        text += (
            f"and.b32 rw, {op('keycol', i)}, 0xFFFF;\n"
            f"setp.le.u32 p, rw, {op('lim')};\n"
            f"setp.ne.and.u64 p, {op('xrow', i)}, 0, p;\n"
            f"@p or.b32 m, m, {1 << i};\n"
        )
    text += (
        "T2_NEXT:\n"
        "setp.eq.u32 p, m, 0;\n"
        "@p bra T2_DONE;\n"
        "neg.s32 lb, m;\n"
        "and.b32 lb, lb, m;\n"  # the lowest selected element
        "xor.b32 m, m, lb;\n"
    )
    for i in range(pack):  # its operands
        text += (
            f"setp.eq.u32 q, lb, {1 << i};\n"
            f"@q mov.b32 kc, {op('keycol', i)};\n"
            f"@q mov.b64 xr, {op('xrow', i)};\n"
            f"@q mov.b64 zr, {op('zrow', i)};\n"
            f"@q mov.b64 yr, {op('yrow', i)};\n"
            f"@q mov.b64 rs, {op('rstd', i)};\n"
        )
    text += (
        "shr.u32 col, kc, 16;\n"
        "mul.wide.u32 bo, col, 2;\n"
        "add.s64 ba, xr, bo;\n"
        "ld.global.nc.u16 hw, [ba];\n"  # x (bf16) -> fp64, exactly
        "cvt.u32.u16 rw, hw;\n"
        "shl.b32 rw, rw, 16;\n"
        "mov.b32 dw32, rw;\n"
        "cvt.f64.f32 dy, dw32;\n"
        f"mul.wide.u32 bo, col, {1 << _W_LOG2_BYTES[w_dtype]};\n"
        f"add.s64 ba, {op('w')}, bo;\n" + _W_LOAD[w_dtype] + "cvt.f64.f32 dw, dw32;\n"
        "mul.rn.f64 dy, dy, dw;\n"  # x * w: exact in fp64
        "mul.rn.f64 dy, dy, rs;\n"
    )
    if gate != "none":
        text += (
            "mul.wide.u32 bo, col, 2;\n"
            "add.s64 ba, zr, bo;\n"
            "ld.global.nc.u16 hw, [ba];\n"  # z (bf16)
            "cvt.u32.u16 rw, hw;\n"
            "shl.b32 rw, rw, 16;\n"
            "mov.b32 dw32, rw;\n"
            "cvt.f64.f32 dz, dw32;\n"
            f"mul.rn.f64 dt, dz, {_f64(-1.0 / math.log(2))};\n"  # exp(-z) = 2**t
            "abs.f64 dn, dt;\n"
            f"setp.gt.f64 p, dn, {_f64(MAX_EXP_ARG.value)};\n"
            "@p bra T2_UNDECIDED;\n"
            "cvt.rni.f64.f64 dn, dt;\n"
            "sub.rn.f64 df, dt, dn;\n" + _exp2_poly(coef) + "cvt.rni.s64.f64 bn, dn;\n"  # exact: f in [-1/2, 1/2]
            "add.s64 bn, bn, 1023;\n"
            "shl.b64 bn, bn, 52;\n"  # 2**n, |n| <= 1000: a normal fp64
            "mov.b64 dn, bn;\n"
            "mul.rn.f64 dp, dp, dn;\n"
            "add.rn.f64 dp, dp, 0d3FF0000000000000;\n" + _RCP  # sigmoid(z)
        )
        if gate == "silu":
            text += "mul.rn.f64 dp, dp, dz;\n"
        text += "mul.rn.f64 dy, dy, dp;\n"
    text += (
        "mov.b64 by, dy;\n"
        f"add.s64 by, by, {op('fault')};\n"
        # distance to the bf16 midpoint: fp64 keeps 45 bits below bf16's last; the midpoint is bit 44
        "and.b64 bl, by, 0x00001FFFFFFFFFFF;\n"
        "sub.s64 bl, bl, 0x0000100000000000;\n"
        "abs.s64 bl, bl;\n"
        f"setp.le.s64 p, bl, {op('margin')};\n"
        "@p bra T2_UNDECIDED;\n"
        # round to nearest even at bit 45 with integers: the one rounding of the fp64 value; the top 16
        # bits of its fp32 form are the bf16 result (the conversion is exact: the value is a bf16)
        "shr.u64 bl, by, 45;\n"
        "and.b64 bl, bl, 1;\n"
        "add.s64 by, by, 0x00000FFFFFFFFFFF;\n"
        "add.s64 by, by, bl;\n"
        "and.b64 by, by, 0xFFFFE00000000000;\n"
        "mov.b64 dy, by;\n"
        "cvt.rn.f32.f64 dw32, dy;\n"
        "mov.b32 rw, dw32;\n"
        "shr.u32 rw, rw, 16;\n"
        "cvt.u16.u32 hw, rw;\n"
        "mul.wide.u32 bo, col, 2;\n"
        "add.s64 ba, yr, bo;\n"
        "st.global.b16 [ba], hw;\n"
        "bra T2_NEXT;\n"
        "T2_UNDECIDED:\n"
        "mov.b32 und, 1;\n"
        "bra T2_NEXT;\n"
        "T2_DONE:\n" + "".join(f"mov.b32 ${i}, und;\n" for i in range(pack)) + "}"
    )
    return text


@triton.jit
def near_midpoint(y, near_t):
    """The fast path's lean test in another form: |low 16 bits - 0x8000| <= T, as key <= 2T (an add and
    a mask per element; the same form would be merged with the fast path's keys and kept live across it,
    which spills)."""
    return (y.to(tl.int32, bitcast=True) + (near_t - 0x8000)) & 0xFFFF


@triton.jit
def exact_element(
    near_key,
    cols,
    rows_sel,
    x_rows,
    z_rows,
    y_rows,
    w_ptr,
    rstd64,
    near_t,
    margin,
    fault,
    HAS_Z: tl.constexpr,
    SIGMOID: tl.constexpr,
    ASM: tl.constexpr,
    PTX: tl.constexpr,  # tier_ptx(gate, w dtype, PACK) (GPU only)
    CONSTRAINTS: tl.constexpr,  # tier_constraints(PACK)
    PACK: tl.constexpr,  # elements per thread
):
    """Settle the near-midpoint elements (near_key <= 2T, `near_midpoint`) of the selected rows: each one's
    correctly rounded value is stored to y. Returns an int32 tile, nonzero where an element (on the GPU:
    any element of the same thread) was left undecided: its row must go to the whole-row path. rows_sel:
    [R, 1, 1], the rows to settle; x_rows / z_rows / y_rows: [R, 1, 1] pointers to each row's first
    element; cols: [1, S, C] columns; rstd64: [R, 1, 1] fp64 rstd; near_t: the fast path's bound T in
    fp32 ulps."""
    if ASM:
        und = tl.inline_asm_elementwise(
            PTX,
            CONSTRAINTS,
            [
                (cols << 16) | near_key,  # columns < 2**13 (MAX_D)
                tl.where(rows_sel, x_rows.to(tl.int64, bitcast=True), 0),  # 0: a row not to touch
                z_rows.to(tl.int64, bitcast=True),
                y_rows.to(tl.int64, bitcast=True),
                rstd64.to(tl.int64, bitcast=True),
                w_ptr.to(tl.int64, bitcast=True),
                tl.cast(margin, tl.int64),
                tl.cast(fault, tl.int64),
                2 * near_t,
            ],
            dtype=tl.int32,
            is_pure=False,  # it stores
            pack=PACK,
        )
    else:
        # the interpreter: the same decision on the whole tile (numpy's fp64 exp for the PTX series)
        flag = (near_key <= 2 * near_t) & rows_sel
        x = _widen_to_fp32(tl.load(x_rows + cols, mask=flag, other=0.0))
        w = tl.load(w_ptr + cols, mask=flag, other=0.0)
        if w.dtype == tl.bfloat16:
            w = _widen_to_fp32(w)
        y64 = x.to(tl.float64) * w.to(tl.float64) * rstd64
        far = flag & ~flag  # all False, in the tile's shape
        if HAS_Z:
            z64 = _widen_to_fp32(tl.load(z_rows + cols, mask=flag, other=0.0)).to(tl.float64)
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
        value = rounded.to(tl.float64, bitcast=True).to(tl.float32)  # exact: a bf16 value
        tl.store(y_rows + cols, _exact_cast(value, y_rows.dtype.element_ty), mask=flag & ~undecided)
        und = undecided.to(tl.int32)
    return und


@triton.jit
def rows_rstd64(ssum64, rstd, eps, GROUP: tl.constexpr):
    """[R] fp64 rstd of each row from its squares summed in fp64 (ssum64: exact bf16/fp16 values' squares,
    zeros in padding): two Newton steps from the fast path's fp32 rstd, whose error is below 2**-19 even
    for 8192 columns (16 terms per thread, then a tree); each step squares the error (2**-37, then below
    fp64's own rounding): no fp64 sqrt or divide."""
    ms = ssum64 * (1.0 / GROUP) + eps  # [R]; 1/GROUP rounded once: 2**-53, and no fp64 divide
    r = rstd.to(tl.float64)  # [R]
    h = tl.fma(-(ms * r), r, 1.0)
    r = tl.fma(r * 0.5, h, r)
    h = tl.fma(-(ms * r), r, 1.0)
    return tl.fma(r * 0.5, h, r)
