"""This run beside the reference B200 report where they share a measure."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib import colors as mcolors
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.report.counts import backend_counts
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
)
from rlnorm.report.verdicts import crash_brief, ended_state, finished_checks

COUNT_COLUMNS = (
    "all_rows\ny",
    "all_rows\ndx,dz",
    "full_vs_sub_batches\ny",
    "full_vs_sub_batches\ndx,dz",
    "batch_size_sweep\ny, dx or dz",
    "dweight_repeatable",
    "gates passed",
)


def _differ_cells(entry: Mapping[str, Any] | None) -> dict[str, int | bool | str | None]:
    """column -> the count (row comparisons that differ), a yes/no, None (no value), or 'crashed' / 'timed out'
    for a check a backend's process did not live to finish."""
    if entry is None or not_ran(entry) is not None:
        return {}
    bi = entry.get("batch_invariance") or {}
    counts = backend_counts(entry)
    ended = ended_state(entry)
    done = set(finished_checks(entry))

    def died(check: str) -> bool:
        return ended is not None and check not in done

    def pick(check: str, attr: str) -> int | str | None:
        if died(check):
            return ended
        c = counts.get(check)
        if c is None:
            return None
        if attr == "any":  # the sweep: the report counts only the total; ours also counts it
            return c.any if c.any is not None else c.y
        return getattr(c, attr)

    return {
        COUNT_COLUMNS[0]: pick("all_rows", "y"),
        COUNT_COLUMNS[1]: pick("all_rows", "grad"),
        COUNT_COLUMNS[2]: pick("full_vs_sub_batches", "y"),
        COUNT_COLUMNS[3]: pick("full_vs_sub_batches", "grad"),
        COUNT_COLUMNS[4]: pick("batch_size_sweep", "any"),
        COUNT_COLUMNS[5]: ended if died("dweight_repeatable") else bi.get("dweight_repeatable"),
        COUNT_COLUMNS[6]: ended if ended is not None else gates_passed(entry),
    }


def _fmt_cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{int(v):,}"


def _key_label(doc: Mapping[str, Any], key: str) -> str:
    e = (doc.get("results") or {}).get(key)
    brief = None if e is None else crash_brief(e)
    return key if brief is None else f"{key}\n({brief})"


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
    columns = list(COUNT_COLUMNS)
    if not keys:
        message(ax, "no backends")
    else:
        status = np.zeros((len(keys), len(columns)))  # 0 missing, 1 ok, 2 differs, 3 crashed or timed out
        for i, k in enumerate(keys):
            a_cells, b_cells = _differ_cells(entry(doc, k)), _differ_cells(entry(ref, k))
            for j, col in enumerate(columns):
                a, b = a_cells.get(col), b_cells.get(col)
                bad = (a is False) if isinstance(a, bool) else (isinstance(a, int) and a > 0)
                status[i, j] = 3 if isinstance(a, str) else (0 if a is None else (2 if bad else 1))
                ax.text(j, i, f"{_fmt_cell(a)}  |  {_fmt_cell(b)}", ha="center", va="center", fontsize=9)
        cmap = mcolors.ListedColormap(["#eeeeee", "#c8e6c9", "#ffcdd2", "#ce93d8"])
        ax.imshow(status, cmap=cmap, vmin=0, vmax=3, aspect="auto")
        ax.set_xticks(range(len(columns)), columns, fontsize=8.5)
        ax.set_yticks(range(len(keys)), [_key_label(doc, k) for k in keys])
        ax.xaxis.tick_top()
        ax.set_title(
            "row comparisons that differ (y: the output; dx,dz: dx or dz; sweep: any of them): this run | report"
            "   (colour = this run: green 0, red > 0, grey no value, purple crashed or timed out)\n"
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
