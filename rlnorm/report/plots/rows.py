"""Rows that differ, per backend and check."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.report.plots.common import (
    BAD_COLOR,
    OK_COLOR,
    as_doc,
    backend_keys,
    message,
    not_ran,
    save,
    set_title,
    size_entries,
)

_CHECK_ORDER = ("all_rows", "full_vs_sub_batches", "batch_size_sweep", "dweight_repeatable", "contract_gates")
_TENSOR_STYLE = {  # marker, colour, vertical offset within a check's lane
    "y": ("o", "#1f77b4", -0.24),
    "dx": ("^", "#d62728", -0.08),
    "dz": ("v", "#ff7f0e", 0.08),
    "dweight": ("s", "#2ca02c", 0.24),
}


def _check_rank(check: str) -> tuple[int, str]:
    return (_CHECK_ORDER.index(check), check) if check in _CHECK_ORDER else (len(_CHECK_ORDER), check)


def _summary_counts(entry: Mapping[str, Any]) -> str:
    """The artifact's own differ counts, for when no per-row records are at hand."""
    bi = entry.get("batch_invariance") or {}
    parts = []
    all_rows = size_entries(bi.get("all_rows"))
    if all_rows:
        fwd = sum(int(v.get("fwd_differ") or 0) for v in all_rows.values())
        grad = sum(int(v.get("rowgrad_differ") or 0) for v in all_rows.values())
        parts.append(f"all_rows: fwd {fwd}, grad {grad}")
    sub = bi.get("full_vs_sub_batches") or {}
    if sub:
        parts.append(f"full_vs_sub_batches: fwd {sub.get('fwd_differ')}, grad {sub.get('rowgrad_differ')}")
    sweep = bi.get("batch_size_sweep") or {}
    if sweep:
        parts.append(f"batch_size_sweep: {sweep.get('differ')} of {sweep.get('comparisons')}")
    return "; ".join(parts) if parts else "no batch-invariance summary"


def _tensor_rank(tensor: str) -> int:
    return list(_TENSOR_STYLE).index(tensor) if tensor in _TENSOR_STYLE else len(_TENSOR_STYLE)


def _dropped(entry: Mapping[str, Any]) -> int:
    """Differing (row, tensor) pairs the checks counted but did not record (`records_dropped`)."""
    bi = entry.get("batch_invariance") or {}
    total = 0
    for summary in (
        bi.get("full_vs_sub_batches"),
        bi.get("batch_size_sweep"),
        *size_entries(bi.get("all_rows")).values(),
    ):
        if isinstance(summary, Mapping):
            total += int(summary.get("records_dropped") or 0)
    return total


def _summary_differ(entry: Mapping[str, Any]) -> dict[str, int | None]:
    """check -> how many comparisons the artifact's summary says differ (None: not run/unknown)."""
    bi = entry.get("batch_invariance") or {}
    out: dict[str, int | None] = {}
    all_rows = size_entries(bi.get("all_rows"))
    if all_rows:
        out["all_rows"] = sum(
            int(v.get("fwd_differ") or 0) + int(v.get("rowgrad_differ") or 0) for v in all_rows.values()
        )
    if bi.get("dweight_repeatable") is not None:
        out["dweight_repeatable"] = 0 if bi["dweight_repeatable"] else 1
    sub = bi.get("full_vs_sub_batches") or {}
    if sub:
        out["full_vs_sub_batches"] = int(sub.get("fwd_differ") or 0) + int(sub.get("rowgrad_differ") or 0)
    sweep = bi.get("batch_size_sweep") or {}
    if sweep:
        out["batch_size_sweep"] = int(sweep.get("differ") or 0)
    return out


def plot_differing_rows(
    records_df: Any, artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None
) -> Figure:
    """Per backend: every differing row (row index in its generated case) against the check that
    found it, marker = tensor (y, dx, dz, dweight), lane label = number of differing rows."""
    doc = as_doc(artifact)
    backends = backend_keys(doc)
    have_records = records_df is not None
    if have_records:
        needed = {"backend", "check", "row", "tensor"}
        missing = needed - set(getattr(records_df, "columns", []))
        if missing:
            raise ValueError(f"records_df: missing columns {sorted(missing)} (expected the records.py table)")
    # one panel per backend; panels with points get room for their check lanes, the rest a strip
    subsets: dict[str, Any] = {}
    heights = []
    for key in backends:
        sub = None
        if have_records and not_ran(doc["results"][key]) is None:
            sub = records_df[records_df["backend"] == key]
        subsets[key] = sub
        heights.append(0.8 + 0.55 * sub["check"].nunique() if sub is not None and len(sub) else 0.75)
    heights = heights or [1.0]
    fig = Figure(figsize=(11, 1.2 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    if not backends:
        message(axes[0], "no backends in this artifact")
    for ax, key in zip(axes, backends, strict=False):
        entry = doc["results"][key]
        ax.set_title(f"{key}", loc="left", fontsize=10, fontweight="bold")
        why = not_ran(entry)
        sub = subsets[key]
        if why is not None:
            message(ax, f"no data ({why})")
            continue
        if sub is None:
            message(ax, "per-row records not available; summary: " + _summary_counts(entry), fontsize=9)
            continue
        counted = _summary_differ(entry)
        if len(sub) == 0:
            flagged = {c: n for c, n in counted.items() if n}
            if flagged:  # the summary counts differences the records do not hold (capped or lost)
                text = ", ".join(f"{c}: {n:,}" for c, n in flagged.items())
                message(ax, f"rows differ ({text}) but no per-row records were kept", color=BAD_COLOR, fontsize=10)
            elif counted:
                message(ax, "no differing rows in " + ", ".join(counted) + " (bitwise identical)", color=OK_COLOR)
            else:
                message(ax, "no batch-invariance check ran")
            continue
        checks = sorted(sub["check"].astype(str).unique(), key=_check_rank)
        id_cols = [c for c in ("seed", "case", "row") if c in sub.columns]
        labels = []
        n_total = 0
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for lane, check in enumerate(checks):
            in_check = sub[sub["check"].astype(str) == check]
            row_values = pd.to_numeric(in_check["row"], errors="coerce")
            per_row = in_check[row_values.notna()]
            whole = in_check[row_values.isna()]  # batch-level records (dweight repeats): no row to place
            n_rows = len(per_row.drop_duplicates(subset=id_cols))
            n_total += n_rows
            label = f"{check}\n{n_rows:,} row{'s' if n_rows != 1 else ''}"
            if len(whole):
                label = f"{check}\n{len(whole):,} whole-batch"
                tensors = ", ".join(sorted(set(whole["tensor"].astype(str))))
                ax.text(
                    0.5, lane, f"{tensors} differs between identical whole-batch runs ({len(whole):,}x)",
                    transform=x_in_axes, ha="center", va="center", fontsize=9, color=BAD_COLOR,
                )  # fmt: skip
            labels.append(label)
            for tensor, group in per_row.groupby(per_row["tensor"].astype(str)):
                marker, color, offset = _TENSOR_STYLE.get(tensor, ("x", "#555555", 0.0))
                rows = pd.to_numeric(group["row"]).to_numpy(dtype=float)
                ax.scatter(rows, np.full(rows.shape, lane + offset), marker=marker, s=22, color=color, alpha=0.75)
        dropped = _dropped(entry)
        capped = f"; {dropped:,} more not recorded (max_records)" if dropped else ""
        ax.set_title(
            f"{n_total:,} differing rows ({len(sub):,} records{capped})", loc="right", fontsize=9, color=BAD_COLOR
        )
        ax.set_yticks(range(len(checks)), labels, fontsize=8)
        ax.set_ylim(-0.6, len(checks) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel("row index in the generated case")
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
    set_title(fig, "Rows whose result differs from the row computed alone (bitwise), per backend and check", doc)
    save(fig, out_dir, "differing_rows")
    return fig
