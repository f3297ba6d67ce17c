"""The backward's bits on a GPU: dweight exact, and no launch-time choice changing any bit.

    python tools/dweight_gpu_check.py [--rows 1 32 257 4096 65536 140000] [--device cuda]

For each width and row count: dweight equals the exact sum of the rows' fp32 contributions rounded once
(`rlnorm.numerics.exact_sum`, on the CPU); dx, dz and dweight equal those with 31 tiles per program (the
partition must change no bit), those of the other load and cold-value paths (cp.async stages against the
register prefetch; cold values added inline against deferred to a scratch copy), and those of a backward on
counters the forward's launch zeroed (the autograd route), over 20 repeats. With groups: dweight exact, and
the register cap (168 or 200) changing no bit. One line per case, then the count of failures (exit 1 if any).
The backward's switches are set through `rlnorm.kernel.testing.plant`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, from anywhere

import torch

from rlnorm.inputs import make_case
from rlnorm.kernel._bwd import rms_norm_gated_bwd, workspace_numel
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kernel.testing import plant
from rlnorm.numerics import exact_sum

ROWS = (1, 32, 257, 4096, 65536, 140000)  # 140000 at D=256: 63 tiles per program


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/dweight_gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help=f"row counts (default {list(ROWS)})")
    p.add_argument("--group-rows", type=int, nargs="+", default=[257, 65536], help="row counts of the grouped cases")
    p.add_argument("--repeats", type=int, default=20, help="backward repeats whose dweight must not change")
    p.add_argument("--device", default="cuda", help="cuda (default); cpu runs the Triton interpreter: a few rows")
    return p


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    ia = a.contiguous().view(torch.int16 if a.element_size() == 2 else torch.int32)
    ib = b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32)
    return bool(torch.equal(ia, ib))


def bwd(*args: Any, switches: dict | None = None, **kw: Any) -> tuple:
    """The backward launcher under backward switches (TILES, STAGES, PREFETCH, COLD_MODE, MAXNREG...)."""
    with plant(bwd=switches):
        return rms_norm_gated_bwd(*args, **kw)


def ungrouped(rows_list: Sequence[int], repeats: int, device: str) -> int:
    failures = 0
    for d in (128, 256):
        for rows in rows_list:
            c = make_case(rows, d, seed=rows + d, device=device)
            for w in (c.w, c.w.float()):
                args = (c.dy, c.x, c.z, w, 1e-6, None, True, "silu")
                contrib = torch.empty(rows, d, dtype=torch.float32, device=device)
                got = bwd(*args, contributions=contrib)
                ref31 = bwd(*args, switches={"TILES": 31})
                # the autograd route: the forward's launch zeroes the counters the backward then uses
                ws = torch.full((workspace_numel(rows, d, None),), -1, dtype=torch.int64, device=device)
                rms_norm_gated_fwd(c.x, c.z, w, 1e-6, None, True, "silu", zero=ws)
                zeroed = bwd(*args, workspace=ws)
                exact = same(got[2].cpu(), exact_sum(contrib.cpu(), w.dtype))
                part = all(same(a, b) for a, b in zip(got, ref31, strict=True))
                # the same rows' math through the other paths (same BLOCK_R and warps: same dx, dz bits)
                paths = [bwd(*args, switches=cfg) for cfg in ({"STAGES": 1, "PREFETCH": 1}, {"COLD_MODE": 0})]
                other = all(same(a, b) for out in paths for a, b in zip(out, got, strict=True))
                again = all(same(a, b) for a, b in zip(zeroed, got, strict=True)) and all(
                    same(bwd(*args)[2], got[2]) for _ in range(repeats)
                )
                failures += (not exact) + (not part) + (not other) + (not again)
                print(
                    f"d={d} rows={rows:<6} w={w.dtype!s:<15} dweight exact {exact}  bits == 31 tiles {part}"
                    f"  == prefetch / deferred paths {other}"
                    f"  forward-zeroed counters and {repeats} repeats give the same bits {again}",
                    flush=True,
                )
    return failures


def grouped(rows_list: Sequence[int], device: str) -> int:
    """Groups: dweight exact, and the register cap (168 or 200, bwd_config's choice by width) changes no bit."""
    failures = 0
    for d, g in ((128, 32), (256, 64)):
        for rows in rows_list:
            c = make_case(rows, d, seed=rows + d + g, device=device)
            args = (c.dy, c.x, c.z, c.w, 1e-6, g, True, "silu")
            contrib = torch.empty(rows, d, dtype=torch.float32, device=device)
            got = bwd(*args, contributions=contrib)
            exact = same(got[2].cpu(), exact_sum(contrib.cpu(), c.w.dtype))
            caps = all(
                same(a, b)
                for cap in (168, 200)
                for a, b in zip(bwd(*args, switches={"MAXNREG": cap}), got, strict=True)
            )
            failures += (not exact) + (not caps)
            print(
                f"d={d} group={g} rows={rows:<6} dweight exact {exact}  bits equal at caps 168 and 200 {caps}",
                flush=True,
            )
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("dweight_gpu_check: no CUDA GPU here (--device cpu runs the interpreter on a few rows)", file=sys.stderr)
        return 2
    failures = ungrouped(a.rows, a.repeats, a.device) + grouped(a.group_rows, a.device)
    print(f"dweight_gpu_check: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
