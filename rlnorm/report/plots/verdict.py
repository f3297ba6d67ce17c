"""The headline figure: every backend's verdict per check, coloured, with the count behind it."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from rlnorm.report.plots.common import as_doc, backend_keys, message, save, set_title
from rlnorm.report.verdicts import COLUMNS, STATES, backend_cells, crash_note

STATE_COLORS = {
    "passed": "#a5d6a7",
    "failed": "#ef9a9a",
    "not run": "#e0e0e0",
    "crashed": "#ce93d8",
    "timed out": "#ffcc80",
    "error": "#fff59d",
}
# what each column compares, under its name
COLUMN_NOTES = {
    "all_rows": "row in batch\nvs alone",
    "full_vs_sub_batches": "sub-batch\nvs full batch",
    "batch_size_sweep": "probe in batch\nof m vs alone",
    "dweight_repeatable": "dweight\nrun vs run",
    "forward gate": "y across 7\narrangements",
    "gradient gate": "dx, dz; own dweight\nvs exact sum",
    "correctly rounded": "fraction of y\n= fp64 rounded once",
    "batch_invariant": "the four checks\non the left",
}


def _row_note(entry: Mapping[str, Any]) -> str:
    """Why a backend's row looks as it does, beside it: the crash and where, or why it did not run."""
    note = crash_note(entry)
    if note is not None:
        done = (entry.get("crash") or {}).get("finished_checks") or []
        return note + ("; finished: " + ", ".join(done) if done else "; no check finished")
    status = entry.get("status") or "ran"
    if status != "ran":
        return f"{status}: {entry.get('skip_reason') or 'no reason recorded'}"
    return ""


def plot_verdict(artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None) -> Figure:
    """Backends (rows) by checks (columns), each cell passed / failed / not run / crashed / timed out / error,
    with the count where there is one (row comparisons that differ: y / dx,dz)."""
    doc = as_doc(artifact)
    keys = backend_keys(doc)
    n = max(len(keys), 1)
    fig = Figure(figsize=(17, 2.9 + 0.62 * n), layout="constrained")
    ax = fig.subplots()
    if not keys:
        message(ax, "no backends in this artifact")
        set_title(fig, "Verdict per backend and check", doc)
        save(fig, out_dir, "verdict")
        return fig
    grid = np.zeros((len(keys), len(COLUMNS)))
    notes = []
    for i, key in enumerate(keys):
        entry = doc["results"][key] or {}
        cells = backend_cells(entry)
        for j, col in enumerate(COLUMNS):
            cell = cells[col]
            grid[i, j] = STATES.index(cell.state)
            ax.text(j, i, cell.text, ha="center", va="center", fontsize=8, linespacing=1.1)
        notes.append(_row_note(entry))
    cmap = mcolors.ListedColormap([STATE_COLORS[s] for s in STATES])
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(STATES) - 0.5, aspect="auto")
    # a last, uncoloured column says why a row looks as it does (a crash and where, a skip and why)
    note_x = len(COLUMNS) - 0.4
    labels = [f"{c}\n{COLUMN_NOTES[c]}" for c in COLUMNS]
    ticks = list(range(len(COLUMNS)))
    if any(notes):
        ticks.append(len(COLUMNS) + 0.75)
        labels.append("status\n(crash or skip: why)")
        for i, note in enumerate(notes):
            if note:
                ax.text(note_x, i, textwrap.fill(note, 44), ha="left", va="center", fontsize=7.5, color="#424242")
    ax.set_xlim(-0.5, len(COLUMNS) - 0.5 + (2.5 if any(notes) else 0))
    ax.set_xticks(ticks, labels, fontsize=8.5)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(keys)), keys, fontsize=9)
    ax.set_xticks(np.arange(-0.5, len(COLUMNS)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(keys)), minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.axvline(len(COLUMNS) - 1.5, color="#424242", lw=2)  # the overall verdict apart from its parts
    ax.set_xlabel(
        "check  ·  a count is row comparisons that differ (y: the output; dx,dz: dx or dz) 'of' those made,"
        " summed over sizes and seeds"
    )
    ax.set_ylabel("backend")
    ax.legend(
        handles=[Patch(facecolor=STATE_COLORS[s], edgecolor="#9e9e9e", label=s) for s in STATES],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.09),
        ncols=len(STATES),
        fontsize=9,
        frameon=False,
    )
    set_title(fig, "Verdict per backend and check (bitwise: RL trainer and sampler must compute the same bits)", doc)
    save(fig, out_dir, "verdict")
    return fig
