"""Sessions 13-14: what the exact dweight's cost at D=256 is (atomics or occupancy), and cuts (timing + bits).

    python3 scripts/bwd_gpu_v15.py                             (call 1)
    V15_SET=tiles V15_ROUNDS=3 python3 scripts/bwd_gpu_v15.py  (call 2)
    V15_SET=stripes V15_ROUNDS=3 python3 scripts/bwd_gpu_v15.py  (call 3)
    V15_SET=flush V15_ROUNDS=4 python3 scripts/bwd_gpu_v15.py  (call 5)
    V15_SET=retile V15_ROUNDS=2 python3 scripts/bwd_gpu_v15.py  (session 14, call 2)
    V15_SET=stages V15_ROUNDS=2 python3 scripts/bwd_gpu_v15.py  (session 14, call 3)
    ($OUT/bwd15.json; a line per variant, then the bench's rows)

Phase 1, per D at 262144 rows: GPU time per call of the backward launcher (counter zeroing and finalize included)
from CUDA-graph replays over distinct input sets (`kernel_gpu_v2.graph_us`), against the same process's add;
floor = 5/3 of it. Every variant's dx, dz, dweight bits are compared with the default's on one input set (JOINT
changes dx/dz by design: another formula for mean(g*uh); dweight must not change anywhere but DWEIGHT 0).
Probes: TILES 16 / 8 (twice / four times the flush atomics, the same registers), DWEIGHT 0 (dx/dz alone), register
caps, JOINT (both row sums in one reduction), COLD64 (int64 tile bits: 62 tiles per program, half the atomics).
JOINT and COLD64 were switches of the experiment's tree only (COLD64: what is now the default past 31 tiles; JOINT:
measured slower, removed); outcome in docs/dweight-notes.md, session 13.
Phase 2: forward+backward through autograd with the bench's clocks (`rlnorm.bench.bench_shape`), rlnorm with the
default and with the two fastest variants per D (bwd_config patched in this process), and FLA fused_norm_gate.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel import _bwd as B
from rlnorm.kernel import _dweight
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
ROWS = int(os.environ.get("ROWS", "262144"))
RES: list[dict] = []

SETS = {
    # call 1: what the dweight costs and where (atomics: TILES 16 / 8; occupancy: caps), two cuts
    "probe": {
        128: [
            ("default", {}),
            ("t16", {"TILES": 16}),
            ("t8", {"TILES": 8}),
            ("nodw", {"DWEIGHT": 0}),
            ("joint c80", {"JOINT": 1, "maxnreg": 80}),
            ("joint nocap", {"JOINT": 1, "maxnreg": 0}),
            ("c64 t62", {"COLD64": 1, "TILES": 62}),
            ("c72 t62", {"COLD64": 1, "TILES": 62, "maxnreg": 72}),
            ("nocap t62", {"COLD64": 1, "TILES": 62, "maxnreg": 0}),
        ],
        256: [
            ("default", {}),
            ("t16", {"TILES": 16}),
            ("t8", {"TILES": 8}),
            ("nodw", {"DWEIGHT": 0}),
            ("c64", {"maxnreg": 64}),
            ("c56", {"maxnreg": 56}),
            ("joint", {"JOINT": 1}),
            ("joint c64", {"JOINT": 1, "maxnreg": 64}),
            ("t62", {"COLD64": 1, "TILES": 62}),
            ("t62 c64", {"COLD64": 1, "TILES": 62, "maxnreg": 64}),
            ("t62 joint c64", {"COLD64": 1, "TILES": 62, "JOINT": 1, "maxnreg": 64}),
        ],
    },
    # call 2: tiles per program past 31 (int64 tile bits) against the waves of resident programs
    "tiles": {
        128: [
            ("default", {}),
            ("t28", {"TILES": 28}),
            ("t32", {"COLD64": 1, "TILES": 32}),
            ("t42", {"COLD64": 1, "TILES": 42}),
            ("t48", {"COLD64": 1, "TILES": 48}),
            ("t63", {"COLD64": 1, "TILES": 63}),
            ("t63 c72", {"COLD64": 1, "TILES": 63, "maxnreg": 72}),
        ],
        256: [
            ("default", {}),
            ("t28", {"TILES": 28}),
            ("t32 c64", {"COLD64": 1, "TILES": 32, "maxnreg": 64}),
            ("t42 c64", {"COLD64": 1, "TILES": 42, "maxnreg": 64}),
            ("t48 c64", {"COLD64": 1, "TILES": 48, "maxnreg": 64}),
            ("t63 c64", {"COLD64": 1, "TILES": 63, "maxnreg": 64}),
            ("t63", {"COLD64": 1, "TILES": 63}),
        ],
    },
}
# call 3: more copies of the counters (same-address atomic contention when a wave of programs flushes at once)
SETS["stripes"] = {
    128: [("default", {}), ("s16", {"STRIPES": 16}), ("s32", {"STRIPES": 32}), ("s64", {"STRIPES": 64})],
    256: [
        ("default", {}),
        ("s16", {"STRIPES": 16}),
        ("s32", {"STRIPES": 32}),
        ("s64", {"STRIPES": 64}),
        ("t63 c64", {"COLD64": 1, "TILES": 63, "maxnreg": 64}),
        ("t63 c64 s32", {"COLD64": 1, "TILES": 63, "maxnreg": 64, "STRIPES": 32}),
    ],
}
# call 5 (after 540393c: 63 tiles at D=256): the flush's atomics in consecutive lanes (8 sectors per warp
# instruction instead of 16), with 16 tiles (twice the atomics) to show what the layout saves
SETS["flush"] = {
    d: [
        ("default", {}),
        ("fs", {"FLUSH_SCALAR": 1}),
        ("t16", {"TILES": 16}),
        ("t16 fs", {"TILES": 16, "FLUSH_SCALAR": 1}),
    ]
    for d in (128, 256)
}
# session 14, call 2: with the flush's atomics cheap, tiles per program again, and session 12's one-warp lead
SETS["retile"] = {
    128: [("default", {})]
    + [(f"t{t}", {"TILES": t}) for t in (8, 16, 24)]
    # session 12's one faster shape (2-row tiles on one warp, cold values added inline), under a cap both
    # Tritons fit without spills (sm_90 offline: 3.6 151 registers, 3.7.1 162; at cap 128 3.7.1 spills 31)
    + [(f"w1 t{t}", {"num_warps": 1, "COLD_MODE": 1, "maxnreg": 168, "TILES": t}) for t in (16, 31, 64)]
    # the same with cp.async stages instead of the register prefetch (no registers held for the next tile)
    + [(f"w1 t31 s{s}", {"num_warps": 1, "COLD_MODE": 1, "maxnreg": 168, "PREFETCH": 0, "STAGES": s}) for s in (3, 4)],
    256: [("default", {})] + [(f"t{t}", {"TILES": t}) for t in (8, 16, 24, 31, 48)],
}
# session 14, call 3: cp.async stages (retile's winner at D=128: w1 t31 s4) at both widths
W1 = {"num_warps": 1, "COLD_MODE": 1, "PREFETCH": 0, "maxnreg": 168}
SETS["stages"] = {
    128: [("default", {}), ("w1 t31 s4", dict(W1, STAGES=4))]
    + [(f"w1 t31 s{s}", dict(W1, STAGES=s)) for s in (5, 6)]
    + [(f"w1 t{t} s4", dict(W1, STAGES=4, TILES=t)) for t in (24, 40)]
    + [
        ("w1 t31 s4 rf", dict(W1, STAGES=4, RSTD_FAST=1)),
        ("w2 cold1 s4 c80", {"COLD_MODE": 1, "PREFETCH": 0, "STAGES": 4, "maxnreg": 80}),
    ],
    256: [("default", {}), ("t24", {"TILES": 24})]
    + [(f"w1 t{t} s{s}", dict(W1, STAGES=s, TILES=t)) for t, s in ((31, 4), (63, 4), (31, 3), (63, 6))]
    + [
        ("w2 cold1 s4 c104", {"COLD_MODE": 1, "PREFETCH": 0, "STAGES": 4, "maxnreg": 104}),
        ("w2 s4 c80", {"PREFETCH": 0, "STAGES": 4, "maxnreg": 80}),
        ("r2w2 cold1 s4", {"BLOCK_R": 2, "COLD_MODE": 1, "PREFETCH": 0, "STAGES": 4, "maxnreg": 168}),
    ],
}
SET = os.environ.get("V15_SET", "probe")
VARIANTS = SETS[SET]
ROUNDS = int(os.environ.get("V15_ROUNDS", "2"))


def regs() -> tuple:
    return V.last_regs(B._rms_norm_gated_bwd_kernel)


class stripes_set:
    """`with stripes_set(cfg) as kcfg:` _dweight.STRIPES from cfg's "STRIPES" (default 8), kcfg the rest."""

    def __init__(self, cfg: dict) -> None:
        self.n = cfg.get("STRIPES", 8)
        self.kcfg = {k: v for k, v in cfg.items() if k != "STRIPES"}

    def __enter__(self) -> dict:
        _dweight.STRIPES = self.n
        return self.kcfg

    def __exit__(self, *exc: object) -> None:
        _dweight.STRIPES = 8


def bits(cfg: dict, s0: tuple, ref: tuple | None) -> str:
    dx, dz, dw = B.rms_norm_gated_bwd(s0[3], s0[0], s0[1], s0[2], *ARGS, config=dict(cfg))
    torch.cuda.synchronize()
    if ref is None:
        return "ref"
    same = [torch.equal(a, b) for a, b in zip((dx, dz, dw), ref, strict=True)]
    dx_s, dz_s, dw_s = ("=" if s else "DIFF" for s in same)
    return f"dx {dx_s} dz {dz_s} dw {dw_s}"


def phase1(d: int) -> list[tuple[float, str, dict]]:
    sets = make_sets(ROWS, d, torch.bfloat16, "cuda")
    outs = [torch.empty_like(s[0]) for s in sets]
    s0 = sets[0]
    ref = B.rms_norm_gated_bwd(s0[3], s0[0], s0[1], s0[2], *ARGS)
    torch.cuda.synchronize()
    todo = VARIANTS[d]
    for rnd in range(ROUNDS):
        add_us = V.graph_us(
            lambda: [torch.add(s[0], s[1], out=o) for s, o in zip(sets, outs, strict=True)], len(sets), reps=10
        )
        floor = add_us * 5 / 3
        print(f"d={d} round {rnd} add {add_us:.1f} us, bwd floor {floor:.1f}", flush=True)
        for name, cfg in todo:
            t0 = time.time()
            try:
                with stripes_set(cfg) as kcfg:
                    same = bits(kcfg, s0, ref) if rnd == 0 else ""
                    nreg = regs() if rnd == 0 else None
                    us = V.graph_us(
                        lambda kcfg=kcfg: [
                            B.rms_norm_gated_bwd(s[3], s[0], s[1], s[2], *ARGS, config=dict(kcfg)) for s in sets
                        ],
                        len(sets),
                        reps=10,
                    )
            except Exception as exc:  # one variant failing never stops the sweep
                print(f"  {name:<14} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                RES.append({"d": d, "name": name, "error": str(exc)[:500]})
                continue
            RES.append(
                {"d": d, "round": rnd, "name": name, "cfg": cfg, "us": us, "add": add_us, "regs": nreg, "bits": same}
            )
            print(
                f"  {name:<14} {us:7.1f} us  x floor {us / floor:.3f}  regs {nreg}  {same}  ({time.time() - t0:.0f}s)",
                flush=True,
            )
            with open(os.path.join(OUT, "bwd15.json"), "w") as f:
                json.dump(RES, f, indent=1)
        if SET == "probe":  # later rounds: the default and the three fastest
            ok = sorted((r["us"], r["name"]) for r in RES if r["d"] == d and "us" in r and r["name"] != "nodw")
            best = {n for _, n in ok[:3]} | {"default", "nodw"}
            todo = [(n, c) for n, c in todo if n in best]
    per: dict[str, list[float]] = {}
    for r in RES:
        skip = ("default", "nodw", "t16", "t8", "t16 fs") if SET not in ("retile", "stages") else ("default",)
        if r["d"] == d and "us" in r and r["name"] not in skip:
            per.setdefault(r["name"], []).append(r["us"])
    ranked = sorted((sorted(v)[len(v) // 2], n) for n, v in per.items())  # medians
    cfgs = dict(VARIANTS[d])
    return [(us, n, cfgs[n]) for us, n in ranked[:2]]


def phase2(cands: dict[int, list[tuple[float, str, dict]]]) -> None:
    from rlnorm import bench
    from rlnorm.kit.backends import load_backends

    clock = bench.CudaClock("cuda")
    backends = load_backends(["rlnorm", "fla_fused_norm_gate"])
    orig = B.bwd_config
    for d, cl in cands.items():
        for name, cfg in [("default", {})] + [(n, c) for _, n, c in cl] + [("default", {})]:
            extra = {k: v for k, v in cfg.items() if k != "STRIPES"}
            _dweight.STRIPES = cfg.get("STRIPES", 8)

            def patched(dd: int, group: int, extra: dict = extra) -> dict:
                c = orig(dd, group)
                c.update(extra)
                return c

            B.bwd_config = patched
            try:
                shape = bench.bench_shape(ROWS, d, backends, "cuda", clock, bench.Settings(reps=60, warmup=5))
            finally:
                B.bwd_config = orig
                _dweight.STRIPES = 8
            for e in shape["entries"]:
                if e["us"] is not None:
                    line = (
                        f"bench d={d} {name:<14} {e['name']:<20} {e['mode']:<7} {e['us']:8.2f} us "
                        f"(p20 {e['us_p20']:7.2f} p80 {e['us_p80']:7.2f}) add {shape['add_us']:7.2f}"
                    )
                    print(line, flush=True)
                    RES.append({"bench": line})
            with open(os.path.join(OUT, "bwd15.json"), "w") as f:
                json.dump(RES, f, indent=1)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    a = torch.randn(1 << 24, device="cuda")
    t0 = time.time()
    while time.time() - t0 < 2.0:  # clocks up before the first timing
        a.add_(1.0)
    cands = {d: phase1(d) for d in (128, 256)}
    print("candidates", {d: [(round(u, 1), n) for u, n, _ in c] for d, c in cands.items()}, flush=True)
    if os.environ.get("V15_BENCH", "1") == "1":
        phase2(cands)


if __name__ == "__main__":
    main()
