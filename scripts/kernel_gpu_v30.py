"""Session 15: the forward as a loop over row blocks with cp.async stages (timing + bits), on the H200.

    V30_ROUNDS=3 python3 scripts/kernel_gpu_v30.py     ($OUT/fwd30.json; a line per variant)

Runs at 72e381c only: the TILES / STAGES switches it times were reverted after this probe (session 15, call 1:
every loop form was slower, 1.24-2.8x the add; docs/kernel-notes.md, session 15).

Why: at 262144 rows the tier's ~15% of programs cost ~3 us over the fast path alone (docs/kernel-notes.md,
sessions 11-12): a one-tile program that takes the tier holds its warp slot with no loads in flight. A program
that walks TILES row blocks with the next blocks' loads in flight through shared memory (`tl.range(num_stages=)`,
what cut the backward 121 -> 104 us in session 14) keeps bytes moving while one block settles its elements.
Per D at 262144 rows: GPU time per call from CUDA-graph replays over distinct buffers (`kernel_gpu_v2.graph_us`),
against the same process's add, in interleaved rounds; every variant's output compared bitwise with the default's
on every buffer set (TILES and STAGES must change no bit). EXACT 0 (the fast path alone, NOT correctly rounded)
is the floor the loop can reach. Then 4096 / 16384 / 65536 rows for the tiles-per-program policy.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
ROUNDS = int(os.environ.get("V30_ROUNDS", "3"))
RES: list[dict] = []


def loop(t: int, s: int, cap: int) -> dict:
    return {"TILES": t, "STAGES": s, "MAXNREG": cap}


VARIANTS = {
    128: [("default", {}), ("exact0", {"EXACT": 0})]
    + [(f"t8 s{s} c80", loop(8, s, 80)) for s in (1, 2, 3, 4)]
    + [(f"t{t} s3 c80", loop(t, 3, 80)) for t in (4, 16, 32)]
    + [("t8 s3 c96", loop(8, 3, 96)), ("t8 s2 c64", loop(8, 2, 64)), ("t16 s2 c80", loop(16, 2, 80))],
    256: [("default", {}), ("exact0", {"EXACT": 0})]
    + [(f"t8 s{s} c80", loop(8, s, 80)) for s in (2, 3, 4)]
    + [(f"t{t} s3 c80", loop(t, 3, 80)) for t in (4, 16)]
    + [("t8 s4 c96", loop(8, 4, 96))],
}
# the tiles-per-program policy: where between decode (1 tile) and 262144 rows the loop starts to pay
MID_VARIANTS = [("default", {})] + [(f"t{t} s{s} c80", loop(t, s, 80)) for t, s in ((2, 2), (4, 3), (8, 3))]
MID = {rows: MID_VARIANTS for rows in (4096, 16384, 65536)}


def regs() -> tuple:
    from rlnorm.kernel import _fwd as F

    return V.last_regs(F._rms_norm_gated_fwd_kernel)


def run(d: int, rows: int, variants: list[tuple[str, dict]], rounds: int) -> None:
    sets = make_sets(rows, d, torch.bfloat16, "cuda")
    outs = [torch.empty_like(s[0]) for s in sets]
    refs = [rms_norm_gated_fwd(s[0], s[1], s[2], *ARGS) for s in sets]
    torch.cuda.synchronize()
    notes: dict[str, str] = {}
    for name, var in variants:  # compile + bits once
        t0 = time.time()
        try:
            got = [rms_norm_gated_fwd(s[0], s[1], s[2], *ARGS, _variant=var) for s in sets]
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(got, refs, strict=True))
            notes[name] = f"bits {'=' if same else 'DIFF'} regs {regs()} compile+run {time.time() - t0:.1f}s"
        except Exception as exc:  # one variant failing never stops the probe
            notes[name] = f"FAILED {type(exc).__name__}: {str(exc)[:200]}"
        print(f"d={d} rows={rows} {name}: {notes[name]}", flush=True)
    for rnd in range(rounds):
        add_us = V.graph_us(
            lambda: [torch.add(s[0], s[1], out=o) for s, o in zip(sets, outs, strict=True)], len(sets), reps=20
        )
        print(f"d={d} rows={rows} round {rnd} add {add_us:.2f} us", flush=True)
        for name, var in variants:
            if notes[name].startswith("FAILED"):
                continue
            us = V.graph_us(
                lambda var=var: [rms_norm_gated_fwd(s[0], s[1], s[2], *ARGS, _variant=var) for s in sets],
                len(sets),
                reps=20,
            )
            rec = {"d": d, "rows": rows, "round": rnd, "name": name, "us": us, "add_us": add_us, "x_add": us / add_us}
            rec["note"] = notes[name]
            RES.append(rec)
            print(f"  {name:14s} {us:7.2f} us  {us / add_us:.3f}x add   {notes[name]}", flush=True)
        with open(os.path.join(OUT, "fwd30.json"), "w") as f:
            json.dump(RES, f, indent=1)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for d in (128, 256):
        run(d, 262144, VARIANTS[d], ROUNDS)
    if os.environ.get("V30_MID", "1") == "1":
        for rows, variants in MID.items():
            run(128, rows, variants, 2)


if __name__ == "__main__":
    main()
