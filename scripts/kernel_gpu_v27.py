"""GPU call 5 of session 11 (forward): why is 454be0a's tier (one PTX loop per thread that stores what it
settles) 4-5 us slower at D=256, 262144 rows, than the sixteen inlined copies (call 4: 104.5-105.4 us
against 100.0 in CUDA graphs), when 6b4559e's form of it on the 3-D tile was within ~1 us (call 3)?
Timing only, CUDA graphs (no host in the measurement), each form in its own process, two rounds:
- copies: 421c366's kernel files (the sixteen inlined copies);
- loop: 454be0a as committed (unflagged rows stored before the tier's branch);
- loop_late: the unflagged rows stored after the branch, as the copies do;
- loop_cap80: the loop with an 80-register cap (64 is the default).
    python3 scripts/kernel_gpu_v26.py --prepare && python3 scripts/kernel_gpu_v27.py   (at 454be0a)
Ran as call 5 at 454be0a: the loop 1.5 us slower at D=128 and 1-4 us at D=256 in every form tried
(docs/kernel-notes.md, session 11).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21
from scripts import kernel_gpu_v26 as V26

LATE = [
    (
        "_fwd.py",
        "                _store_chunks(y_rows, y, (row_ok & ~row_flag)[:, None], g2, GROUP, BLOCK_C, SPLIT, True, "
        "INTERP)\n                if tl.max(",
        "                if tl.max(",
    ),
    (
        "_fwd.py",
        "        if TIER2:\n            pass  # stored above, around the tier\n        elif EXACT == 1:",
        "        if EXACT == 1:",
    ),
]
PROBES = [
    ("copies", [], V26.OLD, {}),
    ("loop", [], {}, {}),
    ("loop_late", LATE, {}, {}),
    ("loop_cap80", [], {}, {"MAXNREG": 80}),
]

CHILD = (
    V21.CHILD_HEAD
    + r"""
kw = {"_variant": VARIANT}
for d in (256, 128):
    V.graph_time(d, V.ROWS, [(NAME + "_graph", kw)], calls=2, reps=30)
    for rows in (32, 512, 4096):
        V.graph_time(d, rows, [(NAME, kw)])
print("\n".join(V.SUMMARY))
"""
)


def main() -> None:
    V21.run_forms(PROBES, CHILD, "v27", int(os.environ.get("V27_ROUNDS", "2")), ("graph",))
    V.print_summary()


if __name__ == "__main__":
    main()
