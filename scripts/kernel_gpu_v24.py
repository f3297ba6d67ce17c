"""GPU call 2 of session 11 (forward): the per-element tier as one Triton loop (TIER2 2) against its
sixteen inlined PTX copies (TIER2 1).

Offline (sm_90 SASS, Triton 3.6.0 and 3.7.1 alike): 1976 instructions at D=128 and 1984 at D=256 against
3032 / 3048, 64 registers, no spills. Checks first (the loop against fp64 rounded once and against the
PTX copies, bitwise, standard data and T = 200 so ~0.6% of elements go through the tier; every tier
case; the GPU-only tests with TIER_ON=2), then each form timed in its own process, interleaved.
    V24_ROUNDS=2 python3 scripts/kernel_gpu_v24.py     (at 2974b9b: TIER2 2 exists only there)
Ran as call 2 at 2974b9b: correct everywhere, slower (docs/kernel-notes.md, session 11).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.inputs import make_case
from rlnorm.numerics import round_once
from rlnorm.reference import gated_rmsnorm_math
from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21
from scripts.kernel_gpu_v15 import CASES


def tier_cases():
    """(name, opts, x, z, w, d, fwd kwargs, fp64 rounded once) for every tier case: the standard data at
    T = 10 (silu, 262144 rows) and T = 200 (~0.6% of elements through the tier; each case, 65536 rows)."""
    for name, opts, has_z, wd in CASES:
        for d, near in ((128, None), (256, None), (128, (200, 0)), (256, (200, 0))):
            if name != "silu" and near is None:
                continue
            c = make_case(V.ROWS if name == "silu" else V.ROWS // 4, d, seed=11, device=V.DEV, weight_dtype=wd)
            z = c.z if has_z else None
            ref = round_once(gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64), torch.bfloat16)
            yield name, opts, c.x, z, c.w, d, ({"_near": near} if near else {}), ref


def wrong(y: torch.Tensor, ref: torch.Tensor) -> int:
    return int((~V.same_bits(y, ref)).sum())


def planted(d: int, variant: dict) -> list[tuple[str, int]]:
    """Wrong outputs with a planted tier fault of 2**36 fp64 ulps: covered by the margin, then not."""
    c = make_case(4096, d, seed=11, device=V.DEV)
    ref = round_once(gated_rmsnorm_math(c.x, c.z, c.w, V.OpOptions(), torch.float64), torch.bfloat16)
    out = []
    for tag, t2 in (("covered", (1 << 37, 1 << 36)), ("uncovered", (1 << 14, 1 << 36))):
        out.append((tag, wrong(V.fwd(c.x, c.z, c.w, _near=(200, 0), _tier2=t2, _variant=variant), ref)))
    return out


def agree_loop() -> None:
    for name, opts, x, z, w, d, kw, ref in tier_cases():
        y1 = V.fwd(x, z, w, opts, _variant={"TIER2": 1}, **kw)
        y2 = V.fwd(x, z, w, opts, _variant={"TIER2": 2}, **kw)
        near = kw.get("_near")
        V.SUMMARY.append(
            f"loop agree {name:<10} d={d} near={near} wrong ptx={wrong(y1, ref)} loop={wrong(y2, ref)} "
            f"ptx!=loop={wrong(y1, y2)}"
        )
    for tag, n in planted(256, {"TIER2": 2}):
        V.SUMMARY.append(f"loop planted {tag}: wrong={n}")


def main() -> None:
    V.guarded("agree_loop", agree_loop)
    V21.gpu_tests(("tests/test_kernel_exact_element.py",), {"TIER_ON": "2"})
    print("\n".join(V.SUMMARY), flush=True)
    for _ in range(int(os.environ.get("V24_ROUNDS", "2"))):
        for name, variant in (("ptx", {"TIER2": 1}), ("loop", {"TIER2": 2})):
            V21.run_probe(name, {}, variant)
    V21.run_probe("fast", {}, {"EXACT": 0})
    V.print_summary()


if __name__ == "__main__":
    main()
