"""Session 12, calls 1 and 3: the backward's tile shape and register cap, swept at 262144 rows (timing only).

    python3 scripts/bwd_gpu_v14.py                (call 1, at e61149a)
    V14_SET=sub python3 scripts/bwd_gpu_v14.py    (call 3: needs 0e36a20's `SUB` switch, reverted next)
    ($OUT/bwd14.json; one line per variant)

GPU time per call of the backward launcher (counter zeroing and finalize included) from CUDA-graph replays
over distinct input sets (`kernel_gpu_v2.graph_us`), against the same-process add timed the same way; "floor"
= 5/3 of it (dy, x, z read; dx, dz written). Registers and spills from the compiled kernel. Shapes with
another BLOCK_R or num_warps give other dx/dz bits (another reduction tree): timings here, checks later.
Outcome (docs/dweight-notes.md, session 12): only one-warp programs of 8 columns per thread with COLD_MODE 1
were faster (3-4% at D=128); not kept (201 registers on Triton 3.7.1).
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
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
ROWS = int(os.environ.get("ROWS", "262144"))
RES: list[dict] = []


def regs() -> tuple:
    """(registers, spills) of the most recently compiled backward kernel (round 0: the variant's own)."""
    return V.last_regs(B._rms_norm_gated_bwd_kernel)


SUB2 = {"SUB": 2, "PREFETCH": 0, "num_warps": 1}


def variants(d: int) -> list[tuple[str, dict]]:
    if os.environ.get("V14_SET") == "sub":  # call 3: two tiles per loop step (SUB 2), one-warp programs
        if d == 128:
            return [
                ("default", {}),
                ("s2 r2w1", {**SUB2, "BLOCK_R": 2, "maxnreg": 0}),
                ("s2 r2w1 c128", {**SUB2, "BLOCK_R": 2, "maxnreg": 128}),
                ("s2 r2w1 c128 fast", {**SUB2, "BLOCK_R": 2, "maxnreg": 128, "RSTD_FAST": 1}),
                ("s2 r1w1", {**SUB2, "BLOCK_R": 1, "maxnreg": 0}),
                ("s2 r1w1 c80", {**SUB2, "BLOCK_R": 1, "maxnreg": 80}),
                ("s2 r2w2", {**SUB2, "BLOCK_R": 2, "num_warps": 2, "maxnreg": 0}),
                ("r2w1 pf cold1", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 0, "COLD_MODE": 1}),
            ]
        return [
            ("default", {}),
            ("s2 r1w1", {**SUB2, "BLOCK_R": 1, "maxnreg": 0}),
            ("s2 r1w1 c128", {**SUB2, "BLOCK_R": 1, "maxnreg": 128}),
            ("s2 r1w2", {**SUB2, "BLOCK_R": 1, "num_warps": 2, "maxnreg": 0}),
        ]
    if d == 128:
        return [
            ("default", {}),
            ("r2w1 pf", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 0}),
            ("r2w1 pf c96", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 96}),
            ("r2w1 pf c80", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 80}),
            ("r2w1 nopf", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 0, "PREFETCH": 0}),
            ("r2w1 nopf c80", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 80, "PREFETCH": 0}),
            ("r2w1 pf fast", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 0, "RSTD_FAST": 1}),
            ("r2w1 pf cold1", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 0, "COLD_MODE": 1}),
            ("r4w1 nopf", {"BLOCK_R": 4, "num_warps": 1, "maxnreg": 0, "PREFETCH": 0}),
            ("r4w1 nopf c128", {"BLOCK_R": 4, "num_warps": 1, "maxnreg": 128, "PREFETCH": 0}),
            ("r4w2 pf", {"BLOCK_R": 4, "num_warps": 2, "maxnreg": 0}),
            ("r4w2 pf c96", {"BLOCK_R": 4, "num_warps": 2, "maxnreg": 96}),
            ("r8w4 pf", {"BLOCK_R": 8, "num_warps": 4, "maxnreg": 0}),
            ("r2w2 c80", {"maxnreg": 80, "RSTD_FAST": 1}),
        ]
    return [
        ("default", {}),
        ("r1w1 pf", {"BLOCK_R": 1, "num_warps": 1, "maxnreg": 0}),
        ("r1w1 pf c96", {"BLOCK_R": 1, "num_warps": 1, "maxnreg": 96}),
        ("r1w1 nopf", {"BLOCK_R": 1, "num_warps": 1, "maxnreg": 0, "PREFETCH": 0}),
        ("r2w2 pf", {"BLOCK_R": 2, "num_warps": 2, "maxnreg": 0}),
        ("r2w2 pf c96", {"BLOCK_R": 2, "num_warps": 2, "maxnreg": 96}),
        ("r2w1 nopf", {"BLOCK_R": 2, "num_warps": 1, "maxnreg": 0, "PREFETCH": 0}),
        ("r4w4 pf", {"BLOCK_R": 4, "num_warps": 4, "maxnreg": 0}),
    ]


def time_variant(d: int, rnd: int, name: str, cfg: dict, sets: list, floor: float, add_us: float) -> None:
    t0 = time.time()
    try:
        s0 = sets[0]
        B.rms_norm_gated_bwd(s0[3], s0[0], s0[1], s0[2], *ARGS, config=cfg)
        torch.cuda.synchronize()
        nreg = regs() if rnd == 0 else None
        us = V.graph_us(
            lambda: [B.rms_norm_gated_bwd(s[3], s[0], s[1], s[2], *ARGS, config=cfg) for s in sets], len(sets), reps=10
        )
    except Exception as exc:  # one variant failing never stops the sweep
        print(f"  {name:<16} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        RES.append({"d": d, "name": name, "error": str(exc)[:500]})
        return
    RES.append({"d": d, "round": rnd, "name": name, "cfg": cfg, "us": us, "add": add_us, "regs": nreg})
    print(f"  {name:<16} {us:7.1f} us  x floor {us / floor:.3f}  regs {nreg}  ({time.time() - t0:.0f}s)", flush=True)
    with open(os.path.join(OUT, "bwd14.json"), "w") as f:
        json.dump(RES, f, indent=1)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for d in (128, 256):
        sets = make_sets(ROWS, d, torch.bfloat16, "cuda")
        outs = [torch.empty_like(s[0]) for s in sets]
        todo = variants(d)
        for rnd in range(2):
            add_us = V.graph_us(
                lambda sets=sets, outs=outs: [torch.add(s[0], s[1], out=o) for s, o in zip(sets, outs, strict=True)],
                len(sets),
                reps=10,
            )
            floor = add_us * 5 / 3
            print(f"d={d} round {rnd} add {add_us:.1f} us, bwd floor {floor:.1f}", flush=True)
            for name, cfg in todo:
                time_variant(d, rnd, name, cfg, sets, floor, add_us)
            # second round: the default and the three fastest
            ok = sorted((r["us"], r["name"]) for r in RES if r["d"] == d and "us" in r)
            best = {n for _, n in ok[:3]} | {"default"}
            todo = [(n, c) for n, c in todo if n in best]


if __name__ == "__main__":
    main()
