"""rlnorm.report.investigate on a tiny run with a planted batch-size-dependent backend: real rows to find."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import BATCH_FAULT, DWEIGHT_FAULT, POSITION_FAULT

from rlnorm.inputs import make_case
from rlnorm.kit.backends import Backend
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.report.explain import DIAGNOSES, explain_record, explain_row
from rlnorm.report.investigate import (
    backends_table,
    correctly_rounded,
    differing_rows,
    failing_summary,
    pick_failing,
    records_dropped,
    rows_or_reason,
    rstd_from_x,
)
from rlnorm.report.plots.row import plot_row
from rlnorm.report.runs import check_parameters, latest_run, load_run, locate_run


class ScaledInBatch(Backend):
    """A planted fault that exposes its own rstd: in a batch of more than one row, rstd (and so the
    whole row) is scaled by (1 + 2^-10), so some bf16 outputs and gradients round one ulp apart."""

    key = f"{__name__}:ScaledInBatch"
    source = "planted fault: rstd scaled by (1 + 2^-10) in batches of more than one row"

    @staticmethod
    def _scale(rows: int) -> float:
        return 1 + 2.0**-10 if rows > 1 else 1.0

    def _fn(self, x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions) -> torch.Tensor:
        return (gated_rmsnorm_math(x, z, w, opts) * self._scale(x.shape[0])).to(x.dtype)

    def rstd(self, x: torch.Tensor, z: torch.Tensor | None, w: torch.Tensor, opts: OpOptions) -> torch.Tensor:
        return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + opts.eps) * self._scale(x.shape[0])


FAULTY_SPEC = ScaledInBatch.key


class ScaledByOtherRows(ScaledInBatch):
    """A planted fault whose rows are scaled by the batch's mean |x| (computed in fp64, so rolling
    the rows changes nothing): each row depends on the values of the others."""

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


def _rebuild_spec(rows: int, seed: int, row: int, opts: OpOptions, tensor: str) -> str:
    return json.dumps(
        {
            "v": 1,
            "check": "all_rows",
            "case": {"rows": rows, "d": 128, "seed": seed, "dtype": "bfloat16", "weight_dtype": "bfloat16"},
            "batch": {"kind": "slice", "start": 0, "size": rows},
            "opts": opts.as_dict(),
            "row": row,
            "position": row,
            "tensor": tensor,
        }
    )


def test_locate_run_finds_artifact_and_records(tiny_run: Path) -> None:
    by_folder = locate_run(tiny_run)
    by_file = locate_run(by_folder.artifact)
    assert by_folder.artifact.name == "rms_norm_gated_reuse_check.json"
    assert by_folder.records == tiny_run / "records.csv"
    assert by_file == by_folder
    assert latest_run(tiny_run.parent) == tiny_run


def test_latest_run_from_a_notebook_folder_finds_the_runs_beside_it(
    tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JupyterLab runs a notebook in notebooks/, so the default run is found in ../outputs
    import shutil

    shutil.copytree(tiny_run, tmp_path / "outputs" / "tiny")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert latest_run().resolve() == (tmp_path / "outputs" / "tiny").resolve()


def test_a_path_relative_to_the_repository_root_works_from_notebooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JupyterLab's working directory is notebooks/: `run = "outputs/NAME"` still means the checkout's outputs/NAME,
    and a path that is nowhere says where it was looked for."""
    from rlnorm.checkout import CHECKOUT
    from rlnorm.report import runs

    if CHECKOUT is None:
        pytest.skip("rlnorm is not installed from a checkout")
    monkeypatch.chdir(CHECKOUT / "notebooks")
    assert locate_run("outputs/h200-full").folder.resolve() == (CHECKOUT / "outputs" / "h200-full").resolve()
    with pytest.raises(ValueError, match=r"outputs/nowhere does not exist in .*notebooks \(nor under the checkout"):
        locate_run("outputs/nowhere")
    assert runs.resolve("/abs/path") == Path("/abs/path")


def test_locate_run_rejects_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        locate_run(tmp_path / "nope")
    with pytest.raises(ValueError, match="no artifact JSON"):
        locate_run(tmp_path)
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not an artifact"):
        locate_run(tmp_path / "x.json")
    with pytest.raises(TypeError, match="source"):
        locate_run(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no run folder"):
        latest_run(tmp_path)


def test_differing_rows_default_picks_the_first_faulty_backend(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    assert run.ran_backends == ["reference", BATCH_FAULT, POSITION_FAULT, DWEIGHT_FAULT]
    summary = failing_summary(run.records)
    assert set(summary["backend"]) == {BATCH_FAULT, POSITION_FAULT, DWEIGHT_FAULT}  # the reference has none
    table = differing_rows(run.records)
    assert (table.attrs["backend"], table.attrs["check"]) == (BATCH_FAULT, "all_rows")
    assert len(table) > 0 and (table["max_ulp"] >= 1).all()
    assert table["tensor"].iloc[0] == "y"
    chosen = differing_rows(run.records, POSITION_FAULT, "batch_size_sweep")
    assert set(chosen["backend"]) == {POSITION_FAULT} and set(chosen["check"]) == {"batch_size_sweep"}


def test_differing_rows_names_what_exists_on_a_bad_choice(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    with pytest.raises(ValueError, match="backend: 'reference' has no differing rows"):
        differing_rows(run.records, backend="reference")
    with pytest.raises(ValueError, match="checks with some"):
        differing_rows(run.records, backend=BATCH_FAULT, check="dweight_repeatable")
    with pytest.raises(ValueError, match="no differing rows"):
        pick_failing(run.records.iloc[0:0])


def test_explain_row_reproduces_a_batch_size_fault(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    table = differing_rows(run.records)
    record = table.iloc[0]
    expl = explain_row(record, opts=run.opts, others=run.ran_backends, device="cpu")
    s = expl.summary
    assert s["compared_with"] == "alone"
    assert s["reproduced"] and s["cols_differ"] == int(record["cols_differ"]) and s["max_ulp"] >= 1
    assert s["max_ulp"] == int(record["max_ulp"])
    assert s["diagnosis"] == "batch size" and "depends on the row count" in expl.text
    # the differing columns are exactly those with a nonzero ulp distance, and there are cols_differ of them
    assert len(expl.differing_columns) == s["cols_differ"]
    assert (expl.differing_columns["ulp_batch_vs_compared"] > 0).all()
    # the correctly rounded value is fp64 rounded once; the fault's row alone is correctly rounded
    case = make_case(7, 128, 3).rows([int(record["row"])])
    exact = round_once(gated_rmsnorm_math(case.x, case.z, case.w, OpOptions(), torch.float64), torch.bfloat16)[0]
    assert expl.columns["correctly_rounded"].tolist() == exact.double().tolist()
    assert s["alone_correctly_rounded_cols"] == 128 and s["in_batch_correctly_rounded_cols"] < 128
    # the clean reference is among the others, ran, and is batch invariant on this row
    others = expl.others.set_index("backend")
    assert others.loc["reference", "status"] == "ran" and bool(others.loc["reference", "batch_equal_compared"])
    assert not bool(others.loc["reference", "equal_to_this_in_batch"])
    assert f"differs in {s['cols_differ']} of 128 columns" in expl.text and "computed alone" in expl.text
    assert "does not expose its own rstd" in " ".join(expl.notes)
    assert len(plot_row(expl).axes) == 2


def test_explain_row_compares_full_vs_sub_batch_with_the_full_batch(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    table = differing_rows(run.records, BATCH_FAULT, "full_vs_sub_batches")
    single = table[table["batch_size"] == 1]
    assert not single.empty  # a sub-batch of one row differs from the full batch: the fault is batch size
    expl = explain_row(single.iloc[0], opts=run.opts, others=["reference"], device="cpu")
    s = expl.summary
    assert s["compared_with"] == "full batch" and s["compared_rows"] == 15 and s["batch_rows"] == 1
    assert s["reproduced"] and s["cols_differ"] == int(single.iloc[0]["cols_differ"])
    assert "inside the full batch of 15 rows at position" in expl.text
    assert s["probe_batch_rows"] == 15 and s["diagnosis"] == "batch size"  # the larger side is probed


def _fault_record(tensor: str) -> dict:
    """A hand-made record of the scaling fault: all_rows of 7 rows, seed 3, row 2."""
    return {
        "backend": FAULTY_SPEC,
        "check": "all_rows",
        "seed": 3,
        "case": "n=7",
        "row": 2,
        "tensor": tensor,
        "rebuild": _rebuild_spec(7, 3, 2, OpOptions(), tensor),
    }


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


def test_explain_record_of_a_nondeterministic_dweight(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    table = differing_rows(run.records, DWEIGHT_FAULT)
    assert table.attrs["check"] == "dweight_repeatable" and set(table["tensor"]) == {"dweight"}
    expl = explain_record(table.iloc[0], opts=run.opts, device="cpu")
    s = expl.summary
    assert s["reproduced"] and s["cols_differ"] == 2 and s["max_ulp"] == 1  # call k bumps column k
    first, second = expl.differing_columns.index  # consecutive calls bump consecutive columns
    assert second == first + 1
    assert "not repeatable" in expl.text and expl.rstd.empty and expl.others.empty
    # the planted fault sits on the exact dweight: apart from the bumped column, fp64 rounded once
    assert s["first_equal_fp64_cols"] >= 126
    assert len(plot_row(expl).axes) == 2


def test_explain_row_of_a_backend_that_cannot_run_here_still_shows_the_row() -> None:
    # a GPU run's record of FLA's fused kernel read on a CPU, where it cannot run
    record = {
        "backend": "fla_fused_norm_gate",
        "check": "all_rows",
        "seed": 3,
        "case": "n=7",
        "row": 4,
        "tensor": "y",
        "cols_differ": 2,
        "max_ulp": 1,
        "rebuild": _rebuild_spec(7, 3, 4, OpOptions(), "y"),
    }
    expl = explain_row(record, others=["reference"], device="cpu")
    assert not expl.summary["recomputed"] and expl.summary["reproduced"] is None
    assert "fla_fused_norm_gate cannot run on cpu" in expl.text and "2 columns, 1 ulp" in expl.text
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


def _hand_record(spec: str, row: int = 2, tensor: str = "y") -> dict:
    return {
        "backend": spec,
        "check": "all_rows",
        "seed": 3,
        "case": "n=7",
        "row": row,
        "tensor": tensor,
        "rebuild": _rebuild_spec(7, 3, row, OpOptions(), tensor),
    }


@pytest.mark.parametrize(
    ("spec", "diagnosis"),
    [
        (ScaledInBatch.key, "batch size"),
        (ScaledByOtherRows.key, "other rows"),
        (ScaledPerCall.key, "nondeterministic"),
        (POSITION_FAULT, "position"),
        (BATCH_FAULT, "batch size"),
    ],
)
def test_diagnosis_names_the_planted_cause(spec: str, diagnosis: str) -> None:
    # position faults bump rows at positions 1, 4; the batch-size fault rows whose tag matches the regime
    row = 1 if spec == POSITION_FAULT else 2
    if spec == BATCH_FAULT:
        from tests.faults import batch_size_fault_mask

        row = int(batch_size_fault_mask(make_case(7, 128, 3).x).nonzero()[0])
    expl = explain_row(_hand_record(spec, row), others=[], device="cpu")
    assert expl.summary["reproduced"], expl.text
    assert expl.summary["diagnosis"] == diagnosis
    assert DIAGNOSES[diagnosis] in expl.text


def test_explain_row_rejects_records_without_a_row(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    rec = run.records.iloc[0].to_dict()
    with pytest.raises(ValueError, match="not per row"):
        explain_row({**rec, "tensor": "dweight"})
    with pytest.raises(ValueError, match="missing columns"):
        explain_row({"backend": "reference"})
    with pytest.raises(TypeError, match="record"):
        explain_row(3)  # type: ignore[arg-type]


def test_rstd_both_ways_and_correctly_rounded_gradient() -> None:
    case = make_case(5, 128, seed=7)
    opts = OpOptions()
    r32, r64 = rstd_from_x(case, opts, torch.float32), rstd_from_x(case, opts, torch.float64)
    assert r32.shape == (5, 1) and r32.dtype == torch.float32
    assert torch.allclose(r32.double(), r64, rtol=1e-6)
    grouped = rstd_from_x(case, OpOptions(group_size=32), torch.float64)
    assert grouped.shape == (5, 4)
    dz = correctly_rounded(case, opts, "dz")
    assert dz.dtype == torch.bfloat16 and dz.shape == case.x.shape
    with pytest.raises(ValueError, match="tensor"):
        from rlnorm.report.investigate import compute_tensor

        compute_tensor(None, case, opts, "dweight")


def test_check_parameters_names_an_unknown_one() -> None:
    before = {"In", "Out"}
    check_parameters({"In": 1, "run": "x", "_private": 2}, before, ["run", "row_index"])
    with pytest.raises(ValueError, match=r"unknown \['row_idx'\]; this notebook takes \['row_index', 'run'\]"):
        check_parameters({"run": "x", "row_idx": 3}, before, ["run", "row_index"])


def test_records_dropped_reads_the_checks_note(tiny_run: Path) -> None:
    art = load_run(tiny_run).artifact
    assert records_dropped(art, BATCH_FAULT, "all_rows") == 0
    art["results"][BATCH_FAULT]["batch_invariance"]["all_rows"]["7"]["records_dropped"] = 12
    art["results"][BATCH_FAULT]["batch_invariance"]["full_vs_sub_batches"]["records_dropped"] = 5
    assert records_dropped(art, BATCH_FAULT, "all_rows") == 12
    assert records_dropped(art, BATCH_FAULT, "full_vs_sub_batches") == 5
    assert records_dropped(art, "nope", "all_rows") == 0


def test_a_backend_without_differing_rows_says_which_backends_have_some(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    table, sentence = rows_or_reason(run.records, run.artifact, "reference", None, has_records=True)
    assert table is None and sentence.startswith("**reference** has no differing rows in this run")
    assert BATCH_FAULT in sentence and "every check passed" not in sentence
    table, sentence = rows_or_reason(run.records, run.artifact, BATCH_FAULT, "all_rows", has_records=True)
    assert table is not None and len(table) and sentence == f"**{BATCH_FAULT}**: {table.attrs['counts']}"
    table, sentence = rows_or_reason(run.records.iloc[:0], run.artifact, None, None, has_records=True)
    assert table is None and sentence.startswith("**No differing rows in this run")
    table, sentence = rows_or_reason(run.records.iloc[:0], run.artifact, None, None, has_records=False)
    assert table is None and "no per-row records" in sentence
    statuses = backends_table(run.artifact).set_index("backend")["status"]
    assert statuses.to_dict() == {"reference": "ran", BATCH_FAULT: "ran", POSITION_FAULT: "ran", DWEIGHT_FAULT: "ran"}


def test_failing_summary_of_an_empty_table_keeps_columns() -> None:
    empty = pd.DataFrame(columns=["backend", "check", "tensor", "row", "max_ulp"])
    assert list(failing_summary(empty).columns) == [
        "backend",
        "check",
        "compares",
        "row comparisons",
        "y differs",
        "dx or dz differs",
        "y, dx or dz differs",
        "records kept",
        "records not kept (max_records)",
        "records kept per tensor",
        "max_ulp",
    ]


def test_others_as_a_string_names_the_parameter() -> None:
    # papermill's `-p others reference` hands the notebook a string; iterating it would ask for
    # backends named 'r', 'e', ... — refuse it by name instead
    record = _fault_record("y")
    with pytest.raises(TypeError, match="others: expected a list"):
        explain_row(record, others="reference", device="cpu")
