"""Sixth GPU call (forward, shipped form): the default launch shape (1024-element tiles, 16 elements
per thread) against neighbouring shapes and the fast path alone (EXACT=0), torch.add in the same
run; decode sizes by CUDA-graph replay; accuracy and bitwise invariance of the default.
    python scripts/kernel_gpu_v6.py   ($OUT/v6/v2.json; summary printed last)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from scripts import kernel_gpu_v2 as V

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v6")
E1, E0 = {"EXACT": 1}, {"EXACT": 0}


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    shapes = {
        128: [
            ("default", E1, None),
            ("R4w1", E1, (4, 1)),
            ("R4w2", E1, (4, 2)),
            ("R16w2", E1, (16, 2)),
            ("R8w4", E1, (8, 4)),
            ("R2w1", E1, (2, 1)),
            ("noexact", E0, None),
        ],
        256: [
            ("default", E1, None),
            ("R2w1", E1, (2, 1)),
            ("R8w2", E1, (8, 2)),
            ("R2w2", E1, (2, 2)),
            ("R4w4", E1, (4, 4)),
            ("noexact", E0, None),
        ],
    }
    for d, cands in shapes.items():
        var = [(n, {"_variant": v} | ({"_config": (c[0], d, c[1])} if c else {})) for n, v, c in cands]
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
        for rows in (32, 512, 4096):
            V.guarded(f"graph{d}_{rows}", lambda d=d, rows=rows, var=var: V.graph_time(d, rows, var[:4]))
    for d in (128, 256):
        V.guarded(f"acc{d}", lambda d=d: V.accuracy("default", d, {}))
    V.guarded("acc_wide32", lambda: V.accuracy("default_wide_z32", 128, {}, zscale=32.0))
    V.guarded("acc_nbgF", lambda: V.accuracy("default_nbg_false", 128, {}, V.OpOptions(norm_before_gate=False)))
    V.guarded("acc_sigmoid", lambda: V.accuracy("default_sigmoid", 128, {}, V.OpOptions(activation="sigmoid")))
    V.guarded("acc_noz", lambda: V.accuracy("default_no_z", 128, {}, has_z=False))
    for d in (128, 256):
        V.guarded(f"inv{d}", lambda d=d: V.invariance("default", d, {}))
    V.print_summary()


if __name__ == "__main__":
    main()
