"""GPU calls 15-16 (forward): one-warp launch shapes under register caps at both widths, and the checks
that the default is still the correctly rounded, batch-invariant forward (the tier against the whole-row
path and fp64 rounded once, bitwise; every flagged row forced through the one-column-per-thread row path;
accuracy; sub-batches and permutation). Calls 13-14 (the tier's ablations and the fp64 sum of squares in
the fast path, both since removed) ran `scripts/kernel_gpu_v13.py` at commits 95f4927 and 2964266.
    V15_SECTIONS=shapes python3 scripts/kernel_gpu_v15.py   (timing: shapes x caps, two passes)
    V15_SECTIONS=checks python3 scripts/kernel_gpu_v15.py   (correctness of the default)
Writes $OUT/v15/v2.json; the summary is printed last.
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
from scripts.kernel_gpu_v12 import agree, planted  # tier (the default) vs whole rows vs fp64; planted fault

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v15")  # (after the v12 import, which sets its own)
T1 = {"TIER2": 1}
CASES = [  # (name, options, has z, weight dtype)
    ("silu", V.OpOptions(), True, torch.bfloat16),
    ("sigmoid", V.OpOptions(activation="sigmoid"), True, torch.bfloat16),
    ("no_z", V.OpOptions(), False, torch.bfloat16),
    ("w_fp32", V.OpOptions(), True, torch.float32),
    ("w_fp16", V.OpOptions(), True, torch.float16),
    ("group32", V.OpOptions(group_size=32), True, torch.bfloat16),
    ("gate_first", V.OpOptions(norm_before_gate=False), True, torch.bfloat16),
]


def undecided(name: str, d: int, opts: V.OpOptions, has_z: bool, wdtype: torch.dtype) -> None:
    """A margin nothing passes: every flagged row through the one-column-per-thread row path."""
    c = make_case(V.ROWS // 4, d, seed=11, device=V.DEV, weight_dtype=wdtype)
    z = c.z if has_z else None
    y = V.fwd(c.x, z, c.w, opts, _near=(200, 0), _tier2=(1 << 50, 0))
    ref = round_once(gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64), torch.bfloat16)
    wrong = int((~V.same_bits(y, ref)).sum())
    V.RES.setdefault("undecided", []).append({"case": name, "d": d, "wrong": wrong})
    V.SUMMARY.append(f"all-undecided {name:<14} d={d} wrong={wrong} of {y.numel()}")


def shapes() -> None:
    """One-warp shapes under register caps at both widths (two passes, to see the noise)."""
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    grid = {
        128: [((4, 1), 64), ((4, 1), 56), ((2, 1), 64), ((2, 1), 56), ((8, 2), 56), ((8, 2), 48)],
        256: [((2, 1), 56), ((2, 1), 64), ((1, 1), 48), ((1, 1), 0), ((4, 2), 64), ((4, 2), 48)],
    }
    for d in (128, 256):
        var = [
            ("noexact", {"_variant": {"EXACT": 0}}),
            ("noexact_R2w1", {"_variant": {"EXACT": 0}, "_config": (2, d, 1)}),
        ]
        var += [("default", {})]
        for (r, w), m in grid[d]:
            var.append((f"tier_R{r}w{w}_m{m}", {"_variant": T1 | {"MAXNREG": m}, "_config": (r, d, w)}))
        V.timing_passes(d, var, timer)


def checks() -> None:
    for d in (128, 256):
        V.guarded(f"agree{d}", lambda d=d: agree("standard", d))
        V.guarded(f"agree{d}_T200", lambda d=d: agree("stress_T200", d, near=(200, 0)))
        V.guarded(f"planted{d}", lambda d=d: planted(d))
        V.guarded(f"undecided{d}", lambda d=d: undecided("silu", d, V.OpOptions(), True, torch.bfloat16))
    V.guarded("agree_z32", lambda: agree("z_x32", 128, zscale=32.0))
    for name, opts, has_z, wd in CASES:
        V.guarded(f"undecided_{name}", lambda n=name, o=opts, h=has_z, wd=wd: undecided(n, 128, o, h, wd))
        V.guarded(
            f"agree_{name}",
            lambda n=name, o=opts, h=has_z, wd=wd: agree(n + "_T200", 128, o, h, wdtype=wd, near=(200, 0)),
        )
    V.accuracy_and_invariance()


def main() -> None:
    V.run_sections("V15_SECTIONS", {"shapes": shapes, "checks": checks})


if __name__ == "__main__":
    main()
