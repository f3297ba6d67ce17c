"""Explicit round-to-nearest-even in Triton, with integer bit operations.

Why not a plain `.to(tl.bfloat16)`: the Triton interpreter (CPU) rounds fp32 -> bf16 toward zero,
the GPU to nearest even, so a cast would make CPU results mean nothing about the GPU. Every
helper here returns an fp32 (or fp64) value that is already exactly representable in the target
format, so the final cast is exact and identical on both.

Why round-to-odd: an fp64 value rounded to fp32 with round-to-nearest and then again to bf16
can round twice (double rounding). Rounding to odd at 24 bits keeps a sticky bit, after which
one round-to-nearest-even to <= 22 bits gives the same result as rounding the fp64 value once.

The public names are shared by the forward, the backward and the dweight finalize.
"""

from __future__ import annotations

import triton
import triton.language as tl

# fp32 bit patterns
_F32_ABS_MASK: tl.constexpr = tl.constexpr(0x7FFFFFFF)
_F32_EXP_MASK: tl.constexpr = tl.constexpr(0x7F800000)
_F32_QUIET_BIT: tl.constexpr = tl.constexpr(0x00400000)


@triton.jit
def _round_fp32_to_bf16(v):
    """fp32 -> nearest-even bf16, returned as fp32 whose low 16 bits are zero (NaN stays NaN)."""
    bits = v.to(tl.int32, bitcast=True)
    lsb = (bits >> 16) & 1
    # add 0x7FFF + kept lsb, then clear the dropped bits: the carry rounds up past the midpoint,
    # and at the midpoint only when the kept lsb is odd (ties to even); overflow carries into inf
    rounded = (bits + (0x7FFF + lsb)) & -65536  # -65536 == 0xFFFF0000
    is_nan = (bits & _F32_ABS_MASK) > _F32_EXP_MASK
    # a NaN must not round into inf: keep its sign and top payload, force the quiet bit
    nan_bits = (bits | _F32_QUIET_BIT) & -65536
    return tl.where(is_nan, nan_bits, rounded).to(tl.float32, bitcast=True)


@triton.jit
def _round_fp32_to_fp16(v):
    """fp32 -> nearest-even fp16, returned as fp32 exactly representable in fp16 (inf on overflow).

    Normal fp16 range (|v| >= 2**-14): drop 13 of fp32's 23 mantissa bits like the bf16 case.
    Subnormal fp16 range: the quantum is 2**-24; round the 24-bit integer significand by a
    per-element shift and rebuild the value as k * 2**-24 (k <= 1024, exact in fp32).
    """
    bits = v.to(tl.int32, bitcast=True)
    sign = bits & -2147483648  # 0x80000000
    mag = bits & _F32_ABS_MASK
    # normal range: round at bit 13, ties to even
    lsb13 = (mag >> 13) & 1
    rn = (mag + (0xFFF + lsb13)) & -8192  # -8192 == ~0x1FFF
    # 65520 (0x477FF000) and above round to 65536 or more: fp16 overflow -> inf
    rn = tl.where(rn >= 0x47800000, _F32_EXP_MASK, rn)
    # subnormal range (exponent field < 113, i.e. |v| < 2**-14): value = m * 2**(e - 150)
    e_field = mag >> 23
    m = (mag & 0x7FFFFF) | 0x800000
    # dropped bits: quantum 2**-24 over the significand's unit 2**(e_field - 150); clamp at 25
    # (everything there rounds to zero) so the shift stays defined
    d = tl.minimum(113 - e_field + 13, 25)
    d = tl.maximum(d, 14)  # only used where e_field < 113, i.e. d >= 14
    half_m1 = (1 << (d - 1)) - 1
    k = (m + half_m1 + ((m >> d) & 1)) >> d
    sub = (k.to(tl.float32) * 5.9604644775390625e-08).to(tl.int32, bitcast=True)  # k * 2**-24
    out = tl.where(e_field < 113, sub, rn)
    is_nan = mag > _F32_EXP_MASK
    out = tl.where(is_nan, mag | _F32_QUIET_BIT, out)
    return (out | sign).to(tl.float32, bitcast=True)


@triton.jit
def _round_fp64_to_fp32_odd(v):
    """fp64 -> fp32 rounded to odd: exact when representable, else the neighbour with an odd lsb.

    Works whether the underlying cast truncates (interpreter) or rounds to nearest (GPU): either
    gives one of the two fp32 neighbours, and the remainder says which way the other one lies.
    """
    y32 = v.to(tl.float32)
    rem = v - y32.to(tl.float64)  # exact: y32 is one of v's two fp32 neighbours
    bits = y32.to(tl.int32, bitcast=True)
    finite = (bits & _F32_EXP_MASK) != _F32_EXP_MASK
    inexact_even = (rem != 0.0) & ((bits & 1) == 0) & finite
    # move one ulp toward v: up in magnitude if rem has y32's sign, else down
    away = (rem > 0.0) == (y32 > 0.0)
    stepped = tl.where(away, bits + 1, bits - 1)
    # y32 == 0 with a remainder: v is below the smallest subnormal; take that subnormal, v's sign
    tiny = tl.where(rem > 0.0, 1, -2147483647)  # +2**-149 / -2**-149 bit patterns
    stepped = tl.where(y32 == 0.0, tiny, stepped)
    return tl.where(inexact_even, stepped, bits).to(tl.float32, bitcast=True)


@triton.jit
def _round_fp64_to_fp32_rne(v):
    """fp64 -> nearest-even fp32, explicitly (independent of how the platform's cast rounds)."""
    y32 = v.to(tl.float32)
    rem = v - y32.to(tl.float64)
    bits = y32.to(tl.int32, bitcast=True)
    finite = (bits & _F32_EXP_MASK) != _F32_EXP_MASK
    away = (rem > 0.0) == (y32 > 0.0)
    other_bits = tl.where(away, bits + 1, bits - 1)
    other_bits = tl.where(y32 == 0.0, tl.where(rem > 0.0, 1, -2147483647), other_bits)
    other = other_bits.to(tl.float32, bitcast=True)
    d_other = tl.abs(v - other.to(tl.float64))  # exact: both within one fp32 ulp of v
    d_self = tl.abs(rem)
    take_other = (d_other < d_self) | ((d_other == d_self) & ((bits & 1) == 1))
    take_other = take_other & (rem != 0.0) & finite
    return tl.where(take_other, other, y32)


@triton.jit
def _round_store_value(v, OUT_DTYPE: tl.constexpr):
    """fp32 `v` rounded to nearest even in OUT_DTYPE, as fp32 (exactly representable: cast is exact)."""
    if OUT_DTYPE == tl.bfloat16:
        r = _round_fp32_to_bf16(v)
    elif OUT_DTYPE == tl.float16:
        r = _round_fp32_to_fp16(v)
    else:
        r = v
    return r


@triton.jit
def _round_once_from_fp64(v, OUT_DTYPE: tl.constexpr):
    """fp64 `v` rounded ONCE to nearest even in OUT_DTYPE, as fp32 (exactly representable)."""
    if OUT_DTYPE == tl.float32:
        r = _round_fp64_to_fp32_rne(v)
    else:
        r = _round_store_value(_round_fp64_to_fp32_odd(v), OUT_DTYPE)
    return r


@triton.jit
def exact_cast(r, OUT_DTYPE: tl.constexpr):
    """fp32 `r`, already exactly representable in OUT_DTYPE, as an OUT_DTYPE tensor.

    bf16 goes through the bits: the interpreter's fp32 -> bf16 conversion mangles subnormals.
    """
    if OUT_DTYPE == tl.bfloat16:
        out = (r.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        out = r.to(OUT_DTYPE)
    return out


@triton.jit
def round_fp32_to_out(v, OUT_DTYPE: tl.constexpr):
    """fp32 `v` rounded to nearest even, as an OUT_DTYPE tensor ready to store."""
    return exact_cast(_round_store_value(v, OUT_DTYPE), OUT_DTYPE)


@triton.jit
def round_fp64_to_out(v, OUT_DTYPE: tl.constexpr):
    """fp64 `v` rounded ONCE to nearest even, as an OUT_DTYPE tensor ready to store."""
    return exact_cast(_round_once_from_fp64(v, OUT_DTYPE), OUT_DTYPE)


@triton.jit
def widen_to_fp32(v):
    """A loaded bf16/fp16/fp32 tensor as fp32, exactly.

    bf16 goes through the bits (bf16 is the top half of fp32): the interpreter's bf16 -> fp32
    conversion mangles subnormals. On the GPU this is the same shift the native conversion does.
    """
    if v.dtype == tl.bfloat16:
        out = (v.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        out = v.to(tl.float32)
    return out


@triton.jit
def widen_fast(v, INTERP: tl.constexpr, ASM: tl.constexpr):
    """A loaded tile as fp32, exactly, in the fewest instructions: on the GPU (ASM) a bf16 pair (one
    32-bit register) becomes two fp32 values by one shift and one mask (the native conversion spends a
    byte permute and a shift on the high half); the interpreter goes through `widen_to_fp32`."""
    if INTERP:
        out = widen_to_fp32(v)
    elif v.dtype == tl.bfloat16 and ASM:
        out = tl.inline_asm_elementwise(
            "{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000; }",
            "=r,=r,r",
            [v],
            dtype=tl.float32,
            is_pure=True,
            pack=2,
        )
    else:
        out = v.to(tl.float32)
    return out
