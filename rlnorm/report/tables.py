"""The reuse-check page from a `RunResult`: its words (the first lines name the GPU, the code and the run, since a
page is often read as a lone attachment) and its tables, which the notebook shows as they are. Counts and verdict
words come from `rlnorm.report.verdict`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.kit.params import RunParams
from rlnorm.kit.results import Accuracy, RunResult
from rlnorm.report.plots.common import cpu_note, fmt_ratio, fmt_us
from rlnorm.report.runs import param, records_of
from rlnorm.report.verdict import (
    COMPARES,
    INVARIANCE,
    State,
    clip,
    crash_words,
    differing_table,
    fraction,
    launch_lines,
    run_verdicts,
)

GATE_EXPLANATION = (
    "**Reading the gradient gate.** It compares the backend's *own* dweight (the weight's gradient) with the "
    "exact sum of the single-row dweights, rounded once. A library that sums dweight in fp32 in whatever order "
    "its reduction takes fails it, and its dweight changes when the rows of a batch are permuted or padded: "
    "a trainer then gets a weight gradient that depends on how tokens were packed. rlnorm adds the rows' "
    "contributions exactly (integer counters), so its dweight is the same for every packing."
)


def header(run: RunResult) -> str:
    """One line: the run, its device, its code and when it was made (the artifact's own timestamp)."""
    env = run.environment
    gpu = env.get("gpu") or f"{env.get('device', 'cpu')} (no GPU)"
    commit = (run.commit or "no commit")[:9] + (" (uncommitted changes)" if run.tracked_tree_dirty else "")
    libs = run.libraries
    versions = ", ".join(f"{k} {libs[k]}" for k in ("torch", "triton") if libs.get(k))
    name = param(run, "name") or run.param_set or "unnamed"
    return (f"**Run `{name}`** on **{gpu}** · code `{commit}` · {versions} · created {run.created_at or 'not yet'} · "
            f"{len(run.results)} backends")  # fmt: skip


def device_notice(run: RunResult) -> str:
    """What a reader must know about numbers from this device (empty on a GPU)."""
    if cpu_note(run) is None:
        return ""
    return (
        "> **CPU run.** Triton kernels (rlnorm's, FLA's) run in Triton's interpreter here: the bitwise checks hold as "
        "on a GPU, but the interpreter rounds fp32 -> bf16 casts toward zero (so a Triton kernel's correctly-rounded "
        "fraction is not its GPU value), and the latencies only say that the code ran. Backends that need a GPU are "
        "skipped with the reason. Run `params/full.yaml` on a GPU for the numbers an RFC needs."
    )


def verdict_markdown(run: RunResult) -> str:
    """A line per backend, then the steps that failed after the backends."""
    lines = []
    for key, v in run_verdicts(run).items():
        r = run.results[key]
        if v.overall in (State.SKIPPED, State.NOT_LOADED):
            lines.append(f"- **{key}**: {r.status}: {v.why}")
            continue
        parts = []
        if r.crash is not None:
            state, _, rest = crash_words(r).partition(": ")
            done = ", ".join(r.crash.finished_checks) or "no check"
            parts.append(f"**{state}** ({rest}); finished before it: {done}")
            passed = [c for c in INVARIANCE if v.checks[c].state is State.PASSED]
            if v.overall is not State.FAILED:
                clean = f": {', '.join(passed)} passed before it" if passed else ""
                parts.append(f"no batch-invariance verdict (it {v.overall.value} before its checks ended{clean})")
        if v.overall in (State.FAILED, State.BY_CONSTRUCTION, State.PASSED):
            bold = "" if v.overall is State.PASSED else "**"
            parts.append(f"{bold}{v.headline}{bold} ({v.why})")
        elif r.crash is None:
            parts.append(f"no batch-invariance verdict ({v.why})")
        for gate in ("forward_gate", "gradient_gate") if r.crash is None else ():  # a crash: its gates never ran
            g = v.checks[gate]
            if g.state is not State.NOT_RUN and (g.state is not State.PASSED or gate == "gradient_gate"):
                said = f"**{g.words()}**" if g.state is not State.PASSED else f"passed ({COMPARES[gate]})"
                parts.append(f"{gate.replace('_', ' ')} {said}")
        cr, acc = v.checks["correctly_rounded"], r.accuracy_latency
        if cr.state in (State.PASSED, State.FAILED):
            parts.append(f"correctly rounded {cr.detail}")
        if acc is not None and acc.fwd_us:
            ratio = acc.fwd_roofline_ratio
            star = "*" if acc.ran_host_bound("fwd_us") else ""
            beside = f" = {ratio:.2f}x the torch.add timed beside it" if ratio is not None else ""
            parts.append(f"forward {fmt_us(acc.fwd_us)}{star}{beside}")
        if r.errors and v.overall is not State.RAISED:
            parts.append("errors in " + ", ".join(r.errors))
        lines.append(f"- **{key}**: " + "; ".join(parts))
    failed = []  # the steps after the backends that raised, each with its traceback's tail
    for f in run.failed_steps or []:
        tail = "\n".join(f"  {line}" for line in f.traceback[-8:])
        failed.append(f"- **step `{f.step}` failed**: {f.error} (the results above stand)" +
                      (f"\n\n  ```\n{tail}\n  ```" if tail else ""))  # fmt: skip
    return "\n".join(lines) + ("\n\n" + "\n".join(failed) if failed else "")


LAUNCH_EXPLANATION = (
    "**Launches.** The row checks see only the configurations this process's launches took. The `launch` check "
    "runs each backend's forward (and forward+backward) at every row count of a ladder (1..9, 2^k-1, 2^k, 2^k+1 "
    "and every size the other checks use, up to the full batch) and records each kernel's launch parameters "
    "(constexprs, num_warps, num_stages, the grid past its row extent; a CUDA kernel's block and shared memory). "
    "A parameter that changes with the row count leaves the verdict at *not invariant by construction* until "
    "the `configurations` check has run the kernel at each of its values with no bit changed. **The reference "
    "report's FLA result** follows from this: FLA's `fused_norm_gate` is autotuned on a key holding "
    "`NB = cdiv(rows, 65536)`, so a full batch past 65536 rows and its sub-batches can run different "
    "configurations (on an H100: `BT=16, NB=1, num_warps=16` up to 65536 rows, `BT=32, NB=4, num_warps=8` at "
    "262144), and whether they do depends on what the autotuner timed fastest on that GPU in that process. A "
    "B200 (95 forward, 152 gradient rows) and an H100 (736 y, 3,128 dx/dz) picked differently for the two; an H200 "
    "picked alike, and its rows agreed: a pass of the row checks there, not of the kernel."
)


def launch_markdown(run: RunResult) -> str:
    """Per backend, each kernel whose launch changes with the row count and the evidence ('' when none does)."""
    out = []
    for key, v in run_verdicts(run).items():
        if lines := launch_lines(run.results[key]):
            out.append(f"- **{key}**: " + "; ".join("`{}` {}".format(*line.split(" ", 1)) for line in lines))
        elif v.checks["launch"].state is State.PASSED:  # one configuration per kernel
            out.append(f"- **{key}**: {v.checks['launch'].detail}")
    unseen = {r.launches.unseen for r in run.results.values() if r.launches is not None and r.launches.unseen}
    return "\n".join(out + [f"\n*Not seen here:* {u}" for u in sorted(unseen)])


def shown(obj: Any) -> Any:
    """What a cell displays: text (what a table says when it has no rows) as Markdown, a table as it is."""
    from IPython.display import Markdown  # the notebooks' dependency, not the package's

    return Markdown(obj) if isinstance(obj, str) else obj


def plot_sections(figures: dict[str, Path]) -> list[tuple[str, Path]]:
    """(heading, PNG) for each figure of the evidence; the verdict figure is shown at the top instead."""
    return [(name.replace("_", " "), png) for name, png in figures.items() if name != "verdict"]


def placeholder(what: str) -> str:
    return f"*The {what} appears here when the run has finished; if it is missing, a cell below failed.*"


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
    """Accuracy against fp64, and latency against the torch.add timed beside each backend in the same run."""
    rows = []
    for key, r in run.results.items():
        acc = r.accuracy_latency
        if acc is None:
            continue
        g, cr = acc.grad_rel_err or {}, acc.fwd_correctly_rounded
        ratios = {"fwd / its add": acc.fwd_roofline_ratio, "fwd+bwd / its add (8/3)": acc.fwd_bwd_roofline_ratio}
        rows.append({"backend": key, "rows": acc.rows, "correctly rounded": "" if cr is None else fraction(cr),
                     "max abs err": "" if acc.fwd_max_abs_err is None else f"{acc.fwd_max_abs_err:.6f}",
                     "grad rel err x / z / w": " / ".join("-" if g.get(t) is None else f"{g[t]:.5f}" for t in "xzw"),
                     "fwd us (p20-p80)": _span(acc, "fwd_us"), "fwd+bwd us (p20-p80)": _span(acc, "fwd_bwd_us"),
                     **{name: "" if r is None else fmt_ratio(r) for name, r in ratios.items()}})  # fmt: skip
    return pd.DataFrame(rows).set_index("backend") if rows else pd.DataFrame()


def gates_table(run: RunResult) -> pd.DataFrame:
    """The contract gates per backend: each gate's verdict, and the gradient gate's dweight lines."""
    rows = []
    for key, v in run_verdicts(run).items():
        gates = run.results[key].contract_gates
        if not gates:
            continue
        lines = gates["gradient"].singleton_aggregate if "gradient" in gates else []
        dweight = "; ".join(ln.split("tensor=dweight ")[-1] for ln in lines)
        said = {f"{name} gate": v.checks[f"{name}_gate"].words() for name in ("forward", "gradient")}
        rows.append({"backend": key, **said, "dweight vs exact singleton aggregate": dweight})
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
    rows = [{"parameter": k, "this run": _text(v), "full protocol": "" if v == full.get(k, v) else _text(full[k])}
            for k, v in (run.params or {}).items() if k not in ("output_dir", "staging_dir")]  # fmt: skip
    return pd.DataFrame(rows).set_index("parameter") if rows else pd.DataFrame()


def environment_table(run: RunResult) -> pd.DataFrame:
    """Where the numbers come from: device, versions, commit; the libraries on one line each."""
    env = {k: v for k, v in run.environment.items() if k != "libraries"}
    env["commit"] = (run.commit or "not a git checkout") + (" (uncommitted changes)" if run.tracked_tree_dirty else "")
    libs = run.libraries
    rows = [{"what": k, "value": _text(v)} for k, v in env.items()]
    rows += [{"what": name, "value": version} for name, version in libs.items() if version]
    if missing := [name for name, version in libs.items() if not version]:
        rows.append({"what": "not installed", "value": ", ".join(missing)})
    return pd.DataFrame(rows).set_index("what")


def time_table(timings: dict[str, float]) -> pd.DataFrame:
    """The ten slowest steps (backend: check, gates, ...), so a reader knows what a rerun will cost."""
    steps = sorted(((k, v) for k, v in timings.items() if k not in ("total", "checks")), key=lambda kv: -kv[1])
    return pd.DataFrame([{"step": k, "seconds": round(v, 1)} for k, v in steps[:10]]).set_index("step")


def stack_pairs_table(run: RunResult) -> pd.DataFrame | str:
    """The trainer/sampler pairs RL stacks deploy and how their outputs differ (the full reason where one did not)."""
    table = run.stack_pairs
    if table is None:
        return ""
    n = table.rows * table.d
    out = []
    for p in table.pairs:
        ran = p.status == "ran"
        out.append({"pair": p.name, "stack": p.stack or "", "model": p.model or "",
                    "trainer": p.trainer_source or p.trainer or "", "sampler": p.sampler_source or p.sampler or "",
                    "bitwise equal": p.bitwise_equal if ran else "",
                    "elements differ": f"{p.elements_differ} / {n}" if ran else "", "max ulp": p.max_ulp if ran else "",
                    "status": p.status if ran else f"{p.status}: {p.reason}",
                    "trainer chosen at": p.trainer_where or "",
                    "sampler chosen at": p.sampler_where or ""})  # fmt: skip
    return pd.DataFrame(out).set_index("pair") if out else "no pairs"
