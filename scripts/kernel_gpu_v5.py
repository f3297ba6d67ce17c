"""Fifth GPU call (forward): the exact path for near elements alone (EXACT=3: the element's own fp64
gate and its row's fp64 rstd) against whole-row recompute (EXACT=1), by launch shape, with the
fast path alone (EXACT=0) and torch.add in the same run; decode sizes timed by CUDA-graph replay
(GPU time, no host overhead); then accuracy (worst fast-path error, correctly rounded fraction)
and bitwise invariance of the candidates.
    python scripts/kernel_gpu_v5.py   ($OUT/v5/v2.json; summary printed last)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

import rlnorm
from scripts import kernel_gpu_v2 as V

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v5")
V3 = {"LEAN_GATE": False, "W_TILE": False, "LEAN_TEST": False, "RSTD_FAST": False, "EXACT": 1}
FAST = {"LEAN_GATE": True, "W_TILE": True, "LEAN_TEST": True, "RSTD_FAST": True}
E1, E3, E0 = {**FAST, "EXACT": 1}, {**FAST, "EXACT": 3}, {**FAST, "EXACT": 0}
E3_IEEE = {**E3, "RSTD_FAST": False}


def graph_time(d: int, rows: int, variants: list[tuple[str, dict]], calls: int = 20, reps: int = 20) -> None:
    """GPU time per call from CUDA-graph replays of `calls` launches over distinct buffers."""
    sets = V.make_sets(rows, d, torch.bfloat16, V.DEV)[:calls]

    def timed(fn) -> float:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / calls)
        times.sort()
        return times[len(times) // 2]

    outs = [torch.empty_like(st[0]) for st in sets]

    def add():
        for (x, z, _, _), o in zip(sets, outs, strict=True):
            torch.add(x, z, out=o)

    add_t = timed(add)
    V.RES["timing"].append({"d": d, "rows": rows, "name": "torch.add(graph)", "us": add_t})
    for name, kw in variants:

        def f(kw=kw):
            for x, z, w, _ in sets:
                V.fwd(x, z, w, **kw)

        try:
            t = timed(f)
        except Exception as exc:
            V.SUMMARY.append(f"graph d={d} rows={rows} {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        V.RES["timing"].append({"d": d, "rows": rows, "name": name + "(graph)", "us": t, "ratio": t / add_t})
        V.SUMMARY.append(f"graph d={d} rows={rows:<5} {name:<16} {t:6.2f} us  add {add_t:5.2f}  ratio {t / add_t:.2f}")


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    c128 = [
        ("v3_R8w4", V3, (8, 4)),
        ("e1_R8w4", E1, (8, 4)),
        ("e1_R8w2", E1, (8, 2)),
        ("e3_R8w4", E3, (8, 4)),
        ("e3_R8w2", E3, (8, 2)),
        ("e3_R4w1", E3, (4, 1)),
        ("e3_R2w1", E3, (2, 1)),
        ("e3_R4w2", E3, (4, 2)),
        ("e3_R16w4", E3, (16, 4)),
        ("e3_R16w8", E3, (16, 8)),
        ("e3ieee_R8w4", E3_IEEE, (8, 4)),
        ("e3ieee_R8w2", E3_IEEE, (8, 2)),
        ("e0_R8w4", E0, (8, 4)),
        ("e0_R8w2", E0, (8, 2)),
    ]
    c256 = [
        ("v3_R8w4", V3, (8, 4)),
        ("e1_R4w2", E1, (4, 2)),
        ("e3_R8w4", E3, (8, 4)),
        ("e3_R4w2", E3, (4, 2)),
        ("e3_R4w4", E3, (4, 4)),
        ("e3_R2w1", E3, (2, 1)),
        ("e3_R8w8", E3, (8, 8)),
        ("e3_R2w2", E3, (2, 2)),
        ("e0_R8w4", E0, (8, 4)),
        ("e0_R4w2", E0, (4, 2)),
    ]
    for d, cands in ((128, c128), (256, c256)):
        var = [(n, {"_variant": vv, "_config": (r, d, w)}) for n, vv, (r, w) in cands]
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
    for d, cands in ((128, c128), (256, c256)):
        var = [(n, {"_variant": vv, "_config": (r, d, w)}) for n, vv, (r, w) in cands if not n.startswith("e0")]
        for rows in (32, 512, 4096):
            V.guarded(f"graph{d}_{rows}", lambda d=d, rows=rows, var=var: graph_time(d, rows, var))

    def api_timing() -> None:
        for d in (128, 256):
            sets = V.make_sets(V.ROWS, d, torch.bfloat16, V.DEV)
            nxt = V._rotating(sets)

            def f(nxt=nxt):
                x, z, w, _ = nxt()
                with torch.no_grad():
                    rlnorm.rms_norm_gated(x, z, w)

            t = timer(f)
            V.SUMMARY.append(f"time d={d} rows={V.ROWS:<7} api(default)     {t[0]:7.1f} us (p20 {t[1]:6.1f})")

    V.guarded("api", api_timing)
    acc = [
        ("e3_R8w4", 128, E3, (8, 4)),
        ("e3_R8w2", 128, E3, (8, 2)),
        ("e3_R4w1", 128, E3, (4, 1)),
        ("e3ieee_R8w4", 128, E3_IEEE, (8, 4)),
        ("e3_R8w4", 256, E3, (8, 4)),
        ("e3_R4w2", 256, E3, (4, 2)),
    ]
    for name, d, vv, (r, w) in acc:
        kw = {"_variant": vv, "_config": (r, d, w)}
        V.guarded(f"acc_{name}_{d}", lambda name=name, d=d, kw=kw: V.accuracy(name, d, kw))
    kw = {"_variant": E3, "_config": (8, 128, 2)}
    V.guarded("acc_wide", lambda: V.accuracy("e3_R8w2_wide_z8", 128, kw, zscale=8.0))
    V.guarded("acc_wide32", lambda: V.accuracy("e3_R8w2_wide_z32", 128, kw, zscale=32.0))
    V.guarded("acc_nbgF", lambda: V.accuracy("e3_R8w2_nbg_false", 128, kw, V.OpOptions(norm_before_gate=False)))
    V.guarded("acc_sigmoid", lambda: V.accuracy("e3_R8w2_sigmoid", 128, kw, V.OpOptions(activation="sigmoid")))
    V.guarded("acc_noz", lambda: V.accuracy("e3_R8w2_no_z", 128, kw, has_z=False))
    V.guarded("acc_grp", lambda: V.accuracy("e3_grp16_default_cfg", 128, {"_variant": E3}, V.OpOptions(group_size=16)))
    for name, d, vv, (r, w) in (("e3_R8w2", 128, E3, (8, 2)), ("e3_R4w2", 256, E3, (4, 2))):
        kw = {"_variant": vv, "_config": (r, d, w)}
        V.guarded(f"inv_{name}_{d}", lambda name=name, d=d, kw=kw: V.invariance(name, d, kw))
    print("\n==== summary ====")
    print("\n".join(V.SUMMARY))
    if V.RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in V.RES["errors"]])


if __name__ == "__main__":
    main()
