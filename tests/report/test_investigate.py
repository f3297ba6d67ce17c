"""Investigate and explain: a differing row of a planted faulty backend, rebuilt from its record
(`rlnorm.kit.records.rebuild_case`) and taken apart; the differing backend picked from a planted run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from conftest import POSITION_FAULT
from planted import FAULTY, load_planted

from rlnorm.inputs import make_case
from rlnorm.kit.backends import Backend
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.report.investigate import (
    DIAGNOSES,
    compute_tensor,
    crash_batch,
    crash_table,
    crashed_backends,
    explain_row,
    plot_row,
    rows_or_reason,
)
from rlnorm.report.runs import check_parameters, records_of


class ScaledInBatch(Backend):
    """A planted fault with its own rstd: scaled by (1 + 2^-10) in a batch of more than one row (one-ulp moves)."""

    key = f"{__name__}:ScaledInBatch"
    source = "planted fault: rstd scaled by (1 + 2^-10) in batches of more than one row"

    @staticmethod
    def _scale(rows: int) -> float:
        return 1 + 2.0**-10 if rows > 1 else 1.0

    def _fn(self, x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions) -> torch.Tensor:
        return (gated_rmsnorm_math(x, z, w, opts) * self._scale(x.shape[0])).to(x.dtype)

    def rstd(self, x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions) -> torch.Tensor:
        return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + opts.eps) * self._scale(x.shape[0])


class ScaledByOtherRows(ScaledInBatch):
    """Rows scaled by the batch's mean |x| (fp64, so rolling the rows changes nothing): each depends on the others."""

    key = f"{__name__}:ScaledByOtherRows"

    def _fn(self, x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions) -> torch.Tensor:
        scale = 1 + 2.0**-9 * float(x.detach().double().abs().mean()) if x.shape[0] > 1 else 1.0
        return (gated_rmsnorm_math(x, z, w, opts) * scale).to(x.dtype)


class ScaledPerCall(ScaledInBatch):
    """A planted fault that is nondeterministic in batches: every call scales by a new factor."""

    key = f"{__name__}:ScaledPerCall"
    calls = 0

    def _fn(self, x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions) -> torch.Tensor:
        type(self).calls += 1
        scale = 1 + 2.0**-10 * (type(self).calls % 5) if x.shape[0] > 1 else 1.0
        return (gated_rmsnorm_math(x, z, w, opts) * scale).to(x.dtype)


def _fault_record(tensor: str, spec: str = ScaledInBatch.key, row: int = 2, rows: int = 7, **rebuild: Any) -> dict:
    """A hand-made record of a planted fault: all_rows of a seed-3 case, `row` in the batch of all `rows` rows vs
    alone; `rebuild` replaces fields of its rebuild spec."""
    case = {"rows": rows, "d": 128, "seed": 3, "dtype": "bfloat16", "weight_dtype": "bfloat16"}
    where = {"batch": {"kind": "slice", "start": 0, "size": rows}, "row": row, "position": row}
    rebuild = {"v": 1, "check": "all_rows", "case": case, **where, "opts": OpOptions().as_dict(), "tensor": tensor,
               **rebuild}  # fmt: skip
    return {"backend": spec, "check": rebuild["check"], "seed": 3, "case": f"n={rows}", "row": row, "tensor": tensor,
            "rebuild": json.dumps(rebuild)}  # fmt: skip


def test_explain_row_reproduces_the_planted_batch_size_fault() -> None:
    record = _fault_record("y")
    expl = explain_row(record, others=["reference"], device="cpu")
    s = expl.summary
    assert s["compared_with"] == "alone" and s["reproduced"] and s["max_ulp"] >= 1
    assert s["diagnosis"] == "batch size" and DIAGNOSES["batch size"] in expl.text
    assert len(expl.differing_columns) == s["cols_differ"] > 0
    # the correctly rounded value is fp64 rounded once; the planted fault's row alone is correctly rounded
    case = make_case(7, 128, 3).rows([2])
    exact = round_once(gated_rmsnorm_math(case.x, case.z, case.w, OpOptions(), torch.float64), torch.bfloat16)[0]
    assert expl.columns["correctly_rounded"].tolist() == exact.double().tolist()
    assert s["alone_correctly_rounded_cols"] == 128 and s["in_batch_correctly_rounded_cols"] < 128
    others = expl.others.set_index("backend")
    assert others.loc["reference", "status"] == "ran" and bool(others.loc["reference", "batch_equal_compared"])
    assert len(plot_row(expl).axes) == 2


def test_explain_row_compares_a_sub_batch_with_the_full_batch() -> None:
    sub, full = {"kind": "slice", "start": 4, "size": 1}, {"kind": "slice", "start": 0, "size": 15}
    record = _fault_record("y", row=4, rows=15, check="full_vs_sub_batches", batch=sub, position=0, other=full)
    expl = explain_row(record, others=[], device="cpu")
    s = expl.summary
    assert s["compared_with"] == "full batch" and s["compared_rows"] == 15 and s["batch_rows"] == 1
    assert s["reproduced"] and s["probe_batch_rows"] == 15 and s["diagnosis"] == "batch size"


def test_investigate_picks_the_differing_backend_and_says_why_not_others(tmp_path: Path) -> None:
    run = load_planted(tmp_path / "planted")
    records = records_of(run)
    assert records is not None
    table, _ = rows_or_reason(records, run, None, None)
    assert (table.attrs["backend"], table.attrs["check"]) == (FAULTY, "all_rows")
    assert table["tensor"].iloc[0] != "dweight"
    table, sentence = rows_or_reason(records, run, "clean", None)
    assert table is None and f"'clean' has no differing rows; backends with some: ['{FAULTY}']" in sentence
    table, sentence = rows_or_reason(records, run, "crashes", None)
    assert table is None and "before its process died" in sentence
    table, sentence = rows_or_reason(None, run, None, None)
    assert table is None and "no per-row records" in sentence
    assert crashed_backends(run) == ["crashes"]
    assert crash_table(run).loc[0, "check"] == "full_vs_sub_batches"
    with pytest.raises(ValueError, match="died before it was given a batch"):
        crash_batch(run, "crashes")


def test_bad_records_and_parameters_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not per row"):
        explain_row({**_fault_record("y"), "tensor": "dweight"})
    with pytest.raises(ValueError, match="missing columns"):
        explain_row({"backend": "reference"})
    with pytest.raises(TypeError, match="record"):
        explain_row(3)  # type: ignore[arg-type]
    # papermill's `-p others reference` hands the notebook a string: iterating it would ask for backends 'r', 'e'
    with pytest.raises(TypeError, match="others: expected a list"):
        explain_row(_fault_record("y"), others="reference", device="cpu")
    with pytest.raises(ValueError, match="tensor"):
        compute_tensor(None, make_case(5, 128, seed=7), OpOptions(), "dweight")
    check_parameters({"In": 1, "run": "x", "_private": 2}, {"In", "Out"}, ["run", "row_index"])
    with pytest.raises(ValueError, match=r"unknown \['row_idx'\]; this notebook takes \['row_index', 'run'\]"):
        check_parameters({"run": "x", "row_idx": 3}, {"In", "Out"}, ["run", "row_index"])


def test_explain_row_for_a_gradient_record_and_the_backends_own_rstd() -> None:
    record = _fault_record("dx")
    expl = explain_row(record, others=["reference"], device="cpu")
    assert expl.summary["tensor"] == "dx" and expl.summary["reproduced"]
    # the reference's dx alone is within a few ulps of the fp64-autograd value rounded once
    assert expl.others.set_index("backend").loc["reference", "alone_max_ulp_vs_cr"] <= 4
    # a whole-row scale fault moves every differing column the same way, and the text says so
    assert expl.summary["cols_larger_in_batch"] in (0, expl.summary["cols_differ"])
    assert "shift of the whole row's scale" in expl.text
    # the backend exposes its rstd: alone it is the fp32 one from x, in the batch it moved
    assert expl.rstd.loc[0, "backend_alone"] == expl.rstd.loc[0, "fp32_from_x"]
    assert not expl.rstd.loc[0, "backend_same_both_ways"]
    assert "the row statistic itself moved" in expl.text


def test_explain_row_of_a_backend_that_cannot_run_here_still_shows_the_row() -> None:
    # a GPU run's record of Megatron's batch-invariant norm read on a CPU, where it cannot run
    record = {**_fault_record("y", "megatron_gdn_batch_invariant", 4), "cols_differ": 2, "max_ulp": 1}
    expl = explain_row(record, others=["reference"], device="cpu")
    assert not expl.summary["recomputed"] and expl.summary["reproduced"] is None
    assert "megatron_gdn_batch_invariant cannot run on cpu" in expl.text and "2 columns, 1 ulp" in expl.text
    assert expl.columns["in_batch"].isna().all() and expl.columns["correctly_rounded"].notna().all()
    assert expl.others.set_index("backend").loc["reference", "alone_max_ulp_vs_cr"] == 0
    assert expl.differing_columns.empty
    assert len(plot_row(expl).axes) == 2
    # with the run's records, the plot shows what they hold instead of empty columns
    records = pd.DataFrame([{**record, "max_ulp": u, "cols_differ": c, "row": r} for r, c, u in [(4, 2, 1), (5, 7, 3)]])
    fig = plot_row(expl, records)
    top, bottom = fig.axes
    assert "the run's own records of all_rows" in top.get_title()
    assert [p.get_height() for p in top.patches] == [2, 7] and [p.get_height() for p in bottom.patches] == [1, 3]


@pytest.mark.parametrize(
    ("spec", "diagnosis"),
    [(ScaledByOtherRows.key, "other rows"), (ScaledPerCall.key, "nondeterministic"), (POSITION_FAULT, "position")],
)
def test_diagnosis_names_the_planted_cause(spec: str, diagnosis: str) -> None:
    # position faults bump rows at positions 1, 4 (the batch-size diagnosis: the first explain_row test)
    expl = explain_row(_fault_record("y", spec, 1 if spec == POSITION_FAULT else 2), others=[], device="cpu")
    assert expl.summary["reproduced"], expl.text
    assert expl.summary["diagnosis"] == diagnosis
    assert DIAGNOSES[diagnosis] in expl.text
