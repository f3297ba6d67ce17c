"""The headline figure: every backend's verdict per check, coloured by its state, with the count behind it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from rlnorm.kit.results import RunResult
from rlnorm.report.plots.common import message, save, set_title
from rlnorm.report.verdict import CHECKS, STATE_COLORS, State, crash_words, run_verdicts

COLUMNS = (*CHECKS, "batch_invariant")
NOTES = {  # what each column compares, under its name
    "all_rows": "row in batch\nvs alone",
    "full_vs_sub_batches": "sub-batch\nvs full batch",
    "batch_size_sweep": "probe in batch\nof m vs alone",
    "dweight_repeatable": "dweight\nrun vs run",
    "forward_gate": "y across 7\narrangements",
    "gradient_gate": "dx, dz; own dweight\nvs exact sum",
    "correctly_rounded": "fraction of y\n= fp64 rounded once",
    "batch_invariant": "the first four\nchecks",
}


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
        set_title(fig, title, run)
        return save(fig, folder, "verdict")
    states = list(State)
    grid = np.zeros((len(keys), len(COLUMNS)))
    notes = []
    for i, key in enumerate(keys):
        v = verdicts[key]
        for j, col in enumerate(COLUMNS):
            if col == "batch_invariant":
                state, text = v.overall, v.headline.replace(" batch ", "\nbatch ").replace("no verdict", "no\nverdict")
            else:
                state, text = v.checks[col].state, v.checks[col].cell()
            grid[i, j] = states.index(state)
            ax.text(j, i, text, ha="center", va="center", fontsize=8, linespacing=1.1)
        result = run.results[key]
        done = result.crash.finished_checks if result.crash is not None else []
        crashed = crash_words(result)
        notes.append(crashed + (f"; finished: {', '.join(done)}" if done else "; no check finished") if crashed else "")
        if result.status in ("skipped", "failed"):
            notes[-1] = f"{result.status}: {result.skip_reason or 'no reason recorded'}"
    cmap = mcolors.ListedColormap([STATE_COLORS[s] for s in states])
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(states) - 0.5, aspect="auto")
    labels = [f"{c}\n{NOTES[c]}" for c in COLUMNS]
    ticks: list[float] = list(range(len(COLUMNS)))
    if any(notes):  # a last, uncoloured column says why a row looks as it does (a crash and where, a skip and why)
        ticks.append(len(COLUMNS) + 0.75)
        labels.append("status\n(crash or skip: why)")
        for i, note in enumerate(notes):
            ax.text(len(COLUMNS) - 0.4, i, textwrap.fill(note, 44), ha="left", va="center", fontsize=7.5)
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
    ax.legend(
        handles=[Patch(facecolor=STATE_COLORS[s], edgecolor="#9e9e9e", label=s.value) for s in used],
        loc="upper center", bbox_to_anchor=(0.5, -0.09), ncols=len(used), fontsize=9, frameon=False,
    )  # fmt: skip
    set_title(fig, title, run)
    return save(fig, folder, "verdict")
