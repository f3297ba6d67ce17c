"""Drill into the rows a check found differing: which rows, by how much, and why it matters.

Someone reads "fwd_differ: 95" in an RFC and needs the rows behind it (what each count counts, and how a record
relates to it, is `rlnorm.report.verdict`). A run folder holds the
artifact and the per-row records; each record carries what `rlnorm.kit.records.rebuild_case` needs to
rebuild the exact batch that was compared, so one row is re-examined by recomputing that batch and
the row alone, never by rerunning the check. `notebooks/investigate_rows` only calls this module.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from rlnorm.inputs import Case
from rlnorm.kit.records import RebuiltCase, rebuild_case
from rlnorm.kit.results import RunResult
from rlnorm.kit.worker import run_batch
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.report.verdict import COMPARES, ROW_CHECKS, backend_verdict, differing_table, records_line

ROW_TENSORS = ("y", "dx", "dz")


# --------------------------------------------------------------------------------------------
# the differing rows
# --------------------------------------------------------------------------------------------
def failing_summary(records: pd.DataFrame | None, run: RunResult | None = None) -> pd.DataFrame:
    """One line per backend and check that differs: the run's complete counts, the records kept (per tensor) and
    those `max_records` left out, and the largest recorded difference (`rlnorm.report.verdict.differing_table`)."""
    return differing_table(run, records)


def pick_failing(records: pd.DataFrame, backend: str | None = None, check: str | None = None) -> tuple[str, str]:
    """The (backend, check) to show: the given ones, else the first backend/check with a differing row."""
    if records.empty:
        raise ValueError("records: this run recorded no differing rows (every check passed, or none ran)")
    sel = records
    if backend is not None:
        if backend not in set(records["backend"]):
            with_some = _uniq(records, "backend")
            raise ValueError(f"backend: {backend!r} has no differing rows; backends with some: {with_some}")
        sel = sel[sel["backend"] == backend]
    if check is not None:
        if check not in set(sel["check"]):
            raise ValueError(f"check: {check!r} has no differing rows for {backend or 'any backend'}; "
                             f"checks with some: {_uniq(sel, 'check')}")  # fmt: skip
        sel = sel[sel["check"] == check]
    row_level = sel[sel["tensor"].isin(ROW_TENSORS)]  # prefer a record that names a row over a dweight one
    first = (row_level if not row_level.empty else sel).iloc[0]
    return str(first["backend"]), str(first["check"])


def _uniq(df: pd.DataFrame, col: str) -> list[str]:
    return [str(v) for v in dict.fromkeys(df[col])]


def differing_rows(records: pd.DataFrame, backend: str | None = None, check: str | None = None,
                   run: RunResult | None = None) -> pd.DataFrame:  # fmt: skip
    """The kept records of one backend and check (defaults: the first failing ones), row-level first. `attrs`
    name the backend and check chosen, and `counts`: the sentence that says how many row comparisons differ (from
    the run, when given) and how many of the differing pairs were kept as records."""
    b, c = pick_failing(records, backend, check)
    sel = records[(records["backend"] == b) & (records["check"] == c)].copy()
    sel["_dw"] = ~sel["tensor"].isin(ROW_TENSORS)
    sel = sel.sort_values("_dw", kind="stable").drop(columns="_dw").reset_index(drop=True)
    sel.attrs.update(backend=b, check=c, counts=counts_sentence(run, b, c, len(sel)))
    return sel


def rows_or_reason(records: pd.DataFrame | None, run: RunResult, backend: str | None,
                   check: str | None) -> tuple[pd.DataFrame | None, str]:  # fmt: skip
    """The chosen backend's differing rows and the sentence that counts them, or None and why there are none."""
    if records is None:
        return None, "**This artifact has no per-row records** (the reference report, for one, kept only counts)."
    with_rows = sorted(set(records["backend"])) if len(records) else []
    if backend is not None and backend not in with_rows:
        if backend in crashed_backends(run):
            return None, f"**{backend}** recorded no differing row before its process died: see its trail above."
        others = f"backends with some: {', '.join(with_rows)}" if with_rows else "no backend has any"
        return None, f"**{backend}** has no differing rows in this run; {others}."
    if not with_rows:
        return None, "**No differing rows in this run:** no check recorded one, so there is nothing to drill into."
    table = differing_rows(records, backend, check, run)
    return table, f"**{table.attrs['backend']}**: {table.attrs['counts']}"


def pick_row(table: pd.DataFrame, row: int | None, row_index: int = 0) -> int:
    """The line of `table` to explain: the first record of case row `row` when given, else line `row_index`."""
    if row is not None:
        hits = table.index[table["row"] == row].tolist()
        if not hits:
            rows = sorted({int(r) for r in table["row"].dropna()})
            shown = ", ".join(map(str, rows[:20])) + (" ..." if len(rows) > 20 else "")
            raise ValueError(f"row: {row} has no differing record here; rows with one: {shown}")
        return int(hits[0])
    if not 0 <= row_index < len(table):
        raise ValueError(f"row_index: expected 0 <= row_index < {len(table)}, got {row_index}")
    return row_index


def counts_sentence(run: RunResult | None, backend: str, check: str, kept: int) -> str:
    """'full_vs_sub_batches (row in a sub-batch vs the full batch): y differs in 736 and dx or dz in 3,128 of
    2,621,440 row comparisons; 2,000 of 3,888 records kept (1,888 not kept: max_records)'."""
    what = f"{check} ({COMPARES[check]})" if check in COMPARES else check
    result = None if run is None else run.results.get(backend)
    counted = backend_verdict(backend, result).checks[check].counts if result and check in ROW_CHECKS else None
    if counted is None:  # no counts to read: how many were not kept is unknown, and not said
        return f"{what}: {records_line(kept, None)}"
    return f"{what}: {counted.sentence()}; {records_line(kept, counted.not_kept)}"


# --------------------------------------------------------------------------------------------
# rebuilding one case
# --------------------------------------------------------------------------------------------
# rebuilding a case is `rlnorm.kit.records.rebuild_case` (the record's `rebuild` spec): both sides of the
# comparison and the row alone, so a row is re-examined by recomputing that batch, never by rerunning the check


# --------------------------------------------------------------------------------------------
# explaining one row
# --------------------------------------------------------------------------------------------
def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def compute_tensor(backend: Any, case: Case, opts: OpOptions, tensor: str) -> torch.Tensor:
    """One of y, dx, dz for a whole case, from the backend's own forward / forward_backward."""
    if tensor == "y":
        return backend.forward(case.x, case.z, case.w, opts)
    if tensor not in ROW_TENSORS:
        raise ValueError(f"tensor: expected one of {ROW_TENSORS} (a per-row tensor), got {tensor!r}")
    g = backend.forward_backward(case.x, case.z, case.w, case.dy, opts)
    out = getattr(g, tensor)
    if out is None:
        raise ValueError(f"tensor: the backend returned no {tensor} (z is None?)")
    return out


def correctly_rounded(case: Case, opts: OpOptions, tensor: str) -> torch.Tensor:
    """The fp64 result (forward, or fp64 autograd for dx/dz) rounded ONCE to the output dtype."""
    x = case.x.detach().cpu().to(torch.float64).requires_grad_(tensor == "dx")
    z = None if case.z is None else case.z.detach().cpu().to(torch.float64).requires_grad_(tensor == "dz")
    w = case.w.detach().cpu().to(torch.float64)
    with torch.enable_grad():
        y64 = gated_rmsnorm_math(x, z, w, opts, torch.float64)
        if tensor == "y":
            return round_once(y64.detach(), case.x.dtype)
        leaf = x if tensor == "dx" else z
        (g,) = torch.autograd.grad(y64, leaf, grad_outputs=case.dy.detach().cpu().to(torch.float64))
    return round_once(g, case.x.dtype)


def rstd_from_x(case: Case, opts: OpOptions, compute_dtype: torch.dtype) -> torch.Tensor:
    """1/sqrt(mean(x^2) + eps) per row and group, in `compute_dtype` (x * act(z) when norm after gate)."""
    xf = case.x.detach().cpu().to(compute_dtype)
    if case.z is not None and not opts.norm_before_gate:
        zf = case.z.detach().cpu().to(compute_dtype)
        xf = xf * (torch.sigmoid(zf) if opts.activation == "sigmoid" else zf * torch.sigmoid(zf))
    d = xf.shape[-1]
    g = opts.group_size or d
    xg = xf.reshape(xf.shape[0], d // g, g)
    return torch.rsqrt(xg.pow(2).mean(-1) + opts.eps)


# --------------------------------------------------------------------------------------------
# a backend whose process died
# --------------------------------------------------------------------------------------------
def crashed_backends(run: RunResult) -> list[str]:
    """Backends whose own process crashed or timed out during the run."""
    return [k for k, r in run.results.items() if r.status in ("crashed", "timed_out")]


def crash_table(run: RunResult) -> pd.DataFrame:
    """One line per crashed or timed-out backend: the cause, the check and batch it was on, what it finished."""
    rows = []
    for key in crashed_backends(run):
        r = run.results[key]
        c = r.crash
        rows.append({
            "backend": key,
            "status": r.status,
            "cause": None if c is None else c.cause,
            "check": None if c is None else c.check,
            "batch_size": None if c is None else c.batch_size,
            "finished": "" if c is None else ", ".join(c.finished_checks),
            "seconds": None if c is None else c.seconds,
        })  # fmt: skip
    return pd.DataFrame(rows)


def crash_batch(run: RunResult, backend: str, device: str = "cpu") -> RebuiltCase:
    """The batch a crashed backend was given when its process died, rebuilt from its trail."""
    if backend not in run.results:
        raise ValueError(f"backend: {backend!r} is not in this run; it has {list(run.results)}")
    r = run.results[backend]
    if r.crash is None:
        raise ValueError(f"backend: {backend!r} did not crash or time out in this run (status {r.status})")
    if not r.crash.rebuild:
        raise ValueError(f"backend: {backend!r} died before it was given a batch ({r.crash.cause})")
    return rebuild_case(r.crash.rebuild, device=device)


def reproduce_crash(
    run: RunResult, backend: str, device: str | None = None, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Give the crashed backend the batch it died on again, in a process of its own (so a crash costs nothing
    here), and say how that process ended: `survived` False with the same cause reproduces the crash."""
    crash_batch(run, backend)  # the same clear errors before any process starts
    return run_batch(backend, run.results[backend].crash.rebuild, device or default_device(), timeout_s)  # type: ignore[union-attr]
