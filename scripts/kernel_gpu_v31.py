"""Session 17: the forward's flushed products (FTZ) and store-first variant, on the H200 (bits + timing).

    V31_ROUNDS=3 python3 scripts/kernel_gpu_v31.py     ($OUT/fwd31.json; a line per variant)

Ran at de298a1, where store-first was a switch (STORE_FIRST); it became the only form after this probe (D=128
51.0-51.2 us against 51.7, 1.034-1.040x the add; D=256 97.6-97.8 against 97.9-99.1; FTZ cost nothing: 51.66
against 51.66 with plain products; the underflow cases: 0 wrong with FTZ, 144-4849 of 8192 with plain products).

Why: (1) every fast-path product now flushes subnormals to zero (`_fwd._mul_ftz`, mul.rn.ftz.f32), so an
intermediate that underflows while y stays normal shows as y = 0 and its row goes exact (the hole found in
session 16). First the underflow cases of `rlnorm.inputs.make_underflow_case` on the GPU: outputs that differ
from the fp64 result rounded once, with FTZ (must be 0) and with the plain products (the hole). Then the cost:
offline sm_90 SASS has the same instruction count (3016 against 3032 static), timed here. (2) STORE_FIRST
stores unflagged rows before the tier's branch (394 static instructions to EXIT on that path against ~413).
Per D at 262144 rows and at decode sizes: GPU time per call from CUDA-graph replays over distinct buffers
(`kernel_gpu_v2.graph_us`), against the same process's add, in interleaved rounds; every variant's output
compared bitwise with the default's on every buffer set.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.inputs import UNDERFLOW_KINDS, make_underflow_case
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.numerics import round_once
from rlnorm.reference import gated_rmsnorm_math
from scripts import kernel_gpu_v30 as V30

OUT = os.environ.get("OUT", "/tmp")
ROUNDS = int(os.environ.get("V31_ROUNDS", "3"))
RES: list[dict] = V30.RES  # one list: the underflow records and v30's timing records
VARIANTS = [
    ("default", {}),
    ("plain mul", {"FTZ": False}),
    ("exact0", {"EXACT": 0}),
]


def underflow() -> None:
    for kind in UNDERFLOW_KINDS:
        x, z, w, o = make_underflow_case(kind, rows=64, device="cuda")
        ref = round_once(gated_rmsnorm_math(x, z, w, o, torch.float64), torch.bfloat16)
        for name, var in (("ftz", {}), ("plain mul", {"FTZ": False})):
            y = rms_norm_gated_fwd(x, z, w, o.eps, None, o.norm_before_gate, o.activation, _variant=var)
            wrong = int((y.view(torch.int16) != ref.view(torch.int16)).sum())
            rec = {"underflow": kind, "name": name, "wrong": wrong, "of": y.numel()}
            RES.append(rec)
            print(rec, flush=True)


def run(d: int, rows: int, rounds: int) -> None:
    """kernel_gpu_v30's timing loop (bits against the default once, then interleaved rounds) on VARIANTS."""
    V30.run(d, rows, VARIANTS, rounds)
    with open(os.path.join(OUT, "fwd31.json"), "w") as f:
        json.dump(RES, f, indent=1)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    underflow()
    for d in (128, 256):
        run(d, 262144, ROUNDS)
    for d in (128, 256):
        for rows in (32, 512, 4096):
            run(d, rows, 2)


if __name__ == "__main__":
    main()
