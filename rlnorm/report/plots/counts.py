"""The figures of the verdict: every backend's state per check, the row comparisons that differ with each kept
record at its row, and two runs' verdicts, latencies and accuracies side by side."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from rlnorm.kit.results import BackendResult, RunResult
from rlnorm.report.compare import ABSENT, LATENCY, Comparison
from rlnorm.report.plots.common import BAD_COLOR, MISSING_COLOR, OK_COLOR, cpu_note, finish, message, save
from rlnorm.report.runs import run_label
from rlnorm.report.verdict import (
    CHECKS,
    COLUMNS,
    COMPARES,
    INVARIANCE,
    STATE_COLORS,
    State,
    clip,
    crash_words,
    differing_table,
    records_line,
    run_verdicts,
)

NOTE_CHARS = 52  # one line of 7.5 pt fits the status column (2.5 cells of a 17-inch figure)


def short_note(result: BackendResult) -> str:
    """Why a backend's row looks as it does, in one short line ('' when it ran through): the first clause, and of a
    quoted exception only its message (`skipped: No module named 'vllm'`)."""
    text = crash_words(result, brief=True)
    if result.status in ("skipped", "failed"):
        text = f"{result.status}: {result.skip_reason or 'no reason recorded'}"
    first = text.split("\n")[0].split("; ")[0]
    status, _, why = first.partition(": ")
    quoted = re.split(r"\b[A-Z]\w*(?:Error|Exception): ", why)
    if len(quoted) > 1 and quoted[-1]:
        first = f"{status}: {quoted[-1]}"
    return clip(first, NOTE_CHARS)


def plot_verdict(run: RunResult, folder: Path | None = None) -> Figure:
    """Backends (rows) by checks (columns), each cell coloured by its state, with the count where there is one
    (row comparisons that differ: y / dx,dz, of those made)."""
    verdicts = run_verdicts(run)
    keys = list(verdicts)
    fig = Figure(figsize=(17, 2.9 + 0.62 * max(len(keys), 1)), layout="constrained")
    ax = fig.subplots()
    title = "Verdict per backend and check (bitwise: RL trainer and sampler must compute the same bits)"
    if not keys:
        message(ax, "no backends in this artifact")
        return finish(fig, folder, "verdict", title, run)
    states = list(State)
    grid = np.zeros((len(keys), len(COLUMNS)))
    notes = [short_note(run.results[key]) for key in keys]
    for i, key in enumerate(keys):
        v = verdicts[key]
        for j, col in enumerate(COLUMNS):  # the checks, then the overall verdict
            cv = v.checks.get(col)
            state, text = (cv.state, cv.cell()) if cv is not None else (v.overall, textwrap.fill(v.headline, 14))
            grid[i, j] = states.index(state)
            ax.text(j, i, text, ha="center", va="center", fontsize=8, linespacing=1.1)
    cmap = mcolors.ListedColormap([STATE_COLORS[s] for s in states])
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(states) - 0.5, aspect="auto")
    labels = [f"{c}\n{textwrap.fill(COMPARES.get(c, 'the first six checks'), 20)}" for c in COLUMNS]
    ticks: list[float] = list(range(len(COLUMNS)))
    if any(notes):  # a last, uncoloured column says why a row looks as it does (a crash and where, a skip and why)
        ticks.append(len(COLUMNS) + 0.75)
        labels.append("status: why, in short\n(the full reason: the status table)")
        for i, note in enumerate(notes):
            ax.text(len(COLUMNS) - 0.4, i, note, ha="left", va="center", fontsize=7.5, clip_on=True)
    ax.set_xlim(-0.5, len(COLUMNS) - 0.5 + (2.5 if any(notes) else 0))
    ax.set_xticks(ticks, labels, fontsize=8.5)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(keys)), keys, fontsize=9)
    ax.set_xticks(np.arange(-0.5, len(COLUMNS)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(keys)), minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.axvline(len(COLUMNS) - 1.5, color="#424242", lw=2)  # the overall verdict apart from its parts
    ax.set_xlabel("check  ·  a count is row comparisons that differ (y: the output; dx,dz: dx or dz) 'of' those made,"
                  " summed over sizes and seeds")  # fmt: skip
    ax.set_ylabel("backend")
    used = [s for s in states if s.value in {states[int(g)].value for g in grid.flat}]
    ax.legend(handles=[Patch(facecolor=STATE_COLORS[s], edgecolor="#9e9e9e", label=s.value) for s in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.09), ncols=len(used), fontsize=9, frameon=False)  # fmt: skip
    return finish(fig, folder, "verdict", title, run)


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
    table = differing_table(run, records)  # per backend, the checks that found a difference, then those with records
    lanes = {key: list(table.loc[table["backend"] == key, "check"]) for key in verdicts}
    heights = [0.9 + 0.62 * len(lanes[k]) if lanes[k] and records is not None else 0.75 for k in verdicts] or [1.0]
    fig = Figure(figsize=(12, 1.4 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    if not verdicts:
        message(axes[0], "no backends in this artifact")
    for ax, (key, v) in zip(axes, verdicts.items(), strict=False):
        result = run.results[key]
        crashed = crash_words(result)
        title = key + (f"  ({clip(crashed, 110)})" if crashed else "")
        ax.set_title(title, loc="left", fontsize=10, fontweight="bold", color=BAD_COLOR if crashed else "black")
        counted = {c: v.checks[c] for c in INVARIANCE if v.checks[c].state in (State.PASSED, State.FAILED)}
        if v.overall in (State.SKIPPED, State.NOT_LOADED):
            message(ax, f"no data ({result.status}: {clip(v.why, 90)})")
            continue
        if records is None:
            said = "; ".join(f"{c}: {cv.words()}" for c, cv in counted.items()) or "no batch-invariance summary"
            message(ax, "per-row records not available; " + said, fontsize=9)
            continue
        if not lanes[key]:
            said = "no batch-invariance check ran" + (" before it stopped" if crashed else "")
            if counted:
                said = "nothing differs in " + ", ".join(counted) + " (bitwise identical)"
            message(ax, said, color=OK_COLOR if counted else MISSING_COLOR)
            continue
        sub = records[records["backend"] == key]
        labels = []
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for lane, check in enumerate(lanes[key]):
            in_check = sub[sub["check"].astype(str) == check]
            rows = pd.to_numeric(in_check["row"], errors="coerce")
            counts = v.checks[check].counts if check in v.checks else None
            if counts is not None:
                labels.append(f"{check}\n{COMPARES[check]}\n{counts.short()} {counts.of()}")
            elif check == "dweight_repeatable":
                labels.append(f"{check}\n{COMPARES[check]}\ndiffers ({len(in_check):,} records)")
            else:
                labels.append(f"{check}\n{len(in_check):,} records")
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
        kept = table[table["backend"] == key][["records kept", "records not kept (max_records)"]].sum()
        ax.set_title(records_line(*map(int, kept)), loc="right", fontsize=9, color=BAD_COLOR)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set(ylim=(len(labels) - 0.4, -0.6), xlabel="row index in the generated case (one point per kept record)")
        ax.grid(axis="x", alpha=0.3)
        shown = set(sub.loc[pd.to_numeric(sub["row"], errors="coerce").notna(), "tensor"].astype(str))
        handles = [ax.scatter([], [], marker=TENSOR_STYLE[t][0], color=TENSOR_STYLE[t][1], label=t)
                   for t in TENSOR_STYLE if t in shown]  # fmt: skip
        if handles:
            ax.legend(handles=handles, title="tensor", fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    what = ("Row comparisons that differ bitwise, per backend and check (a count is row comparisons: once per size "
            "and seed; a record is one differing row comparison and tensor)")  # fmt: skip
    return finish(fig, folder, "differing_rows", what, run)


def plot_comparison(cmp: Comparison, folder: Path | None = None) -> Figure:
    """Latency ratios B/A, the share of outputs not correctly rounded, and the verdict grid with A and B per cell."""
    fig = Figure(figsize=(18, 4.8 + 0.25 * len(cmp.latency)), layout="constrained")
    ax_lat, ax_acc, ax_grid = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.3]})
    keys = list(cmp.latency.index)
    pos = np.arange(len(keys))
    for off, m, colour in zip((-0.2, 0.2), LATENCY, ("#3949ab", "#8e24aa"), strict=True):
        vals = cmp.latency[f"{m}_ratio"].to_numpy(dtype=float)
        ok = np.isfinite(vals)
        ax_lat.bar(pos[ok] + off, vals[ok] - 1.0, bottom=1.0, width=0.4, color=colour, label=m)
        for p, v in zip(pos[ok] + off, vals[ok], strict=True):
            ax_lat.annotate(f"{v:.2g}", (p, v), ha="center", va="bottom" if v >= 1 else "top", fontsize=7)
    ax_lat.axhline(1.0, color="k", lw=0.8)
    floor = 1e-7  # exactly correctly rounded (a share of 0) is drawn at the floor, marked "0"
    for off, side, colour, label in ((-0.2, "a", "#546e7a", cmp.label_a), (0.2, "b", "#00897b", cmp.label_b)):
        miss = 1.0 - cmp.accuracy[f"fwd_correctly_rounded_{side}"].to_numpy(dtype=float)
        ok = np.isfinite(miss)
        ax_acc.bar(pos[ok] + off, np.maximum(miss[ok], floor), width=0.4, color=colour, label=label)
        for p, v in zip(pos[ok] + off, miss[ok], strict=True):
            if v <= 0:
                ax_acc.annotate("0", (p, floor), ha="center", va="bottom", fontsize=7)
    for ax, what, title in ((ax_lat, "latency ratio B / A (< 1: B faster)", "latency, where both runs timed it"),
                            (ax_acc, "share of outputs not correctly rounded",
                             "forward accuracy (lower is better)")):  # fmt: skip
        ax.set(yscale="log", ylabel=what)
        ax.set_xticks(pos, keys, rotation=35, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    ax_acc.set_ylim(floor / 2, 1.0)
    v = cmp.verdicts
    backends = list(dict.fromkeys(v.index.get_level_values(0)))
    counted = [run_verdicts(r) for r in cmp.runs]
    colors = {s.value: STATE_COLORS[s] for s in State} | {ABSENT: "#ffffff"}
    for i, key in enumerate(backends):
        for j, check in enumerate(COLUMNS):
            row = v.loc[(key, check)]
            for half, state in ((0, row["state_a"]), (1, row["state_b"])):
                ax_grid.add_patch(Rectangle((j - 0.5 + 0.5 * half, i - 0.5), 0.5, 1, color=colors[state]))
            if row["changed"]:
                ax_grid.add_patch(Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, ec="k", lw=1.5))
            counts = [None if key not in bv else bv[key].checks[check].counts for bv in counted if check in CHECKS]
            if any(counts):  # the differing row comparisons, A over B
                text = "\n".join("–" if c is None else (c.short() if c.differs else "0") for c in counts)
                ax_grid.text(j, i, text, ha="center", va="center", fontsize=6.5)
    ax_grid.set(xlim=(-0.5, len(COLUMNS) - 0.5), ylim=(len(backends) - 0.5, -0.5))
    ax_grid.set_xticks(range(len(COLUMNS)), COLUMNS, rotation=35, ha="right", fontsize=8)
    ax_grid.set_yticks(range(len(backends)), backends, fontsize=8)
    ax_grid.set_title(f"verdicts: left half {cmp.label_a}, right half {cmp.label_b} (framed: changed)", fontsize=9)
    used = sorted({*v["state_a"], *v["state_b"]})
    ax_grid.legend(handles=[Patch(color=colors[s], label=s) for s in used], fontsize=7, loc="upper left",
                   bbox_to_anchor=(1.01, 1.0))  # fmt: skip
    title = f"A: {run_label(cmp.runs[0])}   against   B: {run_label(cmp.runs[1])}"
    note = cpu_note(cmp.runs[1])  # a CPU run's latency ratios against a GPU's say only that the code ran
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=10)
    return save(fig, folder, "vs_reference_report")
