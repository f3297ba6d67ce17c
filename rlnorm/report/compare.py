"""Two runs side by side (typically the reference B200 report and a run of ours), from their `RunResult`s alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlnorm.kit.checks.digests import same_bits
from rlnorm.kit.params import RunParams
from rlnorm.kit.results import RunResult
from rlnorm.report.runs import open_run, param, run_label
from rlnorm.report.verdict import CHECKS, COLUMNS, STATE_COLORS, State, run_verdicts

OP_KEYS = ("d", "eps", "group_size", "norm_before_gate", "activation", "weight_dtype")  # what defines the op
ABSENT = "absent"
LATENCY = ("fwd_us", "fwd_bwd_us")
ACCURACY = ("fwd_correctly_rounded", "fwd_max_abs_err", "grad_rel_err_x", "grad_rel_err_z", "grad_rel_err_w")


@dataclass
class Comparison:
    """Everything `notebooks/compare_runs` shows; each table indexed by backend (and check)."""

    label_a: str
    label_b: str
    environment: pd.DataFrame
    verdicts: pd.DataFrame
    latency: pd.DataFrame
    accuracy: pd.DataFrame
    changes: list[str]  # what_changed's sentences
    different_ops: list[str]
    runs: tuple[RunResult, RunResult]  # A and B

    def changes_markdown(self) -> str:
        """What changed: first whether the runs computed the same op, then each change."""
        lines = []
        if self.different_ops:
            lines.append(f"**These runs computed different ops** ({'; '.join(self.different_ops)}): read what "
                         "follows as two separate results, not as a change of one.\n")  # fmt: skip
        return "\n".join(lines + ([f"- {c}" for c in self.changes] or ["*Nothing changed.*"]))


def _keys(a: RunResult, b: RunResult) -> list[str]:
    return [*a.results, *(k for k in b.results if k not in a.results)]


def _states(run: RunResult, key: str) -> dict[str, tuple[str, str]]:
    """column -> (state word, the words with counts or why) for one backend; 'absent' where the run lacks it."""
    if key not in run.results:
        return dict.fromkeys(COLUMNS, (ABSENT, ABSENT))
    return {c: (state.value, words) for c, (state, words) in run_verdicts(run)[key].columns().items()}


def digest_table(a: RunResult, b: RunResult) -> pd.DataFrame:
    """Per backend: whether A and B computed the same bits on the standard case (None where they cannot tell)."""
    keys = _keys(a, b)
    said = [same_bits(*(r.results[k].digests if k in r.results else None for r in (a, b))) for k in keys]
    index = pd.Index(keys, name="backend")  # object columns: None stays None (never NaN) where they cannot tell
    same = pd.Series([same for same, _ in said], index=index, dtype=object)
    return pd.DataFrame({"same bits": same, "why": [why for _, why in said]}, index=index)


def verdict_table(a: RunResult, b: RunResult, label_a: str = "a", label_b: str = "b") -> pd.DataFrame:
    """Index (backend, check); columns label_a, label_b (the verdict's words), state_a, state_b and `changed`."""
    rows = []
    for key in _keys(a, b):
        sa, sb = _states(a, key), _states(b, key)
        rows += [{"backend": key, "check": c, label_a: sa[c][1], label_b: sb[c][1], "state_a": sa[c][0],
                  "state_b": sb[c][0], "changed": sa[c][0] != sb[c][0]} for c in COLUMNS]  # fmt: skip
    return pd.DataFrame(rows).set_index(["backend", "check"])


def _measure(run: RunResult, key: str, name: str) -> float | None:
    """One accuracy_latency field of a backend (grad_rel_err_x ... for the gradients); None where absent."""
    acc = getattr(run.results.get(key), "accuracy_latency", None)
    if acc is None:
        return None
    return (acc.grad_rel_err or {}).get(name[-1]) if name.startswith("grad_rel_err_") else getattr(acc, name)


def _side_by_side(a: RunResult, b: RunResult, fields: tuple[str, ...]) -> pd.DataFrame:
    rows = [{"backend": k, **{f"{f}_{s}": _measure(r, k, f) for f in fields for s, r in (("a", a), ("b", b))}}
            for k in _keys(a, b)]  # fmt: skip
    return pd.DataFrame(rows).set_index("backend").astype(float)


def latency_table(a: RunResult, b: RunResult) -> pd.DataFrame:
    """Per backend: fwd_us and fwd_bwd_us in a and b, and the ratios b/a (< 1: b is faster)."""
    table = _side_by_side(a, b, LATENCY)
    for m in LATENCY:
        table[f"{m}_ratio"] = table[f"{m}_b"] / table[f"{m}_a"].where(table[f"{m}_a"] != 0)
    return table[[f"{m}_{s}" for m in LATENCY for s in ("a", "b", "ratio")]]


def protocol(run: RunResult) -> dict[str, Any]:
    """The sizes a run measured at, read from its check summaries (the reference report has no params)."""
    invs = [r.batch_invariance for r in run.results.values() if r.batch_invariance is not None]
    rows = next((i.all_rows for i in invs if i.all_rows is not None and i.all_rows.sizes), None)
    sub = next((i.full_vs_sub_batches for i in invs if i.full_vs_sub_batches is not None), None)
    sweep = next((i.batch_size_sweep for i in invs if i.batch_size_sweep is not None), None)
    acc = next((r.accuracy_latency for r in run.results.values() if r.accuracy_latency is not None), None)
    return {"quick": run.quick, "all_rows_sizes": None if rows is None else list(rows.sizes),
            "sub_batches_full_batch": getattr(sub, "full_batch", None),
            "sub_batch_sizes": getattr(sub, "sub_batch_sizes", None), "sub_batches": getattr(sub, "sub_batches", None),
            "sub_batches_coverage": None if sub is None else (sub.coverage or "sampled"),
            "sweep_comparisons": getattr(sweep, "comparisons", None),
            "accuracy_rows": getattr(acc, "rows", None)}  # fmt: skip


def environment_table(a: RunResult, b: RunResult, label_a: str = "a", label_b: str = "b") -> pd.DataFrame:
    """GPU, capability, CUDA, commit, library versions and the protocol side by side."""

    def flat(run: RunResult) -> dict[str, Any]:
        out = {k: run.environment.get(k) for k in ("gpu", "capability", "cuda")}
        out.update(run.libraries, commit=run.commit, tracked_tree_dirty=run.tracked_tree_dirty)
        return {**out, **{f"protocol: {k}": v for k, v in protocol(run).items()}}

    fa, fb = flat(a), flat(b)
    rows = [{"field": k, label_a: fa.get(k), label_b: fb.get(k), "same": fa.get(k) == fb.get(k)}
            for k in [*fa, *(k for k in fb if k not in fa)]]  # fmt: skip
    return pd.DataFrame(rows).set_index("field")


def op_differences(a: RunResult, b: RunResult, label_a: str = "a", label_b: str = "b") -> list[str]:
    """The op parameters two runs differ in (the reference report names none: it computed the defaults)."""
    default = RunParams()
    oa, ob = ({k: str(param(r, k, getattr(default, k))).replace("swish", "silu") for k in OP_KEYS} for r in (a, b))
    return [f"{k}: {oa[k]} in {label_a}, {ob[k]} in {label_b}" for k in OP_KEYS if oa[k] != ob[k]]


def what_changed(cmp: Comparison, latency_move: float, accuracy_move: float) -> list[str]:
    """Plain sentences, the one that matters most first."""
    (a, b), label_a, label_b = cmp.runs, cmp.label_a, cmp.label_b
    out: list[str] = []
    if cmp.different_ops:
        ops = "; ".join(cmp.different_ops)
        out.append(f"the two runs computed different ops ({ops}): their verdicts, latencies and accuracies describe "
                   "different computations and are not a before/after of one")  # fmt: skip
    if a.device_name != b.device_name:
        out.append(f"devices differ ({a.device_name} vs {b.device_name}): latency ratios compare the hardware as "
                   "much as the code")  # fmt: skip
    pa, pb = protocol(a), protocol(b)
    if moved := [k for k in pa if pa[k] != pb[k]]:
        out.append(f"protocol differs ({', '.join(moved)}): differ counts and timings are not like for like")
    out += [f"{k}: only in {label_a}" for k in a.results if k not in b.results]
    out += [f"{k}: only in {label_b}" for k in b.results if k not in a.results]
    both = [k for k in a.results if k in b.results]
    not_both = {k for k in both if a.results[k].status != b.results[k].status}
    for k in not_both:  # a backend that ran in one run only: one line with the reason, not one per check
        ra, rb = a.results[k], b.results[k]
        why = (rb if rb.status != "ran" else ra).skip_reason or ""
        out.append(f"{k}: {ra.status} in {label_a}, {rb.status} in {label_b}" + (f" ({why[:160]})" if why else ""))
    unmeasured: dict[str, list[str]] = {label_a: [], label_b: []}
    for (k, c), row in cmp.verdicts.iterrows():
        if not row["changed"] or k not in both or k in not_both:
            continue
        if State.NOT_RUN.value in (row["state_a"], row["state_b"]):  # measured in one run only: not a flip
            unmeasured[label_a if row["state_a"] == State.NOT_RUN.value else label_b].append(f"{k} {c}")
        else:
            out.append(f"{k} {c}: {row[label_a]} -> {row[label_b]}")
    out += [f"not measured in {label}: {', '.join(items)}" for label, items in unmeasured.items() if items]
    for k, row in cmp.latency.iterrows():
        for m in LATENCY:
            r = row[f"{m}_ratio"]
            if pd.notna(r) and abs(r - 1) > latency_move:
                word = "faster" if r < 1 else "slower"
                out.append(f"{k} {m}: {row[f'{m}_a']:.1f} -> {row[f'{m}_b']:.1f} us ({r:.2f}x, {word})")
    for k, row in cmp.accuracy.iterrows():
        x, y = row["fwd_correctly_rounded_a"], row["fwd_correctly_rounded_b"]
        if pd.notna(x) and pd.notna(y) and abs(y - x) > accuracy_move:
            out.append(f"{k} fwd_correctly_rounded: {x:.6f} -> {y:.6f}")
    return out


def compare_runs(a: str | Path | RunResult, b: str | Path | RunResult, latency_move: float = 0.10,
                 accuracy_move: float = 1e-4) -> Comparison:  # fmt: skip
    """Compare run a (e.g. 'seed', the reference B200 report) with run b (e.g. an H200 run)."""
    if not latency_move >= 0:
        raise ValueError(f"latency_move: expected a fraction >= 0, got {latency_move!r}")
    ra, rb = open_run(a), open_run(b)
    la, lb = (f"{side}: {r.device_name}" + (f" ({param(r, 'name')})" if param(r, "name") else "")
              for side, r in (("A", ra), ("B", rb)))  # fmt: skip
    lb += " (2)" if la == lb else ""
    cmp = Comparison(la, lb, environment_table(ra, rb, la, lb), verdict_table(ra, rb, la, lb), latency_table(ra, rb),
                     _side_by_side(ra, rb, ACCURACY), [], op_differences(ra, rb, la, lb), (ra, rb))  # fmt: skip
    cmp.changes = what_changed(cmp, latency_move, accuracy_move)
    return cmp


def plot_comparison(cmp: Comparison) -> Any:
    """Latency ratios B/A, the share of outputs not correctly rounded, and the verdict grid with A and B per cell."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    fig = Figure(figsize=(18, 4.8 + 0.25 * len(cmp.latency)), layout="constrained")
    ax_lat, ax_acc, ax_grid = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.3]})
    keys = list(cmp.latency.index)
    pos = np.arange(len(keys))
    for off, m, colour in zip((-0.2, 0.2), LATENCY, ("#3949ab", "#8e24aa"), strict=True):
        vals = cmp.latency[f"{m}_ratio"].to_numpy(dtype=float)
        ok = np.isfinite(vals)
        ax_lat.bar(pos[ok] + off, vals[ok] - 1.0, bottom=1.0, width=0.4, color=colour, label=m)
        for p, v in zip(pos[ok] + off, vals[ok], strict=True):
            ax_lat.annotate(f"{v:.2g}", (p, v), ha="center", va="bottom" if v >= 1 else "top", fontsize=7)
    ax_lat.axhline(1.0, color="k", lw=0.8)
    floor = 1e-7  # exactly correctly rounded (a share of 0) is drawn at the floor, marked "0"
    for off, side, colour, label in ((-0.2, "a", "#546e7a", cmp.label_a), (0.2, "b", "#00897b", cmp.label_b)):
        miss = 1.0 - cmp.accuracy[f"fwd_correctly_rounded_{side}"].to_numpy(dtype=float)
        ok = np.isfinite(miss)
        ax_acc.bar(pos[ok] + off, np.maximum(miss[ok], floor), width=0.4, color=colour, label=label)
        for p, v in zip(pos[ok] + off, miss[ok], strict=True):
            if v <= 0:
                ax_acc.annotate("0", (p, floor), ha="center", va="bottom", fontsize=7)
    for ax, what, title in ((ax_lat, "latency ratio B / A (< 1: B faster)", "latency, where both runs timed it"),
                            (ax_acc, "share of outputs not correctly rounded",
                             "forward accuracy (lower is better)")):  # fmt: skip
        ax.set(yscale="log", ylabel=what)
        ax.set_xticks(pos, keys, rotation=35, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    ax_acc.set_ylim(floor / 2, 1.0)
    v = cmp.verdicts
    backends = list(dict.fromkeys(v.index.get_level_values(0)))
    counted = [run_verdicts(r) for r in cmp.runs]
    colors = {s.value: STATE_COLORS[s] for s in State} | {ABSENT: "#ffffff"}
    for i, key in enumerate(backends):
        for j, check in enumerate(COLUMNS):
            row = v.loc[(key, check)]
            for half, state in ((0, row["state_a"]), (1, row["state_b"])):
                ax_grid.add_patch(Rectangle((j - 0.5 + 0.5 * half, i - 0.5), 0.5, 1, color=colors[state]))
            if row["changed"]:
                ax_grid.add_patch(Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, ec="k", lw=1.5))
            counts = [None if key not in bv else bv[key].checks[check].counts for bv in counted if check in CHECKS]
            if any(counts):  # the differing row comparisons, A over B
                text = "\n".join("–" if c is None else (c.short() if c.differs else "0") for c in counts)
                ax_grid.text(j, i, text, ha="center", va="center", fontsize=6.5)
    ax_grid.set(xlim=(-0.5, len(COLUMNS) - 0.5), ylim=(len(backends) - 0.5, -0.5))
    ax_grid.set_xticks(range(len(COLUMNS)), COLUMNS, rotation=35, ha="right", fontsize=8)
    ax_grid.set_yticks(range(len(backends)), backends, fontsize=8)
    ax_grid.set_title(f"verdicts: left half {cmp.label_a}, right half {cmp.label_b} (framed: changed)", fontsize=9)
    used = sorted({*v["state_a"], *v["state_b"]})
    ax_grid.legend(handles=[Patch(color=colors[s], label=s) for s in used], fontsize=7, loc="upper left",
                   bbox_to_anchor=(1.01, 1.0))  # fmt: skip
    fig.suptitle(f"A: {run_label(cmp.runs[0])}   against   B: {run_label(cmp.runs[1])}", fontsize=10)
    return fig
