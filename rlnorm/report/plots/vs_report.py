"""This run beside the reference B200 report where they share a measure."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib import colors as mcolors
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.report.plots.common import (
    MISSING_COLOR,
    REPORT_COLOR,
    THIS_COLOR,
    accuracy_of,
    as_doc,
    backend_keys,
    cpu_note,
    fmt_us,
    gates_passed,
    latency_missing_reason,
    message,
    not_ran,
    num,
    rows_measured,
    run_label,
    save,
    set_title,
    size_entries,
)


def _differ_cells(entry: Mapping[str, Any] | None) -> dict[str, int | bool | None]:
    if entry is None or not_ran(entry) is not None:
        return {}
    bi = entry.get("batch_invariance") or {}
    all_rows = size_entries(bi.get("all_rows")) or None
    sub = bi.get("full_vs_sub_batches") or {}
    sweep = bi.get("batch_size_sweep") or {}

    def total(field: str) -> int | None:
        if not all_rows:
            return None
        vals = [v.get(field) for v in all_rows.values()]
        return None if any(v is None for v in vals) else int(sum(vals))

    return {
        "all_rows fwd": total("fwd_differ"),
        "all_rows grad": total("rowgrad_differ") if entry.get("backward") != "none" else None,
        "sub-batch fwd": sub.get("fwd_differ"),
        "sub-batch grad": sub.get("rowgrad_differ") if entry.get("backward") != "none" else None,
        "size sweep": sweep.get("differ"),
        "dweight repeatable": bi.get("dweight_repeatable"),
        "gates passed": gates_passed(entry),
    }


def _fmt_cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{int(v):,}"


def plot_vs_reference_report(
    artifact: Mapping[str, Any], seed_report: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None
) -> Figure:
    """This run beside the B200 seed report wherever both have a measure: forward and
    forward+backward time, fraction not correctly rounded, and the differing-row counts."""
    doc = as_doc(artifact)
    ref = as_doc(seed_report)
    keys = backend_keys(doc) + [k for k in backend_keys(ref) if k not in doc["results"]]
    fig = Figure(figsize=(15, 4.0 + 0.9 * max(len(keys), 1)), layout="constrained")
    grid = fig.subplot_mosaic([["fwd", "fwd_bwd", "cr"], ["counts", "counts", "counts"]], height_ratios=[1.15, 1])
    ref_env = ref.get("environment") or {}
    ref_name = f"report ({ref_env.get('gpu', '?')})"
    this_gpu = (doc.get("environment") or {}).get("gpu", "?")
    this_name = f"this run ({this_gpu})"
    ys = np.arange(len(keys))
    h = 0.38

    def entry(d: Mapping[str, Any], k: str) -> Mapping[str, Any] | None:
        return (d.get("results") or {}).get(k)

    def value(d: Mapping[str, Any], k: str, field: str) -> float | None:
        e = entry(d, k)
        if e is None or not_ran(e) is not None:
            return None
        v = num(accuracy_of(e).get(field))
        if field == "fwd_correctly_rounded":
            return None if v is None else 1.0 - v
        return v if v is not None and v > 0 else None

    def missing(d: Mapping[str, Any], k: str, field: str) -> str:
        e = entry(d, k)
        if e is None:
            return "absent"
        return latency_missing_reason(e, field)

    panels = (
        ("fwd", "fwd_us", "forward time (us, log scale)", "forward"),
        ("fwd_bwd", "fwd_bwd_us", "forward+backward time (us, log scale)", "forward + backward"),
        ("cr", "fwd_correctly_rounded", "fraction NOT correctly rounded (log scale)", "outputs not correctly rounded"),
    )
    for name, field, xlabel, title in panels:
        ax = grid[name]
        ax.set_title(title, fontsize=11, fontweight="bold")
        this = [value(doc, k, field) for k in keys]
        theirs = [value(ref, k, field) for k in keys]
        present = [v for v in this + theirs if v is not None and v > 0]
        if not keys or not present:
            message(ax, "no shared measure" if keys else "no backends")
            continue
        ax.barh(ys - h / 2, [v or 0 for v in this], height=h, color=THIS_COLOR, label=this_name)
        ax.barh(ys + h / 2, [v or 0 for v in theirs], height=h, color=REPORT_COLOR, label=ref_name)
        ax.set_xscale("log")
        lo, hi = min(present), max(present)
        ax.set_xlim(lo / 4, hi * 30)
        x_text = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for y, k, a, b in zip(ys, keys, this, theirs, strict=True):
            for yy, v, d in ((y - h / 2, a, doc), (y + h / 2, b, ref)):
                if v is None or v <= 0:
                    exact = field == "fwd_correctly_rounded" and v == 0
                    label = "0 (all correctly rounded)" if exact else missing(d, k, field)
                    ax.text(
                        0.01, yy, label, transform=x_text, va="center", fontsize=7, color=MISSING_COLOR, style="italic"
                    )
                else:
                    label = f"{v:.2e}" if field == "fwd_correctly_rounded" else fmt_us(v)
                    ax.text(v * 1.1, yy, label, va="center", fontsize=7)
        ax.set_yticks(ys, keys)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
        if name == "fwd":
            fig.legend(loc="outside upper right", fontsize=9, ncols=2)
    ax = grid["counts"]
    columns = [
        "all_rows fwd",
        "all_rows grad",
        "sub-batch fwd",
        "sub-batch grad",
        "size sweep",
        "dweight repeatable",
        "gates passed",
    ]
    if not keys:
        message(ax, "no backends")
    else:
        status = np.zeros((len(keys), len(columns)))  # 0 missing, 1 ok, 2 differs
        for i, k in enumerate(keys):
            a_cells, b_cells = _differ_cells(entry(doc, k)), _differ_cells(entry(ref, k))
            for j, col in enumerate(columns):
                a, b = a_cells.get(col), b_cells.get(col)
                bad = (a is False) if isinstance(a, bool) else (a is not None and a > 0)
                status[i, j] = 0 if a is None else (2 if bad else 1)
                ax.text(j, i, f"{_fmt_cell(a)}  |  {_fmt_cell(b)}", ha="center", va="center", fontsize=9)
        cmap = mcolors.ListedColormap(["#eeeeee", "#c8e6c9", "#ffcdd2"])
        ax.imshow(status, cmap=cmap, vmin=0, vmax=2, aspect="auto")
        ax.set_xticks(range(len(columns)), columns)
        ax.set_yticks(range(len(keys)), keys)
        ax.xaxis.tick_top()
        ax.set_title(
            "rows that differ: this run | report   (colour = this run: green 0, red > 0, grey no value)\n"
            "gates passed: the report's gradient gates compared the reference op's own dweight hook for every "
            "library, so their dweight lines passed by construction (docs/spec.md §5)",
            fontsize=10,
            loc="left",
        )
    params = doc.get("params") or {}
    coverage = params.get("coverage")
    rows_this, rows_ref = rows_measured(doc), rows_measured(ref)
    notes = [f"vs {run_label(ref)}"]
    if rows_this and rows_ref and rows_this != rows_ref:
        notes.append(f"timed rows: this run {rows_this:,}, report {rows_ref:,}")
    if coverage:
        notes.append(f"this run's sub-batch coverage: {coverage}")
    if cpu_note(doc):
        notes.append(cpu_note(doc))
    extra = " · ".join(notes)
    set_title(fig, "This run beside the B200 reference report", doc, extra)
    save(fig, out_dir, "vs_reference_report")
    return fig
