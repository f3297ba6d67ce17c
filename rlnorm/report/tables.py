"""What the reuse-check page shows of a run in progress: tables, the verdict lines, the plots.

The kit's steps (`rlnorm.kit.steps`) compute and record; this module only reads a `Run` and lays
it out for a reader, so the notebook stays a narrative of calls.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.checkout import seed_report_path
from rlnorm.kit.artifact import ran_host_bound, read_artifact
from rlnorm.kit.params import RunParams
from rlnorm.kit.records import records_frame
from rlnorm.kit.steps import PLOTS_DIR, Run, write_artifact_and_records
from rlnorm.report import plots
from rlnorm.report.counts import COMPARED_WORDS, KEPT_WORDS, NOT_KEPT_WORDS, ROW_CHECKS, backend_counts, count
from rlnorm.report.investigate import failing_summary
from rlnorm.report.plots.common import fmt_ratio, fmt_us, roofline_ratio
from rlnorm.report.verdicts import (
    CRASHED,
    ERROR,
    FAILED,
    PASSED,
    TIMED_OUT,
    backend_cells,
    crash_note,
    finished_checks,
    fraction,
    gate_cell,
    gradient_gate_clause,
)


def device_notice(run: Run) -> str:
    """What a reader must know about numbers from this device (empty on a GPU)."""
    if run.device != "cpu":
        return ""
    return (
        "> **CPU run.** Triton kernels (rlnorm's, FLA's) run in Triton's interpreter here: the bitwise"
        " checks hold as on a GPU, but the interpreter rounds fp32 -> bf16 casts toward zero (so a"
        " Triton kernel's correctly-rounded fraction is not its GPU value), and the latencies only say"
        " that the code ran. Backends that need a GPU are skipped with the reason. Run"
        " `params/full.yaml` on a GPU for the numbers an RFC needs."
    )


def backend_table(run: Run) -> pd.DataFrame:
    """One line per backend: status, source, and why it was skipped."""
    return pd.DataFrame(
        [
            {
                "backend": k,
                "status": r["status"],
                "backward": r["backward"],
                "source": r["source"],
                "why": r["skip_reason"],
            }
            for k, r in run.results.items()
        ]
    ).set_index("backend")


def _fmt(v: Any, digits: int = 1) -> Any:
    """Numbers as a reader scans them (None stays blank, ints stay ints)."""
    if v is None:
        return ""
    if isinstance(v, bool) or isinstance(v, int):
        return v
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return v


def _fraction(v: Any) -> str:
    """A correctly-rounded fraction as the verdict lines print it (six decimals), blank when not measured."""
    return fraction(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else ""


def _results(source: Any) -> dict[str, Any]:
    """`results` of a kit Run, a loaded run (`rlnorm.report.runs.Run`) or an artifact dict."""
    if isinstance(source, Mapping):
        return dict(source.get("results") or {})
    results = getattr(source, "results", None)
    if isinstance(results, Mapping):
        return dict(results)
    return dict((getattr(source, "artifact", None) or {}).get("results") or {})


def invariance_table(run: Run) -> pd.DataFrame:
    """Batch invariance per backend, in the artifact's own field names: per row check the row comparisons made,
    `fwd_differ` (row comparisons whose y differs) and `rowgrad_differ` (whose dx or dz differs; the sweep's
    `differ`: any of them), then the records kept and those `max_records` left out (`rlnorm.report.counts`)."""
    rows = []
    for key, r in run.results.items():
        bi = r.get("batch_invariance") or {}
        counts = backend_counts(r)
        line: dict[str, Any] = {
            "backend": key,
            "status": r["status"],
            "batch_invariant": _fmt(bi.get("batch_invariant")),
        }
        for check in ROW_CHECKS:
            c = counts.get(check)
            line[f"{check} {COMPARED_WORDS}"] = _fmt(None if c is None else c.compared)
            if check == "batch_size_sweep":
                line[f"{check} differ"] = _fmt(None if c is None else (c.any if c.any is not None else c.y))
            else:
                line[f"{check} fwd_differ"] = _fmt(None if c is None else c.y)
                line[f"{check} rowgrad_differ"] = _fmt(None if c is None else c.grad)
        line["dweight_repeatable"] = _fmt(bi.get("dweight_repeatable"))
        line[KEPT_WORDS] = sum(1 for rec in run.records if rec.get("backend") == key)
        line[NOT_KEPT_WORDS] = sum(c.not_kept for c in counts.values())
        line["errors"] = "; ".join(f"{c}: {m}" for c, m in (r.get("errors") or {}).items())
        rows.append(line)
    return pd.DataFrame(rows).set_index("backend")


def accuracy_table(run: Run) -> pd.DataFrame:
    """Accuracy against fp64, and latency against the torch.add timed beside each backend in the same run (the
    ratios are the artifact's `fwd_roofline_ratio` / `fwd_bwd_roofline_ratio`, as the latency plot prints them)."""
    rows = []
    for key, r in run.results.items():
        acc = r.get("accuracy_latency")
        if not acc:
            continue
        g = acc.get("grad_rel_err") or {}
        rows.append(
            {
                "backend": key,
                "rows": acc.get("rows"),
                "correctly rounded": _fraction(acc.get("fwd_correctly_rounded")),
                "max abs err": _fmt(acc.get("fwd_max_abs_err"), 6),
                "grad rel err x / z / w": " / ".join(_fmt(g.get(t), 5) or "-" for t in ("x", "z", "w")),
                "fwd us (p20-p80)": _span(acc, "fwd_us"),
                "fwd+bwd us (p20-p80)": _span(acc, "fwd_bwd_us"),
                "fwd / its add": _ratio(acc, "fwd_us"),
                "fwd+bwd / its add (8/3)": _ratio(acc, "fwd_bwd_us"),
            }
        )
    return pd.DataFrame(rows).set_index("backend") if rows else pd.DataFrame()


def _ratio(acc: dict[str, Any], field: str) -> str:
    """The time over the add timed beside this backend: the latency plot prints this same string."""
    ratio = roofline_ratio(acc, field)
    return "" if ratio is None else fmt_ratio(ratio)


def _span(acc: dict[str, Any], key: str) -> str:
    """Median (p20-p80); * where the GPU queue ran dry while timing (the time includes host overhead)."""
    mid = acc.get(key)
    if mid is None:
        return ""
    lo, hi = acc.get(f"{key}_p20"), acc.get(f"{key}_p80")

    star = "*" if ran_host_bound(acc, key) else ""
    return f"{mid:,.1f}{star}" + (f" ({lo:,.1f}-{hi:,.1f})" if lo is not None and hi is not None else "")


def gates_table(run: Run) -> pd.DataFrame:
    """The contract gates per backend: passed, how many lines failed, and whether the child crashed or hung."""
    rows = []
    for key, r in run.results.items():
        gates = r.get("contract_gates")
        if not gates:
            continue
        row: dict[str, Any] = {"backend": key}
        for name in ("forward", "gradient"):
            g = gates.get(name) or {}
            cell = gate_cell(gates.get(name))
            detail = " ".join(cell.text.split())
            row[name] = cell.state.upper() if cell.state in (FAILED, CRASHED, TIMED_OUT, ERROR) else cell.state
            if cell.state not in (PASSED, FAILED):
                row[name] += f" ({detail})"
            row[f"{name} failed lines"] = len(g.get("failed_lines") or [])
        grad = gates.get("gradient") or {}
        row["dweight vs exact singleton aggregate"] = "; ".join(
            ln.split("tensor=dweight ")[-1] for ln in grad.get("singleton_aggregate") or []
        )
        rows.append(row)
    return pd.DataFrame(rows).set_index("backend") if rows else pd.DataFrame()


def params_table(run: Run) -> pd.DataFrame:
    """This run's parameters beside the full protocol (docs/spec.md §4-5)'s (run paths left out: they say nothing)."""
    p, full = run.params.as_dict(), RunParams().as_dict()
    rows = []
    for key in p:
        if key in ("output_dir", "staging_dir"):
            continue
        mine, spec = p[key], full[key]
        rows.append({"parameter": key, "this run": _short(mine), "full protocol": "" if mine == spec else _short(spec)})
    return pd.DataFrame(rows).set_index("parameter")


def _short(v: Any, width: int = 90) -> str:
    text = ", ".join(map(str, v)) if isinstance(v, list) else str(v)
    return text if len(text) <= width else text[: width - 3] + "..."


def environment_table(run: Run) -> pd.DataFrame:
    """Where the numbers come from: device, versions, commit; the libraries on one line each."""

    env = dict(run.environment)
    libs = env.pop("libraries", {}) or {}
    # the commit read when the run started, the one its artifact and page header name
    env["commit"] = (run.commit or "not a git checkout") + (" (uncommitted changes)" if run.dirty else "")
    rows = [{"what": k, "value": _short(v)} for k, v in env.items()]
    rows += [{"what": name, "value": version} for name, version in libs.items() if version]
    missing = [name for name, version in libs.items() if not version]
    if missing:
        rows.append({"what": "not installed", "value": ", ".join(missing)})
    return pd.DataFrame(rows).set_index("what")


def make_plots(run: Run) -> dict[str, Path]:
    """The docs/spec.md §7.2 figures as PNGs under plots/ (titled from the artifact: GPU, commit, parameter set),
    with the reference B200 report beside this run where they share a measure. {name: PNG path}."""

    if run.artifact is None:
        write_artifact_and_records(run)
    seed_report = _seed_report()
    paths = plots.plot_all(run.artifact, records_frame(run.records), run.out / PLOTS_DIR, seed_report=seed_report)
    run.plots = {name: f"{PLOTS_DIR}/{Path(path).name}" for name, path in paths.items()}
    write_artifact_and_records(run)  # again, now that the artifact can list the PNGs
    return {name: Path(path) for name, path in paths.items()}


def _seed_report() -> dict[str, Any] | None:
    """The reference B200 report, read through the same reader as our artifacts (None if not shipped)."""
    try:
        return read_artifact(seed_report_path())
    except Exception as exc:
        warnings.warn(f"the reference report is not shown beside this run: {exc}", RuntimeWarning, stacklevel=2)
        return None


def record_table(run: Run) -> pd.DataFrame | str:
    """Per backend and check that differs: the complete counts of row comparisons, the records kept (per tensor)
    and those `max_records` left out; the records themselves are the CSV's lines."""
    table = failing_summary(records_frame(run.records), {"results": run.results})
    if table.empty:
        return "No row comparison differed in any check: the records CSV has its header only."
    return table.set_index(["backend", "check"])


def verdict_markdown(run: Any) -> str:
    """One line per backend, for the top of the page: status, batch invariant or not with the counts, the
    gradient gate and what it compares, the correctly rounded fraction, the forward time over the same-run add.

    `run`: a kit Run, a loaded run or an artifact dict (only its `results` are read).
    """
    return "\n".join(f"- **{key}**: " + "; ".join(_verdict_parts(r)) for key, r in _results(run).items())


def _verdict_parts(r: Mapping[str, Any]) -> list[str]:
    status = r.get("status") or "ran"
    if status in ("skipped", "failed"):
        return [f"{status}: {r.get('skip_reason') or 'no reason recorded'}"]
    cells = backend_cells(r)
    parts = []
    crashed = crash_note(r)
    if crashed is not None:
        state, _, rest = crashed.partition(": ")
        done = finished_checks(r)
        parts.append(f"**{state}** ({rest}); finished before it: " + (", ".join(done) if done else "no check"))
    counts = backend_counts(r)
    overall = cells["batch_invariant"]
    if overall.state == PASSED:
        compared = sum(c.compared or 0 for c in counts.values())
        dweight = (r.get("batch_invariance") or {}).get("dweight_repeatable")
        said = {True: "dweight repeatable", None: "no dweight: forward only"}.get(dweight, "dweight not repeatable")
        parts.append(f"batch invariant (0 of {count(compared)} row comparisons differ; {said})")
    elif overall.state == FAILED:
        found = [f"{c}: {counts[c].sentence()}" for c in ROW_CHECKS if c in counts and cells[c].state == FAILED]
        if cells["dweight_repeatable"].state == FAILED:
            found.append("dweight_repeatable: the same batch gives another dweight when run again")
        parts.append("**not** batch invariant (" + "; ".join(found) + ")")
    elif overall.state == ERROR:
        errors = r.get("errors") or {}
        parts.append("no batch-invariance verdict (" + "; ".join(f"{c} raised {m}" for c, m in errors.items()) + ")")
    elif crashed is not None:
        ran = [c for c in (*ROW_CHECKS, "dweight_repeatable") if cells[c].state == PASSED]
        clean = f": {', '.join(ran)} passed before it" if ran else ""
        parts.append(f"no batch-invariance verdict (it {overall.state} before its checks ended{clean})")
    else:
        parts.append("no batch-invariance verdict (checks missing)")
    gates = r.get("contract_gates") or {}
    if gates.get("forward") is not None and cells["forward gate"].state != PASSED:
        parts.append(f"forward gate **{cells['forward gate'].state}**")
    if gates.get("gradient") is not None:
        parts.append(gradient_gate_clause(gates.get("gradient")))
    acc = r.get("accuracy_latency") or {}
    cr = acc.get("fwd_correctly_rounded")
    if isinstance(cr, (int, float)):
        parts.append(f"correctly rounded {fraction(cr)}" + (" (every output)" if cr >= 1 else ""))
    fwd = acc.get("fwd_us")
    if isinstance(fwd, (int, float)):
        ratio = _ratio(acc, "fwd_us")
        star = "*" if ran_host_bound(acc, "fwd_us") else ""
        parts.append(f"forward {fmt_us(fwd)}{star}" + (f" = {ratio} the torch.add timed beside it" if ratio else ""))
    if r.get("errors") and overall.state != ERROR:
        parts.append("errors in " + ", ".join(r["errors"]))
    return parts


def time_table(run: Run, top: int = 10) -> pd.DataFrame:
    """The slowest steps (backend: check, gates, ...), so a reader knows what a rerun will cost."""
    steps = {k: v for k, v in run.timings.items() if k not in ("total", "checks")}
    rows = sorted(steps.items(), key=lambda kv: -kv[1])[:top]
    return pd.DataFrame([{"step": k, "seconds": round(v, 1)} for k, v in rows]).set_index("step")


def agreement_table(run: Run) -> pd.DataFrame | None:
    """Fraction of forward outputs bitwise equal between each pair of backends (None when not run)."""
    a = run.agreement
    if not a or "equal_fraction" not in a:
        return None
    return pd.DataFrame(a["equal_fraction"], index=a["backends"], columns=a["backends"])


def trainer_sampler_table(run: Run) -> pd.DataFrame | str:
    """Trainer against sampler: per pair, who computed each side and how their outputs differ (a line of text
    where the check was skipped or failed, empty text where it did not run)."""
    ts = run.trainer_sampler
    if not ts:
        return ""
    if ts.get("error") or ts.get("skip_reason"):
        return f"trainer vs sampler did not run: {ts.get('error') or ts.get('skip_reason')}"
    n = ts["rows"] * ts["d"]
    rows = []
    for name, pair in ts["pairs"].items():
        why = pair.get("error") or pair.get("skip_reason") or ""
        rows.append(
            {
                "pair": name,
                "trainer": pair.get("trainer") or "",
                "sampler": pair.get("sampler") or "",
                "bitwise equal": "" if pair.get("bitwise_equal") is None else pair["bitwise_equal"],
                "rows differ": "" if why else f"{pair['rows_differ']} / {ts['rows']}",
                "elements differ": "" if why else f"{pair['elements_differ']} / {n}",
                "max ulp": "" if why else pair["max_ulp"],
                "why not compared": why,
            }
        )
    return pd.DataFrame(rows).set_index("pair")
