"""Row comparisons that differ, per backend and check: the counts, and each kept record at its row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.kit.results import RunResult
from rlnorm.report.plots.common import BAD_COLOR, OK_COLOR, message, not_ran, save, set_title, shorten
from rlnorm.report.verdict import COMPARES, INVARIANCE, State, crash_words, records_line, run_verdicts

TENSOR_STYLE = {  # marker, colour, vertical offset within a check's lane
    "y": ("o", "#1f77b4", -0.24),
    "dx": ("^", "#d62728", -0.08),
    "dz": ("v", "#ff7f0e", 0.08),
    "dweight": ("s", "#2ca02c", 0.24),
}


def plot_differing_rows(run: RunResult, records: pd.DataFrame | None, folder: Path | None = None) -> Figure:
    """Per backend, one lane per check that found a difference, labelled with the run's complete counts; each point
    is a kept record (one differing row comparison and tensor) at its row's index in the case, marker = tensor;
    the panel says how many records were kept of how many differing pairs (`max_records` caps them)."""
    if records is not None and {"backend", "check", "row", "tensor"} - set(records.columns):
        raise ValueError(f"records: expected the records table's columns, got {list(records.columns)}")
    verdicts = run_verdicts(run)
    lanes: dict[str, list[str]] = {}
    for key, v in verdicts.items():
        sub = records[records["backend"] == key] if records is not None else None
        checks = [c for c in INVARIANCE if v.checks[c].state is State.FAILED]
        checks += [c for c in (sub["check"].astype(str).unique() if sub is not None else []) if c not in checks]
        lanes[key] = checks
    heights = [0.9 + 0.62 * len(lanes[k]) if lanes[k] and records is not None else 0.75 for k in verdicts] or [1.0]
    fig = Figure(figsize=(12, 1.4 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    if not verdicts:
        message(axes[0], "no backends in this artifact")
    for ax, (key, v) in zip(axes, verdicts.items(), strict=False):
        result = run.results[key]
        crashed = crash_words(result)
        title = key + (f"  ({shorten(crashed, 110)})" if crashed else "")
        ax.set_title(title, loc="left", fontsize=10, fontweight="bold", color=BAD_COLOR if crashed else "black")
        counted = {c: v.checks[c] for c in INVARIANCE if v.checks[c].state in (State.PASSED, State.FAILED)}
        if not_ran(result) is not None:
            message(ax, f"no data ({not_ran(result)})")
            continue
        if records is None:
            said = "; ".join(f"{c}: {cv.words()}" for c, cv in counted.items()) or "no batch-invariance summary"
            message(ax, "per-row records not available; " + said, fontsize=9)
            continue
        if not lanes[key]:
            if counted:
                message(ax, "nothing differs in " + ", ".join(counted) + " (bitwise identical)", color=OK_COLOR)
            else:
                message(ax, "no batch-invariance check ran" + (" before it stopped" if crashed else ""))
            continue
        sub = records[records["backend"] == key]
        kept_total = not_kept_total = 0
        labels = []
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for lane, check in enumerate(lanes[key]):
            in_check = sub[sub["check"].astype(str) == check]
            rows = pd.to_numeric(in_check["row"], errors="coerce")
            counts = v.checks[check].counts if check in v.checks else None
            not_kept = None if counts is None else counts.not_kept
            kept_total, not_kept_total = kept_total + len(in_check), not_kept_total + (not_kept or 0)
            if counts is not None:
                labels.append(f"{check}\n{COMPARES[check]}\n{counts.short()} {counts.of()}")
            elif check == "dweight_repeatable":
                labels.append(f"{check}\n{COMPARES[check]}\ndiffers ({len(in_check):,} records)")
            else:
                labels.append(f"{check}\n{len(in_check):,} records")
            if len(lanes[key]) > 1:  # each lane's own records; the panel's title sums them
                ax.text(0.995, lane + 0.32, records_line(len(in_check), not_kept), transform=x_in_axes, ha="right",
                        va="center", fontsize=7.5, color="#424242")  # fmt: skip
            whole = in_check[rows.isna()]  # batch-level records (dweight repeats): no row to place
            if len(whole) or not len(in_check):
                tensors = ", ".join(sorted(set(whole["tensor"].astype(str))))
                text = (f"{tensors} differs between two runs of one whole batch ({len(whole):,}x)" if len(whole)
                        else "no records kept for this check")  # fmt: skip
                ax.text(0.5, lane, text, transform=x_in_axes, ha="center", va="center", fontsize=9, color=BAD_COLOR)
            placed = in_check[rows.notna()]
            for tensor, group in placed.groupby(placed["tensor"].astype(str)):
                marker, color, offset = TENSOR_STYLE.get(tensor, ("x", "#555555", 0.0))
                xs = pd.to_numeric(group["row"]).to_numpy(dtype=float)
                ax.scatter(xs, np.full(xs.shape, lane + offset), marker=marker, s=22, color=color, alpha=0.75)
        ax.set_title(records_line(kept_total, not_kept_total), loc="right", fontsize=9, color=BAD_COLOR)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(len(labels) - 0.4, -0.6)
        ax.set_xlabel("row index in the generated case (one point per kept record)")
        ax.grid(axis="x", alpha=0.3)
        shown = set(sub.loc[pd.to_numeric(sub["row"], errors="coerce").notna(), "tensor"].astype(str))
        handles = [
            ax.scatter([], [], marker=TENSOR_STYLE[t][0], color=TENSOR_STYLE[t][1], label=t)
            for t in TENSOR_STYLE
            if t in shown
        ]
        if handles:
            ax.legend(handles=handles, title="tensor", fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    what = ("Row comparisons that differ bitwise, per backend and check (a count is row comparisons: once per size "
            "and seed; a record is one differing row comparison and tensor)")  # fmt: skip
    set_title(fig, what, run)
    return save(fig, folder, "differing_rows")
