"""Third GPU call: the leaner fast path (fp32 rstd, native cvt.rn, integer flag tests), exact path
inline (I) vs in a second kernel over a list of flagged rows (S), by launch shape; then accuracy
and invariance of the candidates.  python scripts/kernel_gpu_v3.py  ($OUT/v3.json, summary last)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import rlnorm
from scripts import kernel_gpu_v2 as V

V.OUT = os.environ.get("OUT", "/tmp/kernel_gpu_v3")
S = {"MS_FP64": False, "ACCURATE_ARG": True, "FAST_DIV": True, "EXACT_INLINE": False}
I = {"MS_FP64": False, "ACCURATE_ARG": True, "FAST_DIV": True, "EXACT_INLINE": True}  # noqa: E741
OFF = (-1.0, 0.0)


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = V.torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    v128 = [
        (f"{n}_R{r}w{w}", {"_variant": v, "_config": (r, 128, w)})
        for n, v in (("S", S), ("I", I))
        for r, w in ((8, 4), (16, 4), (4, 2), (2, 1), (32, 8))
    ]
    v128 += [
        ("S_R8w4_noexact", {"_variant": S, "_config": (8, 128, 4), "_near": OFF}),
        ("S_R16w4_noexact", {"_variant": S, "_config": (16, 128, 4), "_near": OFF}),
    ]
    v256 = [
        (f"{n}_R{r}w{w}", {"_variant": v, "_config": (r, 256, w)})
        for n, v in (("S", S), ("I", I))
        for r, w in ((4, 4), (8, 4), (2, 2), (1, 1), (16, 8))
    ]
    v256 += [
        ("S_R4w4_noexact", {"_variant": S, "_config": (4, 256, 4), "_near": OFF}),
        ("S_R8w4_noexact", {"_variant": S, "_config": (8, 256, 4), "_near": OFF}),
    ]
    V.guarded("timing128", lambda: V.timing(128, V.ROWS, v128, timer))
    V.guarded("timing256", lambda: V.timing(256, V.ROWS, v256, timer))
    for rows in (32, 512, 4096):
        for d, cfgs in ((128, ((8, 4), (16, 4))), (256, ((4, 4), (8, 4)))):
            small = [
                (f"{n}_R{r}w{w}", {"_variant": v, "_config": (r, d, w)})
                for n, v in (("S", S), ("I", I))
                for r, w in cfgs
            ]
            V.guarded(f"timing{d}_{rows}", lambda rows=rows, d=d, small=small: V.timing(d, rows, small, timer))

    def api_timing() -> None:
        for d in (128, 256):
            for rows in (V.ROWS, 32, 512, 4096):
                sets = V.make_sets(rows, d, V.torch.bfloat16, V.DEV)
                nxt = V._rotating(sets)

                def f(nxt=nxt):
                    x, z, w, _ = nxt()
                    with V.torch.no_grad():
                        rlnorm.rms_norm_gated(x, z, w)

                t = timer(f)
                V.SUMMARY.append(f"time d={d} rows={rows:<7} api(default)     {t[0]:7.1f} us (p20 {t[1]:6.1f})")

    V.guarded("api", api_timing)
    cands = [
        (f"S_R{r}w{w}", d, {"_variant": S, "_config": (r, d, w)})
        for d, cfgs in ((128, ((8, 4), (16, 4), (4, 2))), (256, ((4, 4), (8, 4), (2, 2))))
        for r, w in cfgs
    ]
    for name, d, kw in cands:
        V.guarded(f"acc_{name}_{d}", lambda name=name, d=d, kw=kw: V.accuracy(name, d, kw))
    kw = {"_variant": S, "_config": (8, 128, 4)}
    V.guarded("acc_wide", lambda: V.accuracy("S_R8w4_wide_z8", 128, kw, zscale=8.0))
    V.guarded("acc_nbgF", lambda: V.accuracy("S_R8w4_nbg_false", 128, kw, V.OpOptions(norm_before_gate=False)))
    V.guarded("acc_sigmoid", lambda: V.accuracy("S_R8w4_sigmoid", 128, kw, V.OpOptions(activation="sigmoid")))
    V.guarded("acc_noz", lambda: V.accuracy("S_R8w4_no_z", 128, kw, has_z=False))
    kw_i = {"_variant": I, "_config": (8, 128, 4)}
    V.guarded("acc_inline", lambda: V.accuracy("I_R8w4", 128, kw_i))
    for name, d, kw in (cands[0], cands[3]):
        V.guarded(f"inv_{name}_{d}", lambda name=name, d=d, kw=kw: V.invariance(name, d, kw))
    print("\n==== summary ====")
    print("\n".join(V.SUMMARY))
    if V.RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in V.RES["errors"]])


if __name__ == "__main__":
    main()
