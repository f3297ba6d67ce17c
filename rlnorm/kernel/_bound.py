"""The forward fast path's proven error bound, and the midpoint test's threshold T derived from it.

Units: u = 2**-24, fp32's unit roundoff. A relative error of k*u in an fp32 value v is less than k fp32
ulps of v (ulp(v) > |v| * 2**-24). Each term below is one step of the compiled fast path (sm_90 PTX of
Triton 3.7.1, read with `tools/compile_sm90.py`); docs/kernel.md §3 gives the derivation. Pure Python,
so the GPU check and the tests import it without a kernel.
"""

from __future__ import annotations

import math
import re

# PTX ISA (9.7.3 Floating Point Instructions), as relative errors in u:
EX2_U = 5.0  # ex2.approx.f32: 2 ulp from the correctly rounded result -> 2.5 ulp of 2**-23 relative each
RCP_U = 2.0  # rcp.approx.f32: 1 ulp across the full range -> 2**-23 relative
# rsqrt.approx.f32 (2**-22.9 relative) enters only squared, through the Newton step: the step's own two
# roundings (h's product, half a unit; the final FMA, one) are what remain
NEWTON_U = 1.5
# the gate, bf16 z: exp(-z) = 2**(-z*L_HI) * exp(z*K) with exp(z*K) taken as 1 + z*K (dropped (zK)**2/2,
# at most 1.53 u while the output is nonzero: |z| < 87.34), 1 + z*K rounded (1), the FMA to 1 + e (1),
# ex2 (5), rcp (2). fp16 z's FMA-recovered split is smaller (7 u before rcp), so one bound covers both.
SIGMOID_U = EX2_U + 1.0 + 1.53 + 1.0 + RCP_U
SILU_U = SIGMOID_U + 1.0  # z * sigmoid(z), rounded
SLACK_U = 0.01  # second-order products of the terms (< 1e-4 u), subnormal squares kept by add.f32 (< 1e-9 u)
ELEMENTS_PER_THREAD = 16  # the default launch (_fwd.fwd_config): 16 elements of one row per thread


def sum_depth(block_g: int, split: int = 2, per_thread: int = ELEMENTS_PER_THREAD) -> int:
    """The most fp32 adds on any square's path to the row's sum of squares, as the compiled code sums.

    In a thread: with two chunks, each column pair is added first (one add), then the pairs in a chain
    (per_thread/2 - 1 adds); with one chunk, the chain over per_thread values. Across threads: a butterfly
    over the lanes (shfl.sync.bfly) and, above one warp, over the warps' partials through shared memory:
    log2(threads per row) adds. A row of at most per_thread columns is summed in one thread; any order of
    n values has depth n - 1 at most."""
    e = min(per_thread, block_g)
    in_thread = e // 2 if split == 2 and e >= 2 else e - 1
    return in_thread + int(math.log2(block_g // e))


def fast_error_ulps(
    group: int,
    has_z: bool = True,
    norm_before_gate: bool = True,
    sigmoid: bool = False,
    weight_fp32: bool = False,
    split: int = 2,
    per_thread: int = ELEMENTS_PER_THREAD,
) -> float:
    """A bound B on the fast path's error in fp32 ulps of its result, against the exact real result, for
    outputs the range test lets through (every intermediate normal: products flush, `_fwd._mul_ftz`).

    group: the group width (D without groups); split, per_thread: the launch's chunks and elements per
    thread (the defaults are the default launch's for groups of 32 columns and more)."""
    block_g = 1 << max(0, (group - 1).bit_length())
    d = sum_depth(block_g, split if block_g >= 32 else 1, per_thread)
    inv_g = 0.0 if group & (group - 1) == 0 else 1.0  # 1/group rounded to fp32 unless a power of two
    # the sum's error, or eps's rounding to fp32 where it is larger (both terms of ms are non-negative)
    sum_u = max(d + inv_g, 1.0)
    gate = (SIGMOID_U if sigmoid else SILU_U) if has_z else 0.0
    if has_z and not norm_before_gate:
        xg = gate + 1.0  # x * act(z), rounded: every square carries 2 * xg + 1 (its own rounding)
        # ms = fma(sum, 1/group, eps) rounded once; eps's own rounding is no larger than the sum's share
        rstd = (2 * xg + 1.0 + sum_u + 1.0) / 2 + NEWTON_U
        return xg + 1.0 + 1.0 + rstd + SLACK_U  # (xg * w) * rstd: two roundings
    rstd = (sum_u + 1.0) / 2 + NEWTON_U
    products = (1.0 if weight_fp32 else 0.0) + 1.0 + (1.0 if has_z else 0.0)  # x * w exact for 16-bit w
    return products + gate + rstd + SLACK_U


def near_threshold(
    group: int,
    has_z: bool = True,
    norm_before_gate: bool = True,
    sigmoid: bool = False,
    weight_fp32: bool = False,
    split: int = 2,
    per_thread: int = ELEMENTS_PER_THREAD,
) -> int:
    """T, the midpoint test's threshold in fp32 ulps: the test passes an output only if its low bits lie at
    least T + 1 ulps from the midpoint, so an error below T + 1 keeps it on the midpoint's correct side:
    T = floor(B)."""
    return math.floor(fast_error_ulps(group, has_z, norm_before_gate, sigmoid, weight_fp32, split, per_thread))


def ptx_sum_depth(ptx: str) -> int | None:
    """The most fp32 adds on any square's path into the mean square that feeds rsqrt, by dataflow over the
    forward's PTX: squares are leaves, add.f32 and a square's fma add one level, shuffles and shared memory
    pass a value on. What `sum_depth` must equal for the Triton that compiled it (tests, GPU check). None
    if the PTX has no such chain."""
    depth: dict[str, int] = {}
    stored = ms_sum = None
    for line in ptx.splitlines():
        ins = line.split("//")[0].strip().rstrip(";")
        ops = [o.strip() for o in re.split(r"[\s,]+", re.sub(r"^@%p\d+\s+", "", ins)) if o.strip()]
        if not ops:
            continue
        op, args = ops[0], ops[1:]
        if op == "mul.f32" and len(args) == 3 and args[1] == args[2]:
            depth[args[0]] = 0
        elif op == "fma.rn.f32" and len(args) == 4 and args[1] == args[2] and args[3] in depth:
            depth[args[0]] = depth[args[3]] + 1
        elif op == "add.f32" and (args[1] in depth or args[2] in depth):
            depth[args[0]] = max(depth.get(args[1], 0), depth.get(args[2], 0)) + 1
        elif op.startswith("shfl.sync.bfly") and args[1] in depth:
            depth[args[0]] = depth[args[1]]
        elif op.startswith("st.shared") and args[-1] in depth:
            stored = depth[args[-1]]
        elif op.startswith("ld.shared") and stored is not None:
            depth[args[0]] = stored
        elif op == "fma.rn.f32" and args[1] in depth and args[1] != args[2]:
            ms_sum = depth[args[1]]  # the mean square: fma(sum, 1/G, eps)
        elif op.startswith("rsqrt.approx"):
            return ms_sum
    return None
