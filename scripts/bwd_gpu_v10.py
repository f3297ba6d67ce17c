"""Session 4, call 3: how the backward's work is cut at decode sizes (none of these choices changes a bit).

    python3 scripts/bwd_gpu_v10.py   (one line per shape; $OUT/bwd10.json)

Per shape (D = 128, 256; 32 / 512 / 4096 rows), GPU time per call of the backward launcher from CUDA-graph
replays over 20 input sets (`kernel_gpu_v2.graph_us`), counter zeroing and finalize included, for
tiles per program (TILES), one counter copy per PPS programs, and ROW_RANGE (hot range per row, element
atomics in inline PTX: no shared-memory layout conversion before the flush's atomics). Each variant's
dx, dz, dweight bits are compared with the default's first.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.kernel import _bwd as B
from rlnorm.kernel import _dweight
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
ARGS = (1e-6, None, True, "silu")
RES: list[dict] = []


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def over(cfg: dict, sets: list) -> object:
    return lambda: [B.rms_norm_gated_bwd(s[3], s[0], s[1], s[2], *ARGS, config=cfg) for s in sets]


def main() -> None:
    pps_default = _dweight.PROGRAMS_PER_STRIPE
    for d in (128, 256):
        for rows in (32, 512, 4096):
            sets = make_sets(rows, d, torch.bfloat16, "cuda")[:20]
            x, z, w, dy = sets[0]
            want = B.rms_norm_gated_bwd(dy, x, z, w, *ARGS)
            block_r = B.bwd_config(d, d)["BLOCK_R"]
            default_tiles = B.tiles_per_program(rows, block_r, 31)
            line = [f"d={d} rows={rows:<5} (default TILES {default_tiles})"]
            for pps in (32, 64, 128):
                _dweight.PROGRAMS_PER_STRIPE = pps
                for tiles in sorted({1, 2, 4, 8, 16, 31, default_tiles}):
                    if tiles * block_r > 4 * rows and tiles != 1:
                        continue
                    for row_range in (0, 1):
                        cfg = {"TILES": tiles, "ROW_RANGE": row_range}
                        try:
                            got = B.rms_norm_gated_bwd(dy, x, z, w, *ARGS, config=cfg)
                            ok = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want, strict=True))
                            t = V.graph_us(over(cfg, sets), len(sets), reps=20)
                        except Exception as exc:  # one variant failing never stops the sweep
                            line.append(f"T{tiles} rr{row_range} pps{pps} FAILED {type(exc).__name__}")
                            continue
                        programs = -(-rows // (block_r * tiles))
                        RES.append(
                            {
                                "d": d,
                                "rows": rows,
                                "tiles": tiles,
                                "row_range": row_range,
                                "pps": pps,
                                "us": t,
                                "same_bits": ok,
                                "programs": programs,
                                "stripes": _dweight.stripes_for(programs),
                            }
                        )
                        line.append(f"T{tiles} rr{row_range} pps{pps} {t:5.2f}{'' if ok else ' DIFFER'}")
            _dweight.PROGRAMS_PER_STRIPE = pps_default
            print(" | ".join(line), flush=True)
            with open(os.path.join(OUT, "bwd10.json"), "w") as fh:
                json.dump(RES, fh, indent=1)


if __name__ == "__main__":
    main()
