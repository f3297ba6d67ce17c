"""GPU call 27 (forward), at 6b4559e: is the tier as one PTX loop per thread intermittently slow at 262144 rows?
Calls 25-26 saw some processes run it at 2.3x the add at D=256 while others ran it at 1.04x. Five rounds of
three processes each (the new form storing the tier's rows but their settled elements, the new form
storing them whole then the settled elements again, the tier as committed at c8893ac), D=256 then D=128,
three passes each, with the GPU's clock and throttle reasons before and after each process.
    python3 scripts/kernel_gpu_v21.py --prepare; python3 scripts/kernel_gpu_v22.py
It was: the loop form ran 1.5-5x the add in most processes, the committed tier 1.02-1.06x in all; the loop
form was reverted after 6b4559e (its "new" and "new_dbl" need that commit's kernel; "old" is c8893ac's).
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v21 as V21
from scripts.kernel_gpu_v20 import patched_tree, run_child

CHILD = r"""
import sys, time
import torch
sys.path.insert(1, ROOT)
from scripts import kernel_gpu_v2 as V
import rlnorm.kernel._fwd as F
assert F.__file__.startswith(TREE), F.__file__
a = torch.randn(1 << 24, device="cuda")
t0 = time.time()
while time.time() - t0 < 1.0:
    a.add_(1.0)
torch.cuda.synchronize()
timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
for d in (256, 128):
    V.timing(d, V.ROWS, [(NAME + s, {"_variant": VARIANT}) for s in ("", "_b", "_c")], timer)
print("\n".join(V.SUMMARY))
"""
PROBES = {  # name: (c8893ac's tier, variant)
    "new": (False, {}),
    "new_dbl": (False, {"TIER_STORE": 1}),  # the tier's rows stored whole, settled elements stored again
    "old": (True, {}),
}
QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
SMI = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader"]


def smi() -> str:
    try:
        return subprocess.run(SMI, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:
        return f"nvidia-smi: {exc}"


def main() -> None:
    trees = {name: patched_tree([], V21.OLD if old else {}) for name, (old, _) in PROBES.items()}
    for rnd in range(5):
        for name in ("new", "new_dbl", "old"):
            before = smi()
            r = run_child(CHILD, trees[name], NAME=f"{name}{rnd}", VARIANT=PROBES[name][1])
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("time")]
            print(f"--- {name} round {rnd}: smi before [{before}] after [{smi()}]", flush=True)
            print("\n".join(lines), flush=True)
            if r.returncode:
                print(r.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
