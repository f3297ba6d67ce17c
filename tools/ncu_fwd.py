"""One forward launch for Nsight Compute to profile: the forward at width D on the standard data, or the add.

    ncu --clock-control none --nvtx --nvtx-include "prof/" --set full python tools/ncu_fwd.py [SWITCHES] [D] [ROWS]
    bash tools/ncu_fwd.sh D ROWS NAME=SWITCHES ...     (runs this once per variant, with the stall reasons)

Runs the forward three times on the standard data (seed 11): the first two launches warm Triton's cache and
the GPU, the third runs in the NVTX range "prof", which ncu's filter profiles. SWITCHES is a JSON object of
forward switches (`{"EXACT": 0}`, applied through `rlnorm.kernel.testing.plant`), `{}` for the shipped kernel, or
`add` for the same-shape `torch.add`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, from anywhere


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/ncu_fwd.py", description=__doc__.split("\n\n")[0])
    p.add_argument("switches", nargs="?", default="{}", help='forward switches as JSON, or "add" (default {})')
    p.add_argument("d", nargs="?", type=int, default=128, help="row width (default 128)")
    p.add_argument("rows", nargs="?", type=int, default=262144, help="rows (default 262144)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    switches = None if a.switches == "add" else json.loads(a.switches)
    import torch

    from rlnorm.inputs import make_case
    from rlnorm.kernel._fwd import rms_norm_gated_fwd
    from rlnorm.kernel.testing import plant

    if not torch.cuda.is_available():
        print("ncu_fwd: needs a CUDA GPU (and Nsight Compute around it)", file=sys.stderr)
        return 2
    c = make_case(a.rows, a.d, seed=11, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    with plant(fwd=switches):
        for i in range(3):
            if i == 2:
                torch.cuda.nvtx.range_push("prof")
            if switches is None:
                torch.add(c.x, c.z)
            else:
                rms_norm_gated_fwd(c.x, c.z, c.w, 1e-6, None, True, "silu")
            torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
