"""Two reuse-check artifacts side by side: verdicts, latency ratios, accuracy and what changed.

The typical pair is the seed B200 report and a run of ours on another GPU; both load through the
same reader (`rlnorm.kit.artifact.read_artifact`), so every accessor here reads the report's shape and
treats our NEW fields as optional. Nothing is recomputed: a comparison only reads two JSON files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.kit.artifact import ENDED_EARLY
from rlnorm.report.counts import check_counts
from rlnorm.report.plots.common import run_label
from rlnorm.report.runs import OP_DEFAULTS, artifact_label, load_artifact, run_device
from rlnorm.report.verdicts import ERROR as ERROR_STATE
from rlnorm.report.verdicts import NOT_RUN, PASSED, crash_note, ended_state, finished_checks, gate_cell

# The checks a verdict is given for, in report order (gates are the contract_gates of docs/spec.md §5).
VERDICT_CHECKS = (
    "all_rows",
    "dweight_repeatable",
    "full_vs_sub_batches",
    "batch_size_sweep",
    "batch_invariant",
    "gate_forward",
    "gate_gradient",
)
PASS, FAIL, NA, ERROR = "pass", "FAIL", "n/a", "error"
INVARIANCE = ("all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep")


@dataclass
class Comparison:
    """Everything `notebooks/compare_runs` shows; each table indexed by backend (and check)."""

    label_a: str
    label_b: str
    environment: pd.DataFrame
    verdicts: pd.DataFrame
    latency: pd.DataFrame
    accuracy: pd.DataFrame
    changes: list[str] = field(default_factory=list)
    different_ops: list[str] = field(default_factory=list)  # op parameters the two runs differ in
    source_a: str = ""  # GPU, commit and parameter set of each run, for the figure's title
    source_b: str = ""

    def changes_markdown(self) -> str:
        """What changed, as the page says it: first whether the runs computed the same op, then each change."""
        lines = []
        if self.different_ops:
            lines.append(
                f"**These runs computed different ops** ({'; '.join(self.different_ops)}): read what follows as two "
                "separate results, not as a change of one.\n"
            )
        lines += [f"- {c}" for c in self.changes] if self.changes else ["*Nothing changed.*"]
        return "\n".join(lines)


def _count_verdict(entry: Mapping[str, Any], check: str) -> tuple[str, str]:
    """pass, or FAIL with the row comparisons that differ in the words of `rlnorm.report.counts` ('95 y / 152
    dx,dz'; the report's sweep counts only the total: '4 y, dx or dz')."""
    c = check_counts(entry, check)
    if c is None:
        return NA, ""
    return (FAIL, c.short()) if c.differs else (PASS, "")


def _bool_verdict(value: Any) -> tuple[str, str]:
    if value is None:
        return NA, ""
    return (PASS, "") if bool(value) else (FAIL, "")


def backend_verdicts(entry: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """check -> (pass/FAIL/n/a, detail) for one `results.<backend>` entry. A backend whose process crashed or
    timed out keeps the verdicts of the checks it finished; the others read `crashed` / `timed_out` with the
    cause and where."""
    status = entry.get("status", "ran")
    ended = ended_state(entry)
    if status != "ran" and ended is None:
        reason = str(entry.get("skip_reason") or "")
        return {c: (status, reason) for c in VERDICT_CHECKS}
    bi = entry.get("batch_invariance") or {}
    gates = entry.get("contract_gates") or {}
    errors = entry.get("errors") or {}
    out = {
        "all_rows": _count_verdict(entry, "all_rows"),
        "dweight_repeatable": _bool_verdict(bi.get("dweight_repeatable")),
        "full_vs_sub_batches": _count_verdict(entry, "full_vs_sub_batches"),
        "batch_size_sweep": _count_verdict(entry, "batch_size_sweep"),
        "batch_invariant": _bool_verdict(bi.get("batch_invariant")),
    }
    # a check that raised has no verdict: say so instead of reading its partial counts as a pass
    for check in INVARIANCE:
        node = bi.get(check)
        if check in errors:
            out[check] = (ERROR, str(errors[check]))
        elif isinstance(node, Mapping) and node.get("error"):
            out[check] = (ERROR, str(node["error"]))
    for gate in ("forward", "gradient"):
        g = gates.get(gate)
        if "contract_gates" in errors:
            out[f"gate_{gate}"] = (ERROR, str(errors["contract_gates"]))
            continue
        if not isinstance(g, Mapping):
            out[f"gate_{gate}"] = (NA, "")
            continue
        cell = gate_cell(g)
        detail = " ".join(cell.text.split())
        verdict = {PASSED: PASS, NOT_RUN: NA, ERROR_STATE: ERROR}.get(cell.state, FAIL)  # a crashed child fails it
        out[f"gate_{gate}"] = (verdict, "" if cell.state == PASSED else detail)
    if ended is not None:
        done, note = set(finished_checks(entry)), crash_note(entry) or ""
        for check in (*INVARIANCE, "gate_forward", "gate_gradient"):
            if check not in done:
                out[check] = (status, note)
        found = any(out[c][0] == FAIL for c in INVARIANCE)
        out["batch_invariant"] = (FAIL, "") if found else (status, note)
    return out


def run_verdicts(art: Mapping[str, Any]) -> pd.DataFrame:
    """One run's verdicts: a backend per line, a check per column (pass / FAIL (counts) / n/a / ...)."""
    rows = {
        key: {c: _cell(v) for c, v in backend_verdicts(entry or {}).items()} for key, entry in art["results"].items()
    }
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(VERDICT_CHECKS)).rename_axis("backend")


def _cell(verdict: tuple[str, str]) -> str:
    v, detail = verdict
    return f"{v} ({detail[:80]})" if detail and v in (FAIL, ERROR, *ENDED_EARLY) else v


def _backends(a: Mapping, b: Mapping) -> list[str]:
    ka, kb = list((a.get("results") or {}).keys()), list((b.get("results") or {}).keys())
    return ka + [k for k in kb if k not in ka]


def verdict_table(a: Mapping, b: Mapping, label_a: str = "a", label_b: str = "b") -> pd.DataFrame:
    """Index (backend, check); columns label_a, label_b (verdict text) and `changed`."""
    rows = []
    ra, rb = a.get("results") or {}, b.get("results") or {}
    for key in _backends(a, b):
        va = backend_verdicts(ra[key]) if key in ra else dict.fromkeys(VERDICT_CHECKS, ("absent", ""))
        vb = backend_verdicts(rb[key]) if key in rb else dict.fromkeys(VERDICT_CHECKS, ("absent", ""))
        for check in VERDICT_CHECKS:
            rows.append(
                {
                    "backend": key,
                    "check": check,
                    label_a: _cell(va[check]),
                    label_b: _cell(vb[check]),
                    "verdict_a": va[check][0],
                    "verdict_b": vb[check][0],
                    "changed": va[check][0] != vb[check][0],
                }
            )
    return pd.DataFrame(rows).set_index(["backend", "check"])


def _num(d: Any, *keys: str) -> float | None:
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return None
        d = d[k]
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        return None
    return float(d)


def _ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or y is None or x == 0 else y / x


def _side_by_side(a: Mapping, b: Mapping, fields: tuple[tuple[str, ...], ...]) -> pd.DataFrame:
    """Per backend: each accuracy_latency field (a path into it) in a and in b."""
    rows = []
    for key in _backends(a, b):
        al_a, al_b = (((x.get("results") or {}).get(key) or {}).get("accuracy_latency") for x in (a, b))
        row: dict[str, Any] = {"backend": key}
        for path in fields:
            name = "_".join(path)
            row[f"{name}_a"], row[f"{name}_b"] = _num(al_a, *path), _num(al_b, *path)
        rows.append(row)
    return pd.DataFrame(rows).set_index("backend").astype(float)


def latency_table(a: Mapping, b: Mapping) -> pd.DataFrame:
    """Per backend: fwd_us and fwd_bwd_us in a and b, and the ratios b/a (< 1: b is faster)."""
    table = _side_by_side(a, b, (("fwd_us",), ("fwd_bwd_us",)))
    for m in ("fwd_us", "fwd_bwd_us"):
        table.insert(table.columns.get_loc(f"{m}_b") + 1, f"{m}_ratio", [
            _ratio(x, y) for x, y in zip(table[f"{m}_a"], table[f"{m}_b"], strict=True)
        ])  # fmt: skip
    return table.astype(float)


def accuracy_table(a: Mapping, b: Mapping) -> pd.DataFrame:
    """Per backend: fraction correctly rounded, max abs error and grad_rel_err x/z/w, a and b."""
    fields = (("fwd_correctly_rounded",), ("fwd_max_abs_err",), *(("grad_rel_err", t) for t in ("x", "z", "w")))
    return _side_by_side(a, b, fields)


def protocol(art: Mapping[str, Any]) -> dict[str, Any]:
    """The sizes a run measured at, read from its check summaries (the seed report has no params)."""

    def first(check: str) -> Mapping[str, Any]:
        for entry in (art.get("results") or {}).values():
            node = ((entry or {}).get("batch_invariance") or {}).get(check)
            if isinstance(node, Mapping):
                return node
        return {}

    def first_acc() -> Mapping[str, Any]:
        for entry in (art.get("results") or {}).values():
            acc = (entry or {}).get("accuracy_latency")
            if isinstance(acc, Mapping):
                return acc
        return {}

    sub, sweep = first("full_vs_sub_batches"), first("batch_size_sweep")
    return {
        "quick": art.get("quick"),
        "all_rows_sizes": sorted((int(k) for k in first("all_rows") if str(k).isdigit()), key=int) or None,
        "sub_batches_full_batch": sub.get("full_batch"),
        "sub_batch_sizes": sub.get("sub_batch_sizes"),
        "sub_batches": sub.get("sub_batches"),
        "sub_batches_coverage": sub.get("coverage", "sampled" if sub else None),
        "sweep_comparisons": sweep.get("comparisons"),
        "accuracy_rows": first_acc().get("rows"),
    }


def environment_table(a: Mapping, b: Mapping, label_a: str = "a", label_b: str = "b") -> pd.DataFrame:
    """GPU, capability, CUDA, commit and library versions side by side."""

    def flat(art: Mapping) -> dict[str, Any]:
        env = art.get("environment") or {}
        out = {k: env.get(k) for k in ("gpu", "capability", "cuda")}
        for lib, ver in (env.get("libraries") or {}).items():
            out[lib] = ver
        out["commit"] = art.get("commit") or art.get("rl_kernel_commit")
        out["tracked_tree_dirty"] = art.get("tracked_tree_dirty")
        return out

    fa = {**flat(a), **{f"protocol: {k}": v for k, v in protocol(a).items()}}
    fb = {**flat(b), **{f"protocol: {k}": v for k, v in protocol(b).items()}}
    keys = list(fa) + [k for k in fb if k not in fa]
    rows = [{"field": k, label_a: fa.get(k), label_b: fb.get(k), "same": fa.get(k) == fb.get(k)} for k in keys]
    return pd.DataFrame(rows).set_index("field")


def op_of(art: Mapping[str, Any]) -> dict[str, Any]:
    """The op a run computed: width, eps, groups, gate order, activation and weight dtype."""
    params = art.get("params") or {}
    src = params.get("op") if isinstance(params.get("op"), Mapping) else params
    op = {k: src.get(k, v) for k, v in OP_DEFAULTS.items()}
    if op["activation"] == "swish":
        op["activation"] = "silu"
    return op


def op_differences(a: Mapping, b: Mapping, label_a: str = "a", label_b: str = "b") -> list[str]:
    """The op parameters two runs differ in: when there are any, their numbers measure different ops."""
    oa, ob = op_of(a), op_of(b)
    return [f"{k}: {oa[k]} in {label_a}, {ob[k]} in {label_b}" for k in OP_DEFAULTS if oa[k] != ob[k]]


def what_changed(
    a: Mapping,
    b: Mapping,
    label_a: str = "a",
    label_b: str = "b",
    latency_move: float = 0.10,
    accuracy_move: float = 1e-4,
) -> list[str]:
    """Plain sentences, the one that matters most first: different ops, then protocol differences, backends in one
    run only, verdict flips, latency and accuracy moves."""
    out: list[str] = []
    ops = op_differences(a, b, label_a, label_b)
    if ops:
        out.append(
            "the two runs computed different ops (" + "; ".join(ops) + "): their verdicts, latencies and accuracies "
            "describe different computations and are not a before/after of one"
        )
    ga, gb = (run_device(x) for x in (a, b))
    if ga != gb:
        out.append(f"devices differ ({ga} vs {gb}): latency ratios compare the hardware as much as the code")
    pa, pb = protocol(a), protocol(b)
    moved = [k for k in pa if pa[k] != pb[k]]
    if moved:
        out.append(f"protocol differs ({', '.join(moved)}): differ counts and timings are not like for like")
    ra, rb = a.get("results") or {}, b.get("results") or {}
    for key in ra:
        if key not in rb:
            out.append(f"{key}: only in {label_a}")
    for key in rb:
        if key not in ra:
            out.append(f"{key}: only in {label_b}")
    # a backend that ran in one run and not the other: one line with the reason, not one per check
    not_both = set()
    for key in ra:
        if key in rb:
            sa, sb = (ra[key] or {}).get("status", "ran"), (rb[key] or {}).get("status", "ran")
            if sa != sb:
                not_both.add(key)
                why = (rb[key] if sb != "ran" else ra[key]).get("skip_reason") or ""
                out.append(f"{key}: {sa} in {label_a}, {sb} in {label_b}" + (f" ({why[:160]})" if why else ""))
    verdicts = verdict_table(a, b, label_a, label_b)
    unmeasured: dict[str, list[str]] = {label_a: [], label_b: []}
    for (key, check), row in verdicts.iterrows():
        if not (row["changed"] and key in ra and key in rb) or key in not_both:
            continue
        if NA in (row["verdict_a"], row["verdict_b"]):  # measured in one run only: not a flip
            unmeasured[label_a if row["verdict_a"] == NA else label_b].append(f"{key} {check}")
        else:
            out.append(f"{key} {check}: {row[label_a]} -> {row[label_b]}")
    for label, items in unmeasured.items():
        if items:
            out.append(f"not measured in {label}: {', '.join(items)}")
    lat = latency_table(a, b)
    for key, row in lat.iterrows():
        for m in ("fwd_us", "fwd_bwd_us"):
            r = row[f"{m}_ratio"]
            if pd.notna(r) and abs(r - 1) > latency_move:
                word = "faster" if r < 1 else "slower"
                out.append(f"{key} {m}: {row[f'{m}_a']:.1f} -> {row[f'{m}_b']:.1f} us ({r:.2f}x, {word})")
    acc = accuracy_table(a, b)
    for key, row in acc.iterrows():
        x, y = row["fwd_correctly_rounded_a"], row["fwd_correctly_rounded_b"]
        if pd.notna(x) and pd.notna(y) and abs(y - x) > accuracy_move:
            out.append(f"{key} fwd_correctly_rounded: {x:.6f} -> {y:.6f}")
    return out


def compare_runs(
    a: str | Path | Mapping[str, Any],
    b: str | Path | Mapping[str, Any],
    latency_move: float = 0.10,
    accuracy_move: float = 1e-4,
) -> Comparison:
    """Compare artifact a (e.g. the seed B200 report) with artifact b (e.g. an H200 run)."""
    if not 0 <= latency_move:
        raise ValueError(f"latency_move: expected a fraction >= 0, got {latency_move!r}")
    art_a, art_b = load_artifact(a), load_artifact(b)
    for name, art in (("a", art_a), ("b", art_b)):
        if not isinstance(art.get("results"), Mapping):
            raise ValueError(f"{name}: expected an artifact with a 'results' mapping, got keys {sorted(art)[:10]}")
    la, lb = artifact_label(art_a, "A"), artifact_label(art_b, "B")
    if la == lb:
        lb += " (2)"
    return Comparison(
        label_a=la,
        label_b=lb,
        environment=environment_table(art_a, art_b, la, lb),
        verdicts=verdict_table(art_a, art_b, la, lb),
        latency=latency_table(art_a, art_b),
        accuracy=accuracy_table(art_a, art_b),
        changes=what_changed(art_a, art_b, la, lb, latency_move, accuracy_move),
        different_ops=op_differences(art_a, art_b, la, lb),
        source_a=run_label(art_a),
        source_b=run_label(art_b),
    )


# colour per (verdict a, verdict b) class in the verdict grid
_GRID_CLASSES = [
    ("pass in both", "#4caf50"),
    ("FAIL in both", "#e53935"),
    ("FAIL -> pass", "#1e88e5"),
    ("pass -> FAIL", "#fb8c00"),
    ("n/a, absent, skipped or error", "#bdbdbd"),
    ("crashed or timed out (either run)", "#ce93d8"),
]


def _grid_class(va: str, vb: str) -> int:
    if va == PASS and vb == PASS:
        return 0
    if va == FAIL and vb == FAIL:
        return 1
    if va == FAIL and vb == PASS:
        return 2
    if va == PASS and vb == FAIL:
        return 3
    if va in ENDED_EARLY or vb in ENDED_EARLY:
        return 5
    return 4


def plot_comparison(cmp: Comparison):
    """Left: latency ratio b/a per backend (log scale; 1 = unchanged). Middle: share of outputs NOT
    correctly rounded, A and B (log scale: 1e-5 for the fp32-math peers, ~0.35 for transformers).
    Right: verdict grid."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    fig, (ax_lat, ax_acc, ax_grid) = plt.subplots(1, 3, figsize=(18, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    lat = cmp.latency
    keys = list(lat.index)
    pos = np.arange(len(keys))
    for off, m, colour in ((-0.2, "fwd_us", "#3949ab"), (0.2, "fwd_bwd_us", "#8e24aa")):
        vals = lat[f"{m}_ratio"].to_numpy(dtype=float)
        ok = np.isfinite(vals)
        # bars grow from 1 (unchanged) up (slower) or down (faster) on a log axis
        ax_lat.bar(pos[ok] + off, vals[ok] - 1.0, bottom=1.0, width=0.4, color=colour, label=m)
        for p, v in zip(pos[ok] + off, vals[ok], strict=True):
            ax_lat.annotate(f"{v:.2g}", (p, v), ha="center", va="bottom" if v >= 1 else "top", fontsize=7)
    ax_lat.axhline(1.0, color="k", lw=0.8)
    ax_lat.set_yscale("log")
    ax_lat.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax_lat.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    finite = lat[["fwd_us_ratio", "fwd_bwd_us_ratio"]].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    if finite.size:
        ax_lat.set_ylim(min(finite.min(), 1.0) / 1.6, max(finite.max(), 1.0) * 1.6)
    ax_lat.set_xticks(pos, keys, rotation=35, ha="right", fontsize=8)
    ax_lat.set_ylabel("latency ratio B / A  (< 1: B faster)")
    ax_lat.set_title("latency, where both runs timed it", fontsize=10)
    ax_lat.legend(fontsize=8)

    acc = cmp.accuracy
    apos = np.arange(len(acc.index))
    floor = 1e-7  # exactly correctly rounded (a share of 0) is drawn at the floor, marked "0"
    for off, side, colour in ((-0.2, "a", "#546e7a"), (0.2, "b", "#00897b")):
        miss = 1.0 - acc[f"fwd_correctly_rounded_{side}"].to_numpy(dtype=float)
        ok = np.isfinite(miss)
        shown = np.maximum(miss[ok], floor)
        label = cmp.label_a if side == "a" else cmp.label_b
        ax_acc.bar(apos[ok] + off, shown, width=0.4, color=colour, label=label)
        for p, v in zip(apos[ok] + off, miss[ok], strict=True):
            if v <= 0:
                ax_acc.annotate("0", (p, floor), ha="center", va="bottom", fontsize=7)
    ax_acc.set_yscale("log")
    ax_acc.set_ylim(floor / 2, 1.0)
    ax_acc.set_xticks(apos, list(acc.index), rotation=35, ha="right", fontsize=8)
    ax_acc.set_ylabel("share of outputs not correctly rounded")
    ax_acc.set_title("forward accuracy (lower is better)", fontsize=10)
    ax_acc.legend(fontsize=7)

    v = cmp.verdicts
    backends = list(dict.fromkeys(v.index.get_level_values(0)))
    grid = np.full((len(backends), len(VERDICT_CHECKS)), 4)
    for i, key in enumerate(backends):
        for j, check in enumerate(VERDICT_CHECKS):
            row = v.loc[(key, check)]
            grid[i, j] = _grid_class(row["verdict_a"], row["verdict_b"])
    cmap = ListedColormap([c for _, c in _GRID_CLASSES])
    ax_grid.imshow(grid, cmap=cmap, vmin=0, vmax=len(_GRID_CLASSES) - 1, aspect="auto")
    ax_grid.set_xticks(range(len(VERDICT_CHECKS)), VERDICT_CHECKS, rotation=35, ha="right", fontsize=8)
    ax_grid.set_yticks(range(len(backends)), backends, fontsize=8)
    ax_grid.set_xticks(np.arange(-0.5, len(VERDICT_CHECKS)), minor=True)
    ax_grid.set_yticks(np.arange(-0.5, len(backends)), minor=True)
    ax_grid.grid(which="minor", color="white", linewidth=1.5)
    ax_grid.tick_params(which="minor", length=0)
    ax_grid.set_title(f"verdicts, {cmp.label_a}  vs  {cmp.label_b}", fontsize=9)
    ax_grid.legend(
        handles=[Patch(color=c, label=n) for n, c in _GRID_CLASSES],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    fig.suptitle(f"A: {cmp.source_a}   against   B: {cmp.source_b}", fontsize=10)
    fig.tight_layout()
    return fig
