"""Drill into the rows a check found differing, say why one differs and draw it column by column: a row is re-examined
by recomputing the batches its record names (`rlnorm.kit.records.rebuild_case`), never by rerunning the check."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlnorm.inputs import Case, make_case
from rlnorm.kit.backends import REGISTRY, describe_error, load_backend
from rlnorm.kit.records import RebuiltCase, rebuild_case
from rlnorm.kit.results import RunResult
from rlnorm.kit.worker import run_batch
from rlnorm.numerics import round_once, ulp_distance
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.report.runs import run_label
from rlnorm.report.verdict import COMPARES, ROW_CHECKS, backend_verdict, records_line

ROW_TENSORS = ("y", "dx", "dz")
OTHERS_IN_BATCH_ROWS = 1024
# ulp distances per column: the two sides the check compared, the batch vs alone, and each vs correctly rounded
ULP_COLUMNS = ("ulp_batch_vs_compared", "ulp_batch_vs_alone", "ulp_alone_vs_cr", "ulp_batch_vs_cr",
               "ulp_compared_vs_cr")  # fmt: skip


def rows_or_reason(records: pd.DataFrame | None, run: RunResult, backend: str | None,
                   check: str | None) -> tuple[pd.DataFrame | None, str]:  # fmt: skip
    """The kept records of one backend and check (defaults: the first with a differing row), row-level first, and
    the sentence that counts them (also in `attrs`, with the backend and check); or None and why there are none."""
    if records is None:
        return None, "**This artifact has no per-row records** (the reference report, for one, kept only counts)."
    if backend in crashed_backends(run) and backend not in set(records["backend"]):
        return None, f"**{backend}** recorded no differing row before its process died: see its trail above."
    nothing = "**Nothing to drill into:**"
    if records.empty:
        return None, f"{nothing} records: this run recorded no differing rows (every check passed, or none ran)."
    sel = records
    for name, value in (("backend", backend), ("check", check)):
        if value is not None and value not in set(sel[name]):
            where = f" for {backend or 'any backend'}" if name == "check" else ""
            some = [str(v) for v in dict.fromkeys(sel[name])]
            return None, f"{nothing} {name}: {value!r} has no differing rows{where}; {name}s with some: {some}."
        sel = sel if value is None else sel[sel[name] == value]
    row_level = sel[sel["tensor"].isin(ROW_TENSORS)]  # prefer a record that names a row over a dweight one
    first = (row_level if not row_level.empty else sel).iloc[0]
    b, c = str(first["backend"]), str(first["check"])
    sel = records[(records["backend"] == b) & (records["check"] == c)]
    sel = sel.sort_values("tensor", key=lambda t: ~t.isin(ROW_TENSORS), kind="stable").reset_index(drop=True)
    sel.attrs.update(backend=b, check=c, counts=counts_sentence(run, b, c, len(sel)))
    return sel, f"**{b}**: {sel.attrs['counts']}"


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


def counts_sentence(run: RunResult, backend: str, check: str, kept: int) -> str:
    """'all_rows (row in its batch vs the row alone): y differs in 3 ...; 5 of 6 records kept'."""
    what = f"{check} ({COMPARES[check]})" if check in COMPARES else check
    result = run.results.get(backend)
    counted = backend_verdict(backend, result).checks[check].counts if result and check in ROW_CHECKS else None
    if counted is None:  # no counts to read: how many were not kept is unknown, and not said
        return f"{what}: {records_line(kept, None)}"
    return f"{what}: {counted.sentence()}; {records_line(kept, counted.not_kept)}"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def compute_tensor(backend: Any, case: Case, opts: OpOptions, tensor: str) -> torch.Tensor:
    """One of y, dx, dz for a whole case, from the backend's own forward / forward_backward."""
    if tensor == "y":
        return backend.forward(case.x, case.z, case.w, opts)
    if tensor not in ROW_TENSORS:
        raise ValueError(f"tensor: expected one of {ROW_TENSORS} (a per-row tensor), got {tensor!r}")
    out = getattr(backend.forward_backward(case.x, case.z, case.w, case.dy, opts), tensor)
    if out is None:
        raise ValueError(f"tensor: the backend returned no {tensor} (z is None?)")
    return out


def correctly_rounded(case: Case, opts: OpOptions, tensor: str) -> torch.Tensor:
    """The fp64 result (forward, or fp64 autograd for dx, dz or dweight) rounded ONCE to the tensor's dtype."""
    x = case.x.detach().cpu().to(torch.float64).requires_grad_(tensor == "dx")
    z = None if case.z is None else case.z.detach().cpu().to(torch.float64).requires_grad_(tensor == "dz")
    w = case.w.detach().cpu().to(torch.float64).requires_grad_(tensor == "dweight")
    with torch.enable_grad():
        y64 = gated_rmsnorm_math(x, z, w, opts, torch.float64)
        if tensor == "y":
            return round_once(y64.detach(), case.x.dtype)
        leaf = {"dx": x, "dz": z, "dweight": w}[tensor]
        (g,) = torch.autograd.grad(y64, leaf, grad_outputs=case.dy.detach().cpu().to(torch.float64))
    return round_once(g, case.w.dtype if tensor == "dweight" else case.x.dtype)


def rstd_from_x(case: Case, opts: OpOptions, compute_dtype: torch.dtype) -> torch.Tensor:
    """1/sqrt(mean(x^2) + eps) per row and group, in `compute_dtype` (x * act(z) when norm after gate)."""
    xf = case.x.detach().cpu().to(compute_dtype)
    if case.z is not None and not opts.norm_before_gate:
        zf = case.z.detach().cpu().to(compute_dtype)
        xf = xf * (torch.sigmoid(zf) if opts.activation == "sigmoid" else zf * torch.sigmoid(zf))
    xg = xf.reshape(xf.shape[0], -1, opts.group_size or xf.shape[-1])
    return torch.rsqrt(xg.pow(2).mean(-1) + opts.eps)


@dataclass
class RowExplanation:
    """What `explain_record` found: tables and a dict a notebook displays as they are."""

    summary: dict[str, Any]
    columns: pd.DataFrame  # one row per column j of the row
    rstd: pd.DataFrame  # per group: fp32 and fp64 from x, the backend's own if exposed
    others: pd.DataFrame  # how every other backend computes this row
    text: str
    notes: list[str] = field(default_factory=list)
    diff_column: str = "ulp_batch_vs_compared"  # the ulp column that says what the check compared

    @property
    def differing_columns(self) -> pd.DataFrame:
        """The columns where the two compared sides differ."""
        return self.columns[self.columns[self.diff_column] != 0]


def _setup(record: Mapping[str, Any] | pd.Series, device: str | None) -> tuple[dict, RebuiltCase, Any, str]:
    """The record as a dict, its rebuilt batches, its backend and the device to recompute on."""
    if not isinstance(record, (Mapping, pd.Series)):
        raise TypeError(f"record: expected a records row (dict or pandas Series), got {type(record).__name__}")
    rec, device = record.to_dict() if isinstance(record, pd.Series) else dict(record), device or default_device()
    if missing := [c for c in ("backend", "check", "row", "tensor") if c not in rec]:
        raise ValueError(f"record: missing columns {missing}; expected a row of the per-row records table")
    return rec, rebuild_case(rec, device), load_backend(str(rec["backend"])), device


def _recorded(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Where the record came from and what the run measured, for an explanation's summary."""
    names = ("backend", "check", "case", "seed", "cols_differ", "max_ulp")
    return {("recorded_" if k in ("cols_differ", "max_ulp") else "") + k: rec.get(k) for k in names}


def _values(t: torch.Tensor) -> list[float]:
    return [float(v) for v in t.detach().cpu().to(torch.float64)]


def _backend_rstd(backend: Any, case: Case, opts: OpOptions) -> torch.Tensor | None:
    fn = getattr(backend, "rstd", None)
    out = fn(case.x, case.z, case.w, opts) if callable(fn) else None
    return None if out is None else out.detach().cpu().to(torch.float64).reshape(case.x.shape[0], -1)


def explain_row(record: Mapping[str, Any] | pd.Series, others: Iterable[str] | None = None, device: str | None = None,
                others_in_batch: bool | None = None) -> RowExplanation:  # fmt: skip
    """Recompute one differing row, with the options its check used, on both sides of its comparison and alone, and
    explain the difference. `others` (default: every registered backend) run the row too; on both batches when
    `others_in_batch` (default: on a GPU, or up to OTHERS_IN_BATCH_ROWS rows: interpreted Triton is slow)."""
    rec, rb, backend, device = _setup(record, device)
    tensor = str(rec["tensor"])
    if tensor not in ROW_TENSORS:
        raise ValueError(f"record: tensor {tensor!r} is not per row (dweight has no row); pick a y/dx/dz record")
    if isinstance(others, str):  # `papermill -p others x` passes a string: a string is never a list of keys
        raise TypeError(f"others: expected a list of backend keys or None, got the string {others!r} (papermill: -y)")
    opts, batch, other, alone = rb.opts, rb.batch, rb.other, rb.alone
    pos, opos = rb.position, rb.other_position
    ok, why = backend.available(device)
    notes: list[str] = []
    if not ok:  # e.g. a GPU run's vLLM record read on a laptop: show the row, the exact value, the others
        notes.append(f"{rec['backend']} cannot run on {device} ({why}): its own values are not recomputed")

    def row_of(b: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        in_b = compute_tensor(b, batch, opts, tensor)[pos].detach().cpu()
        by_itself = compute_tensor(b, alone, opts, tensor)[0].detach().cpu()
        if rb.other_label == "alone":
            return in_b, by_itself, by_itself
        return in_b, compute_tensor(b, other, opts, tensor)[opos].detach().cpu(), by_itself

    exact = correctly_rounded(alone, opts, tensor)[0]
    d = exact.shape[0]
    columns = pd.DataFrame({"x": _values(alone.x[0]), "z": float("nan") if alone.z is None else _values(alone.z[0])})
    if ok:
        in_batch, compared, by_itself = row_of(backend)
        sides = ((in_batch, compared), (in_batch, by_itself), (by_itself, exact), (in_batch, exact), (compared, exact))
        ulp = {name: ulp_distance(*pair) for name, pair in zip(ULP_COLUMNS, sides, strict=True)}
        mine = {"in_batch": _values(in_batch), "compared": _values(compared), "alone": _values(by_itself)}
        ulps = {k: v.tolist() for k, v in ulp.items()}
    else:  # the row, its correctly rounded value and the other backends still show
        mine = dict.fromkeys(("in_batch", "compared", "alone"), float("nan"))
        ulps = {k: pd.array([pd.NA] * d, dtype="Int64") for k in ULP_COLUMNS}
    columns = columns.assign(**mine, correctly_rounded=_values(exact), **ulps)
    columns.index.name = "col"

    # rstd: the per-row statistic the op divides by, both ways, and the backend's own if it has one
    r32, r64 = rstd_from_x(alone, opts, torch.float32)[0], rstd_from_x(alone, opts, torch.float64)[0]
    rstd = pd.DataFrame({"fp32_from_x": r32.to(torch.float64).tolist(), "fp64_from_x": r64.tolist()})
    rstd["fp32_rel_err"] = (rstd["fp32_from_x"] - rstd["fp64_from_x"]).abs() / rstd["fp64_from_x"]
    own_alone = own_batch = None
    try:
        own_alone, own_batch = (_backend_rstd(backend, c, opts) for c in (alone, batch)) if ok else (None, None)
    except Exception as exc:  # a backend's optional rstd hook failing is a note, not a failure
        notes.append(f"{rec['backend']}.rstd failed: {describe_error(exc)}")
    if own_alone is not None and own_batch is not None:
        rstd["backend_alone"] = own_alone[0].tolist()
        rstd["backend_in_batch"] = own_batch[pos].tolist()
        rstd["backend_same_both_ways"] = rstd["backend_alone"] == rstd["backend_in_batch"]
    else:
        notes.append(f"{rec['backend']} does not expose its own rstd; only the rstd recomputed from x is shown")
    rstd.index.name = "group"

    # how every other backend computes this row
    biggest = max(batch.x.shape[0], other.x.shape[0])
    if others_in_batch is None:
        others_in_batch = device.startswith("cuda") or biggest <= OTHERS_IN_BATCH_ROWS
    other_rows = []
    for key in [k for k in (list(REGISTRY) if others is None else list(others)) if k != rec["backend"]]:
        row: dict[str, Any] = {"backend": key}
        other_rows.append(row)
        try:
            cand = load_backend(key)
            cand_ok, cand_why = cand.available(device)
            if not cand_ok or (tensor != "y" and not cand.has_backward):
                row["status"] = f"unavailable: {cand_why}" if not cand_ok else "no backward"
                continue
            o_alone = compute_tensor(cand, alone, opts, tensor)[0].detach().cpu()
            row.update(status="ran", alone_correctly_rounded_cols=int((ulp_distance(o_alone, exact) == 0).sum()),
                       alone_max_ulp_vs_cr=int(ulp_distance(o_alone, exact).max()))  # fmt: skip
            if ok:
                row["equal_to_this_alone"] = bool(torch.equal(o_alone, by_itself))
                row["equal_to_this_in_batch"] = bool(torch.equal(o_alone, in_batch))
            if others_in_batch:
                o_batch, o_comp, _ = row_of(cand)
                row["batch_equal_compared"] = bool(torch.equal(o_batch, o_comp))
                row["batch_max_ulp_vs_compared"] = int(ulp_distance(o_batch, o_comp).max())
        except Exception as exc:
            row["status"] = f"error: {describe_error(exc)}"
    others_df = pd.DataFrame(other_rows)
    if not others_in_batch:
        notes.append(f"other backends were run on the row alone only (batches of up to {biggest} rows on {device}; "
                     "pass others_in_batch=True to run them on the compared batches too)")  # fmt: skip

    summary: dict[str, Any] = {
        **_recorded(rec), "row": int(rec["row"]), "tensor": tensor, "batch_rows": int(batch.x.shape[0]),
        "position": pos, "compared_with": rb.other_label, "compared_rows": int(other.x.shape[0]),
        "compared_position": opos, "device": device, "columns": d, "recomputed": ok, "cols_differ": None,
        "max_ulp": None, "reproduced": None,
    }  # fmt: skip
    if ok:
        diff_cols = ulp["ulp_batch_vs_compared"] != 0
        summary.update(
            cols_differ=int(diff_cols.sum()),
            max_ulp=int(ulp["ulp_batch_vs_compared"].max()),
            reproduced=bool(diff_cols.any()),
            # of the differing columns, how many are larger in magnitude inside the batch
            cols_larger_in_batch=int((in_batch.abs() > compared.abs())[diff_cols].sum()),
            alone_correctly_rounded_cols=int((ulp["ulp_alone_vs_cr"] == 0).sum()),
            in_batch_correctly_rounded_cols=int((ulp["ulp_batch_vs_cr"] == 0).sum()),
            compared_correctly_rounded_cols=int((ulp["ulp_compared_vs_cr"] == 0).sum()),
        )
        if summary["reproduced"]:  # probe the larger side of the comparison: which property of the batch matters
            larger = batch.x.shape[0] >= other.x.shape[0]
            summary.update(diagnose(backend, *((batch, pos, opts, tensor, in_batch) if larger
                                               else (other, opos, opts, tensor, compared))))  # fmt: skip
    return RowExplanation(summary, columns, rstd, others_df, _explain_text(summary, rstd, others_df), notes)


# what each diagnosis means, in the words the explanation uses
DIAGNOSES = {
    "nondeterministic": "the same batch computed twice gives different bits: run-to-run nondeterminism "
    "(atomics or an unordered reduction), so no single answer exists for this row",
    "position": "moving the row one place within the same batch changes its bits: the result depends on "
    "the row's position in the launch",
    "batch size": "the same number of rows with different other rows gives the same bits, and moving the row "
    "changes nothing: the result depends on the row count (a launch configuration or reduction split "
    "chosen from it), not on the other rows",
    "other rows": "moving the row changes nothing but replacing the other rows does: the result depends on "
    "the values of the other rows (something computed across rows, or shared state)",
}


def diagnose(backend: Any, side: Case, position: int, opts: OpOptions, tensor: str, value: torch.Tensor) -> dict:
    """Why the row at `position` is `value`: the same batch again, rolled by one row, and with the other rows redrawn
    at the same size. One probe each: a hint, not a proof."""
    m = int(side.x.shape[0])
    if m < 2:
        return {}
    again = compute_tensor(backend, side, opts, tensor)[position].detach().cpu()
    rolled = side.rows(torch.roll(torch.arange(m, device=side.x.device), 1))  # row p moves to p + 1
    moved = compute_tensor(backend, rolled, opts, tensor)[(position + 1) % m].detach().cpu()
    fresh = make_case(m, side.x.shape[1], side.seed + 7919, side.x.dtype, side.w.dtype, side.x.device)
    fresh.x[position], fresh.dy[position] = side.x[position], side.dy[position]
    if side.z is not None:
        fresh.z[position] = side.z[position]
    fresh = Case(fresh.x, None if side.z is None else fresh.z, side.w, fresh.dy, fresh.seed)
    other_rows = compute_tensor(backend, fresh, opts, tensor)[position].detach().cpu()
    repeat_eq, moved_eq, fresh_eq = (bool(torch.equal(t, value)) for t in (again, moved, other_rows))
    verdict = ("nondeterministic" if not repeat_eq else "position" if not moved_eq
               else "batch size" if fresh_eq else "other rows")  # fmt: skip
    return {"probe_batch_rows": m, "probe_same_batch_again_equal": repeat_eq, "probe_moved_one_place_equal": moved_eq,
            "probe_other_rows_same_size_equal": fresh_eq, "diagnosis": verdict}  # fmt: skip


def explain_dweight(record: Mapping[str, Any] | pd.Series, device: str | None = None) -> RowExplanation:
    """A dweight record: the same batch run twice, column by column, against the fp64 dweight rounded once."""
    rec, rb, backend, device = _setup(record, device)
    batch, name = rb.batch, rec["backend"]
    ok, why = backend.available(device)
    if not ok:
        raise ValueError(f"record: backend {name!r} cannot run on {device}: {why}")
    first, second = rb.run(backend, "dweight")
    ref = correctly_rounded(batch, rb.opts, "dweight")
    u12, u1r, u2r = ulp_distance(first, second), ulp_distance(first, ref), ulp_distance(second, ref)
    columns = pd.DataFrame({"first_run": _values(first), "second_run": _values(second),
                            "fp64_rounded_once": _values(ref), "ulp_first_vs_second": u12.tolist(),
                            "ulp_first_vs_fp64": u1r.tolist(), "ulp_second_vs_fp64": u2r.tolist()})  # fmt: skip
    columns.index.name = "col"
    d, n_diff, rows = int(first.shape[0]), int((u12 != 0).sum()), int(batch.x.shape[0])
    summary = {
        **_recorded(rec), "tensor": "dweight", "batch_rows": rows, "device": device, "columns": d,
        "cols_differ": n_diff, "max_ulp": int(u12.max()), "reproduced": n_diff > 0,
        "first_equal_fp64_cols": int((u1r == 0).sum()), "second_equal_fp64_cols": int((u2r == 0).sum()),
    }  # fmt: skip
    head = f"{name}'s dweight over the same batch of {_n(rows, 'row')} (seed {rec.get('seed')})"
    text = (f"{head} differs between two identical runs in {n_diff} of {d} columns by at most {summary['max_ulp']} "
            f"ulp (recorded: {_n(rec.get('cols_differ'), 'column')}, {rec.get('max_ulp')} ulp): the weight gradient "
            "is not repeatable, so two training runs on the same data drift apart." if n_diff else f"Recomputed on "
            f"{device}, {head} is bitwise the same in two runs: the recorded difference does not reproduce here (it "
            "depends on the device, timing or launch configuration of the run).")  # fmt: skip
    text += (f" Columns equal to the fp64 dweight rounded once: {summary['first_equal_fp64_cols']}/{d} in the first "
             f"run, {summary['second_equal_fp64_cols']}/{d} in the second.")  # fmt: skip
    notes = ["dweight has no row: no rstd, no per-row peers"]
    return RowExplanation(summary, columns, pd.DataFrame(), pd.DataFrame(), text, notes, "ulp_first_vs_second")


def explain_record(record: Mapping[str, Any] | pd.Series, **kwargs: Any) -> RowExplanation:
    """explain_row for a y/dx/dz record, explain_dweight for a dweight one (kwargs it lacks are dropped)."""
    if isinstance(record, (Mapping, pd.Series)) and record.get("tensor") == "dweight":
        return explain_dweight(record, device=kwargs.get("device"))
    return explain_row(record, **kwargs)


def _n(k: Any, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _explain_text(s: Mapping[str, Any], rstd: pd.DataFrame, others: pd.DataFrame) -> str:
    """The paragraph a reader sees above the tables: what differs, by how much, and what follows."""
    where = (f"row {s['row']} ({s['check']}, case {s['case']}, seed {s['seed']}) at position {s['position']} of a "
             f"batch of {_n(s['batch_rows'], 'row')}")  # fmt: skip
    vs = "alone"
    if s["compared_with"] != "alone":
        vs = f"inside the {s['compared_with']} of {_n(s['compared_rows'], 'row')} at position {s['compared_position']}"
    recorded = f"{_n(s['recorded_cols_differ'], 'column')}, {s['recorded_max_ulp']} ulp"
    if not s["recomputed"]:
        return (f"{s['backend']} cannot run on {s['device']}, so its {s['tensor']} for {where} is not recomputed "
                f"here; the run recorded that it differs from the same row computed {vs} in {recorded}. The table "
                "still shows the row's inputs and its correctly rounded value.") + _others_text(others)  # fmt: skip
    if not s["reproduced"]:
        return (f"Recomputed on {s['device']}, {s['backend']}'s {s['tensor']} for {where} is bitwise the same as "
                f"{vs}: the recorded difference ({recorded}) does not reproduce here, so it depends on the device or "
                "the launch configuration the run used.") + _others_text(others)  # fmt: skip
    lines = [
        f"{s['backend']}'s {s['tensor']} for {where} differs in {s['cols_differ']} of {s['columns']} columns "
        f"by at most {s['max_ulp']} ulp from the same row computed {vs} (recorded: {recorded}).",
        f"The row's inputs are bitwise the same both ways, so the difference comes from how {s['backend']} "
        "computes a batch (launch configuration, reduction order, or a dependence on batch size or position), "
        "not from the data.",
    ]
    if s.get("diagnosis"):
        lines.append(f"Why, probing the batch of {_n(s['probe_batch_rows'], 'row')}: {DIAGNOSES[s['diagnosis']]}.")
    if s["cols_differ"] > 1 and s["cols_larger_in_batch"] in (0, s["cols_differ"]):
        lines.append(f"Every differing column is {'larger' if s['cols_larger_in_batch'] else 'smaller'} in magnitude "
                     "in the batch: a shift of the whole row's scale (its rstd or a final multiply), not independent "
                     "rounding noise per column.")  # fmt: skip
    n = s["columns"]
    also = "" if vs == "alone" else f", {s['compared_correctly_rounded_cols']}/{n} in the {s['compared_with']}"
    lines.append(f"Correctly rounded (fp64, rounded once) columns: {s['alone_correctly_rounded_cols']}/{n} alone, "
                 f"{s['in_batch_correctly_rounded_cols']}/{n} in the batch of "
                 f"{_n(s['batch_rows'], 'row')}{also}.")  # fmt: skip
    if "backend_same_both_ways" in rstd:
        same = bool(rstd["backend_same_both_ways"].all())
        lines.append(f"The backend's own rstd is {'the same' if same else 'DIFFERENT'} alone and in the batch" +
                     (": the difference comes after the row statistic." if same else ": the row statistic itself "
                      "moved."))  # fmt: skip
    return " ".join(lines) + _others_text(others)


def _others_text(others: pd.DataFrame) -> str:
    ran = others[others["status"] == "ran"] if "status" in others else others.iloc[0:0]
    if ran.empty:
        return ""
    cr = ran[ran["alone_max_ulp_vs_cr"] == 0]["backend"].tolist()
    out = (f" Of the other backends that ran, {len(cr)}/{len(ran)} give the correctly rounded row alone"
           + (f" ({', '.join(cr)})." if cr else "."))  # fmt: skip
    if "batch_equal_compared" in ran:
        inv = ran[ran["batch_equal_compared"] == True]["backend"].tolist()  # noqa: E712 (NaN-safe)
        out += f" {len(inv)}/{len(ran)} compute this row bitwise the same in both batches."
    return out


def crashed_backends(run: RunResult) -> list[str]:
    """Backends whose own process crashed or timed out during the run (their crash is recorded)."""
    return [k for k, r in run.results.items() if r.crash is not None]


def crash_table(run: RunResult) -> pd.DataFrame:
    """One line per crashed or timed-out backend: the cause, the check and batch it was on, what it finished."""
    rows = [{"backend": k, "status": r.status, **{f: getattr(r.crash, f) for f in ("cause", "check", "batch_size")},
             "finished": ", ".join(r.crash.finished_checks), "seconds": r.crash.seconds}
            for k, r in run.results.items() if r.crash is not None]  # fmt: skip
    return pd.DataFrame(rows)


def crash_batch(run: RunResult, backend: str) -> RebuiltCase:
    """The batch a crashed backend was given when its process died, rebuilt from its trail."""
    if backend not in run.results:
        raise ValueError(f"backend: {backend!r} is not in this run; it has {list(run.results)}")
    r = run.results[backend]
    if r.crash is None:
        raise ValueError(f"backend: {backend!r} did not crash or time out in this run (status {r.status})")
    if not r.crash.rebuild:
        raise ValueError(f"backend: {backend!r} died before it was given a batch ({r.crash.cause})")
    return rebuild_case(r.crash.rebuild)


def reproduce_crash(run: RunResult, backend: str, device: str | None = None) -> dict[str, Any]:
    """Give the crashed backend the batch it died on again, in a process of its own, and say how that process ended."""
    return run_batch(backend, crash_batch(run, backend).spec, device or default_device())


def plot_row(expl: RowExplanation, records: pd.DataFrame | None = None, run: RunResult | None = None) -> Figure:
    """Per column: ulp distance between the two compared sides (top) and each side's distance to the correctly
    rounded value (bottom). Where the backend cannot run here (a GPU run read on a CPU): per recorded row, the
    columns that differed and the largest ulp distance. Given the run, the title names its GPU and commit."""
    c, s = expl.columns, expl.summary
    cols = np.asarray(c.index)
    fig = Figure(figsize=(10, 4.8), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    if run is not None:
        fig.suptitle(f"{run_label(run)}; recomputed on {s['device']}", fontsize=9)
    if not s.get("recomputed", True):
        if records is None or records.empty:
            ax1.set_title(f"{s['backend']} cannot run on {s['device']}: nothing recomputed to plot", fontsize=10)
            for ax in (ax1, ax2):
                ax.set_axis_off()
            return fig
        return _plot_records(fig, (ax1, ax2), s, records)
    diff = c[expl.diff_column].to_numpy()
    ax1.bar(cols, diff, color=np.where(diff != 0, "#e53935", "#9e9e9e"), width=0.9)
    what = f"row {s['row']} ({s['check']} {s['case']})" if "row" in s else f"{s['check']} {s['case']}"
    ax1.set_title(f"{s['backend']} {s['tensor']}, {what}: {s['cols_differ']}/{s['columns']} columns differ, max "
                  f"{s['max_ulp']} ulp", fontsize=10)  # fmt: skip
    if s["tensor"] == "dweight":
        ax1.set_ylabel("ulp, run 1 vs run 2", fontsize=8)
        sides = [("first run", "ulp_first_vs_fp64", "#1e88e5"), ("second run", "ulp_second_vs_fp64", "#fb8c00")]
    else:
        ax1.set_ylabel(f"ulp, batch vs {s['compared_with']}", fontsize=8)
        sides = [("alone", "ulp_alone_vs_cr", "#1e88e5"), ("in batch", "ulp_batch_vs_cr", "#fb8c00")]
        if s["compared_with"] != "alone":
            sides.append((s["compared_with"], "ulp_compared_vs_cr", "#8e24aa"))
    width = 0.8 / len(sides)
    for i, (label, col, colour) in enumerate(sides):
        ax2.bar(cols + (i - (len(sides) - 1) / 2) * width, c[col], width=width, label=label, color=colour)
    ax2.set_ylabel("ulp vs correctly rounded", fontsize=8)
    ax2.set_xlabel("column")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        top = max(1, int(np.nanmax(ax.get_ylim())))
        ax.set_ylim(0, top + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def _plot_records(fig: Figure, axes: tuple, s: dict, records: pd.DataFrame) -> Figure:
    """The recorded differences of the row's backend and check, one bar per record, as the run measured them."""
    ax1, ax2 = axes
    rec = records[(records["backend"] == s["backend"]) & (records["check"] == s["check"])]
    rec = rec[rec["tensor"] == s["tensor"]] if (rec["tensor"] == s["tensor"]).any() else rec
    rows = rec["row"].to_numpy()
    ax1.bar(np.arange(len(rec)), rec["cols_differ"].to_numpy(), color="#e53935", width=0.9)
    ax1.set_ylabel("columns that differ", fontsize=8)
    ax1.set_title(f"{s['backend']} cannot run on {s['device']}: the run's own records of {s['check']} ({len(rec)} "
                  f"{s['tensor']} records)", fontsize=10)  # fmt: skip
    ax2.bar(np.arange(len(rec)), rec["max_ulp"].to_numpy(), color="#fb8c00", width=0.9)
    ax2.set_ylabel("largest ulp difference", fontsize=8)
    ax2.set_xlabel("recorded row (its index in the seeded case below each bar)")
    step = max(1, len(rec) // 20)
    ax2.set_xticks(np.arange(len(rec))[::step], [str(int(r)) if r == r else "-" for r in rows[::step]], fontsize=7)
    for ax in axes:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return fig
