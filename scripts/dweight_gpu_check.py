"""GPU check of the backward's launch-time choices: for several row counts, dweight equals the exact
sum of the rows' fp32 contributions rounded once (numerics.exact_sum, on the CPU), dx, dz,
dweight bits equal those with 31 tiles per program (the partition must change no bit), equal those of the
default's other load and cold-value paths (cp.async stages against the register prefetch; cold values added
inline against deferred to the scratch copy), and equal those of a backward on counters the forward's launch
zeroed (the autograd route), run after run; with groups, dweight exact and the register cap changing no bit.

    python scripts/dweight_gpu_check.py   (prints one line per case and a final count of failures)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.inputs import make_case
from rlnorm.kernel._bwd import rms_norm_gated_bwd, workspace_numel
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.numerics import exact_sum


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    ia = a.contiguous().view(torch.int16 if a.element_size() == 2 else torch.int32)
    ib = b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32)
    return bool(torch.equal(ia, ib))


def main() -> int:
    failures = 0
    for d in (128, 256):
        for rows in (1, 32, 257, 4096, 65536, 140000):  # 140000 at D=256: 63 tiles per program
            c = make_case(rows, d, seed=rows + d, device="cuda")
            for w in (c.w, c.w.float()):
                contrib = torch.empty(rows, d, dtype=torch.float32, device="cuda")
                got = rms_norm_gated_bwd(c.dy, c.x, c.z, w, 1e-6, None, True, "silu", contributions=contrib)
                ref31 = rms_norm_gated_bwd(c.dy, c.x, c.z, w, 1e-6, None, True, "silu", config={"TILES": 31})
                # the autograd route: the forward's launch zeroes the counters the backward then uses
                ws = torch.full((workspace_numel(rows, d, None),), -1, dtype=torch.int64, device="cuda")
                rms_norm_gated_fwd(c.x, c.z, w, 1e-6, None, True, "silu", zero=ws)
                zeroed = rms_norm_gated_bwd(c.dy, c.x, c.z, w, 1e-6, None, True, "silu", workspace=ws)
                exact = same(got[2].cpu(), exact_sum(contrib.cpu(), w.dtype))
                part = all(same(a, b) for a, b in zip(got, ref31, strict=True))
                # the same rows' math through the other paths (same BLOCK_R and warps: same dx, dz bits)
                paths = [
                    rms_norm_gated_bwd(c.dy, c.x, c.z, w, 1e-6, None, True, "silu", config=cfg)
                    for cfg in ({"STAGES": 1, "PREFETCH": 1}, {"COLD_MODE": 0})
                ]
                other = all(same(a, b) for out in paths for a, b in zip(out, got, strict=True))
                again = all(same(a, b) for a, b in zip(zeroed, got, strict=True)) and all(
                    same(rms_norm_gated_bwd(c.dy, c.x, c.z, w, 1e-6, None, True, "silu")[2], got[2]) for _ in range(20)
                )
                failures += (not exact) + (not part) + (not other) + (not again)
                print(
                    f"d={d} rows={rows:<6} w={w.dtype!s:<15} dweight exact {exact}  bits == 31 tiles {part}"
                    f"  == prefetch / deferred paths {other}"
                    f"  forward-zeroed counters and 20 repeats give the same bits {again}"
                )
    failures += grouped()
    print(f"dweight_gpu_check: {failures} failures")
    return 1 if failures else 0


def grouped() -> int:
    """Groups: dweight exact, and the register cap (168 or 200, bwd_config's choice by width) changes no bit."""
    failures = 0
    for d, g in ((128, 32), (256, 64)):
        for rows in (257, 65536):
            c = make_case(rows, d, seed=rows + d + g, device="cuda")
            args = (c.dy, c.x, c.z, c.w, 1e-6, g, True, "silu")
            contrib = torch.empty(rows, d, dtype=torch.float32, device="cuda")
            got = rms_norm_gated_bwd(*args, contributions=contrib)
            exact = same(got[2].cpu(), exact_sum(contrib.cpu(), c.w.dtype))
            caps = all(
                same(a, b)
                for cap in (168, 200)
                for a, b in zip(rms_norm_gated_bwd(*args, config={"maxnreg": cap}), got, strict=True)
            )
            failures += (not exact) + (not caps)
            print(f"d={d} group={g} rows={rows:<6} dweight exact {exact}  bits equal at caps 168 and 200 {caps}")
    return failures


if __name__ == "__main__":
    raise SystemExit(main())
