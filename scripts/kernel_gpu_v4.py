"""Fourth GPU call (forward): the lean fast path (gate in 7 fp32 ops, w in the tile layout, row-minimum
midpoint tests), rsqrt+Newton rstd, and a persistent loop that loads the next row block while
computing this one; each against the v3 kernel and torch.add in the same run, then accuracy (the
fast path's true worst error sets the bound) and invariance of the candidates.
    python scripts/kernel_gpu_v4.py   ($OUT/v4/gpu_check.json; summary printed last)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import rlnorm
from scripts import kernel_gpu_v2 as V

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v4")
V3 = {"LEAN_GATE": False, "W_TILE": False, "LEAN_TEST": False, "RSTD_FAST": False, "EXACT": 1, "PERSIST": 0}
NEW = {"LEAN_GATE": True, "W_TILE": True, "LEAN_TEST": True, "RSTD_FAST": False, "EXACT": 1, "PERSIST": 0}
FAST = {**NEW, "RSTD_FAST": True}


def v(base: dict, **kw) -> dict:
    return {**base, **kw}


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = V.torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    c128 = [
        ("v3_R8w4", V3, (8, 4)),
        ("new_R8w4", NEW, (8, 4)),
        ("fast_R8w4", FAST, (8, 4)),
        ("fast_R16w4", FAST, (16, 4)),
        ("fast_R4w2", FAST, (4, 2)),
        ("fast_R8w2", FAST, (8, 2)),
        ("fast_R4w1", FAST, (4, 1)),
        ("fast_R8w4_noex", v(FAST, EXACT=0), (8, 4)),
        ("fast_R16w4_noex", v(FAST, EXACT=0), (16, 4)),
        ("v3_R8w4_noex", v(V3, EXACT=0), (8, 4)),
        ("fast_R8w4_P2", v(FAST, PERSIST=2), (8, 4)),
        ("fast_R8w4_P4", v(FAST, PERSIST=4), (8, 4)),
        ("fast_R8w4_P6", v(FAST, PERSIST=6), (8, 4)),
        ("fast_R16w4_P2", v(FAST, PERSIST=2), (16, 4)),
        ("fast_R16w4_P4", v(FAST, PERSIST=4), (16, 4)),
        ("fast_R4w2_P8", v(FAST, PERSIST=8), (4, 2)),
        ("fast_R4w2_P12", v(FAST, PERSIST=12), (4, 2)),
        ("fast_R8w4_P4_noex", v(FAST, PERSIST=4, EXACT=0), (8, 4)),
        ("fast_R16w4_P4_noex", v(FAST, PERSIST=4, EXACT=0), (16, 4)),
        ("new_R8w4_P4", v(NEW, PERSIST=4), (8, 4)),
        ("fast_R8w4_X2", v(FAST, EXACT=2), (8, 4)),
        ("fast_R16w4_X2", v(FAST, EXACT=2), (16, 4)),
        ("fast_R8w4_P4_X2", v(FAST, EXACT=2, PERSIST=4), (8, 4)),
        ("fast_R16w4_P4_X2", v(FAST, EXACT=2, PERSIST=4), (16, 4)),
    ]
    c256 = [
        ("v3_R8w4", V3, (8, 4)),
        ("new_R8w4", NEW, (8, 4)),
        ("fast_R8w4", FAST, (8, 4)),
        ("fast_R4w4", FAST, (4, 4)),
        ("fast_R4w2", FAST, (4, 2)),
        ("fast_R8w4_noex", v(FAST, EXACT=0), (8, 4)),
        ("fast_R8w4_P2", v(FAST, PERSIST=2), (8, 4)),
        ("fast_R8w4_P4", v(FAST, PERSIST=4), (8, 4)),
        ("fast_R4w4_P4", v(FAST, PERSIST=4), (4, 4)),
        ("fast_R4w2_P8", v(FAST, PERSIST=8), (4, 2)),
        ("fast_R8w4_P4_noex", v(FAST, PERSIST=4, EXACT=0), (8, 4)),
        ("fast_R8w4_X2", v(FAST, EXACT=2), (8, 4)),
        ("fast_R8w4_P4_X2", v(FAST, EXACT=2, PERSIST=4), (8, 4)),
    ]
    for d, cands in ((128, c128), (256, c256)):
        var = [(n, {"_variant": vv, "_config": (r, d, w)}) for n, vv, (r, w) in cands]
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
    for rows in (32, 512, 4096):
        for d in (128, 256):
            var = [
                (n, {"_variant": vv, "_config": (r, d, w)})
                for n, vv, (r, w) in (
                    ("v3_R8w4", V3, (8, 4)),
                    ("fast_R8w4", FAST, (8, 4)),
                    ("fast_R8w4_P4", v(FAST, PERSIST=4), (8, 4)),
                    ("fast_R4w2_P8", v(FAST, PERSIST=8), (4, 2)),
                    ("fast_R8w4_X2", v(FAST, EXACT=2), (8, 4)),
                )
            ]
            V.guarded(f"timing{d}_{rows}", lambda rows=rows, d=d, var=var: V.timing(d, rows, var, timer))

    def api_timing() -> None:
        for d in (128, 256):
            sets = V.make_sets(V.ROWS, d, V.torch.bfloat16, V.DEV)
            nxt = V._rotating(sets)

            def f(nxt=nxt):
                x, z, w, _ = nxt()
                with V.torch.no_grad():
                    rlnorm.rms_norm_gated(x, z, w)

            t = timer(f)
            V.SUMMARY.append(f"time d={d} rows={V.ROWS:<7} api(default)     {t[0]:7.1f} us (p20 {t[1]:6.1f})")

    V.guarded("api", api_timing)
    acc = [
        ("new_R8w4", 128, NEW, (8, 4)),
        ("fast_R8w4", 128, FAST, (8, 4)),
        ("fast_R16w4", 128, FAST, (16, 4)),
        ("fast_R8w4_P4", 128, v(FAST, PERSIST=4), (8, 4)),
        ("fast_R4w2_P8", 128, v(FAST, PERSIST=8), (4, 2)),
        ("fast_R8w4", 256, FAST, (8, 4)),
        ("fast_R4w2_P8", 256, v(FAST, PERSIST=8), (4, 2)),
        ("new_R8w4", 256, NEW, (8, 4)),
        ("fast_R8w4_X2", 128, v(FAST, EXACT=2), (8, 4)),
        ("fast_R8w4_P4_X2", 256, v(FAST, EXACT=2, PERSIST=4), (8, 4)),
    ]
    for name, d, vv, (r, w) in acc:
        kw = {"_variant": vv, "_config": (r, d, w)}
        V.guarded(f"acc_{name}_{d}", lambda name=name, d=d, kw=kw: V.accuracy(name, d, kw))
    kw = {"_variant": FAST, "_config": (8, 128, 4)}
    V.guarded("acc_wide", lambda: V.accuracy("fast_R8w4_wide_z8", 128, kw, zscale=8.0))
    V.guarded("acc_wide32", lambda: V.accuracy("fast_R8w4_wide_z32", 128, kw, zscale=32.0))
    V.guarded("acc_nbgF", lambda: V.accuracy("fast_R8w4_nbg_false", 128, kw, V.OpOptions(norm_before_gate=False)))
    V.guarded("acc_sigmoid", lambda: V.accuracy("fast_R8w4_sigmoid", 128, kw, V.OpOptions(activation="sigmoid")))
    V.guarded("acc_noz", lambda: V.accuracy("fast_R8w4_no_z", 128, kw, has_z=False))
    for name, d, vv, (r, w) in (
        ("fast_R8w4_P4", 128, v(FAST, PERSIST=4), (8, 4)),
        ("fast_R4w2_P8", 256, v(FAST, PERSIST=8), (4, 2)),
        ("fast_R8w4_P4_X2", 128, v(FAST, EXACT=2, PERSIST=4), (8, 4)),
    ):
        kw = {"_variant": vv, "_config": (r, d, w)}
        V.guarded(f"inv_{name}_{d}", lambda name=name, d=d, kw=kw: V.invariance(name, d, kw))
    print("\n==== summary ====")
    print("\n".join(V.SUMMARY))
    if V.RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in V.RES["errors"]])


if __name__ == "__main__":
    main()
