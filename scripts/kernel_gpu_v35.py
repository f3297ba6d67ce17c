"""Session 18: the shipped forward under whichever Triton imports first (the image's 3.6, or the pinned 3.7.1
carried onto the H200), so issue 5's item 7 has GPU numbers for both: correct rounding, invariance, timing.

    python3 scripts/kernel_gpu_v35.py     ($OUT/fwd35_<triton version>.json and v2.json; summary lines last)

Why: Triton 3.7.1 (the project's pin) compiles the forward to the same SASS layout as 3.6 offline (2944
instructions, no spills; scripts/compile_sm90.py), but no GPU here had run it. Per width, 262144 rows, seed 11:
outputs against fp64 rounded once (`kernel_gpu_v2.accuracy`, with sigmoid, gate first and no gate at D=128), rows
alone against sub-batches of 7 and 4097 and permuted (`kernel_gpu_v2.invariance`), then the default and the fast
path alone (`EXACT` 0) in CUDA graphs against the same process's add (`kernel_gpu_v33.time_variants`).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton

from rlnorm.options import OpOptions
from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v33 as V33

OUT = os.environ.get("OUT", "/tmp")


def main() -> None:
    print(f"triton {triton.__version__} ({triton.__file__}), torch {torch.__version__}", flush=True)
    V.RES["versions"] = {"triton": triton.__version__, "torch": torch.__version__}
    V.accuracy_and_invariance("default", {}, (128, 256))
    V.guarded("sigmoid", lambda: V.accuracy("sigmoid", 128, {}, OpOptions(activation="sigmoid")))
    V.guarded("gate first", lambda: V.accuracy("gate first", 128, {}, OpOptions(norm_before_gate=False)))
    V.guarded("no gate", lambda: V.accuracy("no gate", 128, {}, has_z=False))
    V.save()
    variants = [("default", {}), ("exact0", {"_variant": {"EXACT": 0}})]
    V33.time_variants({128: variants, 256: variants}, f"fwd35_{triton.__version__}.json")
    with open(os.path.join(OUT, f"fwd35_{triton.__version__}.json")) as f:
        timing = json.load(f)
    V.SUMMARY += [
        f"time d={t['d']} round {t['round']} {t['name']:8s} {t['us']:7.2f} us {t['us'] / t['add_us']:.3f}x add"
        for t in timing
    ]
    V.print_summary()


if __name__ == "__main__":
    main()
