"""Session 15: one forward launch for Nsight Compute to profile (the H200's Firecracker image has ncu).

    ncu --clock-control none --nvtx --nvtx-include "prof/" --set full python3 scripts/ncu_fwd.py VARIANT_JSON [D] [ROWS]
    (scripts/ncu_fwd.sh runs it per variant with the stall-reason metrics)

Runs the forward three times on the standard data (seed 11; the first two launches warm Triton's cache and
the GPU); the third runs in the NVTX range "prof", which ncu's filter profiles. VARIANT_JSON "add" runs the
same-shape torch.add instead.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.inputs import make_case
from rlnorm.kernel._fwd import rms_norm_gated_fwd


def main() -> None:
    spec = sys.argv[1] if len(sys.argv) > 1 else "{}"
    d = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 262144
    c = make_case(rows, d, seed=11, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    for i in range(3):
        if i == 2:
            torch.cuda.nvtx.range_push("prof")
        if spec == "add":
            torch.add(c.x, c.z)
        else:
            rms_norm_gated_fwd(c.x, c.z, c.w, 1e-6, None, True, "silu", _variant=json.loads(spec))
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
