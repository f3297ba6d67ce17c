"""The stack pairs figure: per trainer/sampler pair an RL stack deploys, the share of output elements on which the
sampler's bits differ from the trainer's, with the largest ulp distance; a skipped pair says why in one line."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from rlnorm.kit.results import RunResult
from rlnorm.report.plots.common import BAD_COLOR, MISSING_COLOR, OK_COLOR, finish, message
from rlnorm.report.verdict import clip

TITLE = "Trainer vs sampler as RL stacks deploy them: output elements whose bits differ"


def plot_stack_pairs(run: RunResult, folder: Path | None = None) -> Figure:
    table = run.stack_pairs
    pairs = table.pairs if table is not None else []
    fig = Figure(figsize=(13, 1.8 + 0.5 * max(len(pairs), 1)), layout="constrained")
    ax = fig.subplots()
    if table is None or not pairs:
        message(ax, "the stack pairs did not run in this artifact")
        return finish(fig, folder, "stack_pairs", TITLE, run)
    n = table.rows * table.d
    labels = [f"{p.name}\n{p.trainer} → {p.sampler}" for p in pairs]
    shares = [100.0 * (p.elements_differ or 0) / n if p.status == "ran" and n else 0.0 for p in pairs]
    top = max([*shares, 1.0]) * 1.9  # room right of the longest bar for its words
    for i, (p, share) in enumerate(zip(pairs, shares, strict=True)):
        if p.status != "ran":
            text, color = f"{p.status}: {clip(p.reason or 'no reason recorded', 80)}", MISSING_COLOR
        elif p.bitwise_equal:
            text, color = "bitwise equal", OK_COLOR
        else:
            text, color = f"{p.elements_differ:,} of {n:,} elements differ, max {p.max_ulp} ulp", BAD_COLOR
        ax.barh(i, share, color=color, height=0.6)
        ax.text(share + top * 0.01, i, text, va="center", ha="left", fontsize=8.5, color=color)
    ax.set_yticks(range(len(pairs)), labels, fontsize=8.5)
    ax.set(xlim=(0, top), ylim=(len(pairs) - 0.5, -0.5), ylabel="pair (trainer backend → sampler backend)")
    ax.set_xlabel(f"output elements whose bits differ, sampler vs trainer (% of {table.rows} rows x {table.d})")
    ax.grid(axis="x", alpha=0.3)
    calls = "trainer: one packed batch, forward + backward; sampler: a prefill, then decode steps, inference mode"
    return finish(fig, folder, "stack_pairs", TITLE, run, calls)
