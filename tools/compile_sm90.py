"""Compile (never run) every rlnorm kernel for sm_90 with the installed Triton, on a machine with no GPU, and
count what ptxas made of it: registers, SASS instructions, spill stores and loads.

    python tools/compile_sm90.py                         every option combination: failures, then counts
    python tools/compile_sm90.py --counts 128 256        the default op's kernels at these widths
    python tools/compile_sm90.py --layouts D [SWITCHES]  the blocked layouts of the forward's TTGIR at width D

Why: the H200 image and the project's pin can hold different Tritons, and a kernel that compiles on one
can fail the other's passes, or spill. Install the other Triton in a venv and run this to find out offline:
    python3 -m venv --system-site-packages /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    /tmp/t36/bin/python tools/compile_sm90.py
A fake driver reports an sm_90 target and every JIT launch becomes a compile-only warmup. The counts come
from Triton's own cuobjdump on the cubin. SWITCHES is a JSON object of forward switches (`{"SPLIT": 1}`),
applied through `rlnorm.kernel.testing.plant`. Run it as a script: it compiles out of the interpreter.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's package, from anywhere


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/compile_sm90.py", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--layouts", type=int, metavar="D", help="print the forward's blocked layouts at width D")
    mode.add_argument("--counts", type=int, nargs="+", metavar="D", help="counts of the default op's kernels")
    p.add_argument("switches", nargs="?", default=None, help="with --layouts: forward switches as JSON")
    p.add_argument("--verbose", action="store_true", help="every combination's counts, not just the spills")
    return p


class _Sm90CompileOnly:
    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def compile_only() -> list:
    """Every JIT launch from here on compiles for sm_90 and launches nothing; returns the list the compiled
    kernels are appended to."""
    os.environ["TRITON_INTERPRET"] = "0"
    if "rlnorm.kernel._fwd" in sys.modules:
        raise RuntimeError("compile_only: the kernel was imported before; run this tool as a script")
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(_Sm90CompileOnly())
    orig_run = JITFunction.run
    compiled: list = []

    def run(self: Any, *a: Any, grid: Any, warmup: Any, **kw: Any) -> Any:
        kernel = orig_run(self, *a, grid=grid, warmup=True, **kw)
        compiled.append(kernel)
        return kernel

    JITFunction.run = run
    return compiled


def _tool(name: str) -> Path | None:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return path if path.is_file() else None


def counts(kernel: Any) -> dict[str, Any]:
    """name, registers, SASS instructions, spill stores (STL) and loads (LDL) of one compiled kernel."""
    name = getattr(kernel.metadata, "name", "?")
    tool = _tool("cuobjdump")
    if tool is None or "cubin" not in kernel.asm:
        return {"name": name, "regs": None, "instructions": None, "spill_stores": None, "spill_loads": None}
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        res = subprocess.run([tool, "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", res)
    code = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    return {
        "name": name,
        "regs": int(regs.group(1)) if regs else None,
        "instructions": len(code),
        "spill_stores": sum(" STL" in ln for ln in code),
        "spill_loads": sum(" LDL" in ln for ln in code),
    }


def _line(what: str, c: dict[str, Any]) -> str:
    return (
        f"{what:<58} {c['name']:<34} regs {c['regs']!s:>3}  instructions {c['instructions']!s:>5}  "
        f"spill stores {c['spill_stores']!s:>2} loads {c['spill_loads']!s:>2}"
    )


def forward_layouts(d: int, switches: dict) -> list[str]:
    """The blocked layouts in the TTGIR of the default forward (bf16, silu gate) at width d."""
    compiled = compile_only()
    import torch

    from rlnorm.kernel._fwd import rms_norm_gated_fwd
    from rlnorm.kernel.testing import plant

    x = torch.randn(8, d).bfloat16()
    with plant(fwd=switches):
        rms_norm_gated_fwd(x, x, torch.ones(d).bfloat16(), 1e-6, None, True, "silu")
    return re.findall(r"#ttg\.blocked<\{[^}]*\}>", compiled[-1].asm["ttgir"])


def default_counts(widths: Sequence[int]) -> int:
    """The default op (bf16, silu gate after the norm) at each width: forward, backward, finalize."""
    compiled = compile_only()
    import torch

    from rlnorm.kernel._bwd import rms_norm_gated_bwd
    from rlnorm.kernel._fwd import rms_norm_gated_fwd

    for d in widths:
        x, w = torch.randn(8, d).bfloat16(), torch.ones(d).bfloat16()
        start = len(compiled)
        rms_norm_gated_fwd(x, x, w, 1e-6, None, True, "silu")
        rms_norm_gated_bwd(x, x, x, w, 1e-6, None, True, "silu")
        for k in compiled[start:]:
            print(_line(f"d={d}", counts(k)))
    return 0


def every_combination(verbose: bool) -> int:
    """Compile every option combination; print failures and spills (or all counts); 1 if any failed."""
    compiled = compile_only()
    import torch
    import triton

    from rlnorm.kernel._bwd import rms_norm_gated_bwd
    from rlnorm.kernel._fwd import rms_norm_gated_fwd
    from rlnorm.kernel.testing import plant

    failures = spills = 0

    def attempt(what: str, fn: Callable[[], Any]) -> None:
        nonlocal failures, spills
        start = len(compiled)
        try:
            fn()
        except Exception as e:  # report every failing combination, not just the first
            failures += 1
            print(f"FAIL {what}: {str(e)[:200]}")
            return
        for k in compiled[start:]:
            c = counts(k)
            spilled = bool(c["spill_stores"] or c["spill_loads"])
            spills += spilled
            if verbose or spilled:
                print(("SPILL " if spilled else "") + _line(what, c))

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
        what = f"d={d} group={group} nbg={nbg} act={act} z={has_z} w={str(wdt).replace('torch.', '')}"
        attempt(f"fwd {what}", lambda x=x, z=z, w=w, g=group, n=nbg, a=act: rms_norm_gated_fwd(x, z, w, 1e-6, g, n, a))
        attempt(
            f"bwd {what}",
            lambda dy=dy, x=x, z=z, w=w, g=group, n=nbg, a=act: rms_norm_gated_bwd(dy, x, z, w, 1e-6, g, n, a),
        )

    def tiled_bwd(x: torch.Tensor, d: int, tiles: int) -> Any:
        with plant(bwd={"TILES": tiles}):
            return rms_norm_gated_bwd(x, x, x, torch.ones(d), 1e-6, None, True, "silu")

    for d, tiles in itertools.product([128, 256], [1, 2, 4, 8, 16, 31]):  # tiles_per_program's values
        x = torch.randn(8, d).bfloat16()
        attempt(
            f"bwd d={d} TILES={tiles}",
            lambda x=x, d=d, t=tiles: tiled_bwd(x, d, t),
        )
    for d in (128, 256, 96):  # the forward that also zeroes the backward's counters
        x = torch.randn(8, d).bfloat16()
        ws = torch.empty(100, dtype=torch.int64)
        attempt(
            f"fwd d={d} zero=",
            lambda x=x, d=d, ws=ws: rms_norm_gated_fwd(x, x, torch.ones(d), 1e-6, None, True, "silu", zero=ws),
        )
    print(f"triton {triton.__version__}: {failures} failing combinations, {spills} compiled kernels that spill")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.switches is not None and a.layouts is None:
        p.error("SWITCHES goes with --layouts D")
    if a.layouts is not None:
        print("\n".join(forward_layouts(a.layouts, json.loads(a.switches) if a.switches else {})))
        return 0
    if a.counts:
        return default_counts(a.counts)
    return every_combination(a.verbose)


if __name__ == "__main__":
    raise SystemExit(main())
