"""Runs side by side, from their `RunResult`s alone: two in full (typically the reference B200 report and a run of
ours), and many (a matrix of params, or a cluster's array tasks) as one line per run and backend with an index page
linking every run's page. The run folders are only read."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.kit.artifact import write_atomic
from rlnorm.kit.checks.digests import same_bits
from rlnorm.kit.params import RunParams
from rlnorm.kit.results import RunResult
from rlnorm.report.runs import open_run, param
from rlnorm.report.verdict import COLUMNS, STATE_COLORS, State, run_verdicts

OP_KEYS = ("d", "eps", "group_size", "norm_before_gate", "activation", "weight_dtype")  # what defines the op
RUN_KEYS = (*OP_KEYS, "device")  # what a matrix of runs varies
ABSENT = "absent"
LATENCY = ("fwd_us", "fwd_bwd_us")
ACCURACY = ("fwd_correctly_rounded", "fwd_max_abs_err", "grad_rel_err_x", "grad_rel_err_z", "grad_rel_err_w")
INDEX_FILE = "index.html"
SUMMARY_FILE = "summary.csv"
# summary.csv's column -> the accuracy_latency field it shows
MEASURED = {"correctly_rounded": "fwd_correctly_rounded", "fwd_us": "fwd_us", "fwd_x_add": "fwd_roofline_ratio",
            "fwd_bwd_us": "fwd_bwd_us"}  # fmt: skip


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
        ops = [f"**These runs computed different ops** ({'; '.join(self.different_ops)}): read what follows as two "
               "separate results, not as a change of one.\n"] if self.different_ops else []  # fmt: skip
        return "\n".join(ops + ([f"- {c}" for c in self.changes] or ["*Nothing changed.*"]))


def _keys(a: RunResult, b: RunResult) -> list[str]:
    return [*a.results, *(k for k in b.results if k not in a.results)]


def digest_table(a: RunResult, b: RunResult) -> pd.DataFrame:
    """Per backend: whether A and B computed the same bits on the standard case (None where they cannot tell)."""
    keys = _keys(a, b)
    said = [same_bits(*(r.results[k].digests if k in r.results else None for r in (a, b))) for k in keys]
    index = pd.Index(keys, name="backend")  # object columns: None stays None (never NaN) where they cannot tell
    same = pd.Series([same for same, _ in said], index=index, dtype=object)
    return pd.DataFrame({"same bits": same, "why": [why for _, why in said]}, index=index)


def verdict_table(a: RunResult, b: RunResult, label_a: str = "a", label_b: str = "b") -> pd.DataFrame:
    """Index (backend, check); columns label_a, label_b (the verdict's words), state_a, state_b and `changed`."""
    absent = dict.fromkeys(COLUMNS, (ABSENT, ABSENT))  # where a run lacks the backend
    va, vb = ({k: {c: (s.value, w) for c, (s, w) in v.columns().items()} for k, v in run_verdicts(r).items()}
              for r in (a, b))  # fmt: skip
    rows = []
    for key in _keys(a, b):
        sa, sb = va.get(key, absent), vb.get(key, absent)
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
    not_both = [k for k in both if a.results[k].status != b.results[k].status]  # in run order, not a set's
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
    cmp = Comparison(la, lb, environment_table(ra, rb, la, lb), verdict_table(ra, rb, la, lb), latency_table(ra, rb),
                     _side_by_side(ra, rb, ACCURACY), [], op_differences(ra, rb, la, lb), (ra, rb))  # fmt: skip
    cmp.changes = what_changed(cmp, latency_move, accuracy_move)
    return cmp


def summary_table(runs: Sequence[str | Path | RunResult]) -> pd.DataFrame:
    """One line per run and backend: where the run is, the op it computed, and each backend's verdict."""
    rows = []
    for source in runs:
        run = open_run(source)
        folder = run.folder or Path(".")
        base = {"run": folder.name, "folder": str(folder), "gpu": run.device_name, "commit": (run.commit or "")[:9],
                **{k: param(run, k) for k in RUN_KEYS}}  # fmt: skip
        for key, v in run_verdicts(run).items():
            r, gate = run.results[key], v.checks["gradient_gate"].state
            measured = {name: getattr(r.accuracy_latency, field, None) for name, field in MEASURED.items()}
            rows.append({**base, "backend": key, "status": r.status, "state": v.overall.value, "verdict": v.headline,
                         "why": v.why, **measured,
                         "gradient_gate": None if gate is State.NOT_RUN else gate is State.PASSED})  # fmt: skip
    return pd.DataFrame(rows)


def _cell(r: pd.Series) -> str:
    text = html.escape(r["verdict"])
    if r["status"] == "ran" and pd.notna(r["correctly_rounded"]):
        text += f"<br><small>correctly rounded {r['correctly_rounded']:.6f}</small>"
    elif r["status"] != "ran" and r["why"]:
        text += f"<br><small>{html.escape(str(r['why'])[:140])}</small>"
    return f'<td style="background:{STATE_COLORS[State(r["state"])]}">{text}</td>'


def write_index(runs: Sequence[str | Path], out_dir: str | Path, title: str | None = None) -> tuple[Path, Path]:
    """`index.html` (a table of runs x backends, each run linking its page) and `summary.csv`, in `out_dir`."""
    out = Path(out_dir)
    table = summary_table(runs)
    csv = out / SUMMARY_FILE
    write_atomic(csv, table.to_csv(index=False))
    varies = [k for k in RUN_KEYS if k in table and table[k].astype(str).nunique() > 1]
    backends = list(dict.fromkeys(table["backend"])) if not table.empty else []
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["run", *varies, "GPU", "commit", *backends])
    body = []
    for folder, group in table.groupby("folder", sort=False) if not table.empty else []:
        first = group.iloc[0]
        page = Path(folder) / "reuse_check.html"
        name = html.escape(first["run"])
        link = f'<a href="{html.escape(os.path.relpath(page, out))}">{name}</a>' if page.is_file() else name
        cells = [f"<td>{link}</td>", *(f"<td>{html.escape(str(first[k]))}</td>" for k in varies)]
        cells += [f"<td>{html.escape(str(first['gpu']))}</td>", f"<td><code>{html.escape(first['commit'])}</code></td>"]
        by_backend = {r["backend"]: r for _, r in group.iterrows()}
        cells += [_cell(by_backend[b]) if b in by_backend else "<td></td>" for b in backends]
        body.append("<tr>" + "".join(cells) + "</tr>")
    n = table["folder"].nunique() if not table.empty else 0
    heading = html.escape(title or f"{n} reuse-check runs")
    write_atomic(
        out / INDEX_FILE,
        f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{heading}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}th{{background:#fafafa}}</style></head>
<body><h1>{heading}</h1>
<p>{n} runs; {"varying " + ", ".join(varies) if varies else "the same op"}. Each run's page has the evidence;
<code>{SUMMARY_FILE}</code> has one line per run and backend.</p>
<table><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table></body></html>
""",
    )
    return out / INDEX_FILE, csv
