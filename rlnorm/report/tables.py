"""What the reuse-check page shows of a run in progress: tables, the verdict lines, the plots.

The kit's steps (`rlnorm.kit.steps`) compute and record; this module only reads a `Run` and lays
it out for a reader, so the notebook stays a narrative of calls.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.checkout import seed_report_path
from rlnorm.kit.artifact import ran_host_bound, read_artifact
from rlnorm.kit.environment import git_commit, tracked_tree_dirty
from rlnorm.kit.params import RunParams
from rlnorm.kit.records import records_frame
from rlnorm.kit.steps import PLOTS_DIR, Run, write_artifact_and_records
from rlnorm.report import plots


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


def _total(node: dict[str, Any] | None, field_name: str) -> Any:
    """Sum of a differ count over all_rows' sizes (None when the check did not run)."""
    if not node:
        return None
    vals = [v.get(field_name) for v in node.values() if isinstance(v, dict)]
    vals = [v for v in vals if isinstance(v, int)]
    return sum(vals) if vals else None


def invariance_table(run: Run) -> pd.DataFrame:
    """Batch invariance per backend: the differ counts of each check, the verdict, and errors."""
    rows = []
    for key, r in run.results.items():
        bi = r.get("batch_invariance") or {}
        fvs = bi.get("full_vs_sub_batches") or {}
        sweep = bi.get("batch_size_sweep") or {}
        rows.append(
            {
                "backend": key,
                "status": r["status"],
                "batch_invariant": _fmt(bi.get("batch_invariant")),
                "all_rows fwd_differ": _fmt(_total(bi.get("all_rows"), "fwd_differ")),
                "all_rows rowgrad_differ": _fmt(_total(bi.get("all_rows"), "rowgrad_differ")),
                "sub_batches fwd_differ": _fmt(fvs.get("fwd_differ")),
                "sub_batches rowgrad_differ": _fmt(fvs.get("rowgrad_differ")),
                "sweep differ": _fmt(sweep.get("differ")),
                "dweight_repeatable": _fmt(bi.get("dweight_repeatable")),
                "errors": "; ".join(f"{c}: {m}" for c, m in r.get("errors", {}).items()),
            }
        )
    return pd.DataFrame(rows).set_index("backend")


def accuracy_table(run: Run) -> pd.DataFrame:
    """Accuracy against fp64 and latency against the same-run torch.add roofline, per backend that ran."""
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
                "correctly rounded": _fmt(acc.get("fwd_correctly_rounded"), 5),
                "max abs err": _fmt(acc.get("fwd_max_abs_err"), 6),
                "grad rel err x / z / w": " / ".join(_fmt(g.get(t), 5) or "-" for t in ("x", "z", "w")),
                "fwd us (p20-p80)": _span(acc, "fwd_us"),
                "fwd+bwd us (p20-p80)": _span(acc, "fwd_bwd_us"),
                "fwd / roofline": _fmt(acc.get("fwd_roofline_ratio"), 2),
                "fwd+bwd / roofline": _fmt(acc.get("fwd_bwd_roofline_ratio"), 2),
            }
        )
    return pd.DataFrame(rows).set_index("backend") if rows else pd.DataFrame()


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
            state = "passed" if g.get("passed") else "FAILED"
            if g.get("timed_out"):
                state += " (timed out)"
            elif g.get("returncode") not in (0, None):
                state += f" (child exit {g.get('returncode')})"
            row[name] = state
            row[f"{name} failed lines"] = len(g.get("failed_lines") or [])
        grad = gates.get("gradient") or {}
        row["dweight vs exact singleton aggregate"] = "; ".join(
            ln.split("tensor=dweight ")[-1] for ln in grad.get("singleton_aggregate") or []
        )
        rows.append(row)
    return pd.DataFrame(rows).set_index("backend") if rows else pd.DataFrame()


def check_table(run: Run) -> pd.DataFrame:
    """The headline per backend (what the CLI summary and a quick look need)."""
    return invariance_table(run)


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
    commit = git_commit()
    env["commit"] = (commit or "not a git checkout") + (" (uncommitted changes)" if tracked_tree_dirty() else "")
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
    """Differing rows per backend, check and tensor (the full list is in the records CSV)."""

    df = records_frame(run.records)
    if df.empty:
        return "No row differed in any check: the records CSV has its header only."
    return df.groupby(["backend", "check", "tensor"]).size().unstack("tensor", fill_value=0)


def verdict_markdown(run: Run) -> str:
    """One line per backend: the answer an RFC thread is looking for."""
    lines = []
    for key, r in run.results.items():
        if r["status"] != "ran":
            lines.append(f"- **{key}**: {r['status']}: {r['skip_reason']}")
            continue
        bi = (r.get("batch_invariance") or {}).get("batch_invariant")
        verdict = {True: "batch invariant", False: "**not** batch invariant", None: "no verdict (checks missing)"}[bi]
        acc = r.get("accuracy_latency") or {}
        parts = [verdict]
        if acc.get("fwd_correctly_rounded") is not None:
            parts.append(f"correctly rounded {acc['fwd_correctly_rounded']:.5f}")
        if acc.get("fwd_us") is not None:
            parts.append(f"forward {acc['fwd_us']:.1f} us")
        gates = r.get("contract_gates") or {}
        if gates:
            ok = all((gates.get(g) or {}).get("passed") for g in ("forward", "gradient"))
            parts.append("gates passed" if ok else "**gates failed**")
        if r.get("errors"):
            parts.append(f"errors in {', '.join(r['errors'])}")
        lines.append(f"- **{key}**: " + ", ".join(parts))
    return "\n".join(lines)


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
