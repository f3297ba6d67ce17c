"""Session 17: where the forward's last 1.2 us over its fast path goes at 262144 rows (H200, timing only).

    python3 scripts/kernel_gpu_v33.py     ($OUT/fwd33.json)

default (correctly rounded) against: near0 = the same kernel with the midpoint bound T = 0 (the test and its
reductions still run, but almost no program takes the tier's branch: timing only, NOT correctly rounded), and
exact0 = no test and no tier (`EXACT` 0, NOT correctly rounded). near0 - exact0 is the test's cost, default -
near0 the tier's. Each variant's bits are first compared with the default's (near0 and exact0 may differ: they
are not correctly rounded); then CUDA-graph replays over distinct buffers against the same process's add, in
interleaved rounds. `time_variants` is reused by kernel_gpu_v34.py.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel import _fwd as F
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
VARIANTS = [("default", {}), ("near0", {"_near": (0, 0)}), ("exact0", {"_variant": {"EXACT": 0}})]


def time_variants(variants: dict[int, list[tuple[str, dict]]], out_name: str, rounds: int = 3) -> None:
    """Per width at 262144 rows: each variant's outputs compared bitwise with the default's on every buffer set
    (correctly rounded variants must agree), then interleaved timing rounds against the same process's add."""
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    res = []
    for d, named in variants.items():
        sets = make_sets(262144, d, torch.bfloat16, "cuda")
        outs = [torch.empty_like(s[0]) for s in sets]
        pairs = list(zip(sets, outs, strict=True))
        refs = [rms_norm_gated_fwd(s[0], s[1], s[2], *ARGS) for s in sets]
        for name, kw in named:
            same = all(
                torch.equal(rms_norm_gated_fwd(s[0], s[1], s[2], *ARGS, **kw), r)
                for s, r in zip(sets, refs, strict=True)
            )
            print(f"d={d} {name}: bits {'=' if same else 'DIFF'} regs {V.last_regs(F._rms_norm_gated_fwd_kernel)}")
        for rnd in range(rounds):
            add_us = V.graph_us(lambda pairs=pairs: [torch.add(s[0], s[1], out=o) for s, o in pairs], len(pairs))
            for name, kw in named:
                us = V.graph_us(
                    lambda kw=kw, sets=sets: [rms_norm_gated_fwd(s[0], s[1], s[2], *ARGS, **kw) for s in sets],
                    len(sets),
                )
                res.append({"d": d, "round": rnd, "name": name, "us": us, "add_us": add_us})
                print(f"d={d} round {rnd} {name:10s} {us:7.2f} us  {us / add_us:.3f}x add ({add_us:.2f})", flush=True)
        with open(os.path.join(OUT, out_name), "w") as f:
            json.dump(res, f, indent=1)


def main() -> None:
    time_variants({128: VARIANTS, 256: VARIANTS}, "fwd33.json")


if __name__ == "__main__":
    main()
