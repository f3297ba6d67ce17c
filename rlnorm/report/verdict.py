"""The one verdict model: per backend and check a state, the counts behind it, and the words for both.

A **row comparison** is one row of a seeded case computed two ways and compared bitwise (`all_rows`: in its batch
of n vs alone; `full_vs_sub_batches`: in a sub-batch vs in the full batch; `batch_size_sweep`: a probe row in a
batch of m vs alone). The artifact's counts are row comparisons summed over sizes and seeds, always complete:
`fwd_differ` (y), `rowgrad_differ` (dx or dz), the sweep's `differ` (any). A **record** is one differing (row
comparison, tensor), capped at `max_records` per backend and check; `records_dropped` counts those left out.
Every reader (page, figures, compare, index, the command line) takes its states, counts and words from here.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from enum import Enum

import pandas as pd

from rlnorm.kit.checks.common import BY_CONSTRUCTION, INVARIANT, differing_pairs, uncleared
from rlnorm.kit.process import describe_exit
from rlnorm.kit.results import BackendResult, Gate, RunResult


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


STATE_COLORS = {
    State.PASSED: "#a5d6a7",
    State.FAILED: "#ef9a9a",
    State.BY_CONSTRUCTION: "#f48fb1",
    State.RAISED: "#fff59d",
    State.NOT_RUN: "#e0e0e0",
    State.SKIPPED: "#eeeeee",
    State.NOT_LOADED: "#ffe0b2",
    State.CRASHED: "#ce93d8",
    State.TIMED_OUT: "#ffcc80",
}
ROW_CHECKS = ("all_rows", "full_vs_sub_batches", "batch_size_sweep")
INVARIANCE = ("all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep")
LAUNCH = ("launch", "configurations")  # what the launches were, and every configuration run against the others
CHECKS = (*INVARIANCE, *LAUNCH, "forward_gate", "gradient_gate", "correctly_rounded")
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
    inv = result.batch_invariance
    grad = result.has_backward
    if inv is None:
        return None
    if check == "all_rows":
        if inv.all_rows is None or not inv.all_rows.sizes:
            return None
        sizes = list(inv.all_rows.sizes.values())

        def total(values: list[int | None]) -> int | None:
            return None if any(v is None for v in values) else sum(v for v in values if v is not None)

        return Counts(
            compared=total([s.rows for s in sizes]),
            y=total([s.fwd_differ for s in sizes]),
            grad=total([s.rowgrad_differ for s in sizes]) if grad else None,
            any=None,
            not_kept=sum(s.records_dropped or 0 for s in sizes),
        )
    if check == "full_vs_sub_batches" and inv.full_vs_sub_batches is not None:
        s = inv.full_vs_sub_batches
        return Counts(s.rows_compared, s.fwd_differ, s.rowgrad_differ if grad else None, None, s.records_dropped or 0)
    if check == "batch_size_sweep" and inv.batch_size_sweep is not None:
        w = inv.batch_size_sweep
        return Counts(w.comparisons, w.fwd_differ, w.rowgrad_differ if grad else None, w.differ, w.records_dropped or 0)
    return None


@dataclass(frozen=True)
class CheckVerdict:
    check: str
    state: State
    counts: Counts | None = None
    detail: str = ""  # why: the error, the crash and where, the gate lines that failed

    def cell(self) -> str:
        """The verdict figure's cell: a few short lines."""
        of = "" if self.counts is None or self.counts.compared is None else f"\nof {count(self.counts.compared)}"
        if self.state is State.FAILED and self.counts is not None:
            return self.counts.short() + of
        if self.state is State.PASSED and self.counts is not None:
            return "0 differ" + of
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
    status: str
    checks: dict[str, CheckVerdict]  # CHECKS order
    overall: State  # invariant: PASSED; not invariant: FAILED or BY_CONSTRUCTION; else why there is no verdict
    why: str  # the overall verdict's reason, in words

    @property
    def headline(self) -> str:
        """'invariant', 'not invariant', 'not invariant by construction', 'skipped', 'crashed', 'no verdict'."""
        return {
            State.PASSED: "invariant",
            State.FAILED: "not invariant",
            State.BY_CONSTRUCTION: "not invariant by construction",
            State.SKIPPED: "skipped",
            State.NOT_LOADED: "not loaded",
            State.CRASHED: "crashed",
            State.TIMED_OUT: "timed out",
        }.get(self.overall, "no verdict")

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
    """'crashed: killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 65 rows' ('' if it did not);
    brief: 'crashed in full_vs_sub_batches at 65 rows (SIGSEGV)'."""
    if result.status not in ("crashed", "timed_out"):
        return ""
    state = result.status.replace("_", " ")
    c = result.crash
    where = "" if c is None or not c.check else f" in {c.check}"
    if brief:
        where += f" at {count(c.batch_size)} rows" if where and c is not None and c.batch_size else ""
        return f"{state}{where} ({_short_cause(result)})"
    where += f" at a batch of {count(c.batch_size)} rows" if where and c is not None and c.batch_size else ""
    cause = c.cause if c is not None else (result.skip_reason or "no cause recorded")
    return f"{state}: {cause}{where}"


def _short_cause(result: BackendResult) -> str:
    c = result.crash
    if c is None:
        return (result.skip_reason or "no cause recorded").split(":")[0]
    if c.signal:
        return c.signal
    if c.timed_out:
        return c.cause.replace("timed out ", "")
    return f"exit code {c.exit_code}" if c.exit_code is not None else c.cause.split(":")[0]


def gate_verdict(check: str, gate: Gate | None, error: str | None) -> CheckVerdict:
    if error:
        return CheckVerdict(check, State.RAISED, detail=error)
    if gate is None:
        return CheckVerdict(check, State.NOT_RUN)
    lines = gate.lines or []
    if gate.timed_out:
        return CheckVerdict(check, State.TIMED_OUT, detail="gate child timed out")
    if gate.returncode == 3:  # the child says the backend cannot take this gate (no backward, unavailable)
        why = gate.stderr_tail[-1] if gate.stderr_tail else "cannot take it"
        return CheckVerdict(check, State.NOT_RUN, detail="no backward" if "no backward" in why else "cannot take it")
    if gate.returncode not in (0, None):
        return CheckVerdict(check, State.CRASHED, detail=f"gate child {describe_exit(gate.returncode)[0]}")
    if gate.failed_lines:
        total = f" of {len(lines)}" if lines else ""
        return CheckVerdict(check, State.FAILED, detail=f"{len(gate.failed_lines)}{total} lines failed")
    if gate.passed:
        return CheckVerdict(check, State.PASSED)
    return CheckVerdict(check, State.RAISED, detail="no lines printed")


def _check_verdict(result: BackendResult, check: str) -> CheckVerdict:
    errors = result.errors or {}
    inv = result.batch_invariance
    if check in ROW_CHECKS:
        c = counts_of(result, check)
        node = None if inv is None else getattr(inv, check)
        error = errors.get(check) or (node.error if node is not None else None)
        if error:
            return CheckVerdict(check, State.RAISED, c, error)
        if c is None:
            return CheckVerdict(check, State.NOT_RUN)
        return CheckVerdict(check, State.FAILED if c.differs else State.PASSED, c)
    if check == "dweight_repeatable":
        if errors.get(check):
            return CheckVerdict(check, State.RAISED, detail=errors[check])
        value = None if inv is None else inv.dweight_repeatable
        if value is None:
            return CheckVerdict(check, State.NOT_RUN, detail="" if result.has_backward else "no backward")
        if value:
            return CheckVerdict(check, State.PASSED)
        return CheckVerdict(check, State.FAILED, detail="differs run to run")
    if check in LAUNCH:
        return _launch_verdict(result, check, errors.get(check))
    if check in ("forward_gate", "gradient_gate"):
        gates = result.contract_gates or {}
        return gate_verdict(check, gates.get(check.split("_")[0]), errors.get("contract_gates"))
    acc = result.accuracy_latency
    if acc is not None and (acc.error or errors.get("accuracy_latency")):
        return CheckVerdict(check, State.RAISED, detail=acc.error or errors["accuracy_latency"])
    if acc is None or acc.fwd_correctly_rounded is None:
        return CheckVerdict(check, State.NOT_RUN)
    cr = acc.fwd_correctly_rounded
    if cr >= 1.0:
        return CheckVerdict(check, State.PASSED, detail="1.0 (every output)")
    return CheckVerdict(check, State.FAILED, detail=fraction(cr))


def _launch_verdict(result: BackendResult, check: str, error: str | None) -> CheckVerdict:
    if check == "launch":
        node = result.launches
        if error or (node is not None and node.error):
            return CheckVerdict(check, State.RAISED, detail=error or node.error or "")
        if node is None:
            return CheckVerdict(check, State.NOT_RUN)
        left = uncleared(result)
        varying = [f"{k.kernel.rsplit('.', 1)[-1]}.{p}" for k in node.kernels for p in k.varying]
        if left:
            params = dict.fromkeys(k.rsplit(".", 1)[-1] for k in left)  # the parameters, then where: launch_lines
            return CheckVerdict(check, State.BY_CONSTRUCTION, detail=", ".join(params))
        said = f"varying, each value cleared: {', '.join(varying)}" if varying else "one configuration per kernel"
        seen = f"{len(node.kernels)} kernels seen" + (" here; see launches.unseen" if node.unseen else "")
        return CheckVerdict(check, State.PASSED, detail=f"{said} ({seen}, {len(node.rows)} row counts)")
    node_c = result.configurations
    if error or (node_c is not None and node_c.error):
        return CheckVerdict(check, State.RAISED, detail=error or (node_c.error if node_c else "") or "")
    if node_c is None:
        return CheckVerdict(check, State.NOT_RUN)
    pairs = differing_pairs(result)
    if pairs:
        keys = sorted({p.split(": ", 1)[0] for p in pairs})
        return CheckVerdict(check, State.FAILED, detail=f"{len(pairs)} of {len(node_c.pairs)} configuration pairs "
                            f"differ, in {', '.join(keys)}; e.g. {pairs[0].split(': ', 1)[1]}")  # fmt: skip
    return CheckVerdict(check, State.PASSED, detail=f"{len(node_c.pairs)} pairs, none differs")


def launch_lines(result: BackendResult) -> list[str]:
    """The launch evidence behind a verdict: each kernel whose launch changes with the row count, and why."""
    node = result.launches
    if node is None:
        return []
    cleared = set(result.configurations.cleared) if result.configurations else set()
    out = []
    for k in node.kernels:
        if k.varying:
            done = [p for p in k.varying if f"{k.kernel}.{p}" in cleared]
            tail = f" (cleared by the configurations check: {', '.join(done)})" if done else ""
            out.append(f"{k.kernel} ({'+'.join(k.passes)}): {k.evidence}{tail}")
    return out


def fraction(f: float) -> str:
    """A fraction of outputs with six decimals (1e-5 differences show); exactly 1: '1.0'."""
    return "1.0" if f >= 1.0 else f"{f:.6f}"


def backend_verdict(key: str, result: BackendResult) -> BackendVerdict:
    """Every check's verdict for one backend, and its overall one. A backend whose process died keeps the checks it
    finished; the one it died in and those after it take its state, never "not run" or "passed"."""
    if result.status in ("skipped", "failed"):
        state = State.SKIPPED if result.status == "skipped" else State.NOT_LOADED
        why = result.skip_reason or "no reason recorded"
        return BackendVerdict(key, result.status, {c: CheckVerdict(c, state, detail=why) for c in CHECKS}, state, why)
    ended = {"crashed": State.CRASHED, "timed_out": State.TIMED_OUT}.get(result.status)
    crash = result.crash
    done = set(crash.finished_checks) if crash is not None else set()
    checks = {}
    for c in CHECKS:
        if ended is not None and _RAN_BY.get(c) not in done:  # the gates never run for a backend that died
            here = crash is not None and crash.check is not None and crash.check == _RAN_BY.get(c)
            where = _short_cause(result) + (f" at {count(crash.batch_size)} rows" if here and crash.batch_size else "")
            checks[c] = CheckVerdict(c, ended, detail=where if here else f"not reached ({ended.value} earlier)")
        else:
            checks[c] = _check_verdict(result, c)
    found = [c for c in (*INVARIANCE, "configurations") if checks[c].state is State.FAILED]
    inv = result.batch_invariance
    if found:
        parts = []
        for c in found:
            counts = checks[c].counts
            said = counts.sentence() if counts is not None else "the same batch gives another dweight when run again"
            parts.append(f"{c}: {said}" if c != "configurations" else f"configurations: {checks[c].detail}")
        return BackendVerdict(key, result.status, checks, State.FAILED, "; ".join(parts))
    if ended is not None:
        return BackendVerdict(key, result.status, checks, ended, crash_words(result).partition(": ")[2])
    if inv is not None and inv.verdict == BY_CONSTRUCTION:
        why = "no row differs, but the launch changes with the row count and was not run at each value: "
        return BackendVerdict(key, result.status, checks, State.BY_CONSTRUCTION, why + "; ".join(launch_lines(result)))
    # an artifact without the three-state verdict (the reference report) keeps its bool: rows only
    if inv is not None and (inv.verdict == INVARIANT or (inv.verdict is None and inv.batch_invariant)):
        compared = sum((checks[c].counts.compared or 0) for c in ROW_CHECKS if checks[c].counts is not None)
        dweight = {State.PASSED: "dweight repeatable", State.NOT_RUN: "no dweight: forward only"}.get(
            checks["dweight_repeatable"].state, "dweight not checked"
        )
        launches = "no launch evidence in this artifact" if inv.verdict is None else checks["launch"].detail
        return BackendVerdict(key, result.status, checks, State.PASSED, f"0 of {count(compared)} row comparisons "
                              f"differ; {dweight}; {launches}")  # fmt: skip
    raised = [c for c in (*INVARIANCE, *LAUNCH) if checks[c].state is State.RAISED]
    if raised:
        why = "; ".join(f"{c} raised {clip(checks[c].detail, 120)}" for c in raised)
        return BackendVerdict(key, result.status, checks, State.RAISED, why)
    return BackendVerdict(key, result.status, checks, State.NOT_RUN, "checks missing")


def run_verdicts(run: RunResult) -> dict[str, BackendVerdict]:
    return {key: backend_verdict(key, r) for key, r in run.results.items()}


def verdict_frame(run: RunResult) -> pd.DataFrame:
    """A backend per line, a check per column (and the overall verdict last), each cell the verdict's words."""
    rows = {k: {c: words for c, (_, words) in v.columns().items()} for k, v in run_verdicts(run).items()}
    return pd.DataFrame.from_dict(rows, orient="index", columns=[*CHECKS, "batch_invariant"]).rename_axis("backend")


def summary_lines(run: RunResult) -> list[str]:
    """The command line's summary: a line per backend, then a line per step that failed after the backends."""
    verdicts = run_verdicts(run)
    width = max((len(k) for k in verdicts), default=0)
    lines = [f"  {k:<{width}} {v.sentence()}" for k, v in verdicts.items()]
    for f in run.failed_steps or []:
        lines.append(f"  step {f.step} failed: {clip(f.error, 160)}")
    return lines


def records_line(kept: int, not_kept: int | None) -> str:
    """'2,000 of 3,888 records kept (1,888 not kept: max_records)' / 'all 15 records kept'."""
    if not_kept is None:
        return f"{count(kept)} records kept"
    if not_kept == 0:
        return f"all {count(kept)} records kept" if kept else "0 records kept"
    return f"{count(kept)} of {count(kept + not_kept)} records kept ({count(not_kept)} not kept: max_records)"


_TENSOR_ORDER = ["y", "dx", "dz", "dweight"]
_COUNT_COLUMNS = ["row comparisons", "y differs", "dx or dz differs", "y, dx or dz differs"]


def differing_table(run: RunResult | None, records: pd.DataFrame | None) -> pd.DataFrame:
    """One line per (backend, check) that differs or has records: the complete counts, the records kept (per
    tensor) and those `max_records` left out, and the largest recorded difference (bf16 ulps). Without the run
    only the records are known, and they cannot give the counts: those columns stay empty rather than undercount."""
    verdicts = {} if run is None else run_verdicts(run)
    pairs = [(key, c) for key, v in verdicts.items() for c in INVARIANCE if v.checks[c].state is State.FAILED]
    if records is None or not len(records):
        records = pd.DataFrame(columns=["backend", "check", "tensor"])
    for pair in records[["backend", "check"]].astype(str).drop_duplicates().itertuples(index=False, name=None):
        pairs += [pair] if pair not in pairs else []
    rows = []
    for key, check in pairs:
        sel = records[(records["backend"].astype(str) == key) & (records["check"].astype(str) == check)]
        c = verdicts[key].checks[check].counts if key in verdicts and check in CHECKS else None
        tensors = sel["tensor"].astype(str).value_counts().to_dict()
        ranked = sorted(tensors, key=lambda t: _TENSOR_ORDER.index(t) if t in _TENSOR_ORDER else len(_TENSOR_ORDER))
        ulps = pd.to_numeric(sel["max_ulp"], errors="coerce").dropna() if "max_ulp" in sel else pd.Series([])
        rows.append({
            "backend": key,
            "check": check,
            "compares": COMPARES.get(check, ""),
            **dict(zip(_COUNT_COLUMNS, [None] * 4 if c is None else [c.compared, c.y, c.grad, c.any], strict=True)),
            "records kept": len(sel),
            "records not kept (max_records)": c.not_kept if c else (0 if key in verdicts else None),
            "records kept per tensor": ", ".join(f"{t} {tensors[t]:,}" for t in ranked),
            "max_ulp": None if ulps.empty else int(ulps.max()),
        })  # fmt: skip
    columns = ["backend", "check", "compares", *_COUNT_COLUMNS, "records kept", "records not kept (max_records)",
               "records kept per tensor", "max_ulp"]  # fmt: skip
    counted = [*_COUNT_COLUMNS, "records kept", "records not kept (max_records)", "max_ulp"]
    return pd.DataFrame(rows, columns=columns).astype(dict.fromkeys(counted, "Int64"))
