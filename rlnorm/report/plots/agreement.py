"""The agreement matrix: how often two backends compute bitwise the same output."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib import colors as mcolors
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from rlnorm.kit.results import RunResult
from rlnorm.report.plots.common import BAD_COLOR, message, save, set_title, shorten
from rlnorm.report.verdict import crash_words

FLOOR = 1e-7  # agreement within 1e-7 of 1 takes the scale's last colour
TICKS = (0.0, 0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999, 1.0 - FLOOR)


def _cell(f: float | None) -> str:
    if f is None:
        return "n/a"
    return "1\n(bitwise)" if f >= 1.0 else (f"{f:.6f}" if f >= 0.999 else f"{f:.4f}")


def plot_agreement(run: RunResult, folder: Path | None = None) -> Figure:
    """Fraction of forward outputs bitwise equal between each pair of backends on the same inputs; the colour
    scale is logarithmic in the fraction that differs, so 1 - 1e-5 and 1 - 1e-3 look different."""
    a = run.agreement
    title = "Cross-backend bitwise agreement"
    if a is None or not a.backends:
        fig = Figure(figsize=(7, 3.2), layout="constrained")
        failed = [f for f in run.failed_steps or [] if f.step == "agreement"]
        text = f"agreement step failed: {shorten(failed[0].error, 200)}" if failed else "no agreement matrix"
        message(fig.subplots(), text, color=BAD_COLOR if failed else "#888888")
        set_title(fig, title, run)
        return save(fig, folder, "agreement")
    k = len(a.backends)
    frac = np.array([[np.nan if v is None else v for v in row] for row in a.equal_fraction], dtype=float)
    norm = mcolors.FuncNorm(
        (lambda f: -np.log10(np.clip(1.0 - np.asarray(f, dtype=float), FLOOR, 1.0)),
         lambda s: 1.0 - 10.0 ** (-np.asarray(s, dtype=float))),
        vmin=0.0, vmax=1.0 - FLOOR,
    )  # fmt: skip
    size = 2.6 + 1.05 * k
    fig = Figure(figsize=(size + 1.2, size), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(np.where(frac < 1.0, frac, np.nan), cmap=matplotlib.colormaps["YlOrRd_r"], norm=norm)
    for i in range(k):
        for j in range(k):
            f = None if np.isnan(frac[i, j]) else float(frac[i, j])
            if f is None or f >= 1.0:  # exactly 1 is drawn green apart; n/a grey
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="#eeeeee" if f is None else "#c8e6c9"))
            dark = f is not None and f < 0.9
            ax.text(j, i, _cell(f), ha="center", va="center", fontsize=8.5, color="white" if dark else "black")
    ax.set_xticks(range(k), a.backends, rotation=35, ha="right")
    ax.set_yticks(range(k), a.backends)
    ax.set_xlabel("backend")
    ax.set_ylabel("backend")
    cbar = fig.colorbar(im, ax=ax, shrink=0.8)
    cbar.set_ticks(TICKS, labels=["0" if t == 0 else f"{t:.7f}".rstrip("0") for t in TICKS])
    cbar.set_label("fraction of outputs bitwise equal (as in the cells)\n(green: all equal; grey: n/a)")
    lines = [f"fraction of {a.tensor} elements bitwise equal · {a.rows:,} rows, seed {a.seed}"]
    left_out = [f"{key} ({crash_words(r, brief=True) or r.status})" for key, r in run.results.items()
                if key not in a.backends]  # fmt: skip
    if left_out:
        lines.append("not in the matrix: " + ", ".join(left_out))
    if a.errors:
        lines.append("n/a: " + "; ".join(f"{key}: {shorten(v, 60)}" for key, v in a.errors.items()))
    set_title(fig, title, run, "\n".join(lines))
    return save(fig, folder, "agreement")
