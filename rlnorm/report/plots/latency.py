"""Forward and forward+backward latency against the `torch.add` floor timed beside each backend in the same run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.kit.results import RunResult
from rlnorm.report.plots.common import (
    BAD_COLOR,
    MISSING_COLOR,
    THIS_COLOR,
    cpu_note,
    fmt_ratio,
    fmt_us,
    message,
    missing_reason,
    own_add_us,
    roofline_ratio,
    rows_measured,
    save,
    set_title,
)


def plot_latency(run: RunResult, folder: Path | None = None) -> Figure:
    """Forward and forward+backward time per backend (median, p20-p80 whiskers), each against the torch.add timed
    in the same run beside that backend (3 tensors forward; 8/3 of it for the 8 tensors of forward+backward)."""
    keys = list(run.results)
    fig = Figure(figsize=(14, 2.0 + 0.5 * max(len(keys), 1)), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    panels = (("fwd_us", "forward", "3 tensors"), ("fwd_bwd_us", "forward + backward", "8/3 x, 8 tensors"))
    starred = any_add = False
    accs = [run.results[k].accuracy_latency for k in keys]
    for ax, (field, label, what) in zip(axes, panels, strict=True):
        ax.set_title(label, fontsize=11, fontweight="bold")
        values = [None if a is None or not getattr(a, field) else getattr(a, field) for a in accs]
        present = [v for v in values if v is not None]
        if not present:
            reasons = {missing_reason(run.results[k], field) for k in keys} or {"no backends"}
            message(ax, "no timings: " + "; ".join(sorted(reasons)))
            continue
        ys = np.arange(len(keys))
        adds = [None if a is None or v is None else own_add_us(a, field) for a, v in zip(accs, values, strict=True)]
        span = present + [a for a in adds if a is not None]
        log = max(span) / min(span) > 8  # within 8x a linear axis still shows the differences
        ax.barh(ys, [v or 0.0 for v in values], color=THIS_COLOR, height=0.6)
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for y, key, acc, v in zip(ys, keys, accs, values, strict=True):
            if v is None or acc is None:
                crashed = run.results[key].status in ("crashed", "timed_out")
                ax.text(0.01, y, missing_reason(run.results[key], field), transform=x_in_axes, va="center",
                        fontsize=9, style="italic", color=BAD_COLOR if crashed else MISSING_COLOR)  # fmt: skip
                continue
            lo, hi = getattr(acc, f"{field}_p20"), getattr(acc, f"{field}_p80")
            tip = v
            if lo is not None and hi is not None:
                ax.errorbar([v], [y], xerr=[[max(v - lo, 0)], [max(hi - v, 0)]], fmt="none", ecolor="#222", capsize=3)
                tip = max(v, hi)
            star = "*" if acc.ran_host_bound(field) else ""
            starred |= bool(star)
            ratio = roofline_ratio(acc, field)
            text = fmt_us(v) + star + (f"  ({fmt_ratio(ratio)} its add)" if ratio is not None else "")
            ax.text(tip * 1.12 if log else tip + max(span) * 0.015, y, text, va="center", fontsize=8)
        for i, (y, a) in enumerate((y, a) for y, a in zip(ys, adds, strict=True) if a is not None):
            any_add = True
            label_add = f"torch.add timed beside each backend, same run ({what})" if i == 0 else None
            ax.plot([a, a], [y - 0.42, y + 0.42], color=BAD_COLOR, ls="--", lw=1.4, label=label_add)
        if any(a is not None for a in adds):
            ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(span) / 2.5, max(span) * 60)
        else:
            ax.set_xlim(0, max(span) * 1.5)
        ax.set_yticks(ys, keys)
        ax.set_ylim(len(keys) - 0.4, -0.6)
        ax.set_xlabel(f"time per call (us, median, {'log scale' if log else 'linear'}); whiskers p20-p80")
        ax.set_ylabel("backend")
        ax.grid(axis="x", alpha=0.3)
    rows = rows_measured(run)
    notes = [
        f"{rows:,} rows" if rows else None,
        "ratio: the time over the add timed beside that backend" if any_add else "roofline not measured",
        cpu_note(run),
        "* the GPU queue ran dry while timing: host overhead included" if starred else None,
        "torch.add ran with the queue dry in some timing: the roofline may include host overhead"
        if any(a is not None and a.ran_host_bound("add") for a in accs)
        else None,
    ]
    what = "Latency per backend, against the torch.add timed beside it in the same run (lower is better)"
    set_title(fig, what, run, " · ".join(n for n in notes if n) or None)
    return save(fig, folder, "latency")
