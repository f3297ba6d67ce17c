"""Session 4, call 2: the backward's rstd by rsqrt.approx + an FMA Newton step (RSTD_FAST=1, default)
against sqrt.rn + div.full (RSTD_FAST=0): backward time at 262144 rows and dx/dz error against fp64.

    python3 scripts/bwd_gpu_v9.py   (prints one line per measurement; $OUT/bwd9.json)

Times: `do_bench` (CUDA events, L2 flushed per repetition) over rotating input sets, backward launcher
alone (counters zeroed by torch, finalize included). Errors: ulps of dx, dz against the fp64 autograd
gradient rounded once to bf16, on the standard data (65536 rows, seed 11); every row alone vs in the
batch is not re-checked here (that is the kit's full run).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.inputs import make_case
from rlnorm.kernel import _bwd as B
from rlnorm.numerics import round_once, ulp_distance
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
RES: list[dict] = []


def timing() -> None:
    timer = V.gpu_timer()
    for d in (128, 256):
        sets = make_sets(262144, d, torch.bfloat16, "cuda")
        for fast in (0, 1, 0, 1):
            i = [0]

            def f(fast=fast, i=i, sets=sets):
                i[0] += 1
                x, z, w, dy = sets[i[0] % len(sets)]
                B.rms_norm_gated_bwd(dy, x, z, w, *ARGS, config={"RSTD_FAST": fast})

            t = timer(f)
            RES.append({"d": d, "rows": 262144, "RSTD_FAST": fast, "us": t})
            print(f"bwd d={d} RSTD_FAST={fast} {t[0]:7.1f} us (p20 {t[1]:.1f} p80 {t[2]:.1f})", flush=True)


def accuracy() -> None:
    for d in (128, 256):
        c = make_case(65536, d, seed=11, device="cuda")
        x64, z64, w64 = (t.double().requires_grad_(True) for t in (c.x, c.z, c.w))
        gated_rmsnorm_math(x64, z64, w64, OpOptions(), torch.float64).backward(c.dy.double())
        for fast in (0, 1):
            dx, dz, _ = B.rms_norm_gated_bwd(c.dy, c.x, c.z, c.w, *ARGS, config={"RSTD_FAST": fast})
            out = {"d": d, "RSTD_FAST": fast}
            for name, got, ref in (("dx", dx, x64.grad), ("dz", dz, z64.grad)):
                u = ulp_distance(got, round_once(ref, got.dtype)).float()
                rel = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                out[name] = {"max_ulp": u.max().item(), "mean_ulp": u.mean().item(), "max_rel": rel}
            RES.append(out)
            print(f"accuracy {out}", flush=True)


if __name__ == "__main__":
    for part in (accuracy, timing):
        try:
            part()
        except Exception as exc:  # one part failing never stops the other
            print(f"{part.__name__} FAILED: {type(exc).__name__}: {exc}", flush=True)
    with open(os.path.join(OUT, "bwd9.json"), "w") as fh:
        json.dump(RES, fh, indent=1)
