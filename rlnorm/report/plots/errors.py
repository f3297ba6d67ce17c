"""Error distributions: ulp distance to the correctly rounded value, and absolute error against fp64."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from rlnorm.kit.results import RunResult
from rlnorm.report.plots.common import BAD_COLOR, OK_COLOR, compact, message, missing_reason, save, set_title


def _ulp_rank(k: str) -> tuple[int, int]:
    return (2, 0) if k == "nan" else ((1, int(k[:-1])) if k.endswith("+") else (0, int(k)))


def plot_error_distributions(run: RunResult, folder: Path | None = None) -> Figure:
    """Per backend: histogram of the ulp distance of each forward output to the correctly rounded (fp64, rounded
    once) value, and of the absolute error against fp64 (log-spaced bins)."""
    keys = list(run.results)
    accs = {k: run.results[k].accuracy_latency for k in keys}
    heights = [2.4 if accs[k] is not None and accs[k].fwd_ulp_hist else 0.9 for k in keys] or [1.0]
    fig = Figure(figsize=(12, 1.0 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 2, squeeze=False, gridspec_kw={"height_ratios": heights})
    if not keys:
        message(axes[0, 0], "no backends in this artifact")
        message(axes[0, 1], "no backends in this artifact")
    for (ax_ulp, ax_abs), key in zip(axes, keys, strict=False):
        acc = accs[key]
        cr = None if acc is None else acc.fwd_correctly_rounded
        head = key + (f"   correctly rounded: {cr:.6f}" if cr is not None else "")
        ax_ulp.set_title(head, loc="left", fontsize=10, fontweight="bold")
        ax_abs.set_title("absolute error vs fp64", loc="left", fontsize=10)
        if acc is None or not acc.fwd_ulp_hist:
            why = f"no ulp histogram ({missing_reason(run.results[key], 'fwd_correctly_rounded')})"
            message(ax_ulp, why)
        else:
            ks = sorted(acc.fwd_ulp_hist, key=_ulp_rank)
            counts = [int(acc.fwd_ulp_hist[k] or 0) for k in ks]
            xs = np.arange(len(ks))
            colors = [OK_COLOR if k == "0" else (BAD_COLOR if k == "nan" or k.endswith("+") else "#ef6c00") for k in ks]
            ax_ulp.bar(xs, counts, color=colors, width=0.8)
            ax_ulp.set_xticks(xs, ks, fontsize=7)
            if any(counts):
                ax_ulp.set_yscale("log")
                ax_ulp.set_ylim(0.5, max(counts) * 40)  # headroom for the count labels
            for x, c in zip(xs, counts, strict=True):
                if c > 0:
                    ax_ulp.text(x, c * 1.3, compact(c), ha="center", va="bottom", fontsize=7)
            ax_ulp.set_ylabel("outputs (count)")
            ax_ulp.set_xlabel("ulp distance to the correctly rounded value (bf16 ulps)")
        hist = None if acc is None else acc.fwd_abs_err_hist
        if not hist or not hist.get("edges") or not hist.get("counts"):
            max_err = None if acc is None else acc.fwd_max_abs_err
            extra = f"\nmax abs err {max_err:.3g}" if max_err is not None else ""
            message(ax_abs, "no absolute-error histogram recorded" + extra)
            continue
        edges, counts_a = np.asarray(hist["edges"], dtype=float), np.asarray(hist["counts"], dtype=float)
        if len(edges) != len(counts_a) + 1:
            message(ax_abs, f"malformed histogram: {len(edges)} edges for {len(counts_a)} counts", color=BAD_COLOR)
            continue
        ax_abs.stairs(counts_a, edges, fill=True, color="#5c6bc0", alpha=0.85)
        if np.all(edges > 0):
            ax_abs.set_xscale("log")
        if counts_a.max(initial=0) > 0:
            ax_abs.set_yscale("log")
            ax_abs.set_ylim(bottom=0.5)
        zero = int(hist.get("zero") or 0)
        share = 100 * zero / max(zero + int(counts_a.sum()), 1)
        ax_abs.text(0.02, 0.95, f"exact (error 0): {zero:,} ({share:.2f}%)", transform=ax_abs.transAxes, va="top",
                    fontsize=8, bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})  # fmt: skip
        if acc is not None and acc.fwd_max_abs_err:
            ax_abs.axvline(acc.fwd_max_abs_err, color=BAD_COLOR, ls="--", lw=1)
            ax_abs.text(acc.fwd_max_abs_err, 0.5, f" max {acc.fwd_max_abs_err:.3g}", color=BAD_COLOR, fontsize=7,
                        transform=ax_abs.get_xaxis_transform())  # fmt: skip
        ax_abs.set_ylabel("outputs (count)")
        ax_abs.set_xlabel("|y - y_fp64| (absolute error, log scale)")
    set_title(fig, "Forward error distributions per backend", run)
    return save(fig, folder, "error_distributions")
