"""GPU call 17 (forward): the tile as [BLOCK_R, SPLIT, BLOCK_C], so a thread holds one row's chunks, and
the tier's branch tested by an int32 maximum; timed against the one-chunk layout (SPLIT 1) and against
32 elements per thread, then the checks of scripts/kernel_gpu_v15.py on the new default.
    V16_SECTIONS=layout python3 scripts/kernel_gpu_v16.py   (timing, two passes)
    V16_SECTIONS=checks python3 scripts/kernel_gpu_v16.py   (correctness of the default)
Writes $OUT/v16/v2.json; the summary is printed last.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v15 as V15

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v16")
GRID = {  # (BLOCK_R, num_warps), SPLIT, register cap (None: the policy)
    128: [((4, 1), 1, None), ((4, 1), 2, 56), ((4, 1), 2, 0), ((8, 2), 2, 56), ((8, 1), 4, 80), ((8, 1), 4, 0)],
    256: [((2, 1), 1, None), ((2, 1), 2, 64), ((2, 1), 2, 48), ((4, 1), 4, 80), ((4, 1), 4, 0)],
}


def layout() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    for d in (128, 256):
        var = [
            ("noexact", {"_variant": {"EXACT": 0}}),
            ("noexact_s1", {"_variant": {"EXACT": 0, "SPLIT": 1}}),
            ("default", {}),
        ]
        for (r, w), s, m in GRID[d]:
            vv = {"SPLIT": s} | ({} if m is None else {"MAXNREG": m})
            var.append((f"R{r}w{w}_s{s}_m{m}", {"_variant": vv, "_config": (r, d, w)}))
        V.timing_passes(d, var, timer)


def main() -> None:
    V.run_sections("V16_SECTIONS", {"layout": layout, "checks": V15.checks})


if __name__ == "__main__":
    main()
