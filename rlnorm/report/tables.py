"""The reuse-check page's tables, each from a `RunResult` (what the kit wrote): the notebook shows them as they are.
Their counts and verdict words come from `rlnorm.report.verdict`."""

from __future__ import annotations

from typing import Any

import pandas as pd

from rlnorm.kit.params import RunParams
from rlnorm.kit.results import Accuracy, RunResult
from rlnorm.report.plots.common import fmt_ratio, roofline_ratio
from rlnorm.report.runs import records_of
from rlnorm.report.verdict import clip, differing_table, fraction, run_verdicts


def backend_table(run: RunResult) -> pd.DataFrame:
    """One line per backend: status, source, and why it was skipped."""
    rows = [{"backend": k, "status": r.status, "backward": r.backward, "source": r.source, "why": r.skip_reason}
            for k, r in run.results.items()]  # fmt: skip
    return pd.DataFrame(rows).set_index("backend")


def _span(acc: Accuracy, field: str) -> str:
    """Median (p20-p80); * where the GPU queue ran dry while timing (the time includes host overhead)."""
    mid, lo, hi = getattr(acc, field), getattr(acc, f"{field}_p20"), getattr(acc, f"{field}_p80")
    if mid is None:
        return ""
    star = "*" if acc.ran_host_bound(field) else ""
    return f"{mid:,.1f}{star}" + (f" ({lo:,.1f}-{hi:,.1f})" if lo is not None and hi is not None else "")


def accuracy_table(run: RunResult) -> pd.DataFrame:
    """Accuracy against fp64, and latency against the torch.add timed beside each backend in the same run (the
    ratios are the artifact's `fwd_roofline_ratio` / `fwd_bwd_roofline_ratio`, as the latency figure prints)."""
    rows = []
    for key, r in run.results.items():
        acc = r.accuracy_latency
        if acc is None:
            continue
        g, cr = acc.grad_rel_err or {}, acc.fwd_correctly_rounded
        ratios = [roofline_ratio(acc, f) for f in ("fwd_us", "fwd_bwd_us")]
        rows.append({"backend": key, "rows": acc.rows, "correctly rounded": "" if cr is None else fraction(cr),
                     "max abs err": "" if acc.fwd_max_abs_err is None else f"{acc.fwd_max_abs_err:.6f}",
                     "grad rel err x / z / w": " / ".join("-" if g.get(t) is None else f"{g[t]:.5f}" for t in "xzw"),
                     "fwd us (p20-p80)": _span(acc, "fwd_us"), "fwd+bwd us (p20-p80)": _span(acc, "fwd_bwd_us"),
                     **{name: "" if r is None else fmt_ratio(r) for name, r in
                        zip(("fwd / its add", "fwd+bwd / its add (8/3)"), ratios, strict=True)}})  # fmt: skip
    return pd.DataFrame(rows).set_index("backend") if rows else pd.DataFrame()


def gates_table(run: RunResult) -> pd.DataFrame:
    """The contract gates per backend: the verdict, how many lines failed, and the gradient gate's dweight lines."""
    rows = []
    for key, v in run_verdicts(run).items():
        gates = run.results[key].contract_gates
        if not gates:
            continue
        row: dict[str, Any] = {"backend": key}
        for name in ("forward", "gradient"):
            row[f"{name} gate"] = v.checks[f"{name}_gate"].words()
            row[f"{name} failed lines"] = len(gates[name].failed_lines) if name in gates else 0
        grad = gates.get("gradient")
        lines = grad.singleton_aggregate if grad is not None else []
        row["dweight vs exact singleton aggregate"] = "; ".join(ln.split("tensor=dweight ")[-1] for ln in lines)
        rows.append(row)
    return pd.DataFrame(rows).set_index("backend") if rows else pd.DataFrame()


def agreement_table(run: RunResult) -> pd.DataFrame | None:
    """Fraction of forward outputs bitwise equal between each pair of backends (None when not run)."""
    a = run.agreement
    return None if a is None else pd.DataFrame(a.equal_fraction, index=a.backends, columns=a.backends)


def record_table(run: RunResult, records: pd.DataFrame | None = None) -> pd.DataFrame | str:
    """Per backend and check that differs: the complete counts of row comparisons, the records kept (per tensor)
    and those `max_records` left out; the records themselves are the CSV's lines."""
    table = differing_table(run, records if records is not None else records_of(run))
    if table.empty:
        return "No row comparison differed in any check: the records CSV has its header only."
    return table.set_index(["backend", "check"])


def _text(v: Any) -> str:
    return clip(", ".join(map(str, v)) if isinstance(v, list) else str(v), 90)


def params_table(run: RunResult) -> pd.DataFrame:
    """This run's parameters beside the full protocol's (run paths left out: they say nothing)."""
    full = RunParams().as_dict()
    rows = []
    for key, mine in (run.params or {}).items():
        if key in ("output_dir", "staging_dir"):
            continue
        spec = full.get(key, mine)
        rows.append({"parameter": key, "this run": _text(mine), "full protocol": "" if mine == spec else _text(spec)})
    return pd.DataFrame(rows).set_index("parameter") if rows else pd.DataFrame()


def environment_table(run: RunResult) -> pd.DataFrame:
    """Where the numbers come from: device, versions, commit; the libraries on one line each."""
    env = {k: v for k, v in run.environment.items() if k != "libraries"}
    env["commit"] = (run.commit or "not a git checkout") + (" (uncommitted changes)" if run.tracked_tree_dirty else "")
    libs = run.libraries
    rows = [{"what": k, "value": _text(v)} for k, v in env.items()]
    rows += [{"what": name, "value": version} for name, version in libs.items() if version]
    missing = [name for name, version in libs.items() if not version]
    if missing:
        rows.append({"what": "not installed", "value": ", ".join(missing)})
    return pd.DataFrame(rows).set_index("what")


def time_table(timings: dict[str, float]) -> pd.DataFrame:
    """The ten slowest steps (backend: check, gates, ...), so a reader knows what a rerun will cost."""
    steps = sorted(((k, v) for k, v in timings.items() if k not in ("total", "checks")), key=lambda kv: -kv[1])
    return pd.DataFrame([{"step": k, "seconds": round(v, 1)} for k, v in steps[:10]]).set_index("step")


def stack_pairs_table(run: RunResult) -> pd.DataFrame | str:
    """The trainer/sampler pairs RL stacks deploy: each side's backend, how it ran the rows, where the stack chooses
    it, and how the outputs differ (the full reason where a pair did not run)."""
    table = run.stack_pairs
    if table is None:
        return ""
    n = table.rows * table.d
    out = []
    for p in table.pairs:
        ran = p.status == "ran"
        out.append({
            "pair": p.name,
            "stack": p.stack or "",
            "model": p.model or "",
            "trainer": p.trainer_source or p.trainer or "",
            "sampler": p.sampler_source or p.sampler or "",
            "bitwise equal": p.bitwise_equal if ran else "",
            "elements differ": f"{p.elements_differ} / {n}" if ran else "",
            "max ulp": p.max_ulp if ran else "",
            "status": p.status if ran else f"{p.status}: {p.reason}",
            "trainer chosen at": p.trainer_where or "",
            "sampler chosen at": p.sampler_where or "",
        })  # fmt: skip
    return pd.DataFrame(out).set_index("pair") if out else "no pairs"
