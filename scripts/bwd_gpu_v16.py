"""Session 15: the backward's one-warp shape with groups (timing + bits), on the H200.

    V16_ROUNDS=3 python3 scripts/bwd_gpu_v16.py     ($OUT/bwd16.json; a line per variant)

Why: with group_size, the one-warp shape of session 14 (`bwd_config`, widths up to 256) fits its 168-register cap
with spills offline (sm_90: D=256 groups of 64: 7 spill stores on Triton 3.6, 30 on 3.7.1; D=128 groups of 32: 0 /
15); a 200 cap fits both Tritons without spills (187-193 registers). Per case at 262144 rows: GPU time per call of
the backward launcher from CUDA-graph replays over distinct input sets (`kernel_gpu_v2.graph_us`), against the same
process's add (floor = 5/3 of it: dy, x, z read, dx, dz written), interleaved rounds. Bits: the 200 cap must give
the default's dx, dz and dweight bits (same BLOCK_R and warps); the wider rows' shape (two warps, register
prefetch, deferred cold values) changes dx/dz by design (another reduction order) but never dweight.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel._bwd import rms_norm_gated_bwd
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ROUNDS = int(os.environ.get("V16_ROUNDS", "3"))
ROWS = 262144
# the shape bwd_config gives rows wider than 256 columns, at these widths
WIDE = {"num_warps": 2, "COLD_MODE": 0, "PREFETCH": 1, "STAGES": 1, "TILES": 31, "maxnreg": 0}
CASES = {
    (128, None): [("default", {})],
    (128, 32): [("default", {}), ("cap200", {"maxnreg": 200}), ("wide", dict(WIDE, BLOCK_R=2))],
    (256, None): [("default", {})],
    (256, 64): [("default", {}), ("cap200", {"maxnreg": 200}), ("wide", dict(WIDE, BLOCK_R=2))],
}
RES: list[dict] = []


def run_case(d: int, g: int | None, variants: list[tuple[str, dict]]) -> None:
    sets = make_sets(ROWS, d, torch.bfloat16, "cuda")
    outs = [torch.empty_like(s[0]) for s in sets]
    args = (1e-6, g, True, "silu")
    s0 = sets[0]
    ref = rms_norm_gated_bwd(s0[3], s0[0], s0[1], s0[2], *args)
    notes = {}
    for name, cfg in variants:
        got = rms_norm_gated_bwd(s0[3], s0[0], s0[1], s0[2], *args, config=dict(cfg))
        torch.cuda.synchronize()
        same = [torch.equal(a, b) for a, b in zip(got, ref, strict=True)]
        notes[name] = " ".join(f"{n} {'=' if e else 'DIFF'}" for n, e in zip(("dx", "dz", "dw"), same, strict=True))
    for rnd in range(ROUNDS):
        add = V.graph_us(lambda: [torch.add(s[0], s[1], out=o) for s, o in zip(sets, outs, strict=True)], len(sets))
        print(f"D={d} group={g} round {rnd}: add {add:.1f} us, floor {add * 5 / 3:.1f}", flush=True)
        for name, cfg in variants:
            us = V.graph_us(
                lambda cfg=cfg: [rms_norm_gated_bwd(s[3], s[0], s[1], s[2], *args, config=dict(cfg)) for s in sets],
                len(sets),
                reps=10,
            )
            RES.append({"d": d, "group": g, "round": rnd, "name": name, "us": us, "add": add, "bits": notes[name]})
            print(f"  {name:8s} {us:7.1f} us  x floor {us / (add * 5 / 3):.3f}  {notes[name]}", flush=True)
        with open(os.path.join(OUT, "bwd16.json"), "w") as f:
            json.dump(RES, f, indent=1)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for (d, g), variants in CASES.items():
        run_case(d, g, variants)


if __name__ == "__main__":
    main()
