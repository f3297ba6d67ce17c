"""Per-row records: the typed table, its atomic CSV, and rebuilding any recorded comparison from it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlnorm.inputs import make_case
from rlnorm.kit import checks
from rlnorm.kit.artifact import RECORD_COLUMNS, read_records, records_frame, write_records
from rlnorm.kit.checks.common import bits
from rlnorm.kit.records import rebuild_case, sweep_batch_rows
from rlnorm.kit.results import to_json
from rlnorm.options import OpOptions
from tests.faults import BatchSizeDependentOutput, NondeterministicDweight, PositionDependentOutput


def _records(check: str, backend, opts: OpOptions | None = None, **kw) -> list[dict]:  # type: ignore[no-untyped-def]
    """The check's records as the CSV's rows (dicts), at width 128 in bf16 on the CPU; a planted fault has some."""
    out = getattr(checks, check)(backend, opts, "cpu", d=128, weight_dtype="bfloat16", progress=False, **kw)
    assert out.records
    return [to_json(r) for r in out.records]


def _reproduces(record: dict, backend) -> None:  # type: ignore[no-untyped-def]
    """The rebuilt comparison, recomputed, differs exactly as the record says."""
    rb = rebuild_case(record)
    a, b = rb.run(backend, record["tensor"])
    assert int((bits(a) != bits(b)).sum()) == record["cols_differ"] > 0
    assert float((a.double() - b.double()).abs().max()) == pytest.approx(record["max_abs"])


# -- the table -------------------------------------------------------------------------------------


def test_unknown_column_or_non_dict_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown columns"):
        records_frame([{"backend": "b", "rows": 3}])
    with pytest.raises(TypeError, match=r"records\[0\]"):
        records_frame(["not a dict"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="records"):
        records_frame("x")  # type: ignore[arg-type]


def test_csv_round_trip_is_exact_and_atomic_and_its_rows_rebuild(tmp_path: Path) -> None:
    """A row read back (or its rebuild JSON alone) rebuilds its comparison, options included; the dweight record
    (no row) rebuilds as the same batch twice."""
    fault, opts = PositionDependentOutput(), OpOptions(norm_before_gate=False)
    recs = _records("all_rows", fault, opts, all_rows_sizes=[7], all_rows_seeds=[3])
    recs += _records("dweight_repeatable", NondeterministicDweight(), dweight_rows=7, dweight_seed=3)
    df = records_frame(recs)
    assert df["row"].isna().sum() == 1  # the dweight record has no row
    path = tmp_path / "run" / "records.csv"
    write_records(df, path)
    back = read_records(path)
    pd.testing.assert_frame_equal(back, df)
    rb = rebuild_case(back.iloc[0])
    assert rb.opts == opts and rebuild_case(str(back.iloc[0]["rebuild"])).row == rb.row
    _reproduces(recs[0], fault)
    rb = rebuild_case(back.iloc[-1])
    assert rb.position == rb.row == -1 and rb.batch.x.shape == (7, 128) and rb.other_label == "same batch"
    _reproduces(recs[-1], NondeterministicDweight())
    assert [p.name for p in path.parent.iterdir()] == ["records.csv"]  # no temp file left
    write_records(records_frame([]), path)  # replaces, still readable when empty
    empty = read_records(path)
    assert list(empty.columns) == RECORD_COLUMNS and len(empty) == 0
    with pytest.raises(FileNotFoundError, match="path"):
        read_records(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="missing record columns"):
        write_records(pd.DataFrame({"backend": ["x"]}), path)


# -- rebuild: every check's records rebuild the exact batch and reproduce the difference --------------


# check -> (planted fault, the case's rows and seed, the check's sizes, what the row is compared with)
ROW_RECORDS = {
    "all_rows": (BatchSizeDependentOutput, 63, 4, {"all_rows_sizes": [63], "all_rows_seeds": [4]}, "alone"),
    "full_vs_sub_batches": (
        PositionDependentOutput, 100, 3,
        {"sub_batches_rows": 100, "sub_batch_sizes": [7], "sub_batches_seeds": [3], "coverage": "all"}, "full batch",
    ),
    "batch_size_sweep": (
        PositionDependentOutput, 65, 5,
        {"sweep_n": 65, "sweep_seeds": [5], "sweep_sizes": [9, 33, 65], "sweep_probe_rows": [0, 64]}, "alone",
    ),
}  # fmt: skip


@pytest.mark.parametrize("check", ROW_RECORDS)
def test_a_row_record_rebuilds_its_batch_and_what_it_was_compared_with(check: str) -> None:
    """The batch's rows (a slice, or the sweep's drawn rows), distinct, hold the row at its position; both sides are
    the case's own bits, and recomputed they differ as the record says."""
    fault, rows, seed, kw, label = ROW_RECORDS[check]
    b, case = fault(), make_case(rows, 128, seed)
    for rec in _records(check, b, **kw)[:6]:
        rb = rebuild_case(rec)
        got, row = rb.batch_rows.tolist(), rec["row"]
        assert (
            len(set(got)) == len(got) == rec["batch_size"]
            and got[rb.position] == row
            and rb.position == rec["position"]
        )
        if check != "batch_size_sweep":
            assert got == list(range(rec["batch_start"], rec["batch_start"] + rec["batch_size"]))
        assert torch.equal(bits(rb.batch.x), bits(case.x[rb.batch_rows]))
        assert torch.equal(bits(rb.batch.dy), bits(case.dy[rb.batch_rows]))
        assert torch.equal(bits(rb.alone.x), bits(case.x[row : row + 1]))
        assert rb.other_label == label and torch.equal(bits(rb.other.x[rb.other_position]), bits(case.x[row]))
        _reproduces(rec, b)


def test_sweep_batch_rows_is_seeded_and_places_the_probe() -> None:
    a = sweep_batch_rows(100, 10, 7, 4, perm_seed=123)
    assert a.tolist() == sweep_batch_rows(100, 10, 7, 4, perm_seed=123).tolist()
    assert int(a[4]) == 7 and len(set(a.tolist())) == 10
    # the other rows do not depend on the position
    b = sweep_batch_rows(100, 10, 7, 9, perm_seed=123)
    assert [r for r in a.tolist() if r != 7] == [r for r in b.tolist() if r != 7]
    assert sweep_batch_rows(100, 100, 7, 0, perm_seed=1).sort().values.tolist() == list(range(100))
    with pytest.raises(ValueError, match="position"):
        sweep_batch_rows(100, 10, 7, 10, perm_seed=1)
    with pytest.raises(ValueError, match="m"):
        sweep_batch_rows(100, 101, 7, 0, perm_seed=1)


def test_bad_rebuild_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="rebuild"):
        rebuild_case({"backend": "x"})
    with pytest.raises(ValueError, match="JSON"):
        rebuild_case({"rebuild": "{not json"})
    with pytest.raises(ValueError, match="version"):
        rebuild_case({"rebuild": json.dumps({"v": 99})})
    case = {"rows": 7, "d": 128, "seed": 3, "dtype": "bfloat16", "weight_dtype": "bfloat16"}
    batch = {"kind": "slice", "start": 0, "size": 7}
    spec = {"v": 1, "check": "all_rows", "case": case, "opts": {}, "batch": batch, "row": 2, "position": 3}
    with pytest.raises(ValueError, match="does not hold row"):
        rebuild_case(json.dumps(spec))
    with pytest.raises(ValueError, match="outside"):
        rebuild_case(json.dumps({**spec, "batch": {"kind": "slice", "start": 5, "size": 7}}))
    with pytest.raises(ValueError, match="batch kind"):
        rebuild_case(json.dumps({**spec, "batch": {"kind": "zip"}}))
    with pytest.raises(TypeError, match="record"):
        rebuild_case(3)  # type: ignore[arg-type]
