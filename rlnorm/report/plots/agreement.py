"""The agreement matrix: how often two backends compute bitwise the same output (colour and numbers: the
fraction that agrees)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import matplotlib
import matplotlib.patches
import numpy as np
from matplotlib import colors as mcolors
from matplotlib.figure import Figure

from rlnorm.report.plots.common import BAD_COLOR, as_doc, message, num, save, set_title, shorten
from rlnorm.report.verdicts import crash_brief

_FLOOR = 1e-7  # agreement within 1e-7 of 1 takes the scale's last colour
AGREE_TICKS = (0.0, 0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999, 1.0 - _FLOOR)


def _agree_to_scale(f: Any) -> Any:
    """Fraction that agrees -> -log10(fraction that differs): 0 at no agreement, 7 at 1 - 1e-7."""
    return -np.log10(np.clip(1.0 - np.asarray(f, dtype=float), _FLOOR, 1.0))


def _scale_to_agree(s: Any) -> Any:
    return 1.0 - 10.0 ** (-np.asarray(s, dtype=float))


def _fmt_tick(t: float) -> str:
    return "0" if t == 0 else f"{t:.7f}".rstrip("0")


def _fmt_fraction(f: float | None) -> str:
    if f is None:
        return "n/a"
    if f >= 1.0:
        return "1\n(bitwise)"
    if f >= 0.999:
        return f"{f:.6f}"
    return f"{f:.4f}"


def plot_agreement(artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None) -> Figure:
    """Fraction of forward outputs bitwise equal between each pair of backends on the same inputs."""
    doc = as_doc(artifact)
    agreement = doc.get("agreement")
    if not agreement or not agreement.get("backends"):
        fig = Figure(figsize=(7, 3.2), layout="constrained")
        ax = fig.subplots()
        if agreement and agreement.get("error"):
            message(ax, f"agreement matrix failed: {shorten(agreement['error'], 200)}", color=BAD_COLOR)
        else:
            message(ax, "no cross-backend agreement matrix in this artifact")
        set_title(fig, "Cross-backend bitwise agreement", doc)
        save(fig, out_dir, "agreement")
        return fig
    keys = list(agreement["backends"])
    k = len(keys)
    frac = np.full((k, k), np.nan)
    raw = agreement.get("equal_fraction") or []
    for i in range(min(k, len(raw))):
        for j in range(min(k, len(raw[i]))):
            v = num(raw[i][j])
            frac[i, j] = np.nan if v is None else v
    # colour and numbers both read as the fraction that agrees; the colour scale is logarithmic in the fraction
    # that differs (1 - f), so 1 - 1e-5 and 1 - 1e-3 look different; exactly 1 is drawn green apart
    norm = mcolors.FuncNorm((_agree_to_scale, _scale_to_agree), vmin=0.0, vmax=1.0 - _FLOOR)
    shown = np.where(frac < 1.0, frac, np.nan)
    cmap = matplotlib.colormaps["YlOrRd_r"].with_extremes(bad="white")
    size = 2.6 + 1.05 * k
    fig = Figure(figsize=(size + 1.2, size), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(shown, cmap=cmap, norm=norm)
    for i in range(k):
        for j in range(k):
            f = None if np.isnan(frac[i, j]) else float(frac[i, j])
            if f is not None and f >= 1.0:
                ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, color="#c8e6c9"))
            elif f is None:
                ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, color="#eeeeee"))
            dark = f is not None and f < 0.9
            ax.text(j, i, _fmt_fraction(f), ha="center", va="center", fontsize=8.5, color="white" if dark else "black")
    ax.set_xticks(range(k), keys, rotation=35, ha="right")
    ax.set_yticks(range(k), keys)
    ax.set_xlabel("backend")
    ax.set_ylabel("backend")
    cbar = fig.colorbar(im, ax=ax, shrink=0.8)
    cbar.set_ticks(AGREE_TICKS, labels=[_fmt_tick(t) for t in AGREE_TICKS])
    cbar.set_label("fraction of outputs bitwise equal (as in the cells)\n(green: all equal; grey: n/a)")
    rows, seed = agreement.get("rows"), agreement.get("seed")
    lines = []
    if isinstance(rows, int):
        lines.append(f"fraction of {agreement.get('tensor', 'y')} elements bitwise equal · {rows:,} rows, seed {seed}")
    results = doc.get("results") or {}
    left_out = [f"{k} ({crash_brief(e) or e.get('status', '?')})" for k, e in results.items() if k not in keys]
    if left_out:
        lines.append("not in the matrix: " + ", ".join(left_out))
    failed = agreement.get("errors") or {}
    if failed:
        lines.append("n/a: " + "; ".join(f"{k}: {shorten(v, 60)}" for k, v in failed.items()))
    set_title(fig, "Cross-backend bitwise agreement", doc, "\n".join(lines) or None)
    save(fig, out_dir, "agreement")
    return fig
