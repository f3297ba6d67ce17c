"""The docs/spec.md §7.2 figures, drawn from an artifact (and the per-row records) alone; `plot_verdict`, the
headline, first. What their counts count is defined once, in `rlnorm.report.counts`.

Each function returns a matplotlib Figure and, given `out_dir`, also writes `<name>.png` there.
Figures are built with `matplotlib.figure.Figure` (no pyplot state, so Agg-safe in a worker and
no figure leaks in loops). Every title carries the GPU, the short commit and the parameter-set
name, so a PNG pasted alone into an RFC thread still says where it came from. Missing data
(a skipped backend, a CPU run with no timings, a report that predates a field) is drawn as a
labelled empty panel, never an exception.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rlnorm.report.plots.agreement import plot_agreement
from rlnorm.report.plots.common import BAD_COLOR, as_doc, message, run_label, save, set_title, shorten
from rlnorm.report.plots.errors import plot_error_distributions
from rlnorm.report.plots.latency import plot_latency
from rlnorm.report.plots.rows import plot_differing_rows
from rlnorm.report.plots.verdict import plot_verdict
from rlnorm.report.plots.vs_report import plot_vs_reference_report

__all__ = [
    "PLOT_NAMES",
    "plot_agreement",
    "plot_all",
    "plot_differing_rows",
    "plot_error_distributions",
    "plot_latency",
    "plot_verdict",
    "plot_vs_reference_report",
    "run_label",
]

# the headline figure first: a page (or a reader of the plots folder) shows it before the evidence
PLOT_NAMES = ("verdict", "differing_rows", "error_distributions", "latency", "agreement", "vs_reference_report")


def _failed_figure(name: str, artifact: Mapping[str, Any], exc: BaseException) -> Figure:
    fig = Figure(figsize=(8, 3), layout="constrained")
    message(fig.subplots(), f"plot '{name}' failed:\n{type(exc).__name__}: {shorten(str(exc), 200)}", color=BAD_COLOR)
    try:
        set_title(fig, name, as_doc(artifact))
    except Exception:  # the artifact itself may be what broke the plot
        fig.suptitle(name)
    return fig


def plot_all(
    artifact: Mapping[str, Any],
    records_df: Any,
    out_dir: str | os.PathLike[str],
    seed_report: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Draw every figure into `out_dir`; {name: PNG path}. A plot that raises is replaced by a PNG
    that states the error (and a warning), so one broken figure never costs the others."""
    jobs: list[tuple[str, Any]] = [
        ("verdict", lambda: plot_verdict(artifact, out_dir)),
        ("differing_rows", lambda: plot_differing_rows(records_df, artifact, out_dir)),
        ("error_distributions", lambda: plot_error_distributions(artifact, out_dir)),
        ("latency", lambda: plot_latency(artifact, out_dir)),
        ("agreement", lambda: plot_agreement(artifact, out_dir)),
    ]
    if seed_report is not None:
        jobs.append(("vs_reference_report", lambda: plot_vs_reference_report(artifact, seed_report, out_dir)))
    paths: dict[str, Path] = {}
    for name, draw in jobs:
        try:
            draw()
        except Exception as exc:
            warnings.warn(f"plot {name!r} failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            save(_failed_figure(name, artifact, exc), out_dir, name)
        paths[name] = Path(out_dir) / f"{name}.png"
    return paths
