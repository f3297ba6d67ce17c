"""GPU call 4 of session 11 (forward): the per-element tier as one PTX loop per thread that stores what it
settles (6b4559e's design on the joined tile, its text chosen in the kernel instead of passed as a
constexpr), against the sixteen inlined copies it replaces (421c366's kernel files).

Checks first, on the tree's default: every tier case bitwise equal to fp64 rounded once and to the
whole-row path (T = 10 on the standard data, T = 200 so ~0.6% of elements go through the tier), every
flagged row forced through the row path (a margin nothing passes), the planted tier fault caught by the
margin and visible without it, accuracy and batch invariance (sub-batches of 7 and 4097, permuted) at
both widths, the GPU-only tests. Then each form in its own process (`scripts/kernel_gpu_v25.py`'s child:
host time per launch, do_bench, CUDA-graph replays at 262144 rows, decode sizes in graphs), two rounds.
    python3 scripts/kernel_gpu_v26.py --prepare     (here: writes 421c366's kernel files, untracked)
    python3 scripts/kernel_gpu_v26.py
Ran as call 4 at 454be0a (the loop exists only there; reverted): every check passed, slower at 262144 rows
(docs/kernel-notes.md, session 11).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.inputs import make_case
from rlnorm.numerics import round_once
from rlnorm.reference import gated_rmsnorm_math
from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21
from scripts import kernel_gpu_v25 as V25
from scripts.kernel_gpu_v15 import CASES
from scripts.kernel_gpu_v20 import ROOT, patched_tree, run_child

OLD_COMMIT = "421c366"
OLD = V21.kernel_files(OLD_COMMIT)


def wrong(y: torch.Tensor, ref: torch.Tensor) -> int:
    return int((~V.same_bits(y, ref)).sum())


def checks() -> None:
    for name, opts, has_z, wd in CASES:
        for d, near in ((128, None), (256, None), (128, (200, 0)), (256, (200, 0))):
            if name != "silu" and near is None:
                continue
            c = make_case(V.ROWS if name == "silu" else V.ROWS // 4, d, seed=11, device=V.DEV, weight_dtype=wd)
            z = c.z if has_z else None
            kw = {"_near": near} if near else {}
            ref = round_once(gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64), torch.bfloat16)
            tier = V.fwd(c.x, z, c.w, opts, **kw)
            rows = V.fwd(c.x, z, c.w, opts, _variant={"TIER2": 0}, **kw)
            undecided = V.fwd(c.x, z, c.w, opts, _tier2=(1 << 50, 0), **kw)
            V.SUMMARY.append(
                f"check {name:<10} d={d} near={near} wrong tier={wrong(tier, ref)} rows={wrong(rows, ref)} "
                f"all-undecided={wrong(undecided, ref)} of {ref.numel()}"
            )
    for d in (128, 256):
        c = make_case(4096, d, seed=11, device=V.DEV)
        ref = round_once(gated_rmsnorm_math(c.x, c.z, c.w, V.OpOptions(), torch.float64), torch.bfloat16)
        for tag, t2 in (("covered", (1 << 37, 1 << 36)), ("uncovered", (1 << 14, 1 << 36))):
            y = V.fwd(c.x, c.z, c.w, _near=(200, 0), _tier2=t2)
            V.SUMMARY.append(f"check planted {tag} d={d}: wrong={wrong(y, ref)}")
    V.accuracy_and_invariance()


def gpu_tests() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-k",
            "gpu or widen or cuda",
            "tests/test_kernel_exact_element.py",
            "tests/test_kernel_fwd.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]
    V.SUMMARY.append(f"pytest (GPU-only kernel tests): rc={r.returncode} {tail}")


def main() -> None:
    if sys.argv[1:] == ["--prepare"]:
        V21.prepare(OLD_COMMIT, OLD)
        return
    V.guarded("checks", checks)
    gpu_tests()
    print("\n".join(V.SUMMARY), flush=True)
    out = os.path.join(os.environ.get("OUT", "/tmp"), "v26")
    os.makedirs(out, exist_ok=True)
    for rnd in range(int(os.environ.get("V26_ROUNDS", "2"))):
        for name, files in (("loop", {}), ("copies", OLD)):
            tag = f"{name}_{rnd}"
            r = run_child(V25.CHILD, patched_tree([], files), NAME=name, VARIANT={}, OUTF=f"{out}/{tag}.json")
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("time", "graph", "host"))]
            V.SUMMARY.extend(lines)
            print("\n".join(lines), flush=True)
            if r.returncode:
                print(f"probe {tag} failed:\n{r.stderr[-3000:]}", flush=True)
    json.dump(V.SUMMARY, open(f"{out}/summary.json", "w"), indent=1)
    V.print_summary()


if __name__ == "__main__":
    main()
