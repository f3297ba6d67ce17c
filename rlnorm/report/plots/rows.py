"""Row comparisons that differ, per backend and check (the counts are defined in `rlnorm.report.counts`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.report.counts import COMPARES, ROW_CHECKS, backend_counts, check_counts, records_line
from rlnorm.report.plots.common import (
    BAD_COLOR,
    OK_COLOR,
    as_doc,
    backend_keys,
    message,
    not_ran,
    save,
    set_title,
    shorten,
)
from rlnorm.report.verdicts import crash_note

_CHECK_ORDER = ("all_rows", "full_vs_sub_batches", "batch_size_sweep", "dweight_repeatable", "contract_gates")
_TENSOR_STYLE = {  # marker, colour, vertical offset within a check's lane
    "y": ("o", "#1f77b4", -0.24),
    "dx": ("^", "#d62728", -0.08),
    "dz": ("v", "#ff7f0e", 0.08),
    "dweight": ("s", "#2ca02c", 0.24),
}


def _check_rank(check: str) -> tuple[int, str]:
    return (_CHECK_ORDER.index(check), check) if check in _CHECK_ORDER else (len(_CHECK_ORDER), check)


def _tensor_rank(tensor: str) -> int:
    return list(_TENSOR_STYLE).index(tensor) if tensor in _TENSOR_STYLE else len(_TENSOR_STYLE)


def _lanes(entry: Mapping[str, Any], sub: Any) -> list[str]:
    """The checks a backend's panel shows: those whose summary counts a difference, and those with records."""
    checks = [c for c, n in backend_counts(entry).items() if n.differs]
    if (entry.get("batch_invariance") or {}).get("dweight_repeatable") is False:
        checks.append("dweight_repeatable")
    if sub is not None and len(sub):
        checks += [c for c in sub["check"].astype(str).unique() if c not in checks]
    return sorted(checks, key=_check_rank)


def _lane_label(entry: Mapping[str, Any], check: str, n_records: int) -> str:
    what = COMPARES.get(check, check)
    if check in ROW_CHECKS:
        c = check_counts(entry, check)
        counted = "not in the summary" if c is None else f"{c.short()} {c.of()}".strip()
        return f"{check}\n{what}\n{counted}"
    if check == "dweight_repeatable":
        return f"{check}\n{what}\ndiffers ({n_records:,} record{'s' if n_records != 1 else ''})"
    return f"{check}\n{n_records:,} records"


def _not_kept(entry: Mapping[str, Any], check: str) -> int | None:
    c = check_counts(entry, check) if check in ROW_CHECKS else None
    return None if c is None else c.not_kept


def _summary_text(entry: Mapping[str, Any]) -> str:
    """The artifact's own counts, for when no per-row records are at hand."""
    counts = backend_counts(entry)
    parts = [f"{check}: {c.short()} {c.of()}".strip() for check, c in counts.items()]
    return "; ".join(parts) if parts else "no batch-invariance summary"


def plot_differing_rows(
    records_df: Any, artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None
) -> Figure:
    """Per backend, one lane per check that found a difference: the lane label gives the artifact's complete
    counts (row comparisons whose y, whose dx or dz differ); each point is a kept record (one differing row
    comparison and tensor) at its row's index in the case, marker = tensor; the lane's right end says how many
    records were kept of how many differing pairs (`max_records` caps them)."""
    doc = as_doc(artifact)
    backends = backend_keys(doc)
    have_records = records_df is not None
    if have_records:
        needed = {"backend", "check", "row", "tensor"}
        missing = needed - set(getattr(records_df, "columns", []))
        if missing:
            raise ValueError(f"records_df: missing columns {sorted(missing)} (expected the records.py table)")
    subsets: dict[str, Any] = {}
    lanes: dict[str, list[str]] = {}
    heights = []
    for key in backends:
        entry = doc["results"][key]
        sub = records_df[records_df["backend"] == key] if have_records and not_ran(entry) is None else None
        subsets[key] = sub
        lanes[key] = _lanes(entry, sub) if not_ran(entry) is None else []
        heights.append(0.9 + 0.62 * len(lanes[key]) if lanes[key] and have_records else 0.75)
    heights = heights or [1.0]
    fig = Figure(figsize=(12, 1.4 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    if not backends:
        message(axes[0], "no backends in this artifact")
    for ax, key in zip(axes, backends, strict=False):
        entry = doc["results"][key]
        crashed = crash_note(entry)
        title = key if crashed is None else f"{key}  ({shorten(crashed, 110)})"
        ax.set_title(title, loc="left", fontsize=10, fontweight="bold", color=BAD_COLOR if crashed else "black")
        why = not_ran(entry)
        sub = subsets[key]
        if why is not None:
            message(ax, f"no data ({why})")
            continue
        if sub is None:
            message(ax, "per-row records not available; counts: " + _summary_text(entry), fontsize=9)
            continue
        checks = lanes[key]
        if not checks:
            counted = [*backend_counts(entry)]
            if (entry.get("batch_invariance") or {}).get("dweight_repeatable") is not None:
                counted.insert(1 if "all_rows" in counted else 0, "dweight_repeatable")
            if counted:
                message(ax, "nothing differs in " + ", ".join(counted) + " (bitwise identical)", color=OK_COLOR)
            else:
                message(ax, "no batch-invariance check ran" + (" before it stopped" if crashed else ""))
            continue
        labels = []
        kept_total, not_kept_total = 0, 0
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for lane, check in enumerate(checks):
            in_check = sub[sub["check"].astype(str) == check]
            row_values = pd.to_numeric(in_check["row"], errors="coerce")
            per_row = in_check[row_values.notna()]
            whole = in_check[row_values.isna()]  # batch-level records (dweight repeats): no row to place
            labels.append(_lane_label(entry, check, len(in_check)))
            not_kept = _not_kept(entry, check)
            kept_total += len(in_check)
            not_kept_total += not_kept or 0
            if len(checks) > 1:  # each lane's own records; the panel's title sums them
                ax.text(
                    0.995, lane + 0.32, records_line(len(in_check), not_kept), transform=x_in_axes, ha="right",
                    va="center", fontsize=7.5, color="#424242",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )  # fmt: skip
            if len(whole):
                tensors = ", ".join(sorted(set(whole["tensor"].astype(str))))
                ax.text(
                    0.5, lane, f"{tensors} differs between two runs of one whole batch ({len(whole):,}x)",
                    transform=x_in_axes, ha="center", va="center", fontsize=9, color=BAD_COLOR,
                )  # fmt: skip
            elif not len(in_check):
                ax.text(
                    0.5, lane, "no records kept for this check", transform=x_in_axes, ha="center", va="center",
                    fontsize=9, color=BAD_COLOR,
                )  # fmt: skip
            for tensor, group in per_row.groupby(per_row["tensor"].astype(str)):
                marker, color, offset = _TENSOR_STYLE.get(tensor, ("x", "#555555", 0.0))
                rows = pd.to_numeric(group["row"]).to_numpy(dtype=float)
                ax.scatter(rows, np.full(rows.shape, lane + offset), marker=marker, s=22, color=color, alpha=0.75)
        ax.set_title(records_line(kept_total, not_kept_total), loc="right", fontsize=9, color=BAD_COLOR)
        ax.set_yticks(range(len(checks)), labels, fontsize=8)
        ax.set_ylim(-0.6, len(checks) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel("row index in the generated case (one point per kept record)")
        ax.grid(axis="x", alpha=0.3)
        handles = []
        placed = sub[pd.to_numeric(sub["row"], errors="coerce").notna()]
        for t in sorted(set(placed["tensor"].astype(str)), key=_tensor_rank):
            marker, color, _ = _TENSOR_STYLE.get(t, ("x", "#555555", 0.0))
            handles.append(ax.scatter([], [], marker=marker, color=color, label=t))
        if handles:
            ax.legend(
                handles=handles,
                title="tensor",
                fontsize=8,
                title_fontsize=8,
                loc="center left",
                bbox_to_anchor=(1.0, 0.5),
            )
    set_title(
        fig,
        "Row comparisons that differ bitwise, per backend and check (a count is row comparisons: once per size and"
        " seed; a record is one differing row comparison and tensor)",
        doc,
    )
    save(fig, out_dir, "differing_rows")
    return fig
