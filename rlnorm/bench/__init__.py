"""The benchmark: rlnorm, its variants and every available peer against a same-run `torch.add`.

    python -m rlnorm bench ...          the speed table (`main`; rlnorm/bench/cli.py lists the options)
    python -m rlnorm bench-merge ...    several runs merged, or saved runs appended (`merge.main`)

Modules: `runner` times shapes, `table` formats, `variants` parses `--variant` and times rlnorm under
kernel switches, `base` compares another commit's kernel (`--base`), `merge` merges runs of separate
processes, `results` appends rows to benchmarks/results.csv, `files` reads and writes the JSON.
docs/benchmarking.md explains the clocks and the ratios.
"""

from __future__ import annotations

from rlnorm.bench.cli import main
from rlnorm.bench.files import EXIT_EXISTS
from rlnorm.bench.runner import PEERS, QUICK, SMOKE, Settings, bench_shape, entry, fastest_peer, run
from rlnorm.bench.table import format_markdown, format_table

__all__ = [
    "EXIT_EXISTS",
    "PEERS",
    "QUICK",
    "SMOKE",
    "Settings",
    "bench_shape",
    "entry",
    "fastest_peer",
    "format_markdown",
    "format_table",
    "main",
    "run",
]
