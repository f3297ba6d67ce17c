"""Compile (never run) every rlnorm kernel for sm_90 with the installed Triton, on a machine with no GPU.

Why: the H200 image has Triton 3.6 while this project pins 3.7; a kernel that compiles on one can
fail the other's MLIR passes. Install the other Triton in a venv and run this to find out offline:
    python3 -m venv --system-site-packages /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    /tmp/t36/bin/python scripts/compile_sm90.py
A fake driver reports an sm_90 target and every JIT launch is turned into a compile-only warmup.
    python3 scripts/compile_sm90.py --layouts D [VARIANT_JSON]
prints the blocked layouts of the forward's TTGIR at width D instead. Since 70e9895 (the tile as two joined
2-D chunks) Triton 3.6 and 3.7 both give a thread 16 columns of one row at D=128 (sizePerThread [1, 8, 2],
threadsPerWarp [4, 8, 1]); the 3-D tile before it got two rows per thread from 3.7 (docs/kernel-notes.md,
sessions 9 and 10).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction


class _Sm90CompileOnly:
    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def _compile_only() -> list:
    """Every JIT launch from here on compiles for sm_90 and launches nothing; returns the list the compiled
    kernels are appended to."""
    driver.set_active(_Sm90CompileOnly())
    orig_run = JITFunction.run
    compiled: list = []

    def run(self, *a, grid, warmup, **kw):
        kernel = orig_run(self, *a, grid=grid, warmup=True, **kw)
        compiled.append(kernel)
        return kernel

    JITFunction.run = run
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    return compiled


def forward_layouts(d: int, variant: dict) -> list[str]:
    """The blocked layouts in the TTGIR of the default forward (bf16, silu gate) at width d."""
    compiled = _compile_only()
    from rlnorm.kernel._fwd import rms_norm_gated_fwd

    x = torch.randn(8, d).bfloat16()
    rms_norm_gated_fwd(x, x, torch.ones(d).bfloat16(), 1e-6, None, True, "silu", _variant=variant)
    return re.findall(r"#ttg\.blocked<\{[^}]*\}>", compiled[-1].asm["ttgir"])


def main() -> int:
    if sys.argv[1:2] == ["--layouts"]:
        print("\n".join(forward_layouts(int(sys.argv[2]), json.loads(sys.argv[3]) if sys.argv[3:] else {})))
        return 0
    _compile_only()
    from rlnorm.kernel._bwd import rms_norm_gated_bwd
    from rlnorm.kernel._fwd import rms_norm_gated_fwd

    failures = 0
    combos = itertools.product(
        [128, 256, 96, 200, 8192],
        [None, 32],
        [True, False],
        ["silu", "sigmoid"],
        [True, False],
        [torch.bfloat16, torch.float32],
    )
    for d, group, nbg, act, has_z, wdt in combos:
        if group is not None and d % group:
            continue
        if d == 8192 and (group, nbg, act) != (None, True, "silu"):
            continue
        x = torch.randn(8, d).bfloat16()
        z = torch.randn(8, d).bfloat16() if has_z else None
        w, dy = torch.ones(d, dtype=wdt), torch.randn(8, d).bfloat16()
        for name in ("fwd", "bwd"):
            try:
                if name == "fwd":
                    rms_norm_gated_fwd(x, z, w, 1e-6, group, nbg, act)
                else:
                    rms_norm_gated_bwd(dy, x, z, w, 1e-6, group, nbg, act)
            except Exception as e:  # report every failing combination, not just the first
                failures += 1
                print(f"FAIL {name} d={d} group={group} nbg={nbg} act={act} z={has_z} w={wdt}: {str(e)[:200]}")
    for d, tiles in itertools.product([128, 256], [1, 2, 4, 8, 16, 31]):  # tiles_per_program's values
        x = torch.randn(8, d).bfloat16()
        try:
            rms_norm_gated_bwd(x, x, x, torch.ones(d), 1e-6, None, True, "silu", config={"TILES": tiles})
        except Exception as e:
            failures += 1
            print(f"FAIL bwd d={d} TILES={tiles}: {str(e)[:200]}")
    for d in (128, 256, 96):  # the forward that also zeroes the backward's counters
        x = torch.randn(8, d).bfloat16()
        try:
            rms_norm_gated_fwd(x, x, torch.ones(d), 1e-6, None, True, "silu", zero=torch.empty(100, dtype=torch.int64))
        except Exception as e:
            failures += 1
            print(f"FAIL fwd d={d} zero=: {str(e)[:200]}")
    print(f"triton {triton.__version__}: {failures} failing combinations")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
