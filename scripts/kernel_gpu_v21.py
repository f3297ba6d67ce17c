"""GPU calls 24-26 and 28 (forward): the tier's latency, and the layout fix.

Call 23 (scripts/kernel_gpu_v20.py) found the tier's ~1.2 us at decode sizes going mostly with the per-
element PTX. Call 24 timed near keys computed before the sixteen per-element branches, the exp series by
Estrin's scheme and the fp64 reciprocal without the IEEE slow-path test: no gain at D=128, D=256 slower
(spills). Calls 25-26 timed one copy of the PTX per thread, a loop over its flagged elements (6b4559e,
with "new_dbl" = TIER_STORE 1): decode 0.2-0.6 us faster, 262144 rows 1.5-5x slower in most processes
(call 27, scripts/kernel_gpu_v22.py); reverted. Call 28 timed the tile built from two joined 2-D chunks
(f19a55f: the same layout on Triton 3.6 and 3.7) against c8893ac: D=256 108 us against 101, reverted.
Each variant in its own process (a warm-up first, three interleaved passes at 262144 rows, then decode
sizes in CUDA graphs); then the checks of scripts/kernel_gpu_v15.py and the GPU-only tests on the tree's
default. At the tree's kernel (c8893ac's) "new" and "old" are the same kernel.
    python3 scripts/kernel_gpu_v21.py --prepare      (here, in the git checkout: c8893ac's kernel files)
    V21_SECTIONS=probe,checks,pytest V21_PROBES=new,old,new,old python3 scripts/kernel_gpu_v21.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v15 as V15
from scripts.kernel_gpu_v20 import ROOT, patched_tree, run_child

OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v21")
V.OUT = OUT
# the kernel as committed at c8893ac (the tier as sixteen inlined copies of the per-element PTX): the
# device has no git history, so `--prepare` writes these files from it here first (untracked files travel)
OLD_COMMIT = "c8893ac"


def kernel_files(commit: str, files: tuple[str, ...] = ("_exact_element.py", "_fwd.py")) -> dict[str, str]:
    """Where `prepare` puts the kernel files of `commit` (rlnorm/kernel/<file>), by file name."""
    return {f: os.path.join(ROOT, "scripts", "probe_data", f"{f}.{commit}.txt") for f in files}


OLD = kernel_files(OLD_COMMIT)


def prepare(commit: str = OLD_COMMIT, files: dict[str, str] = OLD) -> None:
    """Write a commit's kernel files from git (run in the checkout before a device call)."""
    os.makedirs(os.path.dirname(next(iter(files.values()))), exist_ok=True)
    for fname, path in files.items():
        src = subprocess.run(
            ["git", "show", f"{commit}:rlnorm/kernel/{fname}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        with open(path, "w") as fh:
            fh.write(src)


PROBES = {"new": (False, {}), "old": (True, {}), "fast": (False, {"EXACT": 0})}  # name: (c8893ac's tier, variant)

# Every probe child starts so: the package copy it was given, then ~2 s of work so the clocks are up
CHILD_HEAD = r"""
import json, sys, time
import torch
sys.path.insert(1, ROOT)
from scripts import kernel_gpu_v2 as V
import rlnorm.kernel._fwd as F
assert F.__file__.startswith(TREE), F.__file__
a = torch.randn(1 << 24, device="cuda")
t0 = time.time()
while time.time() - t0 < 2.0:  # clocks up before the first timing
    a.add_(1.0)
torch.cuda.synchronize()
"""

CHILD = (
    CHILD_HEAD
    + r"""
timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
for d in DIMS:
    V.timing_passes(d, [(NAME, {"_variant": VARIANT})], timer, passes=3)
print("\n".join(V.SUMMARY))
json.dump(V.RES, open(OUTF, "w"), indent=1)
"""
)


def run_probe(name: str, files: dict[str, str], variant: dict, dims: tuple[int, ...] = (128, 256)) -> None:
    """Time the forward in its own process, on a copy of the package with `files` (file name -> path of
    its text) as its kernel files; the summary lines go to V.SUMMARY."""
    os.makedirs(OUT, exist_ok=True)
    tag = f"{name}_{len(os.listdir(OUT))}"
    outf = os.path.join(OUT, tag + ".json")
    r = run_child(CHILD, patched_tree([], files), NAME=name, VARIANT=variant, DIMS=dims, OUTF=outf)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("time", "graph"))]
    V.SUMMARY.extend(lines)
    print("\n".join(lines), flush=True)
    if r.returncode:
        print(f"probe {name} failed:\n{r.stderr[-3000:]}", flush=True)


def probe() -> None:
    for name in os.environ.get("V21_PROBES", "new,old,fast,new,old").split(","):
        old, variant = PROBES[name]
        run_probe(name, OLD if old else {}, variant)


def gpu_tests(
    files: tuple[str, ...] = ("tests/test_kernel_exact_element.py", "tests/test_kernel_fwd.py"), env: dict | None = None
) -> None:
    """The GPU-only kernel tests of `files` (stopping at the first failure); the outcome goes to V.SUMMARY."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-k", "gpu or widen or cuda", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]
    V.SUMMARY.append(f"pytest (GPU-only kernel tests): rc={r.returncode} {tail}")
    print(r.stdout[-3000:], r.stderr[-2000:], flush=True)


def run_forms(forms: list[tuple], child: str, out_name: str, rounds: int, prefixes: tuple[str, ...]) -> None:
    """Each form (name, text patches, kernel files, variant) in its own process on its own package copy,
    `rounds` times interleaved; the child's lines starting with `prefixes` go to V.SUMMARY, and the
    summary to $OUT/<out_name>/summary.json."""
    out = os.path.join(os.environ.get("OUT", "/tmp"), out_name)
    os.makedirs(out, exist_ok=True)
    for rnd in range(rounds):
        for name, patches, files, variant in forms:
            tag = f"{name}_{rnd}"
            r = run_child(child, patched_tree(patches, files), NAME=name, VARIANT=variant, OUTF=f"{out}/{tag}.json")
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith(prefixes)]
            V.SUMMARY.extend(lines)
            print("\n".join(lines), flush=True)
            if r.returncode:
                print(f"probe {tag} failed:\n{r.stderr[-3000:]}", flush=True)
    json.dump(V.SUMMARY, open(f"{out}/summary.json", "w"), indent=1)


def main() -> None:
    if sys.argv[1:] == ["--prepare"]:
        prepare()
        return
    V.run_sections("V21_SECTIONS", {"probe": probe, "checks": V15.checks, "pytest": gpu_tests})
    json.dump(V.SUMMARY, open(os.path.join(OUT, "summary.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
