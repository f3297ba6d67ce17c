"""`python -m benchmarks.run` on the CPU: every backend and variant timed beside the same run's add, failures kept
as lines, refusals before any timing, a cut run's finished shapes kept. No speed claim rests on these times."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import run, runner
from benchmarks.variants import VariantBackend, VariantError, parse_variant, parse_variants
from rlnorm.inputs import make_case
from rlnorm.kit import environment
from rlnorm.kit.backends import ReferenceBackend, RlnormBackend, UnavailableBackend
from rlnorm.options import OpOptions
from rlnorm.timing import CpuClock, Timing

ARGS = ["--d", "128", "--rows", "3", "--small-rows", "--smoke", "--no-progress"]


class Broken(ReferenceBackend):
    """Its backward fails on the timed shape (5 rows), past the availability probe."""

    key = "broken"

    def forward_backward(self, x, z, w, dy, opts):
        if x.shape[0] == 5:
            raise RuntimeError("planted failure in the backward")
        return super().forward_backward(x, z, w, dy, opts)


def by_key(shape: dict) -> dict[tuple[str, str], dict]:
    return {(e["name"], e["mode"]): e for e in shape["entries"]}


def test_a_run_times_every_backend_and_variant_beside_the_add(tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = [*ARGS, "--backends", "reference", "--variant", "fwd.EXACT=0", "--out", str(out)]
    assert run.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == runner.RUN and doc["complete"] and doc["clock"].startswith("cpu")
    assert doc["command"] == "python -m benchmarks.run " + " ".join(a for a in argv[:-2] if a != "--no-progress")
    (shape,) = doc["shapes"]
    by = by_key(shape)
    # the variant's line follows plain rlnorm, added because a variant needs it beside
    names = list(dict.fromkeys(e["name"] for e in shape["entries"]))
    assert names == ["torch.add", "rlnorm", "rlnorm[fwd.EXACT=0]", "reference"]
    for key in names[1:]:
        for mode in ("fwd", "fwd_bwd"):
            e = by[(key, mode)]
            assert e["status"] == "ok" and e["method"] == "events" and e["add_us"] == shape["add"]["events"]["us"]
            floor = e["add_us"] * (8 / 3 if mode == "fwd_bwd" else 1)
            assert e["ratio"] == pytest.approx(e["us"] / floor)
    assert doc["variants"] == {"rlnorm[fwd.EXACT=0]": {"fwd": {"EXACT": 0}, "bwd": {}}}
    assert not (tmp_path / "run.json.partial").exists()
    assert "| 3 | 128 | rlnorm[fwd.EXACT=0] |" in capsys.readouterr().out
    # an existing file is kept, refused before any timing
    assert run.main([*ARGS, "--backends", "reference", "--out", str(out)]) == run.EXIT_EXISTS
    assert json.loads(out.read_text()) == doc


def test_a_variant_line_runs_under_its_switches():
    # rows 344..351 of the standard data hold an element the fast path alone rounds wrongly (docs/kernel.md):
    # the EXACT=0 line gives other bits than rlnorm, and only inside its context
    c = make_case(1024, 128, seed=11).rows(slice(344, 352))
    plain, variant = RlnormBackend(), VariantBackend(parse_variant("fwd.EXACT=0"))
    want = plain.forward(c.x, c.z, c.w, OpOptions())
    with variant.context():
        assert not torch.equal(variant.forward(c.x, c.z, c.w, OpOptions()), want)
    assert torch.equal(variant.forward(c.x, c.z, c.w, OpOptions()), want)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["fwd.EXACT"], "expected fwd.NAME=VALUE"),
        (["mid.EXACT=0"], "expected fwd.NAME=VALUE"),
        (["fwd.EXACT=O"], "expected an integer"),
        (["fwd.EXACT=0,fwd.EXACT=1"], "twice"),
        (["fwd.NO_SUCH=1"], "unknown forward switch 'NO_SUCH'"),
        (["bwd.STAGES=99"], "STAGES=99 is not allowed"),
        (["fwd.EXACT=0,bwd.STAGES=2", "bwd.STAGES=2,fwd.EXACT=0"], "given twice"),  # the same variant twice
    ],
)
def test_a_bad_variant_is_refused_naming_what_is_wrong(specs, message, capsys):
    with pytest.raises(VariantError, match=message):
        parse_variants(specs)
    flags = [arg for spec in specs for arg in ("--variant", spec)]
    assert run.main([*ARGS, *flags]) == 2 and message in capsys.readouterr().err


def test_a_failing_or_unavailable_backend_is_a_line_with_its_reason():
    missing = UnavailableBackend("missing", "not installed here")
    shape = runner.bench_shape(5, 128, [Broken(), missing, ReferenceBackend()], "cpu", CpuClock(), runner.SMOKE)
    by = by_key(shape)
    assert by[("broken", "fwd")]["status"] == "ok"
    assert by[("broken", "fwd_bwd")]["status"] == "failed" and "planted failure" in by[("broken", "fwd_bwd")]["reason"]
    assert by[("missing", "fwd")]["status"] == by[("missing", "fwd_bwd")]["status"] == "unavailable"
    assert by[("reference", "fwd_bwd")]["status"] == "ok"  # the table goes on after a failure
    assert "no CUDA graphs" in by[("reference", "fwd")]["method_reason"]


def test_fastest_peer_leaves_out_the_add_rlnorm_and_its_variants():
    t = Timing

    def e(name: str, us: float, wall: float) -> dict:
        return runner.entry(name, "fwd", "ok", "", t(us, us, us), add_us=1.0, wall=t(wall, wall, wall), method="graph")

    entries = [e("torch.add", 1, 1), e("rlnorm", 4, 20), e("rlnorm[fwd.EXACT=0]", 2, 5), e("a", 3, 40), e("b", 5, 10)]
    fp = runner.fastest_peer(entries)
    assert fp["fwd"]["name"] == "a" and fp["fwd"]["rlnorm_over_fastest"] == pytest.approx(4 / 3)
    assert fp["fwd"]["wall"]["name"] == "b" and fp["fwd"]["wall"]["rlnorm_over_fastest"] == pytest.approx(2.0)
    assert fp["fwd_bwd"] is None


def test_a_cut_run_keeps_its_finished_shapes(tmp_path, monkeypatch):
    real, done = runner.bench_shape, []

    def cut_after_one(*a, **k):
        if done:
            raise KeyboardInterrupt("planted: the run is cut")
        done.append(1)
        return real(*a, **k)

    monkeypatch.setattr(runner, "bench_shape", cut_after_one)
    out = tmp_path / "run.json"
    with pytest.raises(KeyboardInterrupt):
        run.main([*ARGS, "--rows", "2", "3", "--backends", "reference", "--out", str(out)])  # the last --rows wins
    part = json.loads((tmp_path / "run.json.partial").read_text())
    assert not out.exists() and part["complete"] is False and [s["rows"] for s in part["shapes"]] == [2]


def test_a_stated_commit_wins_over_git(monkeypatch):
    """The GPU copy of the tree may carry a stale .git: $RLNORM_COMMIT, when given, is what is recorded."""
    monkeypatch.setattr(environment, "git_commit", lambda repo_dir=None: "0" * 40)
    monkeypatch.setattr(environment, "tracked_tree_dirty", lambda repo_dir=None: True)
    monkeypatch.setenv(environment.COMMIT_ENV, "A5D5072")
    monkeypatch.setenv(environment.DIRTY_ENV, "0")
    v = runner.code_version()
    assert v["commit"] == "a5d5072" and v["tracked_tree_dirty"] is False and v["git_head"] == "0" * 40
    monkeypatch.setenv(environment.DIRTY_ENV, "maybe")
    with pytest.raises(ValueError, match="RLNORM_TREE_DIRTY"):
        runner.code_version()
