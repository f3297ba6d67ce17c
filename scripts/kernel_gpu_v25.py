"""GPU call 3 of session 11 (forward): is the probes' "pathological" timing at 262144 rows the kernel or
the harness?

Session 9 timed 6b4559e's tier (one PTX loop per thread) 1.5-5x slower at 262144 rows in most processes,
and the committed tier never; session 11's call 2 saw the committed tier and the fast path alone
(EXACT 0) 1.6-2x slow at D=128 in some processes, with wide p20-p80, and D=256 never. The probes time
with triton's do_bench: an L2 flush (a 256 MB zero, ~60-70 us), then the call, with events around it; a
Python launch path slower than flush + kernel lets the queue run dry, and the host's time enters the
measurement. D=128's kernel is the shortest, so it would show first. This times each form three ways in
one process: do_bench as before, CUDA-graph replays at 262144 rows (no host in the measurement), and the
host's own time per launch; each form in its own process, two rounds interleaved.
    python3 scripts/kernel_gpu_v25.py --prepare     (here: writes 6b4559e's kernel files, untracked)
    python3 scripts/kernel_gpu_v25.py
Ran as call 3 at 421c366: the harness (docs/kernel-notes.md, session 11).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v21 as V21

LOOP_COMMIT = "6b4559e"
LOOP = V21.kernel_files(LOOP_COMMIT)
PROBES = [("ptx", {}, {}), ("loop6b", LOOP, {}), ("fast", {}, {"EXACT": 0})]

CHILD = (
    V21.CHILD_HEAD
    + r"""
timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
kw = {"_variant": VARIANT}
for d in (128, 256):
    sets = V.make_sets(V.ROWS, d, torch.bfloat16, "cuda")
    x, z, w, _ = sets[0]
    for _ in range(5):
        V.fwd(x, z, w, **kw)
    torch.cuda.synchronize()
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        V.fwd(x, z, w, **kw)
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    V.SUMMARY.append(f"host d={d} {NAME:<8} {host:6.1f} us per launch (python + triton launcher)")
    V.timing(d, V.ROWS, [(NAME + "_bench", kw)], timer)
    V.graph_time(d, V.ROWS, [(NAME + "_graph", kw)], calls=len(sets), reps=20)
    V.timing(d, V.ROWS, [(NAME + "_bench2", kw)], timer)
    for rows in (32, 512, 4096):
        V.graph_time(d, rows, [(NAME, kw)])
print("\n".join(V.SUMMARY))
json.dump(V.RES, open(OUTF, "w"), indent=1)
"""
)


def main() -> None:
    if sys.argv[1:] == ["--prepare"]:
        V21.prepare(LOOP_COMMIT, LOOP)
        return
    forms = [(name, [], files, variant) for name, files, variant in PROBES]
    V21.run_forms(forms, CHILD, "v25", int(os.environ.get("V25_ROUNDS", "2")), ("time", "graph", "host"))
    V.print_summary()


if __name__ == "__main__":
    main()
