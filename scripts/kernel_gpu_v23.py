"""GPU call 32 (forward): was the joined tile's D=256 loss its late load? Yes.

Call 28 timed the joined tile (f19a55f: the same layout on Triton 3.6 and 3.7) at 108 us against 101 at
D=256. Offline, at the 56-register cap ptxas issues one of z's loads ~160 instructions late there; at a
64 cap all six loads come first (docs/kernel-notes.md, session 9). 0f2b328 holds the joined tile with each
tile's loads issued before its widening. This times, each in its own process (three passes at 262144
rows, then decode sizes): the tree's tile at its caps and at 64; 0f2b328's at its caps and at 64.
Call 32 ran it at b1a543b, where the tree's tile was still the 3-D one: joined at 64 registers 101.2 us,
3-D at 56 100.6-101.2 (docs/kernel-notes.md, session 10). Since 70e9895 the tree holds the joined tile
(cap 64), so "main" and "join" are the same kernel here: check out b1a543b to repeat call 32.
    python3 scripts/kernel_gpu_v23.py --prepare      (here, in the git checkout)
    V23_ROUNDS=1 python3 scripts/kernel_gpu_v23.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21

JOIN_COMMIT = "0f2b328"
JOIN = V21.kernel_files(JOIN_COMMIT, ("_fwd.py",))
PROBES = [  # (name, kernel files, variant, widths)
    ("main", {}, {}, (256, 128)),
    ("main_cap64", {}, {"MAXNREG": 64}, (256,)),
    ("join", JOIN, {}, (256, 128)),
    ("join_cap64", JOIN, {"MAXNREG": 64}, (256,)),
]


def main() -> None:
    if sys.argv[1:] == ["--prepare"]:
        V21.prepare(JOIN_COMMIT, JOIN)
        return
    for _ in range(int(os.environ.get("V23_ROUNDS", "2"))):
        for name, files, variant, dims in PROBES:
            V21.run_probe(name, files, variant, dims)
    V.print_summary()


if __name__ == "__main__":
    main()
