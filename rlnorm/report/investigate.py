"""Drill into the rows a check found differing: which rows, by how much, and why it matters.

Someone reads "fwd_differ: 95" in an RFC and needs the rows behind it (what each count counts, and how a record
relates to it, is `rlnorm.report.counts`). A run folder holds the
artifact and the per-row records; each record carries what `rlnorm.kit.records.rebuild_case` needs to
rebuild the exact batch that was compared, so one row is re-examined by recomputing that batch and
the row alone, never by rerunning the check. `notebooks/investigate_rows` only calls this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from rlnorm.inputs import Case
from rlnorm.kit.artifact import ENDED_EARLY
from rlnorm.kit.isolation import run_batch
from rlnorm.kit.records import RebuiltCase, rebuild_case
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.report.counts import (
    COMPARES,
    ROW_CHECKS,
    check_counts,
    count_table,
    kept_by_tensor,
    records_line,
    records_of,
)

ROW_TENSORS = ("y", "dx", "dz")


# --------------------------------------------------------------------------------------------
# the differing rows
# --------------------------------------------------------------------------------------------
def failing_summary(records: pd.DataFrame, artifact: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One line per backend and check that differs: the artifact's complete counts of row comparisons
    (`rlnorm.report.counts`: y differs, dx or dz differs), the records kept and those `max_records` left out,
    the records kept per tensor, and the largest difference recorded (bf16 ulps).

    Without the artifact only the records are known, and they cannot give the counts: those columns stay empty.
    """
    results = None if artifact is None else (artifact.get("results") or {})
    out = count_table(results, records)
    per_tensor, max_ulp = [], []
    for key, check in zip(out["backend"], out["check"], strict=True):
        kept = kept_by_tensor(records, key, check)
        per_tensor.append(", ".join(f"{t} {n:,}" for t, n in kept.items()))
        sel = records_of(records, key, check)
        ulps = pd.to_numeric(sel["max_ulp"], errors="coerce") if "max_ulp" in sel.columns else pd.Series([])
        max_ulp.append(None if ulps.dropna().empty else int(ulps.max()))
    out["records kept per tensor"] = per_tensor
    out["max_ulp"] = pd.array(max_ulp, dtype="Int64")
    return out


def pick_failing(records: pd.DataFrame, backend: str | None = None, check: str | None = None) -> tuple[str, str]:
    """The (backend, check) to show: the given ones, else the first backend/check with a differing row."""
    if records.empty:
        raise ValueError("records: this run recorded no differing rows (every check passed, or none ran)")
    sel = records
    if backend is not None:
        if backend not in set(records["backend"]):
            raise ValueError(
                f"backend: {backend!r} has no differing rows; backends with some: {_uniq(records, 'backend')}"
            )
        sel = sel[sel["backend"] == backend]
    if check is not None:
        if check not in set(sel["check"]):
            raise ValueError(
                f"check: {check!r} has no differing rows for {backend or 'any backend'}; "
                f"checks with some: {_uniq(sel, 'check')}"
            )
        sel = sel[sel["check"] == check]
    # prefer a record that names a row (y/dx/dz) over a dweight one
    row_level = sel[sel["tensor"].isin(ROW_TENSORS)]
    first = (row_level if not row_level.empty else sel).iloc[0]
    return str(first["backend"]), str(first["check"])


def _uniq(df: pd.DataFrame, col: str) -> list[str]:
    return [str(v) for v in dict.fromkeys(df[col])]


def differing_rows(
    records: pd.DataFrame,
    backend: str | None = None,
    check: str | None = None,
    artifact: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The kept records of one backend and check (defaults: the first failing ones), row-level first.

    The result's `attrs` name the backend and check chosen, and `counts`: the sentence that says how many row
    comparisons differ (from the artifact, when given) and how many of the differing pairs were kept as records.
    """
    b, c = pick_failing(records, backend, check)
    sel = records[(records["backend"] == b) & (records["check"] == c)].copy()
    sel["_dw"] = ~sel["tensor"].isin(ROW_TENSORS)
    sel = sel.sort_values("_dw", kind="stable").drop(columns="_dw").reset_index(drop=True)
    sel.attrs["backend"], sel.attrs["check"] = b, c
    sel.attrs["counts"] = counts_sentence(artifact, b, c, len(sel))
    return sel


def backends_table(artifact: Mapping[str, Any]) -> pd.DataFrame:
    """One line per backend of the run: whether it ran here, why not, and what ran."""
    res = artifact.get("results") or {}
    cols = ["status", "skip_reason", "source"]
    return pd.DataFrame([{"backend": k, **{c: (v or {}).get(c) for c in cols}} for k, v in res.items()])


def rows_or_reason(
    records: pd.DataFrame,
    artifact: Mapping[str, Any],
    backend: str | None,
    check: str | None,
    *,
    has_records: bool,
) -> tuple[pd.DataFrame | None, str]:
    """The chosen backend's differing rows and the sentence that counts them, or None and why there are none."""
    if not has_records:
        return None, "**This artifact has no per-row records** (the seed report, for one, kept only counts)."
    with_rows = sorted(set(records["backend"])) if len(records) else []
    if backend is not None and backend not in with_rows:
        if backend in crashed_backends(artifact):
            return None, f"**{backend}** recorded no differing row before its process died: see its trail above."
        others = f"backends with some: {', '.join(with_rows)}" if with_rows else "no backend has any"
        return None, f"**{backend}** has no differing rows in this run; {others}."
    if not with_rows:
        return None, "**No differing rows in this run:** no check recorded one, so there is nothing to drill into."
    table = differing_rows(records, backend, check, artifact=artifact)
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


def counts_sentence(artifact: Mapping[str, Any] | None, backend: str, check: str, kept: int) -> str:
    """'full_vs_sub_batches (row in a sub-batch vs the full batch): y differs in 736 and dx or dz in 3,128 of
    2,621,440 row comparisons; 2,000 of 3,888 records kept (1,888 not kept: max_records)'."""
    what = f"{check} ({COMPARES[check]})" if check in COMPARES else check
    entry = None if artifact is None else (artifact.get("results") or {}).get(backend)
    counted = check_counts(entry, check) if entry is not None and check in ROW_CHECKS else None
    if counted is None:  # no row-check counts to read: how many were not kept is unknown, and not said
        return f"{what}: {records_line(kept, None)}"
    return f"{what}: {counted.sentence()}; {records_line(kept, counted.not_kept)}"


def records_dropped(artifact: Mapping[str, Any], backend: str, check: str) -> int:
    """How many differing (row comparison, tensor) pairs a check counted but did not keep as records (`max_records`)."""
    entry = (artifact.get("results") or {}).get(backend) or {}
    counted = check_counts(entry, check) if check in ROW_CHECKS else None
    return 0 if counted is None else counted.not_kept


# --------------------------------------------------------------------------------------------
# rebuilding one case
# --------------------------------------------------------------------------------------------
@dataclass
class RebuiltRow:
    """Both sides of a recorded comparison: the row inside `batch` (the batch the record names) and
    inside `other` (what it was compared with: the row alone, or the full batch for
    full_vs_sub_batches), plus the row alone."""

    batch: Case
    position: int
    other: Case
    other_position: int
    other_label: str
    alone: Case
    opts: OpOptions | None = None


def rebuild(record: Mapping[str, Any]) -> RebuiltRow:
    """`rlnorm.kit.records.rebuild_case(record)` as a RebuiltRow; `other` defaults to the row alone."""

    got = rebuild_case(dict(record))
    other = getattr(got, "other", None)
    if other is None:
        return RebuiltRow(got.batch, int(got.position), got.alone, 0, "alone", got.alone, getattr(got, "opts", None))
    return RebuiltRow(
        batch=got.batch,
        position=int(got.position),
        other=other,
        other_position=int(got.other_position),
        other_label=str(getattr(got, "other_label", "other batch")),
        alone=got.alone,
        opts=getattr(got, "opts", None),
    )


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
def crashed_backends(artifact: Mapping[str, Any]) -> list[str]:
    """Backends whose own process crashed or timed out during the run."""
    return [k for k, r in (artifact.get("results") or {}).items() if (r or {}).get("status") in ENDED_EARLY]


def crash_table(artifact: Mapping[str, Any]) -> pd.DataFrame:
    """One line per crashed or timed-out backend: the cause, the check and batch it was on, what it finished."""
    rows = []
    for key in crashed_backends(artifact):
        c = artifact["results"][key].get("crash") or {}
        rows.append(
            {
                "backend": key,
                "status": artifact["results"][key]["status"],
                "cause": c.get("cause"),
                "check": c.get("check"),
                "batch_size": c.get("batch_size"),
                "finished": ", ".join(c.get("finished_checks") or []),
                "seconds": c.get("seconds"),
            }
        )
    return pd.DataFrame(rows)


def crash_batch(artifact: Mapping[str, Any], backend: str, device: str = "cpu") -> RebuiltCase:
    """The batch a crashed backend was given when its process died, rebuilt from its trail."""
    entry = (artifact.get("results") or {}).get(backend)
    if entry is None:
        raise ValueError(f"backend: {backend!r} is not in this run; it has {list(artifact.get('results') or {})}")
    crash = entry.get("crash")
    if not crash:
        raise ValueError(f"backend: {backend!r} did not crash or time out in this run (status {entry.get('status')})")
    if not crash.get("rebuild"):
        raise ValueError(f"backend: {backend!r} died before it was given a batch ({crash.get('cause')})")
    return rebuild_case(crash["rebuild"], device=device)


def reproduce_crash(
    artifact: Mapping[str, Any], backend: str, device: str | None = None, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Give the crashed backend the batch it died on again, in a process of its own (so a crash costs nothing
    here), and say how that process ended: `survived` False with the same cause reproduces the crash."""
    crash_batch(artifact, backend)  # the same clear errors before any process starts
    spec = artifact["results"][backend]["crash"]["rebuild"]
    return run_batch(backend, spec, device or default_device(), timeout_s)
