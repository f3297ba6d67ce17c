"""Each backend's verdict per check as one state and a short text: the headline figure's cells and the verdict lines.

States: passed, failed, not run, crashed, timed out, error. A backend whose own process died (status `crashed`
or `timed_out`) keeps the checks it finished as what they are; the check it died in, and those after it, take
its state (never "not run", never "passed"), and its overall verdict is failed when a finished check already
found a difference, else the crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlnorm.kit.artifact import ENDED_EARLY
from rlnorm.kit.isolation import describe_exit
from rlnorm.report.counts import ROW_CHECKS, check_counts, count

PASSED, FAILED, NOT_RUN, CRASHED, TIMED_OUT, ERROR = "passed", "failed", "not run", "crashed", "timed out", "error"
STATES = (PASSED, FAILED, NOT_RUN, CRASHED, TIMED_OUT, ERROR)
COLUMNS = (
    "all_rows",
    "full_vs_sub_batches",
    "batch_size_sweep",
    "dweight_repeatable",
    "forward gate",
    "gradient gate",
    "correctly rounded",
    "batch_invariant",
)
# the worker's check behind each column (what `crash.finished_checks` names)
_CHECK_OF = {
    "all_rows": "all_rows",
    "full_vs_sub_batches": "full_vs_sub_batches",
    "batch_size_sweep": "batch_size_sweep",
    "dweight_repeatable": "dweight_repeatable",
    "correctly rounded": "accuracy_latency",
}
GRADIENT_GATE_COMPARES = (
    "dx, dz across batch arrangements; its own dweight against the exact sum of single-row dweights"
)


@dataclass(frozen=True)
class Cell:
    state: str
    text: str


def ended_state(entry: Mapping[str, Any]) -> str | None:
    """CRASHED / TIMED_OUT for a backend whose process died, else None."""
    status = entry.get("status")
    if status not in ENDED_EARLY:
        return None
    return TIMED_OUT if status == "timed_out" else CRASHED


def crash_of(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    crash = entry.get("crash")
    return crash if isinstance(crash, Mapping) else {}


def crash_where(entry: Mapping[str, Any]) -> str:
    """'full_vs_sub_batches at a batch of 65 rows' (or '' when the trail did not say)."""
    crash = crash_of(entry)
    check = crash.get("check")
    if not check:
        return ""
    size = crash.get("batch_size")
    return str(check) + (f" at a batch of {count(size)} rows" if isinstance(size, int) else "")


def crash_cause(entry: Mapping[str, Any]) -> str:
    """'killed by SIGSEGV (signal 11)', 'timed out after 600 s', 'exited with code 3'."""
    crash = crash_of(entry)
    return str(crash.get("cause") or entry.get("skip_reason") or "no cause recorded")


def crash_note(entry: Mapping[str, Any]) -> str | None:
    """'crashed: killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 65 rows' (None if it did not)."""
    state = ended_state(entry)
    if state is None:
        return None
    where = crash_where(entry)
    return f"{state}: {crash_cause(entry)}" + (f" in {where}" if where else "")


def crash_brief(entry: Mapping[str, Any]) -> str | None:
    """A line-sized crash: 'crashed in full_vs_sub_batches at 64 rows (SIGSEGV)' (None if it did not)."""
    state = ended_state(entry)
    if state is None:
        return None
    crash = crash_of(entry)
    size = crash.get("batch_size")
    where = f" in {crash['check']}" if crash.get("check") else ""
    where += f" at {count(size)} rows" if where and isinstance(size, int) else ""
    return f"{state}{where} ({short_cause(entry)})"


def short_cause(entry: Mapping[str, Any]) -> str:
    """A cell-sized cause: 'SIGSEGV', 'exit code 3', 'after 600 s', 'device error'."""
    crash = crash_of(entry)
    if crash.get("signal"):
        return str(crash["signal"])
    if crash.get("timed_out"):
        return str(crash_cause(entry)).replace("timed out ", "")
    if isinstance(crash.get("exit_code"), int):
        return f"exit code {crash['exit_code']}"
    return crash_cause(entry).split(":")[0]


def finished_checks(entry: Mapping[str, Any]) -> list[str]:
    return [str(c) for c in crash_of(entry).get("finished_checks") or []]


def _died_cell(entry: Mapping[str, Any], state: str, check: str | None) -> Cell:
    crash = crash_of(entry)
    if check is not None and crash.get("check") == check:
        size = crash.get("batch_size")
        at = f"\nat {count(size)} rows" if isinstance(size, int) else ""
        return Cell(state, f"{state} here:\n{short_cause(entry)}{at}")
    return Cell(state, f"not reached\n({state} earlier)")


def _row_cell(entry: Mapping[str, Any], check: str) -> Cell:
    c = check_counts(entry, check)
    if c is None:
        return Cell(NOT_RUN, "not run")
    if c.error:
        return Cell(ERROR, "raised:\n" + _clip(c.error.split(":")[0], 24))
    if c.differs:
        return Cell(FAILED, c.short() + ("" if c.compared is None else f"\nof {count(c.compared)}"))
    return Cell(PASSED, "0 differ" + ("" if c.compared is None else f"\nof {count(c.compared)}"))


def _dweight_cell(entry: Mapping[str, Any]) -> Cell:
    errors = entry.get("errors") or {}
    if errors.get("dweight_repeatable"):
        return Cell(ERROR, "raised:\n" + _clip(str(errors["dweight_repeatable"]).split(":")[0], 24))
    value = (entry.get("batch_invariance") or {}).get("dweight_repeatable")
    if value is True:
        return Cell(PASSED, "repeatable")
    if value is False:
        return Cell(FAILED, "differs\nrun to run")
    return Cell(NOT_RUN, "no backward" if entry.get("backward") == "none" else "not run")


def gate_cell(gate: Any) -> Cell:
    """One contract gate (forward or gradient) of a backend that ran."""
    if not isinstance(gate, Mapping):
        return Cell(NOT_RUN, "not run")
    lines = gate.get("lines") or []
    failed = gate.get("failed_lines") or []
    code = gate.get("returncode")
    if gate.get("timed_out"):
        return Cell(TIMED_OUT, "gate child\ntimed out")
    if code == 3:  # the child says the backend cannot take this gate (no backward, unavailable)
        tail = gate.get("stderr_tail") or []
        why = str(tail[-1]) if tail else "cannot take it"
        return Cell(NOT_RUN, "no backward" if "no backward" in why else "cannot take it")
    if code not in (0, None):
        return Cell(CRASHED, "gate child\n" + describe_exit(code)[0].replace(" (signal", "\n(signal"))
    if failed:
        total = f" of {len(lines)}" if lines else ""
        return Cell(FAILED, f"{len(failed)}{total}\nlines failed")
    if gate.get("passed"):
        return Cell(PASSED, f"all {len(lines)}\nlines pass" if lines else "passed")
    return Cell(ERROR, "no lines\nprinted")


def _rounded_cell(entry: Mapping[str, Any]) -> Cell:
    acc = entry.get("accuracy_latency")
    if not isinstance(acc, Mapping) or not acc:
        return Cell(NOT_RUN, "not run")
    if acc.get("error") or (entry.get("errors") or {}).get("accuracy_latency"):
        return Cell(ERROR, "raised")
    cr = acc.get("fwd_correctly_rounded")
    if not isinstance(cr, (int, float)) or isinstance(cr, bool):
        return Cell(NOT_RUN, "not measured")
    if cr >= 1.0:
        return Cell(PASSED, "1.0\n(every output)")
    return Cell(FAILED, fraction(cr))


def fraction(f: float) -> str:
    """A fraction of outputs: '0.999986', '0.653728' (six decimals: 1e-5 differences show); exactly 1: '1.0'."""
    return "1.0" if f >= 1.0 else f"{f:.6f}"


def _overall_cell(entry: Mapping[str, Any], cells: Mapping[str, Cell]) -> Cell:
    checks = ("all_rows", "full_vs_sub_batches", "batch_size_sweep", "dweight_repeatable")
    found = [c for c in checks if cells[c].state == FAILED]
    if found:
        return Cell(FAILED, "no:\n" + ", ".join(_abbrev(c) for c in found))
    ended = ended_state(entry)
    if ended is not None:
        return Cell(ended, "no verdict\n(" + ended + ")")
    value = (entry.get("batch_invariance") or {}).get("batch_invariant")
    if value is True:
        return Cell(PASSED, "yes")
    if any(cells[c].state == ERROR for c in checks):
        return Cell(ERROR, "no verdict\n(a check raised)")
    return Cell(NOT_RUN, "no verdict\n(checks missing)")


def _abbrev(check: str) -> str:
    return {"all_rows": "all_rows", "full_vs_sub_batches": "sub-batches", "batch_size_sweep": "sweep"}.get(
        check, "dweight"
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def backend_cells(entry: Mapping[str, Any]) -> dict[str, Cell]:
    """column -> Cell for one `results.<backend>` entry, in COLUMNS order."""
    status = entry.get("status") or "ran"
    if status == "skipped":
        return {c: Cell(NOT_RUN, "skipped") for c in COLUMNS}
    if status == "failed":
        return {c: Cell(ERROR, "not loaded") for c in COLUMNS}
    ended = ended_state(entry)
    done = set(finished_checks(entry))
    cells: dict[str, Cell] = {}
    for col in COLUMNS[:-1]:
        check = _CHECK_OF.get(col)
        if ended is not None and (check is None or check not in done):
            cells[col] = _died_cell(entry, ended, check)  # the gates never run for a backend that died
        elif col in ROW_CHECKS:
            cells[col] = _row_cell(entry, col)
        elif col == "dweight_repeatable":
            cells[col] = _dweight_cell(entry)
        elif col == "correctly rounded":
            cells[col] = _rounded_cell(entry)
        else:
            gates = entry.get("contract_gates") or {}
            if (entry.get("errors") or {}).get("contract_gates"):
                cells[col] = Cell(ERROR, "gates raised")
            else:
                cells[col] = gate_cell(gates.get(col.split()[0]))
    cells["batch_invariant"] = _overall_cell(entry, cells)
    return cells


def gradient_gate_clause(gate: Any) -> str:
    """The gradient gate in one clause that says what it compares (and, failed, which comparisons failed)."""
    cell = gate_cell(gate)
    if cell.state == PASSED:
        return f"gradient gate passed ({GRADIENT_GATE_COMPARES})"
    if cell.state != FAILED:
        return f"gradient gate **{cell.state}** ({cell.text.replace(chr(10), ' ')})"
    failed = [str(ln) for ln in (gate or {}).get("failed_lines") or []]
    single = sum(ln.startswith("singleton_aggregate") for ln in failed)
    order = sum(ln.startswith("dweight") for ln in failed)
    rows = len(failed) - single - order
    parts = []
    if single:
        parts.append(f"its own fp32 dweight is not the exact sum of single-row dweights ({single} lines)")
    if order:
        parts.append(f"it moves with row order or padding ({order} lines)")
    if rows:
        parts.append(f"dx or dz differs between batch arrangements ({rows} lines)")
    return "gradient gate **failed**: " + ", and ".join(parts)
