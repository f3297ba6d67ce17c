"""One differing row, column by column: how far apart the two compared sides are, and how far each is
from the correctly rounded value."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlnorm.kit.results import RunResult
from rlnorm.report.investigate import RowExplanation
from rlnorm.report.runs import run_label


def plot_row(expl: RowExplanation, records: pd.DataFrame | None = None, run: RunResult | None = None) -> Figure:
    """Per column: ulp distance between the two compared sides (top) and each side's distance to the correctly
    rounded value (bottom). Where the backend cannot run here (a GPU run read on a CPU): per recorded row, the
    columns that differed and the largest ulp distance. Given the run, the title names its GPU and commit."""
    c, s = expl.columns, expl.summary
    cols = np.asarray(c.index)
    fig = Figure(figsize=(10, 4.8), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    if run is not None:
        fig.suptitle(f"{run_label(run)}; recomputed on {s['device']}", fontsize=9)
    if not s.get("recomputed", True):
        if records is None or records.empty:
            ax1.set_title(f"{s['backend']} cannot run on {s['device']}: nothing recomputed to plot", fontsize=10)
            for ax in (ax1, ax2):
                ax.set_axis_off()
            return fig
        return _plot_records(fig, (ax1, ax2), s, records)
    diff = c[expl.diff_column].to_numpy()
    ax1.bar(cols, diff, color=np.where(diff != 0, "#e53935", "#9e9e9e"), width=0.9)
    what = f"row {s['row']} ({s['check']} {s['case']})" if "row" in s else f"{s['check']} {s['case']}"
    ax1.set_title(f"{s['backend']} {s['tensor']}, {what}: {s['cols_differ']}/{s['columns']} columns differ, max "
                  f"{s['max_ulp']} ulp", fontsize=10)  # fmt: skip
    if s["tensor"] == "dweight":
        ax1.set_ylabel("ulp, run 1 vs run 2", fontsize=8)
        sides = [("first run", "ulp_first_vs_fp64", "#1e88e5"), ("second run", "ulp_second_vs_fp64", "#fb8c00")]
    else:
        ax1.set_ylabel(f"ulp, batch vs {s['compared_with']}", fontsize=8)
        sides = [("alone", "ulp_alone_vs_cr", "#1e88e5"), ("in batch", "ulp_batch_vs_cr", "#fb8c00")]
        if s["compared_with"] != "alone":
            sides.append((s["compared_with"], "ulp_compared_vs_cr", "#8e24aa"))
    width = 0.8 / len(sides)
    for i, (label, col, colour) in enumerate(sides):
        ax2.bar(cols + (i - (len(sides) - 1) / 2) * width, c[col], width=width, label=label, color=colour)
    ax2.set_ylabel("ulp vs correctly rounded", fontsize=8)
    ax2.set_xlabel("column")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        top = max(1, int(np.nanmax(ax.get_ylim())))
        ax.set_ylim(0, top + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def _plot_records(fig: Figure, axes: tuple, s: dict, records: pd.DataFrame) -> Figure:
    """The recorded differences of the row's backend and check, one bar per record, as the run measured them."""
    ax1, ax2 = axes
    rec = records[(records["backend"] == s["backend"]) & (records["check"] == s["check"])]
    rec = rec[rec["tensor"] == s["tensor"]] if "tensor" in s and (rec["tensor"] == s["tensor"]).any() else rec
    rows = rec["row"].to_numpy()
    ax1.bar(np.arange(len(rec)), rec["cols_differ"].to_numpy(), color="#e53935", width=0.9)
    ax1.set_ylabel("columns that differ", fontsize=8)
    ax1.set_title(f"{s['backend']} cannot run on {s['device']}: the run's own records of {s['check']} ({len(rec)} "
                  f"{s.get('tensor', '')} records)", fontsize=10)  # fmt: skip
    ax2.bar(np.arange(len(rec)), rec["max_ulp"].to_numpy(), color="#fb8c00", width=0.9)
    ax2.set_ylabel("largest ulp difference", fontsize=8)
    ax2.set_xlabel("recorded row (its index in the seeded case below each bar)")
    step = max(1, len(rec) // 20)
    ax2.set_xticks(np.arange(len(rec))[::step], [str(int(r)) if r == r else "-" for r in rows[::step]], fontsize=7)
    for ax in axes:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return fig
