"""Session 17: launch shapes and register caps of the forward at 262144 rows after store-first (H200, timing + bits).

    python3 scripts/kernel_gpu_v34.py     ($OUT/fwd34.json)

Why: the exact tier costs ~1.0-1.3 us at D=128 (kernel_gpu_v33), paid by the ~15% of programs (4 rows of 128) that
hold a near-midpoint element. Fewer rows per program make fewer programs take it (2 rows: ~8%) at the price of more
programs and 8 elements per thread; store-first also changed what is live across the branch, so the 64-register cap
(session 7) is timed again at 56 and 72 and uncapped. Every shape depends on the width only, and every variant's
outputs must equal the default's bit for bit (`kernel_gpu_v33.time_variants`).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v33 as V33

VARIANTS = {
    128: [
        ("default", {}),
        ("2 rows", {"_config": (2, 128, 1)}),
        ("cap 56", {"_variant": {"MAXNREG": 56}}),
        ("cap 72", {"_variant": {"MAXNREG": 72}}),
        ("uncapped", {"_variant": {"MAXNREG": 0}}),
    ],
    256: [
        ("default", {}),
        ("1 row", {"_config": (1, 256, 1)}),
        ("cap 72", {"_variant": {"MAXNREG": 72}}),
    ],
}

if __name__ == "__main__":
    V33.time_variants(VARIANTS, "fwd34.json")
