"""Error distributions: ulp distance to the correctly rounded value, and absolute error."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from rlnorm.report.plots.common import (
    BAD_COLOR,
    OK_COLOR,
    accuracy_of,
    as_doc,
    backend_keys,
    compact,
    message,
    not_ran,
    num,
    save,
    set_title,
    shorten,
)
from rlnorm.report.verdicts import crash_note


def _ulp_items(hist: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    def rank(k: str) -> tuple[int, int]:
        if k == "nan":
            return (2, 0)
        if k.endswith("+"):
            return (1, int(k[:-1]))
        return (0, int(k))

    keys = sorted(hist, key=rank)
    return keys, [int(hist[k] or 0) for k in keys]


def plot_error_distributions(artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None) -> Figure:
    """Per backend: histogram of the ulp distance of each forward output to the correctly rounded
    (fp64, rounded once) value, and of the absolute error against fp64 (log-spaced bins)."""
    doc = as_doc(artifact)
    backends = backend_keys(doc)
    n = max(len(backends), 1)
    # rows with a histogram get full height; rows that only carry a message, a strip
    heights = [
        2.4 if not_ran(doc["results"][k]) is None and accuracy_of(doc["results"][k]).get("fwd_ulp_hist") else 0.9
        for k in backends
    ] or [1.0]
    fig = Figure(figsize=(12, 1.0 + sum(heights)), layout="constrained")
    axes = fig.subplots(n, 2, squeeze=False, gridspec_kw={"height_ratios": heights})
    if not backends:
        message(axes[0, 0], "no backends in this artifact")
        message(axes[0, 1], "no backends in this artifact")
    for (ax_ulp, ax_abs), key in zip(axes, backends, strict=False):
        entry = doc["results"][key]
        acc = accuracy_of(entry)
        why = not_ran(entry)
        crashed = crash_note(entry)
        cr = num(acc.get("fwd_correctly_rounded"))
        head = f"{key}" + (f"   correctly rounded: {cr:.6f}" if cr is not None else "")
        ax_ulp.set_title(head, loc="left", fontsize=10, fontweight="bold")
        ulp = acc.get("fwd_ulp_hist")
        if why is not None:
            message(ax_ulp, f"no data ({why})")
        elif crashed is not None and not acc:
            message(ax_ulp, f"{crashed}: accuracy_latency not reached", color=BAD_COLOR)
        elif not ulp:
            why_not = f" (the check raised: {shorten(acc['error'], 80)})" if acc.get("error") else ""
            message(ax_ulp, "no ulp histogram recorded" + (why_not if acc else " (accuracy check not run)"))
        else:
            keys, counts = _ulp_items(ulp)
            xs = np.arange(len(keys))
            colors = [
                OK_COLOR if k == "0" else (BAD_COLOR if k in ("nan",) or k.endswith("+") else "#ef6c00") for k in keys
            ]
            ax_ulp.bar(xs, counts, color=colors, width=0.8)
            ax_ulp.set_xticks(xs, keys, fontsize=7)
            if any(c > 0 for c in counts):
                ax_ulp.set_yscale("log")
                ax_ulp.set_ylim(0.5, max(counts) * 40)  # headroom for the count labels
            for x, c in zip(xs, counts, strict=True):
                if c > 0:
                    ax_ulp.text(x, c * 1.3, compact(c), ha="center", va="bottom", fontsize=7)
            ax_ulp.set_ylabel("outputs (count)")
            ax_ulp.set_xlabel("ulp distance to the correctly rounded value")
        ax_abs.set_title("absolute error vs fp64" if why is None else "", loc="left", fontsize=10)
        hist = acc.get("fwd_abs_err_hist")
        if why is not None:
            message(ax_abs, f"no data ({why})")
        elif crashed is not None and not acc:
            message(ax_abs, f"no data ({crashed.split(':')[0]} before accuracy_latency)", color=BAD_COLOR)
        elif not hist or not hist.get("edges") or not hist.get("counts"):
            max_err = num(acc.get("fwd_max_abs_err"))
            extra = f"\nmax abs err {max_err:.3g}" if max_err is not None else ""
            message(ax_abs, "no absolute-error histogram recorded" + extra)
        else:
            edges = np.asarray(hist["edges"], dtype=float)
            counts = np.asarray(hist["counts"], dtype=float)
            if len(edges) != len(counts) + 1:
                message(ax_abs, f"malformed histogram: {len(edges)} edges for {len(counts)} counts", color=BAD_COLOR)
                continue
            ax_abs.stairs(counts, edges, fill=True, color="#5c6bc0", alpha=0.85)
            if np.all(edges > 0):
                ax_abs.set_xscale("log")
            if counts.max(initial=0) > 0:
                ax_abs.set_yscale("log")
                ax_abs.set_ylim(bottom=0.5)
            zero = int(hist.get("zero") or 0)
            nonzero = int(counts.sum())
            denom = max(zero + nonzero, 1)
            ax_abs.text(
                0.02,
                0.95,
                f"exact (error 0): {zero:,} ({100 * zero / denom:.2f}%)",
                transform=ax_abs.transAxes,
                va="top",
                fontsize=8,
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
            )
            max_err = num(acc.get("fwd_max_abs_err"))
            if max_err is not None and max_err > 0:
                ax_abs.axvline(max_err, color=BAD_COLOR, ls="--", lw=1)
                ax_abs.text(
                    max_err,
                    0.5,
                    f" max {max_err:.3g}",
                    color=BAD_COLOR,
                    fontsize=7,
                    transform=ax_abs.get_xaxis_transform(),
                )
            ax_abs.set_ylabel("outputs (count)")
            ax_abs.set_xlabel("|y - y_fp64| (absolute error, log scale)")
    set_title(fig, "Forward error distributions per backend", doc)
    save(fig, out_dir, "error_distributions")
    return fig
