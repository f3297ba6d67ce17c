"""Exact rounding, ulp distances and exact sums: the yardsticks every check measures with. `.to(torch.bfloat16)` of
float64 rounds twice (through float32), so `round_once`; `exact_sum` is the order-independent dweight (docs/spec.md §2).
"""

from __future__ import annotations

import math

import numpy as np
import torch

_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def round_to_odd_fp32(y64: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd: the sticky step that makes a second rounding exact."""
    y32 = y64.to(torch.float32)
    rem = y64 - y32.to(torch.float64)  # exact: y32 is one of y64's two float32 neighbours
    bits = y32.view(torch.int32)
    inexact_even = (rem != 0) & ((bits & 1) == 0) & torch.isfinite(y64)
    # one ulp towards y64: magnitude up where rem has y64's sign (a y32 of +-0 then steps to the smallest subnormal)
    step = torch.where((rem > 0) == (y64 > 0), 1, -1).to(torch.int32)
    return torch.where(inexact_even, bits + step, bits).view(torch.float32)


def round_once(y64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values to `dtype` (bf16, fp16, fp32) once, to nearest even."""
    if dtype in (torch.float64, torch.float32):
        return y64.to(dtype, copy=True)
    if dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"dtype: expected bfloat16, float16, float32 or float64, got {dtype}")
    # round-to-odd to 24 bits, then round-to-nearest-even to <= 11 bits: exact (24 >= 11 + 2)
    return round_to_odd_fp32(y64.to(torch.float64)).to(dtype)


def ordered_int(t: torch.Tensor) -> torch.Tensor:
    """Map floats to integers whose difference counts representable values in between (-0 == +0)."""
    if t.dtype not in _INT_VIEW:
        raise TypeError(f"t: expected bfloat16, float16 or float32, got {t.dtype}")
    bits = t.contiguous().view(_INT_VIEW[t.dtype]).to(torch.int64)
    sign_mask = 1 << (8 * t.element_size() - 1)
    mag = bits & (sign_mask - 1)
    return torch.where(bits < 0, -mag, mag)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Number of `a.dtype` values between a and b (0: bitwise equal up to the sign of zero; NaN against a number:
    the largest int64, never mistaken for close)."""
    if a.dtype != b.dtype:
        raise TypeError(f"b: expected dtype {a.dtype} like a, got {b.dtype}")
    dist = (ordered_int(a) - ordered_int(b)).abs()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return torch.where(nan_a != nan_b, torch.iinfo(torch.int64).max, torch.where(nan_a & nan_b, 0, dist))


def _odd_float(total: int) -> float:
    """total * 2**-149 as a float64 rounded to odd: one more rounding, to 24 bits or fewer, is then exact."""
    shift = max(0, abs(total).bit_length() - 53)
    q = abs(total) >> shift
    return math.copysign(math.ldexp(q | int(q << shift != abs(total)), shift - 149), total)


def exact_sum(values: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Column sums of a [N, D] float32 tensor, exact, rounded once to `dtype`: each finite float32 is m * 2**(e - 149),
    m < 2**24, so mantissas sum per exponent in int64 (exact below 2**39 rows), then as Python integers. NaN or both
    infinities sum to NaN, one infinity to itself, as the kernel's finalize (`_dweight.py`) does."""
    if values.dtype != torch.float32:
        raise TypeError(f"values: expected float32, got {values.dtype}")
    if values.dim() != 2:
        raise ValueError(f"values: expected a 2-D [rows, columns] tensor, got shape {tuple(values.shape)}")
    if dtype not in _INT_VIEW:
        raise TypeError(f"dtype: expected bfloat16, float16 or float32, got {dtype}")
    v = values.detach().cpu().numpy()
    has_nan = np.isnan(v).any(0)
    has_pos = (v == np.inf).any(0)
    has_neg = (v == -np.inf).any(0)
    v = np.where(np.isfinite(v), v, np.float32(0))  # a non-finite value adds nothing to the exact part
    bits = v.view(np.int32).astype(np.int64)
    exp_field = (bits >> 23) & 0xFF
    mant = (bits & 0x7FFFFF) | np.where(exp_field > 0, 0x800000, 0)  # the implicit one of normals
    shift = np.maximum(exp_field, 1) - 1  # subnormals share the scale of exponent field 1
    signed = np.where(bits < 0, -mant, mant)
    per_exp = np.zeros((255, v.shape[1]), dtype=np.int64)
    cols = np.broadcast_to(np.arange(v.shape[1]), v.shape)
    np.add.at(per_exp, (shift.ravel(), cols.ravel()), signed.ravel())
    special = np.where(has_nan | (has_pos & has_neg), np.nan, np.where(has_pos, np.inf, -np.inf))
    out = [
        float(special[j]) if has_nan[j] or has_pos[j] or has_neg[j]
        else _odd_float(sum(int(per_exp[k, j]) << int(k) for k in np.nonzero(per_exp[:, j])[0]))
        for j in range(v.shape[1])
    ]  # fmt: skip
    return round_once(torch.tensor(out, dtype=torch.float64), dtype)
