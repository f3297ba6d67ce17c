"""The results table: rows from every kind of bench file, append-only, CPU rows refused unless asked."""

from __future__ import annotations

import csv
import io
import json

import pytest
from bench_fakes import TINY, Eager, FakeGraphClock, FixedClock

from rlnorm.bench import cli, files, merge, results, runner
from rlnorm.bench.results import COLUMNS, ResultsError, append_rows, rows_from_doc

H200 = {"gpu": "NVIDIA H200", "libraries": {"torch": "2.11.0+cu130", "triton": "3.6.0"}}
CMD = "python -m rlnorm bench --quick"


def run_doc(gpu_env: dict = H200, command: str | None = CMD, commit: str = "fe8e668aaaa", clock=None) -> dict:
    """A one-shape run as `python -m rlnorm bench --out` writes it, timed by a fixed clock."""
    shape = runner.bench_shape(3, 128, [Eager()], "cpu", clock or FakeGraphClock(us=10.0, wall_us=30.0), TINY)
    return {
        "kind": files.RUN,
        "command": command,
        "environment": gpu_env,
        "commit": commit,
        "tracked_tree_dirty": False,
        "created_at": "2026-12-04T14:09:52Z",
        "complete": True,
        "shapes": [shape],
    }


def read(path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_a_run_gives_a_row_per_backend_mode_and_clock():
    rows = rows_from_doc(run_doc())
    assert all(list(r) == list(COLUMNS) for r in rows)
    keyed = {(r["backend"], r["mode"], r["clock"]): r for r in rows}
    assert set(keyed) == {
        ("torch.add", "fwd", "graph"),
        ("torch.add", "fwd", "wall"),
        ("eager_test", "fwd", "graph"),
        ("eager_test", "fwd", "wall"),
        ("eager_test", "fwd_bwd", "graph"),
        ("eager_test", "fwd_bwd", "wall"),
    }
    fb = keyed[("eager_test", "fwd_bwd", "graph")]
    assert fb["shape"] == "3x128" and fb["p50_us"] == "2.000" and fb["ratio_to_add"] == f"{3 / 8:.4f}"
    assert (fb["gpu"], fb["torch"], fb["triton"]) == ("NVIDIA H200", "2.11.0+cu130", "3.6.0")
    assert (fb["commit"], fb["date"], fb["runs"], fb["command"]) == ("fe8e668", "2026-12-04T14:09:52Z", "1", CMD)
    assert fb["host_bound"] == "false" and keyed[("eager_test", "fwd", "wall")]["host_bound"] == ""
    assert keyed[("eager_test", "fwd", "wall")]["p50_us"] == "30.000"


def test_the_command_comes_from_the_file_or_is_stated():
    with pytest.raises(ResultsError, match="--command"):
        rows_from_doc(run_doc(command=None))
    assert {r["command"] for r in rows_from_doc(run_doc(command=None), "stated")} == {"stated"}
    dirty = {**run_doc(), "tracked_tree_dirty": True}
    assert {r["commit"] for r in rows_from_doc(dirty)} == {"fe8e668-dirty"}


def test_appending_never_rewrites_a_row(tmp_path):
    table = tmp_path / "benchmarks" / "results.csv"
    first = rows_from_doc(run_doc())
    assert append_rows(table, first) == len(first)
    before = table.read_bytes()
    assert before.startswith(",".join(COLUMNS).encode() + b"\n")
    later = rows_from_doc(run_doc(commit="6498cfe", clock=FakeGraphClock(us=11.0, per_call_us=2.5)))
    assert append_rows(table, later) == len(later)
    after = table.read_bytes()
    assert after.startswith(before) and len(after) > len(before)  # the first rows byte for byte
    assert append_rows(table, first) == 0  # rows already there are not written twice
    assert table.read_bytes() == after
    assert len(read(table)) == len(first) + len(later)


def test_a_table_without_a_final_newline_is_appended_after_it(tmp_path):
    table = tmp_path / "results.csv"
    append_rows(table, rows_from_doc(run_doc()))
    cut = table.read_bytes().rstrip(b"\n")
    table.write_bytes(cut)
    append_rows(table, rows_from_doc(run_doc(commit="6498cfe")))
    assert table.read_bytes().startswith(cut + b"\n")
    assert all(len(r) == len(COLUMNS) for r in csv.reader(io.StringIO(table.read_text())))


def test_a_table_with_other_columns_is_refused(tmp_path):
    table = tmp_path / "results.csv"
    table.write_text("date,gpu,us\n2026,H200,1.0\n")
    with pytest.raises(ResultsError, match="columns"):
        append_rows(table, rows_from_doc(run_doc()))
    assert table.read_text() == "date,gpu,us\n2026,H200,1.0\n"


def test_cpu_rows_are_refused_unless_asked(tmp_path):
    table = tmp_path / "results.csv"
    cpu = rows_from_doc(run_doc(gpu_env={"gpu": "cpu", "libraries": {"torch": "2.13.0+cpu"}}))
    with pytest.raises(ResultsError, match="--allow-cpu"):
        append_rows(table, cpu)
    assert not table.exists()
    assert append_rows(table, cpu, allow_cpu=True) == len(cpu)
    assert {r["gpu"] for r in read(table)} == {"cpu"}


def test_a_merge_gives_medians_with_the_runs_and_both_commands():
    docs = [run_doc(commit="fe8e668"), run_doc(commit="fe8e668"), run_doc(commit="6498cfe")]
    docs[2]["created_at"] = "2026-12-04T14:14:02Z"
    merged = merge.merge(docs, ["a.json", "b.json", "c.json"], allow_mixed_commits=True, command="MERGE")
    rows = {(r["backend"], r["mode"], r["clock"]): r for r in rows_from_doc(merged)}
    r = rows[("eager_test", "fwd", "graph")]
    assert (r["runs"], r["commit"], r["date"]) == ("3", "fe8e668/6498cfe", "2026-12-04T14:14:02Z")
    assert r["command"] == f"{CMD} (in each of 3 processes); merged by MERGE"
    wall = rows[("eager_test", "fwd", "wall")]
    assert (wall["p20_us"], wall["p50_us"], wall["p80_us"], wall["ratio_to_add"]) == (
        "30.000",
        "30.000",
        "30.000",
        "1.0000",
    )


def test_the_cli_appends_a_gpu_run_and_refuses_a_cpu_one_before_timing(tmp_path, monkeypatch, capsys):
    table = tmp_path / "results.csv"
    args = ["--d", "128", "--rows", "2", "--small-rows", "--backends", "reference", "--smoke", "--no-progress"]
    called = []
    monkeypatch.setattr(runner, "run", lambda *a, **k: called.append(1))
    assert cli.main([*args, "--append-results", str(table)]) == 2
    assert "--allow-cpu" in capsys.readouterr().err and not called and not table.exists()
    monkeypatch.undo()
    monkeypatch.setattr(runner, "CpuClock", lambda: FixedClock(1.0))
    assert cli.main([*args, "--append-results", str(table), "--allow-cpu"]) == 0
    rows = read(table)
    assert {r["command"] for r in rows} == {f"python -m rlnorm bench {' '.join(args[:-1])}"}
    assert {r["backend"] for r in rows} == {"torch.add", "reference"} and {r["gpu"] for r in rows} == {"cpu"}


def test_bench_merge_appends_a_saved_file_or_a_merge(tmp_path, capsys):
    table = tmp_path / "results.csv"
    paths = []
    for i, doc in enumerate([run_doc(command=None), run_doc(command=None)]):
        p = tmp_path / f"run{i}.json"
        p.write_text(json.dumps(doc))
        paths.append(str(p))
    assert merge.main([paths[0], "--append-results", str(table)]) == 2  # a saved run without its command
    assert "--command" in capsys.readouterr().err and not table.exists()
    assert merge.main([paths[0], "--append-results", str(table), "--command", "python3 -m rlnorm.bench"]) == 0
    one = read(table)
    assert {r["runs"] for r in one} == {"1"} and {r["command"] for r in one} == {"python3 -m rlnorm.bench"}
    before = table.read_bytes()
    assert merge.main([*paths, "--append-results", str(table), "--command", "two runs, merged"]) == 0
    assert table.read_bytes().startswith(before)
    added = read(table)[len(one) :]
    assert added and {r["runs"] for r in added} == {"2"} and {r["command"] for r in added} == {"two runs, merged"}
    assert merge.main([paths[0], "--append-results", str(table), "--command", "python3 -m rlnorm.bench"]) == 0
    assert "appended 0 rows" in capsys.readouterr().out  # the same file again adds nothing
    assert merge.main(["--append-results", *paths]) == 2  # the option took the first file for the table
    assert "not a .csv table" in capsys.readouterr().err


def test_the_recorded_command_leaves_out_where_results_go():
    p = cli.build_parser()
    argv = ["--quick", "--out", "x.json", "--force", "--append-results", "t.csv", "--allow-cpu", "--no-progress"]
    assert files.command_line("P", argv, p.parse_args(argv)) == "P --quick"
    argv = ["--append-results", "--quick", "--out=x.json", "--variant", "fwd.EXACT=0"]
    assert files.command_line("P", argv, p.parse_args(argv)) == "P --quick --variant fwd.EXACT=0"


def test_the_default_table_is_the_checkouts(tmp_path):
    assert results.results_path("benchmarks/results.csv") == results.default_path()
    assert results.default_path().parts[-2:] == ("benchmarks", "results.csv")
    assert results.results_path(str(tmp_path / "t.csv")) == tmp_path / "t.csv"
