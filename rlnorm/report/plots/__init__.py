"""The docs/spec.md §7.2 figures, drawn from a `RunResult` (and its per-row records) alone. Each returns a
matplotlib Figure (no pyplot state: Agg-safe) and, given a folder, writes `<name>.png` there; every title says the
GPU, commit and parameter set; missing data is a labelled empty panel, never an exception."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from rlnorm.kit.results import RunResult
from rlnorm.report.compare import compare_runs
from rlnorm.report.plots.common import BAD_COLOR, finish, message
from rlnorm.report.plots.counts import plot_comparison, plot_differing_rows, plot_verdict
from rlnorm.report.plots.measures import plot_agreement, plot_error_distributions, plot_latency, plot_stack_pairs
from rlnorm.report.runs import records_of
from rlnorm.report.verdict import clip

PLOT_NAMES = ("verdict", "differing_rows", "error_distributions", "latency", "agreement", "stack_pairs")
PLOT_NAMES += ("vs_reference_report",)


def make_plots(run: RunResult, folder: Path, records: pd.DataFrame | None = None) -> dict[str, Path]:
    """Every figure as `folder/<name>.png`; a figure that raises is replaced by a PNG that states the error (and a
    warning), so one broken figure never costs the others. The kit records the paths in the artifact."""
    folder = Path(folder)
    records = records if records is not None else records_of(run)
    jobs = {
        "verdict": lambda: plot_verdict(run, folder),
        "differing_rows": lambda: plot_differing_rows(run, records, folder),
        "error_distributions": lambda: plot_error_distributions(run, folder),
        "latency": lambda: plot_latency(run, folder),
        "agreement": lambda: plot_agreement(run, folder),
        "stack_pairs": lambda: plot_stack_pairs(run, folder),
        "vs_reference_report": lambda: plot_comparison(compare_runs("seed", run), folder),
    }
    for name, draw in jobs.items():
        try:
            draw()
        except Exception as exc:
            warnings.warn(f"plot {name!r} failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            fig = Figure(figsize=(8, 3), layout="constrained")
            message(fig.subplots(), f"plot '{name}' failed:\n{type(exc).__name__}: {clip(str(exc), 200)}",
                    color=BAD_COLOR)  # fmt: skip
            finish(fig, folder, name, name, run)
    return {name: folder / f"{name}.png" for name in jobs}
