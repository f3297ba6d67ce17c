"""The figures of what was measured: forward error distributions, latency against the same-run torch.add floor,
the cross-backend bitwise agreement matrix, and the trainer/sampler pairs RL stacks deploy."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib import colors as mcolors
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from rlnorm.kit.results import Accuracy, BackendResult, RunResult
from rlnorm.report.plots.common import (
    BAD_COLOR,
    MISSING_COLOR,
    OK_COLOR,
    cpu_note,
    finish,
    fmt_ratio,
    fmt_us,
    message,
)
from rlnorm.report.verdict import clip, crash_words


def compact(n: int) -> str:
    """12 -> '12', 524283 -> '524k', 2.6e6 -> '2.6M': labels that fit above a narrow bar."""
    return f"{n:,}" if n < 10_000 else (f"{n / 1000:.0f}k" if n < 1_000_000 else f"{n / 1e6:.1f}M")


def own_add_us(acc: Accuracy, field: str) -> float | None:
    """The floor `field` is measured against: the torch.add timed beside this backend in the same run, which moves
    3 tensors (forward+backward must move 8)."""
    add = acc.roofline_add_us
    return None if add is None or add <= 0 else add * (1.0 if field == "fwd_us" else 8 / 3)


def missing_reason(result: BackendResult, field: str) -> str:
    """Why a backend has no `field` (a time, or the correctly rounded fraction)."""
    if result.status in ("skipped", "failed"):
        return result.status
    acc = result.accuracy_latency
    if acc is None:
        return crash_words(result, brief=True) or "accuracy_latency not run"
    if field == "fwd_bwd_us" and not result.has_backward:
        return "no backward"
    if acc.error:
        return "check raised"
    if acc.timed is False and field.endswith("_us"):
        return f"not timed ({acc.device or 'this device'})"
    return "not measured"


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
    for ax in axes[0] if not keys else ():
        message(ax, "no backends in this artifact")
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
            if any(counts):  # headroom for the count labels
                ax_ulp.set(yscale="log", ylim=(0.5, max(counts) * 40))
            for x, c in zip(xs, counts, strict=True):
                if c > 0:
                    ax_ulp.text(x, c * 1.3, compact(c), ha="center", va="bottom", fontsize=7)
            ax_ulp.set(ylabel="outputs (count)", xlabel="ulp distance to the correctly rounded value (bf16 ulps)")
        hist = None if acc is None else acc.fwd_abs_err_hist
        if not hist:
            max_err = None if acc is None else acc.fwd_max_abs_err
            extra = f"\nmax abs err {max_err:.3g}" if max_err is not None else ""
            message(ax_abs, "no absolute-error histogram recorded" + extra)
            continue
        # the accuracy check's histogram: ABS_ERR_EDGES (positive, one more than the counts) and their counts
        edges, counts_a = np.asarray(hist["edges"], dtype=float), np.asarray(hist["counts"], dtype=float)
        ax_abs.stairs(counts_a, edges, fill=True, color="#5c6bc0", alpha=0.85)
        ax_abs.set_xscale("log")
        if counts_a.max(initial=0) > 0:
            ax_abs.set(yscale="log", ylim=(0.5, None))
        zero = int(hist.get("zero") or 0)
        share = 100 * zero / max(zero + int(counts_a.sum()), 1)
        ax_abs.text(0.02, 0.95, f"exact (error 0): {zero:,} ({share:.2f}%)", transform=ax_abs.transAxes, va="top",
                    fontsize=8, bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})  # fmt: skip
        if acc is not None and acc.fwd_max_abs_err:
            ax_abs.axvline(acc.fwd_max_abs_err, color=BAD_COLOR, ls="--", lw=1)
            ax_abs.text(acc.fwd_max_abs_err, 0.5, f" max {acc.fwd_max_abs_err:.3g}", color=BAD_COLOR, fontsize=7,
                        transform=ax_abs.get_xaxis_transform())  # fmt: skip
        ax_abs.set(ylabel="outputs (count)", xlabel="|y - y_fp64| (absolute error, log scale)")
    return finish(fig, folder, "error_distributions", "Forward error distributions per backend", run)


def plot_latency(run: RunResult, folder: Path | None = None) -> Figure:
    """Forward and forward+backward time per backend (median, p20-p80 whiskers), each against the torch.add timed
    in the same run beside that backend (3 tensors forward; 8/3 of it for the 8 tensors of forward+backward)."""
    keys = list(run.results)
    fig = Figure(figsize=(14, 2.0 + 0.5 * max(len(keys), 1)), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    panels = (("fwd_us", "fwd_roofline_ratio", "forward", "3 tensors"),
              ("fwd_bwd_us", "fwd_bwd_roofline_ratio", "forward + backward", "8/3 x, 8 tensors"))  # fmt: skip
    starred = any_add = False
    accs = [run.results[k].accuracy_latency for k in keys]
    for ax, (field, ratio_field, label, what) in zip(axes, panels, strict=True):
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
        ax.barh(ys, [v or 0.0 for v in values], color="#1f77b4", height=0.6)
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for y, key, acc, v in zip(ys, keys, accs, values, strict=True):
            if v is None or acc is None:
                crashed = run.results[key].status in ("crashed", "timed_out")
                ax.text(0.01, y, missing_reason(run.results[key], field), transform=x_in_axes, va="center",
                        fontsize=9, style="italic", color=BAD_COLOR if crashed else MISSING_COLOR)  # fmt: skip
                continue
            lo, hi = getattr(acc, f"{field}_p20"), getattr(acc, f"{field}_p80")
            tip = v if lo is None or hi is None else max(v, hi)
            if lo is not None and hi is not None:
                ax.errorbar([v], [y], xerr=[[max(v - lo, 0)], [max(hi - v, 0)]], fmt="none", ecolor="#222", capsize=3)
            star = "*" if acc.ran_host_bound(field) else ""
            starred |= bool(star)
            ratio = getattr(acc, ratio_field)  # the time over the add timed beside it
            text = fmt_us(v) + star + (f"  ({fmt_ratio(ratio)} its add)" if ratio is not None else "")
            ax.text(tip * 1.12 if log else tip + max(span) * 0.015, y, text, va="center", fontsize=8)
        for i, (y, a) in enumerate((y, a) for y, a in zip(ys, adds, strict=True) if a is not None):
            any_add = True
            label_add = f"torch.add timed beside each backend, same run ({what})" if i == 0 else None
            ax.plot([a, a], [y - 0.42, y + 0.42], color=BAD_COLOR, ls="--", lw=1.4, label=label_add)
        if any(a is not None for a in adds):
            ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
        xlabel = f"time per call (us, median, {'log scale' if log else 'linear'}); whiskers p20-p80"
        ax.set(xscale="log" if log else "linear", xlabel=xlabel, ylabel="backend", ylim=(len(keys) - 0.4, -0.6))
        ax.set_xlim(*((min(span) / 2.5, max(span) * 60) if log else (0, max(span) * 1.5)))
        ax.set_yticks(ys, keys)
        ax.grid(axis="x", alpha=0.3)
    rows = next((a.rows for a in accs if a is not None and a.rows and a.rows > 0), None)
    add_dry = any(a is not None and a.ran_host_bound("add") for a in accs)
    notes = [f"{rows:,} rows" if rows else None,
             "ratio: the time over the add timed beside that backend" if any_add else "roofline not measured",
             cpu_note(run), "* the GPU queue ran dry while timing: host overhead included" if starred else None,
             "torch.add ran with the queue dry in some timing: the roofline may include host overhead" if add_dry
             else None]  # fmt: skip
    what = "Latency per backend, against the torch.add timed beside it in the same run (lower is better)"
    return finish(fig, folder, "latency", what, run, " · ".join(n for n in notes if n) or None)


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
        text = f"agreement step failed: {clip(failed[0].error, 200)}" if failed else "no agreement matrix"
        message(fig.subplots(), text, color=BAD_COLOR if failed else MISSING_COLOR)
        return finish(fig, folder, "agreement", title, run)
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
    ax.set(xlabel="backend", ylabel="backend")
    cbar = fig.colorbar(im, ax=ax, shrink=0.8)
    cbar.set_ticks(TICKS, labels=["0" if t == 0 else f"{t:.7f}".rstrip("0") for t in TICKS])
    cbar.set_label("fraction of outputs bitwise equal (as in the cells)\n(green: all equal; grey: n/a)")
    lines = [f"fraction of {a.tensor} elements bitwise equal · {a.rows:,} rows, seed {a.seed}"]
    left_out = [f"{key} ({crash_words(r, brief=True) or r.status})" for key, r in run.results.items()
                if key not in a.backends]  # fmt: skip
    if left_out:
        lines.append("not in the matrix: " + ", ".join(left_out))
    if a.errors:
        lines.append("n/a: " + "; ".join(f"{key}: {clip(v, 60)}" for key, v in a.errors.items()))
    return finish(fig, folder, "agreement", title, run, "\n".join(lines))


PAIRS_TITLE = "Trainer vs sampler as RL stacks deploy them: output elements whose bits differ"


def plot_stack_pairs(run: RunResult, folder: Path | None = None) -> Figure:
    """Per pair, the share of output elements whose bits differ, sampler vs trainer; a skipped pair says why."""
    table = run.stack_pairs
    pairs = table.pairs if table is not None else []
    fig = Figure(figsize=(13, 1.8 + 0.5 * max(len(pairs), 1)), layout="constrained")
    ax = fig.subplots()
    if table is None or not pairs:
        message(ax, "the stack pairs did not run in this artifact")
        return finish(fig, folder, "stack_pairs", PAIRS_TITLE, run)
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
    return finish(fig, folder, "stack_pairs", PAIRS_TITLE, run, calls)
