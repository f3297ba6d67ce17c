"""Merging bench runs of separate processes: medians, same-run ratios, per-run verdicts, refusals."""

from __future__ import annotations

import json

import pytest

from rlnorm import timing
from rlnorm.bench import files, runner
from rlnorm.bench.merge import MergeError, main, merge


def run_doc(add_us: float, times: dict[str, float], commit: str = "abc1234", gpu: str = "NVIDIA H200") -> dict:
    """One bench file's worth: a 32x128 shape timed by graph, backends' fwd times in us."""
    entries = [runner.entry("torch.add", "fwd", timing.Timing(add_us, add_us, add_us), add_us, 1, method="graph")]
    for name, us in times.items():
        if us is None:
            entries.append(runner.entry(name, "fwd", None, None, 1, "failed", "boom"))
        else:
            entries.append(runner.entry(name, "fwd", timing.Timing(us, us, us), add_us, 1, method="graph"))
    shape = {
        "rows": 32,
        "d": 128,
        "dtype": "bfloat16",
        "graph_tried": True,
        "add_us": add_us,
        "add": {},
        "add_notes": {},
        "entries": entries,
        "fastest_peer": runner.fastest_peer(entries),
    }
    return {
        "kind": "rlnorm.bench",
        "commit": commit,
        "tracked_tree_dirty": False,
        "environment": {"gpu": gpu},
        "complete": True,
        "shapes": [shape],
    }


RUNS = [  # the peer moves between processes; rlnorm does not
    run_doc(1.0, {"rlnorm": 3.0, "peer": 2.0}),
    run_doc(2.0, {"rlnorm": 3.0, "peer": 4.0}),
    run_doc(1.0, {"rlnorm": 3.0, "peer": 5.0}),
]
PATHS = ["a.json", "b.json", "c.json"]


def entry_of(merged: dict, name: str) -> dict:
    return next(e for e in merged["shapes"][0]["entries"] if e["name"] == name and e["mode"] == "fwd")


def test_medians_spread_and_per_run_verdicts():
    m = merge(RUNS, PATHS)
    peer = entry_of(m, "peer")
    assert (peer["us"], peer["us_p20"], peer["us_p80"], peer["runs_ok"]) == (4.0, 2.0, 5.0, 3)
    v = m["shapes"][0]["verdict"]["fwd"]
    assert (v["runs"], v["runs_no_slower"]) == (3, 2)  # slower only in the run where the peer took 2 us
    assert v["median_ratio"] == pytest.approx(0.75)
    assert m["shapes"][0]["fastest_peer"]["fwd"]["rlnorm_over_fastest"] == pytest.approx(3.0 / 4.0)


def test_ratios_stay_same_run_ratios():
    # each run's time over ITS OWN add, then the median of those: 4/1, 2/2, 3/4 -> 1.0. The fault
    # this guards against, the median time over the median add of other processes, gives 3/2 = 1.5
    runs = [run_doc(1.0, {"rlnorm": 4.0}), run_doc(2.0, {"rlnorm": 2.0}), run_doc(4.0, {"rlnorm": 3.0})]
    m = merge(runs, PATHS)
    mine = entry_of(m, "rlnorm")
    assert mine["ratio"] == pytest.approx(1.0)  # per run 4.0, 1.0, 0.75 -> median 1.0
    assert mine["us"] / m["shapes"][0]["add_us"] == pytest.approx(1.5)  # the cross-process ratio: not used


def test_a_backend_failing_in_one_run_is_counted_not_dropped():
    runs = [run_doc(1.0, {"rlnorm": 3.0, "peer": None}), *RUNS[1:]]
    peer = entry_of(merge(runs, PATHS), "peer")
    assert (peer["runs_ok"], peer["runs"], peer["status"]) == (2, 3, "ok")
    assert peer["not_ok"] == "failed: boom"
    dead = entry_of(merge([run_doc(1.0, {"peer": None})] * 2, PATHS[:2]), "peer")
    assert (dead["status"], dead["us"], dead["reason"]) == ("failed", None, "boom")


def test_refuses_mixed_commits_unless_asked_and_mixed_gpus_always():
    other = run_doc(1.0, {"rlnorm": 3.0}, commit="def5678")
    with pytest.raises(MergeError, match="runs: expected one commit"):
        merge([RUNS[0], other], PATHS[:2])
    assert merge([RUNS[0], other], PATHS[:2], allow_mixed_commits=True)["shapes"]
    b200 = run_doc(1.0, {"rlnorm": 3.0}, gpu="NVIDIA B200")
    with pytest.raises(MergeError, match="runs: expected one GPU"):
        merge([RUNS[0], b200], PATHS[:2], allow_mixed_commits=True)
    with pytest.raises(MergeError, match="at least 2"):
        merge(RUNS[:1], PATHS[:1])


def test_cli_writes_once_and_names_a_bad_file(tmp_path, capsys):
    paths = []
    for i, doc in enumerate(RUNS):
        p = tmp_path / f"run{i}.json"
        p.write_text(json.dumps(doc))
        paths.append(str(p))
    out = tmp_path / "merged.json"
    assert main([*paths, "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["kind"] == "rlnorm.bench.merged" and [s["path"] for s in merged["sources"]] == paths
    assert "no slower than the fastest peer in 2 of 3 runs" in capsys.readouterr().out
    assert main([*paths, "--out", str(out)]) == files.EXIT_EXISTS  # never overwritten silently
    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    assert main([paths[0], str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err
