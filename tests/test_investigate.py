"""rlnorm.investigate on a tiny run with a planted batch-size-dependent backend: real rows to find."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlnorm.inputs import make_case
from rlnorm.investigate import (
    correctly_rounded,
    differing_rows,
    explain_row,
    failing_summary,
    latest_run,
    load_run,
    locate_run,
    pick_failing,
    plot_row,
    rstd_from_x,
)
from rlnorm.numerics import round_once, ulp_distance
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math

FAULTY_MODULE = "tiny_planted_faults"
FAULTY_SPEC = f"{FAULTY_MODULE}:BatchSizeDependent"
TINY_ROWS = 7
TINY_SEED = 3

# A planted fault: the same row is scaled by (1 + 2^-10) whenever it is computed with others, so
# a few of its bf16 outputs round one ulp differently in a batch than alone.
_FAULTY_SOURCE = textwrap.dedent(
    '''
    """A backend whose output depends on the batch size (for rlnorm's investigate tests)."""
    from rlnorm.backends import Backend
    from rlnorm.reference import gated_rmsnorm_math


    class BatchSizeDependent(Backend):
        key = "tiny_planted_faults:BatchSizeDependent"
        source = "planted fault: scales rows by (1 + 2^-10) in batches of more than one row"

        def _fn(self, x, z, w, opts):
            y = gated_rmsnorm_math(x, z, w, opts)
            if x.shape[0] > 1:
                y = y * (1 + 2.0**-10)
            return y.to(x.dtype)
    '''
)


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


def _all_rows_records(backend, key: str, rows: int, seed: int, opts: OpOptions) -> tuple[dict, list[dict]]:
    """A minimal all_rows check: each row alone vs inside the whole case, bitwise, y/dx/dz."""
    case = make_case(rows, 128, seed)
    full = backend.forward_backward(case.x, case.z, case.w, case.dy, opts)
    records, fwd, grad = [], set(), set()
    for r in range(rows):
        one = case.rows([r])
        alone = backend.forward_backward(one.x, one.z, one.w, one.dy, opts)
        for tensor in ("y", "dx", "dz"):
            a, b = getattr(alone, tensor)[0], getattr(full, tensor)[r]
            ulp = ulp_distance(b, a)
            if int((ulp != 0).sum()) == 0:
                continue
            (fwd if tensor == "y" else grad).add(r)
            records.append(
                {
                    "backend": key,
                    "check": "all_rows",
                    "seed": seed,
                    "case": f"n={rows}",
                    "batch_start": 0,
                    "batch_size": rows,
                    "position": r,
                    "row": r,
                    "tensor": tensor,
                    "cols_differ": int((ulp != 0).sum()),
                    "max_abs": float((a.double() - b.double()).abs().max()),
                    "max_ulp": int(ulp.max()),
                    "rebuild": _rebuild_spec(rows, seed, r, opts, tensor),
                }
            )
    summary = {str(rows): {"rows": rows, "fwd_differ": len(fwd), "rowgrad_differ": len(grad)}}
    return summary, records


def write_tiny_run(folder: Path, faulty_spec: str = FAULTY_SPEC) -> Path:
    """A run folder holding an artifact and records: `reference` (clean) and a planted faulty backend.

    Built from the artifact and records modules directly, with a one-size all_rows check, so the
    investigate tests need neither the full checks nor the runner.
    """
    from rlnorm.artifact import build_artifact, write_artifact
    from rlnorm.backends import load_backend
    from rlnorm.environment import collect_environment
    from rlnorm.records import records_frame, write_records

    opts = OpOptions()
    results, all_records = {}, []
    for key in ("reference", faulty_spec):
        backend = load_backend(key)
        summary, recs = _all_rows_records(backend, key, TINY_ROWS, TINY_SEED, opts)
        all_records += recs
        invariant = all(v["fwd_differ"] == 0 and v["rowgrad_differ"] == 0 for v in summary.values())
        results[key] = {
            "source": backend.source,
            "backward": "full",
            "status": "ran",
            "skip_reason": None,
            "batch_invariance": {"all_rows": summary, "batch_invariant": invariant},
            "accuracy_latency": None,
            "contract_gates": None,
            "errors": {},
        }
    folder.mkdir(parents=True, exist_ok=True)
    write_records(records_frame(all_records), folder / "records.csv")
    params = {"name": folder.name, **opts.as_dict(), "backends": ["reference"], "custom_backends": [faulty_spec]}
    doc = build_artifact(
        params=params,
        environment=collect_environment("cpu"),
        results=results,
        agreement=None,
        records_path="records.csv",
        plots=None,
        quick=True,
        checks=["all_rows"],
        commit=None,
        dirty=None,
    )
    return write_artifact(doc, folder / "rms_norm_gated_reuse_check.json")


def install_faulty_module(folder: Path) -> Path:
    """Write the planted backend's module into `folder` and make it importable here; return folder
    (a notebook kernel, a child process, needs it on PYTHONPATH too)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{FAULTY_MODULE}.py").write_text(_FAULTY_SOURCE)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return folder


@pytest.fixture(scope="module")
def faulty_module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_faulty_module(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, faulty_module_dir: Path) -> Path:
    folder = tmp_path_factory.mktemp("outputs") / "tiny"
    write_tiny_run(folder)
    return folder


def test_locate_run_finds_artifact_and_records(tiny_run: Path) -> None:
    by_folder = locate_run(tiny_run)
    by_file = locate_run(by_folder.artifact)
    assert by_folder.artifact.name == "rms_norm_gated_reuse_check.json"
    assert by_folder.records == tiny_run / "records.csv"
    assert by_file == by_folder
    assert latest_run(tiny_run.parent) == tiny_run


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


def test_differing_rows_default_picks_the_faulty_backend(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    assert run.ran_backends == ["reference", FAULTY_SPEC]
    summary = failing_summary(run.records)
    assert set(summary["backend"]) == {FAULTY_SPEC}  # the clean reference has no differing rows
    table = differing_rows(run.records)
    assert table.attrs == {"backend": FAULTY_SPEC, "check": "all_rows"}
    assert len(table) > 0 and (table["max_ulp"] >= 1).all()
    assert table["tensor"].iloc[0] == "y"


def test_differing_rows_names_what_exists_on_a_bad_choice(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    with pytest.raises(ValueError, match="backend: 'reference' has no differing rows"):
        differing_rows(run.records, backend="reference")
    with pytest.raises(ValueError, match="checks with some"):
        differing_rows(run.records, check="batch_size_sweep")
    with pytest.raises(ValueError, match="no differing rows"):
        pick_failing(run.records.iloc[0:0])


def test_explain_row_reproduces_the_planted_difference(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    table = differing_rows(run.records)
    record = table.iloc[0]
    expl = explain_row(record, opts=run.opts, others=run.ran_backends, device="cpu")
    s = expl.summary
    assert s["reproduced"] and s["cols_differ"] == int(record["cols_differ"]) and s["max_ulp"] >= 1
    assert s["max_ulp"] == int(record["max_ulp"])
    # the differing columns are exactly those with a nonzero ulp distance, and there are cols_differ of them
    assert len(expl.differing_columns) == s["cols_differ"]
    assert (expl.differing_columns["ulp_batch_vs_alone"] > 0).all()
    # the correctly rounded value is fp64 rounded once
    case = make_case(TINY_ROWS, 128, TINY_SEED).rows([int(record["row"])])
    exact = round_once(gated_rmsnorm_math(case.x, case.z, case.w, OpOptions(), torch.float64), torch.bfloat16)[0]
    assert expl.columns["correctly_rounded"].tolist() == exact.double().tolist()
    # the clean reference is among the others, ran, and is batch invariant on this row
    ref = expl.others.set_index("backend").loc["reference"]
    assert ref["status"] == "ran" and bool(ref["batch_equal_alone"])
    assert ref["alone_correctly_rounded_cols"] >= 120
    assert "differs in" in expl.text and f"{s['cols_differ']} of 128 columns" in expl.text
    assert "does not expose its own rstd" in " ".join(expl.notes)
    fig = plot_row(expl)
    assert len(fig.axes) == 2


def test_explain_row_for_a_gradient_record(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    table = differing_rows(run.records)
    grad = table[table["tensor"] == "dx"]
    assert not grad.empty
    expl = explain_row(grad.iloc[0], opts=run.opts, others=["reference"], device="cpu")
    assert expl.summary["tensor"] == "dx" and expl.summary["reproduced"]
    # the reference's dx alone is within a few ulps of the fp64-autograd value rounded once
    assert expl.others.set_index("backend").loc["reference", "alone_max_ulp_vs_cr"] <= 4


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
        from rlnorm.investigate import compute_tensor

        compute_tensor(None, case, opts, "dweight")


def test_failing_summary_of_an_empty_table_keeps_columns() -> None:
    empty = pd.DataFrame(columns=["backend", "check", "tensor", "row", "max_ulp"])
    assert list(failing_summary(empty).columns) == ["backend", "check", "tensor", "records", "rows", "max_ulp"]
