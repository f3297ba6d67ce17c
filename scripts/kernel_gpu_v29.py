"""GPU calls 2-3 of session 12 (forward): 454be0a's tier (one PTX loop per thread that stores what it settles)
with the tier rows stored whole first ("dbl": the tile's 16-byte stores before the tier's branch, for every
row but the risky ones; the loop then stores its settled elements over them, from the lanes that stored
them), against the sixteen inlined copies (2686246's files) and 454be0a as committed (element-masked stores of
the tier rows' other elements, which session 11 found to be where its 262144-row time goes).
Checks of the new form first, in its own process (`scripts/kernel_gpu_v26.py`'s: every tier case against
fp64 rounded once and the row path, all-undecided, planted faults, accuracy, invariance), then timing in
CUDA graphs (scripts/kernel_gpu_v27.py's child), each form in its own process, interleaved rounds.
    python3 scripts/kernel_gpu_v29.py --prepare     (here: writes 454be0a's and 2686246's kernel files, untracked)
    python3 scripts/kernel_gpu_v29.py                       (call 2: checks of dbl, two rounds; "loop" was timed
                                                             where FORMS now has dbl_late)
    V29_CHECK=dbl_late V29_ROUNDS=3 python3 scripts/kernel_gpu_v29.py   (call 3)
Outcome (docs/kernel-notes.md, session 12): every check passed; dbl as fast as the copies at D=128 and
0.3-0.6 us faster at decode sizes, ~2.3% slower at D=256, 262144 rows; not kept.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21
from scripts import kernel_gpu_v27 as V27
from scripts.kernel_gpu_v20 import patched_tree, run_child

LOOP_COMMIT = "454be0a"
LOOP = V21.kernel_files(LOOP_COMMIT)
COPIES = V21.kernel_files("2686246")  # the sixteen inlined copies, as shipped until this session
_FIRST = (
    "                _store_chunks(y_rows, y, (row_ok & ~row_flag)[:, None], g2, GROUP, BLOCK_C, SPLIT, True, INTERP)\n"
    "                if tl.max("
)
_KEEP = (
    "                    keep = tier_row[:, None, None] & (tier_key > 2 * NEAR_T0)  # [BLOCK_R, C, S]\n"
    "                    _store_chunks(y_rows, y, row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT, True, INTERP, keep)\n"
)
DBL = [
    ("_fwd.py", _FIRST, _FIRST.replace("~row_flag", "~risky_row")),
    ("_fwd.py", _KEEP, ""),
]
_UND = "                    row_bits = _row_bits(risky_row | _row_any(und != 0))\n"
# "late": a program with no flagged row stores its tile after the branch (as the copies do); one with a
# flagged row stores it whole inside the branch, before the loop
LATE = [
    ("_fwd.py", _FIRST, "                if tl.max("),
    (
        "_fwd.py",
        _KEEP,
        "                    _store_chunks(y_rows, y, (row_ok & ~risky_row)[:, None], g2, GROUP, BLOCK_C, SPLIT, True, "
        "INTERP)\n",
    ),
    (
        "_fwd.py",
        _UND,
        _UND
        + "                else:\n"
        + "                    _store_chunks(y_rows, y, row_ok[:, None], g2, GROUP, BLOCK_C, SPLIT, True, INTERP)\n",
    ),
]
FORMS = [
    ("copies", [], COPIES, {}),
    ("dbl", DBL, LOOP, {}),
    ("dbl_late", LATE, LOOP, {}),
]
CHECK_CHILD = (
    V21.CHILD_HEAD
    + r"""
from scripts import kernel_gpu_v26 as V26
V.guarded("checks", V26.checks)
print("\n".join(V.SUMMARY))
"""
)


def main() -> None:
    if sys.argv[1:] == ["--prepare"]:
        V21.prepare(LOOP_COMMIT, LOOP)
        V21.prepare("2686246", COPIES)
        return
    for name, patches in [(n, p) for n, p, _, _ in FORMS if n in os.environ.get("V29_CHECK", "dbl").split(",")]:
        r = run_child(CHECK_CHILD, patched_tree(patches, LOOP), NAME=name, VARIANT={}, OUTF="/dev/null")
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("check", "acc", "inv", "["))]
        V.SUMMARY.extend(f"{name}: {ln}" for ln in lines)
        print(r.stdout[-6000:], r.stderr[-3000:] if r.returncode else "", flush=True)
    V21.run_forms(FORMS, V27.CHILD, "v29", int(os.environ.get("V29_ROUNDS", "2")), ("graph",))
    V.print_summary()


if __name__ == "__main__":
    main()
