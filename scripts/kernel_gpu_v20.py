"""GPU call 23 (forward): where the tier's latency goes. The D=128 forward's cost over the fast path alone is
the ~15% of one-warp programs that take the tier's branch; at decode sizes one such program sets the
launch's time (~1.3 us of 2.9 at 32 rows). Each probe is a patched copy of the package (timing only: the
patched kernels are NOT correctly rounded), run in its own process:
    base        the kernel as committed
    fast        EXACT 0: no midpoint test, no tier (the floor)
    no_elem     the per-element fp64 PTX removed (the row's fp64 rstd still computed)
    no_rstd64   the row's fp64 rstd replaced by the fp32 one (no reload of x, no fp64 sums)
    no_gate     the per-element PTX without its fp64 gate (exp series and reciprocal)
    shell       both removed: the branch, the undecided test and the row bitmask only
    python3 scripts/kernel_gpu_v20.py
Prints one line per probe and size; writes $OUT/v20/<probe>.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v20")

_CALL = "                    y = exact_element(\n"
_CALL_END = "                    )  # [BLOCK_R, S, C]\n"
_RSTD64 = "rstd64 = rows_rstd64(_row_sum(xr64 * xr64), rstd, eps, GROUP)"
_SILU = "value = _run_ptx(PTX_SILU_BF16, PTX_SILU_FP16, PTX_SILU_FP32, W_DTYPE, *args)"
_NONE = "value = _run_ptx(PTX_NONE_BF16, PTX_NONE_FP16, PTX_NONE_FP32, W_DTYPE, *args)"
NO_ELEM = [
    ("_fwd.py", _CALL, "                    y_unused = exact_element(\n"),
    ("_fwd.py", _CALL_END, _CALL_END + "                    y = tl.where(rstd64[:, None, None] == -1.0, 0.0, y)\n"),
]
NO_RSTD64 = [("_fwd.py", _RSTD64, "rstd64 = rstd.to(tl.float64)")]
PROBES = {
    "base": ([], {}),
    "fast": ([], {"EXACT": 0}),
    "no_elem": (NO_ELEM, {}),
    "no_rstd64": (NO_RSTD64, {}),
    "no_gate": ([("_exact_element.py", _SILU, _NONE)], {}),
    "shell": (NO_ELEM + NO_RSTD64, {}),
}


def patched_tree(patches: list[tuple[str, str, str]], files: dict[str, str] | None = None) -> str:
    """A copy of the package with kernel files replaced (`files`: file name -> path of its text), then the
    text patches applied (each must match exactly once)."""
    tmp = tempfile.mkdtemp(prefix="rlnorm_probe_")
    shutil.copytree(os.path.join(ROOT, "rlnorm"), os.path.join(tmp, "rlnorm"))
    for fname, path in (files or {}).items():
        shutil.copyfile(path, os.path.join(tmp, "rlnorm", "kernel", fname))
    for fname, old, new in patches:
        path = os.path.join(tmp, "rlnorm", "kernel", fname)
        src = open(path).read()
        if src.count(old) != 1:
            raise SystemExit(f"patch for {fname} matches {src.count(old)} times: {old[:60]!r}")
        open(path, "w").write(src.replace(old, new))
    return tmp


def run_child(child: str, tree: str, **names: object) -> subprocess.CompletedProcess:
    """Run `child` (Python source) in its own process on the package copy `tree`, with ROOT, TREE and
    `names` defined as Python literals before it."""
    head = "".join(f"{k}={v!r}; " for k, v in {"ROOT": ROOT, "TREE": tree, **names}.items())
    env = {**os.environ, "PYTHONPATH": tree}
    return subprocess.run(
        [sys.executable, "-c", head + "\n" + child], env=env, capture_output=True, text=True, cwd=tree
    )


CHILD = r"""
import json, sys
import torch
sys.path.insert(1, ROOT)
from scripts import kernel_gpu_v2 as V
import rlnorm.kernel._fwd as F
assert F.__file__.startswith(TREE), F.__file__
timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
var = [(NAME, {"_variant": VARIANT})]
for d in (128, 256):
    V.timing(d, V.ROWS, var, timer)
    for rows in (32, 512, 4096):
        V.graph_time(d, rows, var)
print("\n".join(V.SUMMARY))
json.dump(V.RES, open(OUTF, "w"), indent=1)
"""


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    order = os.environ.get("V20_PROBES", ",".join(PROBES) + ",base").split(",")
    for i, name in enumerate(order):
        patches, variant = PROBES[name]
        tag = f"{name}_{i}"
        r = run_child(CHILD, patched_tree(patches), NAME=tag, VARIANT=variant, OUTF=os.path.join(OUT, tag + ".json"))
        print(r.stdout[-4000:], flush=True)
        if r.returncode:
            print(f"probe {name} failed:\n{r.stderr[-3000:]}", flush=True)
        json.dump({"probe": name, "rc": r.returncode}, open(os.path.join(OUT, tag + ".rc.json"), "w"))


if __name__ == "__main__":
    main()
