"""GPU call 6 of session 11: `kernel_gpu_v2.gpu_timer` with the queue primed, against CUDA-graph replays in
the same process (scripts/kernel_gpu_v25.py's child: host time per launch, the timer twice, graphs at
262144 rows and decode sizes); the shipped forward and its fast path alone (EXACT 0), each in its own
process, three rounds. Call 3's do_bench read D=128 1.3-2x slow in some processes.
    python3 scripts/kernel_gpu_v28.py
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v25 as V25
from scripts.kernel_gpu_v20 import patched_tree, run_child


def main() -> None:
    out = os.path.join(os.environ.get("OUT", "/tmp"), "v28")
    os.makedirs(out, exist_ok=True)
    for _ in range(int(os.environ.get("V28_ROUNDS", "3"))):
        for name, variant in (("tier", {}), ("fast", {"EXACT": 0})):
            r = run_child(V25.CHILD, patched_tree([]), NAME=name, VARIANT=variant, OUTF=os.devnull)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("time", "graph", "host"))]
            V.SUMMARY.extend(lines)
            print("\n".join(lines), flush=True)
            if r.returncode:
                print(f"probe {name} failed:\n{r.stderr[-3000:]}", flush=True)
    json.dump(V.SUMMARY, open(f"{out}/summary.json", "w"), indent=1)
    V.print_summary()


if __name__ == "__main__":
    main()
