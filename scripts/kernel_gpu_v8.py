"""Eighth GPU call: the forward's fixed exact-path cost (the store waiting on the row tests) against
storing first and overwriting flagged rows after a barrier (EXACT=4), with the near test off
(timing only) to price the machinery apart from the rows it recomputes; accuracy and invariance of
EXACT=4.

    python scripts/kernel_gpu_v8.py   ($OUT/v8/v2.json; summary printed last)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from scripts import kernel_gpu_v2 as V

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v8")
E1, E4 = {"EXACT": 1}, {"EXACT": 4}
VARIANTS = [
    ("default", {"_variant": E1}),
    ("store_first", {"_variant": E4}),
    ("nonear", {"_variant": E1, "_near": (-1, 0)}),
    ("store_first+nonear", {"_variant": E4, "_near": (-1, 0)}),
    ("noexact", {"_variant": {"EXACT": 0}}),
]


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    for d in (128, 256):
        V.guarded(f"timing{d}", lambda d=d: V.timing(d, V.ROWS, VARIANTS, timer))
    for rows in (32, 512, 4096):
        V.guarded(f"graph128_{rows}", lambda rows=rows: V.graph_time(128, rows, VARIANTS[:2] + VARIANTS[4:]))
    for d in (128, 256):
        V.guarded(f"acc{d}", lambda d=d: V.accuracy("store_first", d, {"_variant": E4}))
    V.guarded("acc_wide32", lambda: V.accuracy("store_first_z32", 128, {"_variant": E4}, zscale=32.0))
    V.guarded("inv128", lambda: V.invariance("store_first", 128, {"_variant": E4}))
    print("\n==== summary ====")
    print("\n".join(V.SUMMARY))
    if V.RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in V.RES["errors"]])


if __name__ == "__main__":
    main()
