"""GPU call 6 of session 11: `kernel_gpu_v2.gpu_timer` with the queue primed, against CUDA-graph replays in
the same process (scripts/kernel_gpu_v25.py's child: host time per launch, the timer twice, graphs at
262144 rows and decode sizes); the shipped forward and its fast path alone (EXACT 0), each in its own
process, three rounds. Call 3's do_bench read D=128 1.3-2x slow in some processes.
    python3 scripts/kernel_gpu_v28.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21
from scripts import kernel_gpu_v25 as V25


def main() -> None:
    forms = [("tier", [], {}, {}), ("fast", [], {}, {"EXACT": 0})]
    V21.run_forms(forms, V25.CHILD, "v28", int(os.environ.get("V28_ROUNDS", "3")), ("time", "graph", "host"))
    V.print_summary()


if __name__ == "__main__":
    main()
