"""Forward and forward+backward latency against the `torch.add` floor timed beside each backend in the same run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.kit.artifact import ran_host_bound
from rlnorm.report.plots.common import (
    BAD_COLOR,
    MISSING_COLOR,
    THIS_COLOR,
    accuracy_of,
    as_doc,
    backend_keys,
    cpu_note,
    fmt_ratio,
    fmt_us,
    latency_missing_reason,
    message,
    num,
    own_add_us,
    roofline_ratio,
    rows_measured,
    save,
    set_title,
)
from rlnorm.report.verdicts import ended_state


def plot_latency(artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None) -> Figure:
    """Forward and forward+backward time per backend (median, p20-p80 whiskers), each against the torch.add
    timed in the same run beside that backend (3 tensors forward; 8/3 of it for 8 tensors forward+backward).
    The ratio printed is the artifact's `fwd_roofline_ratio` / `fwd_bwd_roofline_ratio`, as in the table."""
    doc = as_doc(artifact)
    backends = backend_keys(doc)
    n = max(len(backends), 1)
    fig = Figure(figsize=(14, 2.0 + 0.5 * n), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    panels = (("fwd_us", "forward", "3 tensors"), ("fwd_bwd_us", "forward + backward", "8/3 x, 8 tensors"))
    starred = False  # a time marked *: the GPU queue ran dry while it was timed (host overhead included)
    any_add = False
    for ax, (field, label, what) in zip(axes, panels, strict=True):
        ax.set_title(label, fontsize=11, fontweight="bold")
        if not backends:
            message(ax, "no backends in this artifact")
            continue
        entries = [doc["results"][k] for k in backends]
        values = [num(accuracy_of(e).get(field)) for e in entries]
        values = [v if v is not None and v > 0 else None for v in values]
        present = [v for v in values if v is not None]
        if not present:
            reasons = {latency_missing_reason(e, field) for e in entries}
            message(ax, "no timings: " + "; ".join(sorted(reasons)))
            continue
        ys = np.arange(len(backends))
        lows, highs, tips = [], [], []
        for e, v in zip(entries, values, strict=True):
            p20, p80 = num(accuracy_of(e).get(f"{field}_p20")), num(accuracy_of(e).get(f"{field}_p80"))
            ok = v is not None and p20 is not None and p80 is not None
            lows.append(max(v - p20, 0.0) if ok else 0.0)
            highs.append(max(p80 - v, 0.0) if ok else 0.0)
            tips.append(max(v, p80) if ok else v)
        ax.barh(ys, [v or 0.0 for v in values], color=THIS_COLOR, height=0.6)
        ax.errorbar(
            [v or np.nan for v in values], ys, xerr=[lows, highs], fmt="none", ecolor="#222222", capsize=3, lw=1
        )
        adds = [None if v is None else own_add_us(accuracy_of(e), field) for e, v in zip(entries, values, strict=True)]
        span = present + [a for a in adds if a is not None]
        log = max(span) / min(span) > 8  # within 8x a linear axis still shows the differences
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(span) / 2.5, max(span) * 60)
        else:
            ax.set_xlim(0, max(span) * 1.5)
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for y, e, v, tip in zip(ys, entries, values, tips, strict=True):
            if v is None:
                ax.text(
                    0.01,
                    y,
                    latency_missing_reason(e, field),
                    transform=x_in_axes,
                    va="center",
                    fontsize=9,
                    color=MISSING_COLOR if ended_state(e) is None else BAD_COLOR,  # a crash is no skip
                    style="italic",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )
                continue
            star = "*" if ran_host_bound(accuracy_of(e), field) else ""
            starred |= bool(star)
            ratio = roofline_ratio(accuracy_of(e), field)
            text = fmt_us(v) + star + (f"  ({fmt_ratio(ratio)} its add)" if ratio is not None else "")
            x = tip * 1.12 if log else tip + max(span) * 0.015
            ax.text(x, y, text, va="center", fontsize=8)
        drawn = [(y, a) for y, a in zip(ys, adds, strict=True) if a is not None]
        if drawn:
            any_add = True
            for i, (y, a) in enumerate(drawn):
                label_add = f"torch.add timed beside each backend, same run ({what})" if i == 0 else None
                ax.plot([a, a], [y - 0.42, y + 0.42], color=BAD_COLOR, ls="--", lw=1.4, label=label_add)
            ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
        ax.set_yticks(ys, backends)
        ax.set_ylim(len(backends) - 0.4, -0.6)
        scale = "log scale" if log else "linear"
        ax.set_xlabel(f"time per call (us, median, {scale}); whiskers p20-p80")
        ax.grid(axis="x", alpha=0.3)
    rows = rows_measured(doc)
    add_starred = any(ran_host_bound(accuracy_of(e), "add") for e in (doc.get("results") or {}).values())
    notes = [
        f"{rows:,} rows" if rows else None,
        None if any_add else "roofline not measured",
        "ratio: the time over the add timed beside that backend (fwd_roofline_ratio, fwd_bwd_roofline_ratio)"
        if any_add
        else None,
        cpu_note(doc),
        "* the GPU queue ran dry while timing: host overhead included" if starred else None,
        "torch.add ran with the queue dry in some timing: the roofline may include host overhead"
        if add_starred
        else None,
    ]
    extra = " · ".join(n for n in notes if n) or None
    what = "Latency per backend, against the torch.add timed beside it in the same run (lower is better)"
    set_title(fig, what, doc, extra)
    save(fig, out_dir, "latency")
    return fig
