"""Runs of separate processes merged (every ratio still to its own run's add), and the append-only results table."""

from __future__ import annotations

import csv
import json

import pytest

from benchmarks import merge, results, run, runner
from rlnorm.timing import Timing


def one_run(rlnorm_us: float, peer_us: float, add_us: float, commit: str = "a" * 40, gpu: str = "NVIDIA H200") -> dict:
    """A run's document as `runner.run` writes it: one shape, the add, rlnorm and one peer (forward only)."""

    def e(name: str, us: float) -> dict:
        return runner.entry(name, "fwd", "ok", "", Timing(us, us * 0.9, us * 1.1), add_us=add_us, method="graph")

    entries = [e("torch.add", add_us), e("rlnorm", rlnorm_us), e("peer", peer_us)]
    shape = {"rows": 32, "d": 128, "dtype": "bfloat16", "add_us": add_us, "entries": entries, "graph_tried": True}
    shape["fastest_peer"] = runner.fastest_peer(entries)
    return {
        "kind": runner.RUN,
        "command": "python -m benchmarks.run --quick",
        "environment": {"gpu": gpu, "libraries": {"torch": "2.13.0", "triton": "3.7.1"}},
        "commit": commit,
        "tracked_tree_dirty": False,
        "created_at": "2026-12-06T10:00:00Z",
        "shapes": [shape],
    }


def test_medians_are_of_same_run_ratios_and_the_verdict_counts_runs():
    # run 2 ran slow throughout (its add too): its ratio is the same as run 1's, and so is the median
    runs = [one_run(4.0, 5.0, 2.0), one_run(8.0, 10.0, 4.0), one_run(6.0, 5.0, 2.0)]
    m = merge.merge(runs, ["r1", "r2", "r3"], command="merge")
    (shape,) = m["shapes"]
    mine = next(e for e in shape["entries"] if e["name"] == "rlnorm")
    assert mine["ratio"] == pytest.approx(2.0) and mine["us"] == 6.0 and (mine["us_p20"], mine["us_p80"]) == (4, 8)
    assert mine["runs_ok"] == 3
    v = shape["verdict"]["fwd"]
    assert (v["runs"], v["runs_no_slower"], v["median_ratio"]) == (3, 2, pytest.approx(0.8))


def test_runs_of_other_gpus_or_commits_are_refused():
    with pytest.raises(merge.MergeError, match="one GPU"):
        merge.merge([one_run(1, 1, 1), one_run(1, 1, 1, gpu="NVIDIA H100")], ["a", "b"], allow_mixed_commits=True)
    mixed = [one_run(1, 1, 1), one_run(1, 1, 1, commit="b" * 40)]
    with pytest.raises(merge.MergeError, match="allow-mixed-commits"):
        merge.merge(mixed, ["a", "b"])
    assert merge.merge(mixed, ["a", "b"], allow_mixed_commits=True)["sources"][1]["commit"] == "b" * 40


def test_appending_never_rewrites_a_row_and_skips_those_present(tmp_path):
    table = tmp_path / "results.csv"
    table.write_text(",".join(results.COLUMNS) + "\nkept,as,it,was" + ",x" * 12)  # no final newline
    before = table.read_text()
    rows = results.rows_from_doc(one_run(4.0, 5.0, 2.0))
    assert len(rows) == 3 and {r["clock"] for r in rows} == {"graph"} and rows[1]["ratio_to_add"] == "2.0000"
    assert results.append_rows(table, rows) == 3
    assert results.append_rows(table, rows) == 0  # already there
    text = table.read_text()
    assert text.startswith(before + "\n") and len(list(csv.reader(text.splitlines()))) == 5
    (tmp_path / "other.csv").write_text("a,b\n")
    with pytest.raises(results.ResultsError, match="columns"):
        results.append_rows(tmp_path / "other.csv", rows)
    with pytest.raises(results.ResultsError, match="allow-cpu"):
        results.append_rows(table, results.rows_from_doc(one_run(1, 1, 1, gpu="cpu")))


def test_the_command_line_merges_appends_and_appends_a_saved_file(tmp_path, capsys):
    paths = []
    for i, (mine, add) in enumerate([(4.0, 2.0), (8.0, 4.0)]):
        paths.append(str(tmp_path / f"run{i}.json"))
        (tmp_path / f"run{i}.json").write_text(json.dumps(one_run(mine, 5.0, add)))
    table, out = tmp_path / "results.csv", tmp_path / "merged.json"
    assert run.main(["--merge", *paths, "--out", str(out), f"--append-results={table}"]) == 0
    merged = json.loads(out.read_text())
    assert merged["kind"] == merge.MERGED and "no slower than the fastest peer in 1 of 2" in capsys.readouterr().out
    rows = list(csv.DictReader(table.read_text().splitlines()))
    assert {r["runs"] for r in rows} == {"2"} and "merged by python -m benchmarks.run --merge" in rows[0]["command"]
    # one saved run: its own rows, the command it records
    assert run.main(["--merge", paths[0], "--append-results", str(table)]) == 0
    rows = list(csv.DictReader(table.read_text().splitlines()))
    assert rows[-1]["command"] == "python -m benchmarks.run --quick" and rows[-1]["runs"] == "1"
    assert run.main(["--merge", paths[0]]) == 2 and "at least 2" in capsys.readouterr().err
