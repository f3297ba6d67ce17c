"""GPU call 4 of session 11 (forward): the per-element tier as one PTX loop per thread that stores what it
settles (6b4559e's design on the joined tile, its text chosen in the kernel instead of passed as a
constexpr), against the sixteen inlined copies it replaces (421c366's kernel files).

Checks first, on the tree's default: every tier case bitwise equal to fp64 rounded once and to the
whole-row path (T = 10 on the standard data, T = 200 so ~0.6% of elements go through the tier), every
flagged row forced through the row path (a margin nothing passes), the planted tier fault caught by the
margin and visible without it, accuracy and batch invariance (sub-batches of 7 and 4097, permuted) at
both widths, the GPU-only tests. Then each form in its own process (`scripts/kernel_gpu_v25.py`'s child:
host time per launch, do_bench, CUDA-graph replays at 262144 rows, decode sizes in graphs), two rounds.
    python3 scripts/kernel_gpu_v26.py --prepare     (here: writes 421c366's kernel files, untracked)
    python3 scripts/kernel_gpu_v26.py
Ran as call 4 at 454be0a (the loop exists only there; reverted): every check passed, slower at 262144 rows
(docs/kernel-notes.md, session 11).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21
from scripts import kernel_gpu_v24 as V24
from scripts import kernel_gpu_v25 as V25

OLD_COMMIT = "421c366"
OLD = V21.kernel_files(OLD_COMMIT)


def checks() -> None:
    for name, opts, x, z, w, d, kw, ref in V24.tier_cases():
        tier = V.fwd(x, z, w, opts, **kw)
        rows = V.fwd(x, z, w, opts, _variant={"TIER2": 0}, **kw)
        undecided = V.fwd(x, z, w, opts, _tier2=(1 << 50, 0), **kw)
        V.SUMMARY.append(
            f"check {name:<10} d={d} near={kw.get('_near')} wrong tier={V24.wrong(tier, ref)} "
            f"rows={V24.wrong(rows, ref)} all-undecided={V24.wrong(undecided, ref)} of {ref.numel()}"
        )
    for d in (128, 256):
        for tag, n in V24.planted(d, {}):
            V.SUMMARY.append(f"check planted {tag} d={d}: wrong={n}")
    V.accuracy_and_invariance()


def main() -> None:
    if sys.argv[1:] == ["--prepare"]:
        V21.prepare(OLD_COMMIT, OLD)
        return
    V.guarded("checks", checks)
    V21.gpu_tests()
    print("\n".join(V.SUMMARY), flush=True)
    forms = [("loop", [], {}, {}), ("copies", [], OLD, {})]
    V21.run_forms(forms, V25.CHILD, "v26", int(os.environ.get("V26_ROUNDS", "2")), ("time", "graph", "host"))
    V.print_summary()


if __name__ == "__main__":
    main()
