"""This run beside the reference B200 report where they share a measure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colors as mcolors
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.kit.results import RunResult
from rlnorm.report.plots.common import (
    MISSING_COLOR,
    REPORT_COLOR,
    THIS_COLOR,
    cpu_note,
    fmt_us,
    message,
    missing_reason,
    rows_measured,
    save,
    set_title,
)
from rlnorm.report.runs import run_label
from rlnorm.report.verdict import BackendVerdict, State, backend_verdict, crash_words

# column -> (check, which count); the sweep's is its total, as the report counts it
COUNT_COLUMNS = {
    "all_rows\ny": ("all_rows", "y"),
    "all_rows\ndx,dz": ("all_rows", "grad"),
    "full_vs_sub_batches\ny": ("full_vs_sub_batches", "y"),
    "full_vs_sub_batches\ndx,dz": ("full_vs_sub_batches", "grad"),
    "batch_size_sweep\ny, dx or dz": ("batch_size_sweep", "any"),
    "dweight_repeatable": ("dweight_repeatable", ""),
    "gates passed": ("", ""),
}
_DIED = (State.CRASHED, State.TIMED_OUT)


def count_cell(v: BackendVerdict | None, column: str) -> tuple[str, int]:
    """(text, colour class) of one count column: 0 no value, 1 nothing differs, 2 differs, 3 crashed."""
    if v is None or v.overall in (State.SKIPPED, State.NOT_LOADED):
        return "–", 0
    check, what = COUNT_COLUMNS[column]
    if not check:  # the gates the backend could take
        taken = [v.checks[g] for g in ("forward_gate", "gradient_gate") if v.checks[g].state is not State.NOT_RUN]
        if any(c.state in _DIED for c in taken):
            return taken[0].state.value, 3
        ok = all(c.state is State.PASSED for c in taken)
        return ("yes", 1) if taken and ok else (("NO", 2) if taken else ("–", 0))
    cv = v.checks[check]
    if cv.state in _DIED:
        return cv.state.value, 3
    if check == "dweight_repeatable":
        return {State.PASSED: ("yes", 1), State.FAILED: ("NO", 2)}.get(cv.state, ("–", 0))
    n = None if cv.counts is None else getattr(cv.counts, what)
    if what == "any" and n is None and cv.counts is not None:
        n = cv.counts.y
    return ("–", 0) if n is None else (f"{n:,}", 2 if n else 1)


def plot_vs_reference_report(run: RunResult, seed: RunResult, folder: Path | None = None) -> Figure:
    """This run beside the B200 reference report wherever both have a measure: forward and forward+backward time,
    the fraction not correctly rounded, and the differing-row counts."""
    keys = list(run.results) + [k for k in seed.results if k not in run.results]
    fig = Figure(figsize=(15, 4.0 + 0.9 * max(len(keys), 1)), layout="constrained")
    grid = fig.subplot_mosaic([["fwd", "fwd_bwd", "cr"], ["counts", "counts", "counts"]], height_ratios=[1.15, 1])
    names = (f"this run ({run.environment.get('gpu', '?')})", f"report ({seed.environment.get('gpu', '?')})")
    ys, h = np.arange(len(keys)), 0.38

    def value(r: RunResult, key: str, field: str) -> float | None:
        result = r.results.get(key)
        acc = None if result is None else result.accuracy_latency
        v = None if acc is None else getattr(acc, field)
        if field == "fwd_correctly_rounded":
            return None if v is None else 1.0 - v
        return v if v else None

    panels = (
        ("fwd", "fwd_us", "forward time (us, log scale)", "forward"),
        ("fwd_bwd", "fwd_bwd_us", "forward+backward time (us, log scale)", "forward + backward"),
        ("cr", "fwd_correctly_rounded", "fraction NOT correctly rounded (log scale)", "outputs not correctly rounded"),
    )
    for name, field, xlabel, title in panels:
        ax = grid[name]
        ax.set_title(title, fontsize=11, fontweight="bold")
        sides = [[value(r, k, field) for k in keys] for r in (run, seed)]
        present = [v for side in sides for v in side if v]
        if not present:
            message(ax, "no shared measure" if keys else "no backends")
            continue
        x_text = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for off, side, r, color, label in ((-h / 2, sides[0], run, THIS_COLOR, names[0]),
                                           (h / 2, sides[1], seed, REPORT_COLOR, names[1])):  # fmt: skip
            ax.barh(ys + off, [v or 0 for v in side], height=h, color=color, label=label)
            for y, k, v in zip(ys, keys, side, strict=True):
                if v:
                    ax.text(v * 1.1, y + off, f"{v:.2e}" if name == "cr" else fmt_us(v), va="center", fontsize=7)
                    continue
                exact = name == "cr" and v == 0
                why = "0 (all correctly rounded)" if exact else (missing_reason(r.results[k], field)
                                                                if k in r.results else "absent")  # fmt: skip
                ax.text(0.01, y + off, why, transform=x_text, va="center", fontsize=7, color=MISSING_COLOR,
                        style="italic")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlim(min(present) / 4, max(present) * 30)
        ax.set_yticks(ys, keys)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
        if name == "fwd":
            fig.legend(loc="outside upper right", fontsize=9, ncols=2)
    ax = grid["counts"]
    if not keys:
        message(ax, "no backends")
    else:
        ours = {k: backend_verdict(k, r) for k, r in run.results.items()}
        theirs = {k: backend_verdict(k, r) for k, r in seed.results.items()}
        classes = np.zeros((len(keys), len(COUNT_COLUMNS)))
        for i, k in enumerate(keys):
            for j, col in enumerate(COUNT_COLUMNS):
                (a, cls), (b, _) = count_cell(ours.get(k), col), count_cell(theirs.get(k), col)
                classes[i, j] = cls
                ax.text(j, i, f"{a}  |  {b}", ha="center", va="center", fontsize=9)
        cmap = mcolors.ListedColormap(["#eeeeee", "#c8e6c9", "#ffcdd2", "#ce93d8"])
        ax.imshow(classes, cmap=cmap, vmin=0, vmax=3, aspect="auto")
        ax.set_xticks(range(len(COUNT_COLUMNS)), list(COUNT_COLUMNS), fontsize=8.5)
        labels = [k + (f"\n({crash_words(run.results[k], brief=True)})" if k in run.results and
                       crash_words(run.results[k]) else "") for k in keys]  # fmt: skip
        ax.set_yticks(range(len(keys)), labels)
        ax.xaxis.tick_top()
        ax.set_title(
            "row comparisons that differ (y: the output; dx,dz: dx or dz; sweep: any of them): this run | report"
            "   (colour = this run: green 0, red > 0, grey no value, purple crashed or timed out)\n"
            "gates passed: the report's gradient gates compared the reference op's own dweight hook for every "
            "library, so their dweight lines passed by construction (docs/spec.md §5)",
            fontsize=10, loc="left",
        )  # fmt: skip
    notes = [f"vs {run_label(seed)}"]
    rows_this, rows_ref = rows_measured(run), rows_measured(seed)
    if rows_this and rows_ref and rows_this != rows_ref:
        notes.append(f"timed rows: this run {rows_this:,}, report {rows_ref:,}")
    if (run.params or {}).get("coverage"):
        notes.append(f"this run's sub-batch coverage: {run.params['coverage']}")  # type: ignore[index]
    notes.append(cpu_note(run) or "")
    set_title(fig, "This run beside the B200 reference report", run, " · ".join(n for n in notes if n))
    return save(fig, folder, "vs_reference_report")
