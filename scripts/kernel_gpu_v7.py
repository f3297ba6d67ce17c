"""Seventh GPU call: where the forward's exact path costs (occupancy, the fp64 gate, how many rows it
takes) and the backward at decode sizes by tiles per program.

    python scripts/kernel_gpu_v7.py   ($OUT/v7/v2.json; summary printed last)

Forward at 262144 rows against a same-run torch.add: the default; register caps (maxnreg: the rare
exact path spills, more programs fit an SM); EXACT=2 (the exact path's gate in fp32: prices the fp64
exp and divide; timing only); tighter error bounds T (timing only: prices the rows a tighter fast
path would keep off the exact path); EXACT=0. Backward: TILES per program at decode sizes (graph
time) and at 262144 rows (events), with dx/dz/dweight bits compared across TILES.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel import _bwd as B
from scripts import kernel_gpu_v2 as V

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v7")
E1, E0, E2 = {"EXACT": 1}, {"EXACT": 0}, {"EXACT": 2}


def fwd_variants(d: int) -> list[tuple[str, dict]]:
    shape = {128: [(16, 2), (4, 1), (8, 4)], 256: [(8, 2), (2, 1), (4, 4)]}[d]
    var = [("default", {"_variant": E1})]
    var += [(f"maxnreg{m}", {"_variant": E1 | {"maxnreg": m}}) for m in (32, 40, 48)]
    var += [(f"R{r}w{w}+mr40", {"_variant": E1 | {"maxnreg": 40}, "_config": (r, d, w)}) for r, w in shape]
    var += [("exact_fp32gate", {"_variant": E2}), ("exact_fp32gate+mr40", {"_variant": E2 | {"maxnreg": 40}})]
    var += [(f"T{t}", {"_variant": E1, "_near": (t, 0)}) for t in (6, 4, 2)]
    var += [("noexact", {"_variant": E0})]
    return var


def bwd_call(st, tiles: int):
    x, z, w, dy = st
    return B.rms_norm_gated_bwd(dy, x, z, w, 1e-6, None, True, "silu", config={"TILES": tiles})


def bwd_tiles(d: int) -> None:
    for rows in (32, 512, 4096):
        sets = make_sets(rows, d, torch.bfloat16, V.DEV)[:20]
        ref = bwd_call(sets[0], 31)
        for tiles in (1, 2, 4, 8, 31):
            got = bwd_call(sets[0], tiles)
            same = all(V.same_bits(a, b).all().item() for a, b in zip(got, ref, strict=True))

            def f(tiles=tiles, sets=sets):
                for st in sets:
                    bwd_call(st, tiles)

            t = V.graph_us(f, len(sets))
            V.RES["timing"].append({"d": d, "rows": rows, "name": f"bwd TILES={tiles}(graph)", "us": t, "same": same})
            V.SUMMARY.append(f"bwd graph d={d} rows={rows:<5} TILES={tiles:<3} {t:6.2f} us  bits==TILES31 {same}")
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    sets = make_sets(V.ROWS, d, torch.bfloat16, V.DEV)
    for tiles in (31, 8):
        i = [0]

        def f(tiles=tiles, i=i):
            i[0] += 1
            bwd_call(sets[i[0] % len(sets)], tiles)

        t = timer(f)
        V.RES["timing"].append({"d": d, "rows": V.ROWS, "name": f"bwd TILES={tiles}", "us": t})
        V.SUMMARY.append(f"bwd events d={d} rows={V.ROWS} TILES={tiles:<3} {t[0]:7.1f} us")


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    for d in (128, 256):
        var = fwd_variants(d)
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
    dec = [v for v in fwd_variants(128) if v[0] in ("default", "maxnreg40", "T2", "noexact", "exact_fp32gate")]
    for rows in (32, 512, 4096):
        V.guarded(f"graph128_{rows}", lambda rows=rows: V.graph_time(128, rows, dec))
    for d in (128, 256):
        V.guarded(f"bwd{d}", lambda d=d: bwd_tiles(d))
    print("\n==== summary ====")
    print("\n".join(V.SUMMARY))
    if V.RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in V.RES["errors"]])


if __name__ == "__main__":
    main()
