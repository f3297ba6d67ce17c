"""`python -m rlnorm bench` on the CPU: the JSON and markdown it writes, refusals, a cut run."""

from __future__ import annotations

import json

import pytest
from bench_fakes import FixedClock

from rlnorm.bench import cli, files, runner

ARGS = ["--d", "128", "--rows", "2", "--small-rows", "--backends", "reference", "--quick", "--no-progress"]


def test_main_writes_json_and_markdown(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "CpuClock", lambda: FixedClock(1.0))
    out = tmp_path / "bench.json"
    assert cli.main([*ARGS, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "rlnorm.bench"
    assert [s["rows"] for s in data["shapes"]] == [2]
    assert {e["name"] for e in data["shapes"][0]["entries"]} == {"torch.add", "reference"}
    env = data["environment"]
    assert env["libraries"]["torch"] and "triton" in env["libraries"] and "gpu" in env
    assert "commit" in data and data["settings"]["reps"] == runner.QUICK.reps
    assert data["complete"] is True
    assert not list(tmp_path.glob(".bench.json.*"))  # the atomic writer left no temp file
    assert not (tmp_path / "bench.json.partial").exists()  # the per-shape partial file is gone once whole
    printed = capsys.readouterr().out
    assert "| 2 | 128 | reference |" in printed and "commit" in printed


def test_main_refuses_to_overwrite_without_force(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "CpuClock", lambda: FixedClock(1.0))
    out = tmp_path / "bench.json"
    out.write_text("keep me")
    called = []
    monkeypatch.setattr(runner, "run", lambda *a, **k: called.append(1))
    assert cli.main([*ARGS, "--out", str(out)]) == files.EXIT_EXISTS
    assert out.read_text() == "keep me" and not called  # refused before any timing
    monkeypatch.undo()
    monkeypatch.setattr(runner, "CpuClock", lambda: FixedClock(1.0))
    assert cli.main([*ARGS, "--out", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["kind"] == "rlnorm.bench"


def test_main_rejects_bad_settings():
    with pytest.raises(SystemExit):
        cli.main([*ARGS, "--graph-calls", "0"])


def test_a_cut_run_keeps_its_finished_shapes(tmp_path, monkeypatch):
    """Each finished shape is written to OUT.partial, so a timeout still leaves numbers behind."""
    monkeypatch.setattr(runner, "CpuClock", lambda: FixedClock(1.0))
    real = runner.bench_shape
    done = []

    def cut_after_one(*a, **k):
        if done:
            raise KeyboardInterrupt("planted: the run is cut")
        done.append(1)
        return real(*a, **k)

    monkeypatch.setattr(runner, "bench_shape", cut_after_one)
    out = tmp_path / "bench.json"
    args = ["--d", "128", "--rows", "2", "3", "--small-rows", "--backends", "reference", "--quick", "--no-progress"]
    with pytest.raises(KeyboardInterrupt):
        cli.main([*args, "--out", str(out)])
    assert not out.exists()
    part = json.loads((tmp_path / "bench.json.partial").read_text())
    assert part["complete"] is False and [s["rows"] for s in part["shapes"]] == [2]
