"""The one verdict model: per backend and check a state, the counts behind it (complete; the records are capped at
`max_records`) and the words for both, which every reader (page, figures, compare, index, command line) takes."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from enum import Enum

import pandas as pd

from rlnorm.kit.checks.common import BY_CONSTRUCTION, INVARIANCE_CHECKS, INVARIANT, differing_pairs, uncleared
from rlnorm.kit.process import describe_exit
from rlnorm.kit.results import BackendResult, Configurations, Crash, Gate, Launches, RunResult


class State(Enum):
    PASSED = "passed"
    FAILED = "failed"
    # no row differs, but a launch parameter changes with the row count and was not run at each of its values
    BY_CONSTRUCTION = "by construction"
    RAISED = "raised"  # the check raised: what it found so far is no verdict
    NOT_RUN = "not run"  # not measured here (not selected, no backward, the gate cannot take it)
    SKIPPED = "skipped"  # the backend cannot run here
    NOT_LOADED = "not loaded"  # the backend could not be loaded
    CRASHED = "crashed"  # the backend's process died before this check finished
    TIMED_OUT = "timed out"  # ... or outlived its time limit


# in State's order
_COLORS = ("#a5d6a7", "#ef9a9a", "#f48fb1", "#fff59d", "#e0e0e0", "#eeeeee", "#ffe0b2", "#ce93d8", "#ffcc80")
STATE_COLORS = dict(zip(State, _COLORS, strict=True))
ROW_CHECKS = ("all_rows", "full_vs_sub_batches", "batch_size_sweep")
INVARIANCE = INVARIANCE_CHECKS  # the worker's batch-invariance checks, in its order
LAUNCH = ("launch", "configurations")  # what the launches were, and every configuration run against the others
CHECKS = (*INVARIANCE, *LAUNCH, "forward_gate", "gradient_gate", "correctly_rounded")
COLUMNS = (*CHECKS, "batch_invariant")  # the checks, then the overall verdict
# the worker's check behind each verdict column (what `crash.finished_checks` names)
_RAN_BY = {**{c: c for c in (*INVARIANCE, *LAUNCH)}, "correctly_rounded": "accuracy_latency"}
COMPARES = {
    "all_rows": "row in its batch vs the row alone",
    "full_vs_sub_batches": "row in a sub-batch vs the full batch",
    "batch_size_sweep": "probe row in a batch of m vs alone",
    "launch": "each kernel's launch parameters over the row ladder",
    "configurations": "rows under each configuration a kernel may pick, pair by pair",
    "dweight_repeatable": "dweight of one batch, run vs run",
    "forward_gate": "y across 7 batch arrangements",
    "gradient_gate": "dx, dz across arrangements; own dweight vs the exact sum of single-row dweights",
    "correctly_rounded": "fraction of y equal to fp64 rounded once",
}


def count(n: int | None) -> str:
    """An integer as every report prints it: '3,128'; '?' where unknown."""
    return "?" if n is None else f"{n:,}"


@dataclass(frozen=True)
class Counts:
    """One row check's counts for one backend, straight from its summary."""

    compared: int | None  # row comparisons made
    y: int | None  # fwd_differ
    grad: int | None  # rowgrad_differ (None: forward only)
    any: int | None  # the sweep's differ (None for the other checks)
    not_kept: int  # records_dropped

    @property
    def differs(self) -> bool:
        return any((c or 0) > 0 for c in (self.y, self.grad, self.any))

    def short(self) -> str:
        """'736 y / 3,128 dx,dz'; '12 y, dx or dz' where only the sweep's total is known."""
        if self.y is None and self.any is not None:
            return f"{count(self.any)} y, dx or dz"
        return f"{count(self.y)} y" + ("" if self.grad is None else f" / {count(self.grad)} dx,dz")

    def of(self) -> str:
        return "" if self.compared is None else f"of {count(self.compared)} row comparisons"

    def sentence(self) -> str:
        """'y differs in 736 and dx or dz in 3,128 of 2,621,440 row comparisons'."""
        if self.y is None and self.any is not None:
            text = f"y, dx or dz differs in {count(self.any)}"
        else:
            text = f"y differs in {count(self.y)}"
            text += "" if self.grad is None else f" and dx or dz in {count(self.grad)}"
        return f"{text} {self.of()}".strip()


def counts_of(result: BackendResult, check: str) -> Counts | None:
    """The counts of one row check (None when it left no summary)."""
    node, grad = getattr(result.batch_invariance, check, None), result.has_backward
    if node is None or (check == "all_rows" and not node.sizes):
        return None
    if check != "all_rows":  # a sweep counts comparisons and any difference; full_vs_sub_batches rows
        compared, any_ = (node.comparisons, node.differ) if check == "batch_size_sweep" else (node.rows_compared, None)
        return Counts(compared, node.fwd_differ, node.rowgrad_differ if grad else None, any_, node.records_dropped or 0)
    sizes = list(node.sizes.values())

    def total(field: str) -> int | None:
        values = [getattr(s, field) for s in sizes]
        return None if None in values else sum(values)

    not_kept = sum(s.records_dropped or 0 for s in sizes)
    return Counts(total("rows"), total("fwd_differ"), total("rowgrad_differ") if grad else None, None, not_kept)


@dataclass(frozen=True)
class CheckVerdict:
    check: str
    state: State
    counts: Counts | None = None
    detail: str = ""  # why: the error, the crash and where, the gate lines that failed

    def cell(self) -> str:
        """The verdict figure's cell: a few short lines."""
        of = "" if self.counts is None or self.counts.compared is None else f"\nof {count(self.counts.compared)}"
        if self.counts is not None and self.state in (State.PASSED, State.FAILED):
            return (self.counts.short() if self.state is State.FAILED else "0 differ") + of
        if self.detail and self.state in (State.PASSED, State.FAILED):
            return textwrap.fill(self.detail, 20)
        if self.detail:
            return f"{self.state.value}:\n{clip(self.detail, 22)}"
        return self.state.value

    def words(self) -> str:
        """One line: 'failed (736 y / 3,128 dx,dz of 2,621,440 row comparisons)', 'passed', 'raised (why)'."""
        if self.counts is not None and self.state in (State.PASSED, State.FAILED):
            return f"{self.state.value} ({self.counts.short()} {self.counts.of()})".replace(" )", ")")
        return self.state.value + (f" ({clip(self.detail, 80)})" if self.detail else "")


@dataclass(frozen=True)
class BackendVerdict:
    backend: str
    checks: dict[str, CheckVerdict]  # CHECKS order
    overall: State  # invariant: PASSED; not invariant: FAILED or BY_CONSTRUCTION; else why there is no verdict
    why: str  # the overall verdict's reason, in words

    @property
    def headline(self) -> str:
        """'invariant', 'not invariant', 'not invariant by construction'; else the state ('crashed') or 'no verdict'."""
        if self.overall in (State.RAISED, State.NOT_RUN):
            return "no verdict"
        not_invariant = {State.FAILED: "not invariant", State.BY_CONSTRUCTION: "not invariant by construction"}
        return "invariant" if self.overall is State.PASSED else not_invariant.get(self.overall, self.overall.value)

    def sentence(self) -> str:
        """'not batch invariant (all_rows: y differs in 3 ... ; dweight_repeatable: ...)'."""
        return f"{self.headline} ({self.why})" if self.why else self.headline

    def columns(self) -> dict[str, tuple[State, str]]:
        """Per check, then `batch_invariant` (the overall verdict): the state and its words."""
        return {**{c: (cv.state, cv.words()) for c, cv in self.checks.items()},
                "batch_invariant": (self.overall, self.sentence())}  # fmt: skip


def clip(text: str, width: int) -> str:
    """One line of at most `width` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def crash_words(result: BackendResult, brief: bool = False) -> str:
    """'crashed: killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 65 rows' ('' if it did not: a
    crash is recorded with, and only with, the status crashed or timed_out)."""
    c = result.crash
    if c is None:
        return ""
    where = f" in {c.check}" if c.check else ""
    if where and c.batch_size:
        where += f" at {'' if brief else 'a batch of '}{count(c.batch_size)} rows"
    state = result.status.replace("_", " ")
    return f"{state}{where} ({_short_cause(c)})" if brief else f"{state}: {c.cause}{where}"


def _short_cause(c: Crash) -> str:
    if c.signal:
        return c.signal
    if c.timed_out:
        return c.cause.replace("timed out ", "")
    return f"exit code {c.exit_code}" if c.exit_code is not None else c.cause.split(":")[0]


def gate_verdict(check: str, gate: Gate | None) -> CheckVerdict:
    if gate is None:
        return CheckVerdict(check, State.NOT_RUN)
    if gate.timed_out:
        return CheckVerdict(check, State.TIMED_OUT, detail="gate child timed out")
    if gate.returncode == 3:  # the child says the backend cannot take this gate (no backward, unavailable)
        said = "no backward" if gate.stderr_tail and "no backward" in gate.stderr_tail[-1] else "cannot take it"
        return CheckVerdict(check, State.NOT_RUN, detail=said)
    if gate.returncode not in (0, None):
        return CheckVerdict(check, State.CRASHED, detail=f"gate child {describe_exit(gate.returncode)[0]}")
    if gate.failed_lines:
        total = f" of {len(gate.lines)}" if gate.lines else ""
        return CheckVerdict(check, State.FAILED, detail=f"{len(gate.failed_lines)}{total} lines failed")
    if gate.passed:
        return CheckVerdict(check, State.PASSED)
    return CheckVerdict(check, State.RAISED, detail="no lines printed")


def _check_verdict(result: BackendResult, check: str) -> CheckVerdict:
    """A check that raised says so first; the accuracy check's own error before the worker's."""
    acc, inv = result.accuracy_latency, result.batch_invariance
    node = {"launch": result.launches, "configurations": result.configurations}.get(check, getattr(inv, check, None))
    error = (result.errors or {}).get(_RAN_BY.get(check, "contract_gates")) or getattr(node, "error", None)
    if check == "correctly_rounded":  # without its summary, the accuracy check did not run
        error = None if acc is None else acc.error or error
    counts = counts_of(result, check) if check in ROW_CHECKS else None
    if error:
        return CheckVerdict(check, State.RAISED, counts, error)
    if check in ("forward_gate", "gradient_gate"):
        return gate_verdict(check, (result.contract_gates or {}).get(check.split("_")[0]))
    if check in LAUNCH:
        return _launch_verdict(result, check, node)
    if check == "correctly_rounded":
        if acc is None or acc.fwd_correctly_rounded is None:
            return CheckVerdict(check, State.NOT_RUN)
        cr = acc.fwd_correctly_rounded
        return CheckVerdict(check, State.PASSED if cr >= 1.0 else State.FAILED, detail=fraction(cr) +
                            (" (every output)" if cr >= 1.0 else ""))  # fmt: skip
    if check == "dweight_repeatable":
        if node is None:
            return CheckVerdict(check, State.NOT_RUN, detail="" if result.has_backward else "no backward")
        return CheckVerdict(check, State.PASSED if node else State.FAILED, detail="" if node else "differs run to run")
    if counts is None:
        return CheckVerdict(check, State.NOT_RUN)
    return CheckVerdict(check, State.FAILED if counts.differs else State.PASSED, counts)


def _launch_verdict(result: BackendResult, check: str, node: Launches | Configurations | None) -> CheckVerdict:
    if node is None:
        return CheckVerdict(check, State.NOT_RUN)
    if check == "configurations":
        if pairs := differing_pairs(result):
            keys = ", ".join(sorted({p.split(": ", 1)[0] for p in pairs}))
            first = pairs[0].split(": ", 1)[1]
            said = f"{len(pairs)} of {len(node.pairs)} configuration pairs differ, in {keys}; e.g. {first}"
            return CheckVerdict(check, State.FAILED, detail=said)
        return CheckVerdict(check, State.PASSED, detail=f"{len(node.pairs)} pairs, none differs")
    if left := uncleared(result):  # the parameters, then where: launch_lines
        params = dict.fromkeys(k.rsplit(".", 1)[-1] for k in left)
        return CheckVerdict(check, State.BY_CONSTRUCTION, detail=", ".join(params))
    varying = [f"{k.kernel.rsplit('.', 1)[-1]}.{p}" for k in node.kernels for p in k.varying]
    said = f"varying, each value cleared: {', '.join(varying)}" if varying else "one configuration per kernel"
    seen = f"{len(node.kernels)} kernels seen" + (" here; see launches.unseen" if node.unseen else "")
    return CheckVerdict(check, State.PASSED, detail=f"{said} ({seen}, {len(node.rows)} row counts)")


def launch_lines(result: BackendResult) -> list[str]:
    """Each kernel whose launch changes with the row count, and each parameter not run at each value here."""
    cleared = set(result.configurations.cleared) if result.configurations else set()
    out = []
    for k in (k for k in (result.launches.kernels if result.launches else []) if k.varying):
        done = [p for p in k.varying if f"{k.kernel}.{p}" in cleared]
        tail = f" (cleared by the configurations check: {', '.join(done)})" if done else ""
        out.append(f"{k.kernel} ({'+'.join(k.passes)}): {k.evidence}{tail}")
    unexercised = result.configurations.unexercised.items() if result.configurations else ()
    return out + [f"{key}: not run at each value here: {why}" for key, why in unexercised if key not in cleared]


def fraction(f: float) -> str:
    """A fraction of outputs with six decimals (1e-5 differences show); exactly 1: '1.0'."""
    return "1.0" if f >= 1.0 else f"{f:.6f}"


def backend_verdict(key: str, result: BackendResult) -> BackendVerdict:
    """A backend whose process died keeps the checks it finished; the rest take its state, never "not run"."""
    if result.status in ("skipped", "failed"):
        state = State.SKIPPED if result.status == "skipped" else State.NOT_LOADED
        why = result.skip_reason or "no reason recorded"
        return BackendVerdict(key, {c: CheckVerdict(c, state, detail=why) for c in CHECKS}, state, why)
    crash = result.crash  # recorded where the status is crashed or timed_out
    ended = None if crash is None else State(result.status.replace("_", " "))
    checks = {}
    for c in CHECKS:
        ran_by = _RAN_BY.get(c)
        if ended is not None and ran_by not in crash.finished_checks:  # the gates never run for a backend that died
            here = ran_by is not None and crash.check == ran_by
            where = _short_cause(crash) + (f" at {count(crash.batch_size)} rows" if here and crash.batch_size else "")
            checks[c] = CheckVerdict(c, ended, detail=where if here else f"not reached ({ended.value} earlier)")
        else:
            checks[c] = _check_verdict(result, c)
    return BackendVerdict(key, checks, *_overall(result, checks, ended))


def _overall(result: BackendResult, checks: dict[str, CheckVerdict], ended: State | None) -> tuple[State, str]:
    if found := [c for c in (*INVARIANCE, "configurations") if checks[c].state is State.FAILED]:
        other = {"dweight_repeatable": "the same batch gives another dweight when run again",
                 "configurations": checks["configurations"].detail}  # fmt: skip
        return State.FAILED, "; ".join(f"{c}: {checks[c].counts.sentence() if checks[c].counts else other[c]}"
                                       for c in found)  # fmt: skip
    if ended is not None:
        return ended, crash_words(result).partition(": ")[2]
    inv = result.batch_invariance
    if inv is not None and inv.verdict == BY_CONSTRUCTION:
        why = "no row differs, but a launch parameter that may change with the row count was not run at each value: "
        return State.BY_CONSTRUCTION, why + "; ".join(launch_lines(result))
    # an artifact without the three-state verdict (the reference report) keeps its bool: rows only
    if inv is not None and (inv.verdict == INVARIANT or (inv.verdict is None and inv.batch_invariant)):
        compared = sum((checks[c].counts.compared or 0) for c in ROW_CHECKS if checks[c].counts is not None)
        dweight = {State.PASSED: "dweight repeatable", State.NOT_RUN: "no dweight: forward only"}.get(
            checks["dweight_repeatable"].state, "dweight not checked")  # fmt: skip
        launches = "no launch evidence in this artifact" if inv.verdict is None else checks["launch"].detail
        return State.PASSED, f"0 of {count(compared)} row comparisons differ; {dweight}; {launches}"
    if raised := [c for c in (*INVARIANCE, *LAUNCH) if checks[c].state is State.RAISED]:
        return State.RAISED, "; ".join(f"{c} raised {clip(checks[c].detail, 120)}" for c in raised)
    return State.NOT_RUN, "checks missing"


def run_verdicts(run: RunResult) -> dict[str, BackendVerdict]:
    return {key: backend_verdict(key, r) for key, r in run.results.items()}


def verdict_frame(run: RunResult) -> pd.DataFrame:
    """A backend per line, a check per column (and the overall verdict last), each cell the verdict's words."""
    rows = {k: {c: words for c, (_, words) in v.columns().items()} for k, v in run_verdicts(run).items()}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(COLUMNS)).rename_axis("backend")


def summary_lines(run: RunResult) -> list[str]:
    """The command line's summary: a line per backend, then a line per step that failed after the backends."""
    verdicts = run_verdicts(run)
    width = max((len(k) for k in verdicts), default=0)
    return [f"  {k:<{width}} {v.sentence()}" for k, v in verdicts.items()] + [
        f"  step {f.step} failed: {clip(f.error, 160)}" for f in run.failed_steps or []]  # fmt: skip


def records_line(kept: int, not_kept: int | None) -> str:
    """'2,000 of 3,888 records kept (1,888 not kept: max_records)' / 'all 15 records kept'."""
    if not_kept is None:
        return f"{count(kept)} records kept"
    if not_kept == 0:
        return f"all {count(kept)} records kept" if kept else "0 records kept"
    return f"{count(kept)} of {count(kept + not_kept)} records kept ({count(not_kept)} not kept: max_records)"


_TENSOR_ORDER = ["y", "dx", "dz", "dweight"]
_COUNT_COLUMNS = ["row comparisons", "y differs", "dx or dz differs", "y, dx or dz differs"]
_COUNTED = [*_COUNT_COLUMNS, "records kept", "records not kept (max_records)", "max_ulp"]


def differing_table(run: RunResult, records: pd.DataFrame | None) -> pd.DataFrame:
    """One line per (backend, check) that differs or has records, counted from the run (the records are capped)."""
    verdicts = run_verdicts(run)
    pairs = [(key, c) for key, v in verdicts.items() for c in INVARIANCE if v.checks[c].state is State.FAILED]
    if records is None or not len(records):
        records = pd.DataFrame(columns=["backend", "check", "tensor"])
    recorded = records[["backend", "check"]].astype(str)
    pairs += [p for p in recorded.drop_duplicates().itertuples(index=False, name=None) if p not in pairs]
    rows = []
    for key, check in pairs:
        sel = records[(recorded["backend"] == key) & (recorded["check"] == check)]
        c = verdicts[key].checks[check].counts if key in verdicts else None
        tensors = sel["tensor"].astype(str).value_counts().to_dict()
        ranked = sorted(tensors, key=lambda t: _TENSOR_ORDER.index(t) if t in _TENSOR_ORDER else len(_TENSOR_ORDER))
        ulps = pd.to_numeric(sel["max_ulp"], errors="coerce").dropna() if "max_ulp" in sel else pd.Series([])
        counts = [None] * 4 if c is None else [c.compared, c.y, c.grad, c.any]
        rows.append({"backend": key, "check": check, "compares": COMPARES.get(check, ""),
                     **dict(zip(_COUNT_COLUMNS, counts, strict=True)), "records kept": len(sel),
                     "records not kept (max_records)": c.not_kept if c else (0 if key in verdicts else None),
                     "records kept per tensor": ", ".join(f"{t} {tensors[t]:,}" for t in ranked),
                     "max_ulp": None if ulps.empty else int(ulps.max())})  # fmt: skip
    columns = ["backend", "check", "compares", *_COUNTED[:-1], "records kept per tensor", "max_ulp"]
    return pd.DataFrame(rows, columns=columns).astype(dict.fromkeys(_COUNTED, "Int64"))
