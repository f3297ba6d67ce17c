"""The SPEC §6 figures, drawn from an artifact (and the per-row records) alone.

Each function returns a matplotlib Figure and, given `out_dir`, also writes `<name>.png` there.
Figures are built with `matplotlib.figure.Figure` (no pyplot state, so Agg-safe in a worker and
no figure leaks in loops). Every title carries the GPU, the short commit and the parameter-set
name, so a PNG pasted alone into an RFC thread still says where it came from. Missing data
(a skipped backend, a CPU run with no timings, a report that predates a field) is drawn as a
labelled empty panel, never an exception.
"""

from __future__ import annotations

import math
import os
import textwrap
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.patches
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib import transforms as mtransforms
from matplotlib.figure import Figure

from rlnorm.artifact import normalize_artifact, ran_host_bound

PLOT_NAMES = ("differing_rows", "error_distributions", "latency", "agreement", "vs_reference_report")

# the order checks are listed in, top to bottom; others follow alphabetically
_CHECK_ORDER = ("all_rows", "full_vs_sub_batches", "batch_size_sweep", "dweight_repeatable", "contract_gates")
_TENSOR_STYLE = {  # marker, colour, vertical offset within a check's lane
    "y": ("o", "#1f77b4", -0.24),
    "dx": ("^", "#d62728", -0.08),
    "dz": ("v", "#ff7f0e", 0.08),
    "dweight": ("s", "#2ca02c", 0.24),
}
_MISSING_COLOR = "#888888"
_OK_COLOR = "#2e7d32"
_BAD_COLOR = "#c62828"
_THIS_COLOR = "#1f77b4"
_REPORT_COLOR = "#9e9e9e"


# ---------------------------------------------------------------------------------------------
# shared helpers


def _doc(artifact: Mapping[str, Any]) -> dict[str, Any]:
    """Normalized view (the seed report works as well as our artifacts)."""
    if not isinstance(artifact, Mapping):
        raise TypeError(f"artifact: expected an artifact dict, got {type(artifact).__name__}")
    return normalize_artifact(artifact)


def run_label(artifact: Mapping[str, Any]) -> str:
    """'NVIDIA H200 · commit 1a2b3c4 · params quick': where a figure's numbers come from."""
    env = artifact.get("environment") or {}
    gpu = env.get("gpu") or "unknown device"
    commit = artifact.get("commit") or artifact.get("rl_kernel_commit")
    short = commit[:7] if isinstance(commit, str) else "no commit"
    if artifact.get("tracked_tree_dirty"):
        short += "+dirty"
    if artifact.get("schema_version") == "seed":
        params = "B200 reference report"
    else:
        params = f"params {artifact.get('param_set') or 'unnamed'}"
        if artifact.get("quick"):
            params += " (quick)"
    return f"{gpu} · commit {short} · {params}"


def _title(fig: Figure, what: str, artifact: Mapping[str, Any], extra: str | None = None) -> None:
    lines = [what, run_label(artifact)]
    if extra:
        lines.extend(extra.split("\n"))
    width = max(int(fig.get_figwidth() * 8.5), 40)  # ~characters of 12pt bold per inch: no clipped titles
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in lines), fontsize=12, fontweight="bold")


def _save(fig: Figure, out_dir: str | os.PathLike[str] | None, name: str) -> Path | None:
    if out_dir is None:
        return None
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=100, facecolor="white")
    fig.rlnorm_png = path  # type: ignore[attr-defined]  # where plot_all finds it
    return path


def _message(ax: Any, text: str, color: str = _MISSING_COLOR, fontsize: float = 11) -> None:
    """Fill a panel with a message instead of data."""
    wrapped = "\n".join(textwrap.fill(line, 70) for line in text.split("\n"))
    ax.text(0.5, 0.5, wrapped, ha="center", va="center", transform=ax.transAxes, color=color, fontsize=fontsize)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_color("#dddddd")


def _backends(doc: Mapping[str, Any]) -> list[str]:
    return list((doc.get("results") or {}).keys())


def _not_ran(entry: Mapping[str, Any]) -> str | None:
    """Why a backend has no data: 'skipped: reason' / 'failed: reason', None when it ran."""
    status = entry.get("status") or "ran"
    if status == "ran":
        return None
    reason = entry.get("skip_reason") or "no reason recorded"
    return f"{status}: {_shorten(reason, 90)}"


def _shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _acc(entry: Mapping[str, Any]) -> dict[str, Any]:
    return entry.get("accuracy_latency") or {}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _compact(n: int) -> str:
    """12 -> '12', 524283 -> '524k', 2.6e6 -> '2.6M': bar labels that fit above a narrow bar."""
    if n < 10_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n / 1000:.0f}k"
    return f"{n / 1e6:.1f}M"


def _fmt_us(us: float) -> str:
    """Microseconds as a reader scans them: '53.1 us', '865 us', '115.3 ms', '2.16 s'."""
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e4:
        return f"{us / 1e3:,.1f} ms"
    return f"{us:,.0f} us" if us >= 100 else f"{us:.1f} us"


def _fmt_ratio(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else (f"{r:.1f}x" if r < 100 else f"{r:,.0f}x")


def _cpu_note(doc: Mapping[str, Any]) -> str | None:
    """A CPU run's times (Triton interpreted) say nothing about a GPU: say so on the figure."""
    env = doc.get("environment") or {}
    if env.get("gpu") == "cpu":
        interp = " (Triton interpreted)" if env.get("triton_interpret") == "1" else ""
        return f"CPU run{interp}: times say nothing about GPU speed"
    return None


def _rows_measured(doc: Mapping[str, Any]) -> int | None:
    for e in (doc.get("results") or {}).values():
        rows = _acc(e).get("rows")
        if isinstance(rows, int) and rows > 0:
            return rows
    return None


# ---------------------------------------------------------------------------------------------
# 1. which rows differ


def _check_rank(check: str) -> tuple[int, str]:
    return (_CHECK_ORDER.index(check), check) if check in _CHECK_ORDER else (len(_CHECK_ORDER), check)


def _size_entries(all_rows: Any) -> dict[str, Mapping[str, Any]]:
    """all_rows' per-size entries (its `error` key, when the check raised, is not one)."""
    return {k: v for k, v in (all_rows or {}).items() if isinstance(v, Mapping)}


def _summary_counts(entry: Mapping[str, Any]) -> str:
    """The artifact's own differ counts, for when no per-row records are at hand."""
    bi = entry.get("batch_invariance") or {}
    parts = []
    all_rows = _size_entries(bi.get("all_rows"))
    if all_rows:
        fwd = sum(int(v.get("fwd_differ") or 0) for v in all_rows.values())
        grad = sum(int(v.get("rowgrad_differ") or 0) for v in all_rows.values())
        parts.append(f"all_rows: fwd {fwd}, grad {grad}")
    sub = bi.get("full_vs_sub_batches") or {}
    if sub:
        parts.append(f"full_vs_sub_batches: fwd {sub.get('fwd_differ')}, grad {sub.get('rowgrad_differ')}")
    sweep = bi.get("batch_size_sweep") or {}
    if sweep:
        parts.append(f"batch_size_sweep: {sweep.get('differ')} of {sweep.get('comparisons')}")
    return "; ".join(parts) if parts else "no batch-invariance summary"


def _tensor_rank(tensor: str) -> int:
    return list(_TENSOR_STYLE).index(tensor) if tensor in _TENSOR_STYLE else len(_TENSOR_STYLE)


def _dropped(entry: Mapping[str, Any]) -> int:
    """Differing (row, tensor) pairs the checks counted but did not record (`records_dropped`)."""
    bi = entry.get("batch_invariance") or {}
    total = 0
    for summary in (
        bi.get("full_vs_sub_batches"),
        bi.get("batch_size_sweep"),
        *_size_entries(bi.get("all_rows")).values(),
    ):
        if isinstance(summary, Mapping):
            total += int(summary.get("records_dropped") or 0)
    return total


def _summary_differ(entry: Mapping[str, Any]) -> dict[str, int | None]:
    """check -> how many comparisons the artifact's summary says differ (None: not run/unknown)."""
    bi = entry.get("batch_invariance") or {}
    out: dict[str, int | None] = {}
    all_rows = _size_entries(bi.get("all_rows"))
    if all_rows:
        out["all_rows"] = sum(
            int(v.get("fwd_differ") or 0) + int(v.get("rowgrad_differ") or 0) for v in all_rows.values()
        )
    if bi.get("dweight_repeatable") is not None:
        out["dweight_repeatable"] = 0 if bi["dweight_repeatable"] else 1
    sub = bi.get("full_vs_sub_batches") or {}
    if sub:
        out["full_vs_sub_batches"] = int(sub.get("fwd_differ") or 0) + int(sub.get("rowgrad_differ") or 0)
    sweep = bi.get("batch_size_sweep") or {}
    if sweep:
        out["batch_size_sweep"] = int(sweep.get("differ") or 0)
    return out


def plot_differing_rows(
    records_df: Any, artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None
) -> Figure:
    """Per backend: every differing row (row index in its generated case) against the check that
    found it, marker = tensor (y, dx, dz, dweight), lane label = number of differing rows."""
    doc = _doc(artifact)
    backends = _backends(doc)
    have_records = records_df is not None
    if have_records:
        needed = {"backend", "check", "row", "tensor"}
        missing = needed - set(getattr(records_df, "columns", []))
        if missing:
            raise ValueError(f"records_df: missing columns {sorted(missing)} (expected the records.py table)")
    # one panel per backend; panels with points get room for their check lanes, the rest a strip
    subsets: dict[str, Any] = {}
    heights = []
    for key in backends:
        sub = None
        if have_records and _not_ran(doc["results"][key]) is None:
            sub = records_df[records_df["backend"] == key]
        subsets[key] = sub
        heights.append(0.8 + 0.55 * sub["check"].nunique() if sub is not None and len(sub) else 0.75)
    heights = heights or [1.0]
    fig = Figure(figsize=(11, 1.2 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    if not backends:
        _message(axes[0], "no backends in this artifact")
    for ax, key in zip(axes, backends, strict=False):
        entry = doc["results"][key]
        ax.set_title(f"{key}", loc="left", fontsize=10, fontweight="bold")
        why = _not_ran(entry)
        sub = subsets[key]
        if why is not None:
            _message(ax, f"no data ({why})")
            continue
        if sub is None:
            _message(ax, "per-row records not available; summary: " + _summary_counts(entry), fontsize=9)
            continue
        counted = _summary_differ(entry)
        if len(sub) == 0:
            flagged = {c: n for c, n in counted.items() if n}
            if flagged:  # the summary counts differences the records do not hold (capped or lost)
                text = ", ".join(f"{c}: {n:,}" for c, n in flagged.items())
                _message(ax, f"rows differ ({text}) but no per-row records were kept", color=_BAD_COLOR, fontsize=10)
            elif counted:
                _message(ax, "no differing rows in " + ", ".join(counted) + " (bitwise identical)", color=_OK_COLOR)
            else:
                _message(ax, "no batch-invariance check ran")
            continue
        checks = sorted(sub["check"].astype(str).unique(), key=_check_rank)
        id_cols = [c for c in ("seed", "case", "row") if c in sub.columns]
        labels = []
        n_total = 0
        x_in_axes = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for lane, check in enumerate(checks):
            in_check = sub[sub["check"].astype(str) == check]
            row_values = pd.to_numeric(in_check["row"], errors="coerce")
            per_row = in_check[row_values.notna()]
            whole = in_check[row_values.isna()]  # batch-level records (dweight repeats): no row to place
            n_rows = len(per_row.drop_duplicates(subset=id_cols))
            n_total += n_rows
            label = f"{check}\n{n_rows:,} row{'s' if n_rows != 1 else ''}"
            if len(whole):
                label = f"{check}\n{len(whole):,} whole-batch"
                tensors = ", ".join(sorted(set(whole["tensor"].astype(str))))
                ax.text(
                    0.5, lane, f"{tensors} differs between identical whole-batch runs ({len(whole):,}x)",
                    transform=x_in_axes, ha="center", va="center", fontsize=9, color=_BAD_COLOR,
                )  # fmt: skip
            labels.append(label)
            for tensor, group in per_row.groupby(per_row["tensor"].astype(str)):
                marker, color, offset = _TENSOR_STYLE.get(tensor, ("x", "#555555", 0.0))
                rows = pd.to_numeric(group["row"]).to_numpy(dtype=float)
                ax.scatter(rows, np.full(rows.shape, lane + offset), marker=marker, s=22, color=color, alpha=0.75)
        dropped = _dropped(entry)
        capped = f"; {dropped:,} more not recorded (max_records)" if dropped else ""
        ax.set_title(
            f"{n_total:,} differing rows ({len(sub):,} records{capped})", loc="right", fontsize=9, color=_BAD_COLOR
        )
        ax.set_yticks(range(len(checks)), labels, fontsize=8)
        ax.set_ylim(-0.6, len(checks) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel("row index in the generated case")
        ax.grid(axis="x", alpha=0.3)
        handles = []
        placed = sub[pd.to_numeric(sub["row"], errors="coerce").notna()]
        for t in sorted(set(placed["tensor"].astype(str)), key=_tensor_rank):
            marker, color, _ = _TENSOR_STYLE.get(t, ("x", "#555555", 0.0))
            handles.append(ax.scatter([], [], marker=marker, color=color, label=t))
        if handles:
            ax.legend(
                handles=handles,
                title="tensor",
                fontsize=8,
                title_fontsize=8,
                loc="center left",
                bbox_to_anchor=(1.0, 0.5),
            )
    _title(fig, "Rows whose result differs from the row computed alone (bitwise), per backend and check", doc)
    _save(fig, out_dir, "differing_rows")
    return fig


# ---------------------------------------------------------------------------------------------
# 2. error distributions


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
    doc = _doc(artifact)
    backends = _backends(doc)
    n = max(len(backends), 1)
    # rows with a histogram get full height; rows that only carry a message, a strip
    heights = [
        2.4 if _not_ran(doc["results"][k]) is None and _acc(doc["results"][k]).get("fwd_ulp_hist") else 0.9
        for k in backends
    ] or [1.0]
    fig = Figure(figsize=(12, 1.0 + sum(heights)), layout="constrained")
    axes = fig.subplots(n, 2, squeeze=False, gridspec_kw={"height_ratios": heights})
    if not backends:
        _message(axes[0, 0], "no backends in this artifact")
        _message(axes[0, 1], "no backends in this artifact")
    for (ax_ulp, ax_abs), key in zip(axes, backends, strict=False):
        entry = doc["results"][key]
        acc = _acc(entry)
        why = _not_ran(entry)
        cr = _num(acc.get("fwd_correctly_rounded"))
        head = f"{key}" + (f"   correctly rounded: {cr:.6f}" if cr is not None else "")
        ax_ulp.set_title(head, loc="left", fontsize=10, fontweight="bold")
        ulp = acc.get("fwd_ulp_hist")
        if why is not None:
            _message(ax_ulp, f"no data ({why})")
        elif not ulp:
            why_not = f" (the check raised: {_shorten(acc['error'], 80)})" if acc.get("error") else ""
            _message(ax_ulp, "no ulp histogram recorded" + (why_not if acc else " (accuracy check not run)"))
        else:
            keys, counts = _ulp_items(ulp)
            xs = np.arange(len(keys))
            colors = [
                _OK_COLOR if k == "0" else (_BAD_COLOR if k in ("nan",) or k.endswith("+") else "#ef6c00") for k in keys
            ]
            ax_ulp.bar(xs, counts, color=colors, width=0.8)
            ax_ulp.set_xticks(xs, keys, fontsize=7)
            if any(c > 0 for c in counts):
                ax_ulp.set_yscale("log")
                ax_ulp.set_ylim(0.5, max(counts) * 40)  # headroom for the count labels
            for x, c in zip(xs, counts, strict=True):
                if c > 0:
                    ax_ulp.text(x, c * 1.3, _compact(c), ha="center", va="bottom", fontsize=7)
            ax_ulp.set_ylabel("outputs (count)")
            ax_ulp.set_xlabel("ulp distance to the correctly rounded value")
        ax_abs.set_title("absolute error vs fp64" if why is None else "", loc="left", fontsize=10)
        hist = acc.get("fwd_abs_err_hist")
        if why is not None:
            _message(ax_abs, f"no data ({why})")
        elif not hist or not hist.get("edges") or not hist.get("counts"):
            max_err = _num(acc.get("fwd_max_abs_err"))
            extra = f"\nmax abs err {max_err:.3g}" if max_err is not None else ""
            _message(ax_abs, "no absolute-error histogram recorded" + extra)
        else:
            edges = np.asarray(hist["edges"], dtype=float)
            counts = np.asarray(hist["counts"], dtype=float)
            if len(edges) != len(counts) + 1:
                _message(ax_abs, f"malformed histogram: {len(edges)} edges for {len(counts)} counts", color=_BAD_COLOR)
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
            max_err = _num(acc.get("fwd_max_abs_err"))
            if max_err is not None and max_err > 0:
                ax_abs.axvline(max_err, color=_BAD_COLOR, ls="--", lw=1)
                ax_abs.text(
                    max_err,
                    0.5,
                    f" max {max_err:.3g}",
                    color=_BAD_COLOR,
                    fontsize=7,
                    transform=ax_abs.get_xaxis_transform(),
                )
            ax_abs.set_ylabel("outputs (count)")
            ax_abs.set_xlabel("|y - y_fp64| (absolute error, log scale)")
    _title(fig, "Forward error distributions per backend", doc)
    _save(fig, out_dir, "error_distributions")
    return fig


# ---------------------------------------------------------------------------------------------
# 3. latency


def _roofline_us(doc: Mapping[str, Any]) -> float | None:
    """The same-run torch.add time (3 tensors); the median over backends that recorded one."""
    values = [_num(_acc(e).get("roofline_add_us")) for e in (doc.get("results") or {}).values()]
    values = [v for v in values if v is not None and v > 0]
    return float(np.median(values)) if values else None


def _latency_missing_reason(entry: Mapping[str, Any], field: str) -> str:
    why = _not_ran(entry)
    if why is not None:
        return why.split(":")[0]
    acc = _acc(entry)
    if field == "fwd_bwd_us" and entry.get("backward") == "none":
        return "no backward"
    if not acc:
        return "accuracy_latency not run"
    if acc.get("error"):
        return "check raised"
    if acc.get("timed") is False:
        device = acc.get("device") or "this device"
        return f"not timed ({device})"
    return "not measured"


def plot_latency(artifact: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None) -> Figure:
    """Forward and forward+backward time per backend (median, p20-p80 whiskers), with the same-run
    torch.add roofline (3 tensors forward; 8/3 of it for 8 tensors forward+backward)."""
    doc = _doc(artifact)
    backends = _backends(doc)
    roof = _roofline_us(doc)
    n = max(len(backends), 1)
    fig = Figure(figsize=(14, 2.0 + 0.5 * n), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    panels = (
        ("fwd_us", "forward", roof, "3 tensors"),
        ("fwd_bwd_us", "forward + backward", None if roof is None else roof * 8 / 3, "8/3 x, 8 tensors"),
    )
    starred = False  # a time marked *: the GPU queue ran dry while it was timed (host overhead included)
    for ax, (field, label, roof_line, what) in zip(axes, panels, strict=True):
        ax.set_title(label, fontsize=11, fontweight="bold")
        if not backends:
            _message(ax, "no backends in this artifact")
            continue
        entries = [doc["results"][k] for k in backends]
        values = [_num(_acc(e).get(field)) for e in entries]
        values = [v if v is not None and v > 0 else None for v in values]
        present = [v for v in values if v is not None]
        if not present:
            reasons = {_latency_missing_reason(e, field) for e in entries}
            _message(ax, "no timings: " + "; ".join(sorted(reasons)))
            continue
        ys = np.arange(len(backends))
        lows, highs, tips = [], [], []
        for e, v in zip(entries, values, strict=True):
            p20, p80 = _num(_acc(e).get(f"{field}_p20")), _num(_acc(e).get(f"{field}_p80"))
            ok = v is not None and p20 is not None and p80 is not None
            lows.append(max(v - p20, 0.0) if ok else 0.0)
            highs.append(max(p80 - v, 0.0) if ok else 0.0)
            tips.append(max(v, p80) if ok else v)
        ax.barh(ys, [v or 0.0 for v in values], color=_THIS_COLOR, height=0.6)
        ax.errorbar(
            [v or np.nan for v in values], ys, xerr=[lows, highs], fmt="none", ecolor="#222222", capsize=3, lw=1
        )
        span = present + ([roof_line] if roof_line else [])
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
                    _latency_missing_reason(e, field),
                    transform=x_in_axes,
                    va="center",
                    fontsize=9,
                    color=_MISSING_COLOR,
                    style="italic",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )
                continue
            star = "*" if ran_host_bound(_acc(e), field) else ""
            starred |= bool(star)
            text = _fmt_us(v) + star + (f"  ({_fmt_ratio(v / roof_line)} roofline)" if roof_line else "")
            x = tip * 1.12 if log else tip + max(span) * 0.015
            ax.text(x, y, text, va="center", fontsize=8)
        if roof_line is not None:
            ax.axvline(
                roof_line, color=_BAD_COLOR, ls="--", lw=1.3, label=f"torch.add roofline {_fmt_us(roof_line)} ({what})"
            )
            ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
        ax.set_yticks(ys, backends)
        ax.set_ylim(len(backends) - 0.4, -0.6)
        scale = "log scale" if log else "linear"
        ax.set_xlabel(f"time per call (us, median, {scale}); whiskers p20-p80")
        ax.grid(axis="x", alpha=0.3)
    rows = _rows_measured(doc)
    add_starred = any(ran_host_bound(_acc(e), "add") for e in (doc.get("results") or {}).values())
    notes = [
        f"{rows:,} rows" if rows else None,
        None if roof is not None else "roofline not measured",
        _cpu_note(doc),
        "* the GPU queue ran dry while timing: host overhead included" if starred else None,
        "torch.add ran with the queue dry in some timing: the roofline may include host overhead"
        if add_starred
        else None,
    ]
    extra = " · ".join(n for n in notes if n) or None
    _title(fig, "Latency per backend (lower is better)", doc, extra)
    _save(fig, out_dir, "latency")
    return fig


# ---------------------------------------------------------------------------------------------
# 4. agreement matrix


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
    doc = _doc(artifact)
    agreement = doc.get("agreement")
    if not agreement or not agreement.get("backends"):
        fig = Figure(figsize=(7, 3.2), layout="constrained")
        ax = fig.subplots()
        if agreement and agreement.get("error"):
            _message(ax, f"agreement matrix failed: {_shorten(agreement['error'], 200)}", color=_BAD_COLOR)
        else:
            _message(ax, "no cross-backend agreement matrix in this artifact")
        _title(fig, "Cross-backend bitwise agreement", doc)
        _save(fig, out_dir, "agreement")
        return fig
    keys = list(agreement["backends"])
    k = len(keys)
    frac = np.full((k, k), np.nan)
    raw = agreement.get("equal_fraction") or []
    for i in range(min(k, len(raw))):
        for j in range(min(k, len(raw[i]))):
            v = _num(raw[i][j])
            frac[i, j] = np.nan if v is None else v
    # colour by how many outputs differ, on a log scale: 1 - 1e-5 and 1 must look different
    mismatch = 1.0 - frac
    shown = np.where(mismatch > 0, np.log10(np.clip(mismatch, 1e-9, 1)), np.nan)
    cmap = matplotlib.colormaps["YlOrRd"].with_extremes(bad="white")
    size = 2.6 + 1.05 * k
    fig = Figure(figsize=(size + 1.2, size), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(shown, cmap=cmap, norm=mcolors.Normalize(vmin=-7, vmax=0))
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
    cbar.set_label("log10(fraction of outputs that differ)\n(green: bitwise identical; grey: n/a)")
    rows, seed = agreement.get("rows"), agreement.get("seed")
    lines = []
    if isinstance(rows, int):
        lines.append(f"fraction of {agreement.get('tensor', 'y')} elements bitwise equal · {rows:,} rows, seed {seed}")
    left_out = [f"{k} ({e.get('status', '?')})" for k, e in (doc.get("results") or {}).items() if k not in keys]
    if left_out:
        lines.append("not in the matrix: " + ", ".join(left_out))
    failed = agreement.get("errors") or {}
    if failed:
        lines.append("n/a: " + "; ".join(f"{k}: {_shorten(v, 60)}" for k, v in failed.items()))
    _title(fig, "Cross-backend bitwise agreement", doc, "\n".join(lines) or None)
    _save(fig, out_dir, "agreement")
    return fig


# ---------------------------------------------------------------------------------------------
# 5. this run beside the B200 report


def _differ_cells(entry: Mapping[str, Any] | None) -> dict[str, int | bool | None]:
    if entry is None or _not_ran(entry) is not None:
        return {}
    bi = entry.get("batch_invariance") or {}
    all_rows = _size_entries(bi.get("all_rows")) or None
    sub = bi.get("full_vs_sub_batches") or {}
    sweep = bi.get("batch_size_sweep") or {}

    def total(field: str) -> int | None:
        if not all_rows:
            return None
        vals = [v.get(field) for v in all_rows.values()]
        return None if any(v is None for v in vals) else int(sum(vals))

    return {
        "all_rows fwd": total("fwd_differ"),
        "all_rows grad": total("rowgrad_differ") if entry.get("backward") != "none" else None,
        "sub-batch fwd": sub.get("fwd_differ"),
        "sub-batch grad": sub.get("rowgrad_differ") if entry.get("backward") != "none" else None,
        "size sweep": sweep.get("differ"),
        "dweight repeatable": bi.get("dweight_repeatable"),
        "gates passed": _gates_passed(entry),
    }


def _gates_passed(entry: Mapping[str, Any]) -> bool | None:
    """Both contract gates passed (None when the gates were not run)."""
    gates = entry.get("contract_gates") or {}
    ran = [g for g in (gates.get("forward"), gates.get("gradient")) if isinstance(g, Mapping)]
    return all(bool(g.get("passed")) for g in ran) if ran else None


def _fmt_cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{int(v):,}"


def plot_vs_reference_report(
    artifact: Mapping[str, Any], seed_report: Mapping[str, Any], out_dir: str | os.PathLike[str] | None = None
) -> Figure:
    """This run beside the B200 seed report wherever both have a measure: forward and
    forward+backward time, fraction not correctly rounded, and the differing-row counts."""
    doc = _doc(artifact)
    ref = _doc(seed_report)
    keys = _backends(doc) + [k for k in _backends(ref) if k not in doc["results"]]
    fig = Figure(figsize=(15, 4.0 + 0.9 * max(len(keys), 1)), layout="constrained")
    grid = fig.subplot_mosaic([["fwd", "fwd_bwd", "cr"], ["counts", "counts", "counts"]], height_ratios=[1.15, 1])
    ref_env = ref.get("environment") or {}
    ref_name = f"report ({ref_env.get('gpu', '?')})"
    this_gpu = (doc.get("environment") or {}).get("gpu", "?")
    this_name = f"this run ({this_gpu})"
    ys = np.arange(len(keys))
    h = 0.38

    def entry(d: Mapping[str, Any], k: str) -> Mapping[str, Any] | None:
        return (d.get("results") or {}).get(k)

    def value(d: Mapping[str, Any], k: str, field: str) -> float | None:
        e = entry(d, k)
        if e is None or _not_ran(e) is not None:
            return None
        v = _num(_acc(e).get(field))
        if field == "fwd_correctly_rounded":
            return None if v is None else 1.0 - v
        return v if v is not None and v > 0 else None

    def missing(d: Mapping[str, Any], k: str, field: str) -> str:
        e = entry(d, k)
        if e is None:
            return "absent"
        return _latency_missing_reason(e, field)

    panels = (
        ("fwd", "fwd_us", "forward time (us, log scale)", "forward"),
        ("fwd_bwd", "fwd_bwd_us", "forward+backward time (us, log scale)", "forward + backward"),
        ("cr", "fwd_correctly_rounded", "fraction NOT correctly rounded (log scale)", "outputs not correctly rounded"),
    )
    for name, field, xlabel, title in panels:
        ax = grid[name]
        ax.set_title(title, fontsize=11, fontweight="bold")
        this = [value(doc, k, field) for k in keys]
        theirs = [value(ref, k, field) for k in keys]
        present = [v for v in this + theirs if v is not None and v > 0]
        if not keys or not present:
            _message(ax, "no shared measure" if keys else "no backends")
            continue
        ax.barh(ys - h / 2, [v or 0 for v in this], height=h, color=_THIS_COLOR, label=this_name)
        ax.barh(ys + h / 2, [v or 0 for v in theirs], height=h, color=_REPORT_COLOR, label=ref_name)
        ax.set_xscale("log")
        lo, hi = min(present), max(present)
        ax.set_xlim(lo / 4, hi * 30)
        x_text = mtransforms.blended_transform_factory(ax.transAxes, ax.transData)
        for y, k, a, b in zip(ys, keys, this, theirs, strict=True):
            for yy, v, d in ((y - h / 2, a, doc), (y + h / 2, b, ref)):
                if v is None or v <= 0:
                    exact = field == "fwd_correctly_rounded" and v == 0
                    label = "0 (all correctly rounded)" if exact else missing(d, k, field)
                    ax.text(
                        0.01, yy, label, transform=x_text, va="center", fontsize=7, color=_MISSING_COLOR, style="italic"
                    )
                else:
                    label = f"{v:.2e}" if field == "fwd_correctly_rounded" else _fmt_us(v)
                    ax.text(v * 1.1, yy, label, va="center", fontsize=7)
        ax.set_yticks(ys, keys)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
        if name == "fwd":
            fig.legend(loc="outside upper right", fontsize=9, ncols=2)
    ax = grid["counts"]
    columns = [
        "all_rows fwd",
        "all_rows grad",
        "sub-batch fwd",
        "sub-batch grad",
        "size sweep",
        "dweight repeatable",
        "gates passed",
    ]
    if not keys:
        _message(ax, "no backends")
    else:
        status = np.zeros((len(keys), len(columns)))  # 0 missing, 1 ok, 2 differs
        for i, k in enumerate(keys):
            a_cells, b_cells = _differ_cells(entry(doc, k)), _differ_cells(entry(ref, k))
            for j, col in enumerate(columns):
                a, b = a_cells.get(col), b_cells.get(col)
                bad = (a is False) if isinstance(a, bool) else (a is not None and a > 0)
                status[i, j] = 0 if a is None else (2 if bad else 1)
                ax.text(j, i, f"{_fmt_cell(a)}  |  {_fmt_cell(b)}", ha="center", va="center", fontsize=9)
        cmap = mcolors.ListedColormap(["#eeeeee", "#c8e6c9", "#ffcdd2"])
        ax.imshow(status, cmap=cmap, vmin=0, vmax=2, aspect="auto")
        ax.set_xticks(range(len(columns)), columns)
        ax.set_yticks(range(len(keys)), keys)
        ax.xaxis.tick_top()
        ax.set_title(
            "rows that differ: this run | report   (colour = this run: green 0, red > 0, grey no value)\n"
            "gates passed: the report's gradient gates compared the reference op's own dweight hook for every "
            "library, so their dweight lines passed by construction (SPEC §4)",
            fontsize=10,
            loc="left",
        )
    params = doc.get("params") or {}
    coverage = params.get("coverage")
    rows_this, rows_ref = _rows_measured(doc), _rows_measured(ref)
    notes = [f"vs {run_label(ref)}"]
    if rows_this and rows_ref and rows_this != rows_ref:
        notes.append(f"timed rows: this run {rows_this:,}, report {rows_ref:,}")
    if coverage:
        notes.append(f"this run's sub-batch coverage: {coverage}")
    if _cpu_note(doc):
        notes.append(_cpu_note(doc))
    extra = " · ".join(notes)
    _title(fig, "This run beside the B200 reference report", doc, extra)
    _save(fig, out_dir, "vs_reference_report")
    return fig


# ---------------------------------------------------------------------------------------------
# all


def _failed_figure(name: str, artifact: Mapping[str, Any], exc: BaseException) -> Figure:
    fig = Figure(figsize=(8, 3), layout="constrained")
    _message(
        fig.subplots(), f"plot '{name}' failed:\n{type(exc).__name__}: {_shorten(str(exc), 200)}", color=_BAD_COLOR
    )
    try:
        _title(fig, name, _doc(artifact))
    except Exception:  # the artifact itself may be what broke the plot
        fig.suptitle(name)
    return fig


def plot_all(
    artifact: Mapping[str, Any],
    records_df: Any,
    out_dir: str | os.PathLike[str],
    seed_report: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Draw every figure into `out_dir`; {name: PNG path}. A plot that raises is replaced by a PNG
    that states the error (and a warning), so one broken figure never costs the others."""
    jobs: list[tuple[str, Any]] = [
        ("differing_rows", lambda: plot_differing_rows(records_df, artifact, out_dir)),
        ("error_distributions", lambda: plot_error_distributions(artifact, out_dir)),
        ("latency", lambda: plot_latency(artifact, out_dir)),
        ("agreement", lambda: plot_agreement(artifact, out_dir)),
    ]
    if seed_report is not None:
        jobs.append(("vs_reference_report", lambda: plot_vs_reference_report(artifact, seed_report, out_dir)))
    paths: dict[str, Path] = {}
    for name, draw in jobs:
        try:
            draw()
        except Exception as exc:
            warnings.warn(f"plot {name!r} failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            _save(_failed_figure(name, artifact, exc), out_dir, name)
        paths[name] = Path(out_dir) / f"{name}.png"
    return paths
