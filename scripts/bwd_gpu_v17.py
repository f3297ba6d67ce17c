"""GPU call 18 (backward): the tile loop's loads software-pipelined by Triton (`tl.range(num_stages=STAGES)`:
cp.async into shared memory, STAGES - 1 tiles ahead, no registers held) against the register prefetch of one
tile (PREFETCH), under register caps; dx/dz alone beside. None of these choices may change a bit: every
variant's dx, dz and dweight are compared with the default's.
    python3 scripts/bwd_gpu_v17.py   ($OUT/bwd17.json; one line per variant)
GPU time per call from CUDA-graph replays over distinct input sets (`kernel_gpu_v2.graph_us`), counter
zeroing and finalize included; the same-run add is timed the same way.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel import _bwd as B
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
RES: list[dict] = []
PIPE = {"PREFETCH": 0}
VARIANTS = {
    128: [
        ("default", {}),
        ("dxdz_only", {"DWEIGHT": False}),
        ("st3_m64", PIPE | {"STAGES": 3}),
        ("st3_m80", PIPE | {"STAGES": 3, "maxnreg": 80}),
        ("st4_m80", PIPE | {"STAGES": 4, "maxnreg": 80}),
        ("st6_m80", PIPE | {"STAGES": 6, "maxnreg": 80}),
        ("st4_m72", PIPE | {"STAGES": 4, "maxnreg": 72}),
        ("st4_m80_dxdz", PIPE | {"STAGES": 4, "maxnreg": 80, "DWEIGHT": False}),
        ("st8_m80", PIPE | {"STAGES": 8, "maxnreg": 80}),
    ],
    256: [
        ("default", {}),
        ("dxdz_only", {"DWEIGHT": False}),
        ("st3", PIPE | {"STAGES": 3}),
        ("st4", PIPE | {"STAGES": 4}),
        ("st6", PIPE | {"STAGES": 6}),
        ("st4_m80", PIPE | {"STAGES": 4, "maxnreg": 80}),
        ("st4_dxdz", PIPE | {"STAGES": 4, "DWEIGHT": False}),
    ],
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16) if t.element_size() == 2 else t.contiguous().view(torch.int32)


def over(cfg: dict, sets: list) -> object:
    return lambda: [B.rms_norm_gated_bwd(s[3], s[0], s[1], s[2], *ARGS, config=cfg) for s in sets]


def main() -> None:
    for d in (128, 256):
        for rows in (262144, 4096, 512, 32):
            sets = make_sets(rows, d, torch.bfloat16, "cuda")[: (4 if rows > 4096 else 20)]
            x, z, w, dy = sets[0]
            want = B.rms_norm_gated_bwd(dy, x, z, w, *ARGS)
            outs = [torch.empty_like(s[0]) for s in sets]

            def add(sets=sets, outs=outs):
                for s, o in zip(sets, outs, strict=True):
                    torch.add(s[0], s[1], out=o)

            add_us = V.graph_us(add, len(sets), reps=10)
            line = [f"d={d} rows={rows:<6} add {add_us:6.2f} floor(5) {add_us * 5 / 3:6.1f}"]
            for name, cfg in VARIANTS[d]:
                if rows <= 4096 and name not in ("default", "st4_m80", "st4", "st3_m64", "st3"):
                    continue
                try:
                    got = B.rms_norm_gated_bwd(dy, x, z, w, *ARGS, config=cfg)
                    n = 2 if cfg.get("DWEIGHT", True) is False else 3
                    ok = all(torch.equal(bits(a), bits(b)) for a, b in list(zip(got, want, strict=True))[:n])
                    t = V.graph_us(over(cfg, sets), len(sets), reps=10)
                except Exception as exc:  # one variant failing never stops the sweep
                    line.append(f"{name} FAILED {type(exc).__name__}: {str(exc)[:160]}")
                    continue
                RES.append({"d": d, "rows": rows, "name": name, "us": t, "add_us": add_us, "same_bits": ok})
                line.append(f"{name} {t:7.2f} ({t / (add_us * 5 / 3):.3f}x floor){'' if ok else ' DIFFER'}")
            print("\n  ".join(line), flush=True)
            with open(os.path.join(OUT, "bwd17.json"), "w") as fh:
                json.dump(RES, fh, indent=1)


if __name__ == "__main__":
    main()
