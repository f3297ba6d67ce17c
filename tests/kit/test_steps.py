"""The run's steps on fast CPU backends: a failing backend, check or later step never stops a run or costs what
stands, the verdict is honest about what ran, and what is written is valid."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import KIT_CHECKS, TINY_SIZES

from rlnorm.kit import steps
from rlnorm.kit.artifact import load_artifact, validate_artifact
from rlnorm.kit.backends import Backend
from rlnorm.kit.params import ParamsError, RunParams, load_params
from rlnorm.kit.results import load_run
from rlnorm.options import OpOptions

FAULT = "tests.faults:BatchSizeDependentOutput"
NO_BACKWARD = "tests.faults:ForwardOnlyBatchSize"  # forward only: a run must still judge its forward


class ExplodingSweep(Backend):
    """The reference op, except that any batch of 9 rows raises: only batch_size_sweep meets one."""

    key = ""
    source = "test: raises on 9-row batches"

    def _fn(self, x, z, w, opts: OpOptions):
        if x.shape[0] == 9:
            raise RuntimeError("planted: 9 rows")
        from rlnorm.reference import rms_norm_gated_reference

        return rms_norm_gated_reference(x, z, w, opts)


TINY = {"name": "unit", "device": "cpu", "progress": False, **TINY_SIZES, "accuracy_rows": 31}
TINY["checks"] = [*KIT_CHECKS, "agreement", "stack_pairs"]  # stack_pairs: only where a test runs its step


@pytest.fixture(scope="module")
def backends_done(tmp_path_factory: pytest.TempPathFactory) -> steps.Run:
    """One run of fast backends, as its backends left it (every step-failure test starts from a copy)."""
    out = tmp_path_factory.mktemp("run") / "unit"
    # skipped and unloadable backends: test_backends_vllm.py, test_isolation.py
    custom = [FAULT, "test_steps:ExplodingSweep", NO_BACKWARD]
    run = steps.start_run(
        load_params({**TINY, "output_dir": str(out), "backends": ["reference"], "custom_backends": custom})
    )
    steps.run_backends(run)
    return run


@pytest.fixture(scope="module")
def finished_run(backends_done: steps.Run) -> steps.Run:
    run = copy.deepcopy(backends_done)
    steps.run_agreement(run)
    steps.finish(run)
    return run


def test_every_backend_is_listed_and_the_verdicts_are_honest(finished_run: steps.Run) -> None:
    r = finished_run.result.results
    assert list(r) == ["reference", FAULT, "test_steps:ExplodingSweep", NO_BACKWARD]
    raised = r["test_steps:ExplodingSweep"]  # a check that raises is recorded, and the run goes on
    assert raised.status == "ran" and "planted: 9 rows" in raised.errors["batch_size_sweep"]
    assert raised.batch_invariance.all_rows.sizes[7].fwd_differ == 0 and raised.accuracy_latency.rows == 31
    assert raised.batch_invariance.batch_invariant is None, "no verdict when a batch-invariance check raised"
    assert r["reference"].status == "ran" and r["reference"].batch_invariance.batch_invariant is True
    assert r[FAULT].batch_invariance.batch_invariant is False
    nb = r[NO_BACKWARD].batch_invariance
    assert r[NO_BACKWARD].backward == "none" and nb.dweight_repeatable is None and nb.batch_invariant is False


def test_artifact_and_records_are_written(finished_run: steps.Run) -> None:
    out = Path(finished_run.params.output_dir)
    art = load_artifact(out / steps.ARTIFACT_FILE)
    assert art.quick is True and art.records == steps.RECORDS_FILE and art.failed_steps is None
    assert "staging_dir" not in art.params, "a temp path says nothing to a reader"
    assert load_params(dict(art.params)).name == "unit", "the recorded params reload"
    assert list(art.results) == list(finished_run.result.results)
    assert art.agreement.backends == [k for k, r in art.results.items() if r.status == "ran"]
    df = pd.read_csv(out / steps.RECORDS_FILE)
    assert set(df["backend"]) == {FAULT, NO_BACKWARD}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    t = finished_run.timings
    assert t["backends"] > 0 and "reference:all_rows" in t and t["reference"] > 0


# -- a step after the backends that raises ----------------------------------------------------------------------------
def _resume(done: steps.Run, tmp_path: Path) -> steps.Run:
    """A copy of the run after its backends, staged in a folder of the test's own."""
    run = copy.deepcopy(done)  # its result, records and agreement outputs, staged afresh
    run.out, run.place_at = tmp_path / ".staging", tmp_path / "run"
    run.out.mkdir()
    steps.write(run)
    return run


def _planted(*args: object, **kwargs: object) -> None:
    raise RuntimeError("planted step failure")


def _fail_agreement(run: steps.Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "agreement_from_outputs", _planted)
    steps.run_agreement(run)
    assert run.result.agreement is None


def _fail_stack_pairs(run: steps.Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "run_child", _planted)
    steps.run_agreement(run)  # a step that works, before one that fails: its result stands too
    steps.run_stack_pairs(run)
    assert run.result.stack_pairs is None and run.result.agreement.equal_fraction[0][0] == 1.0


def _fail_plots(run: steps.Run, monkeypatch: pytest.MonkeyPatch) -> None:
    assert steps.run_plots(run, _planted) == {} and run.result.plots == {}


def _fail_page(run: steps.Run, monkeypatch: pytest.MonkeyPatch) -> None:
    assert steps.run_step(run, "page", _planted) is None


@pytest.mark.parametrize("fail", [_fail_agreement, _fail_stack_pairs, _fail_plots, _fail_page])
def test_a_failing_step_is_recorded(backends_done: steps.Run, tmp_path: Path, monkeypatch, fail) -> None:  # type: ignore[no-untyped-def]
    """The step is recorded, every backend's result stands, the folder is placed whole, and the run fails."""
    run, step = _resume(backends_done, tmp_path), fail.__name__.removeprefix("_fail_")
    fail(run, monkeypatch)
    (failure,) = run.result.failed_steps
    assert failure.step == step and failure.error == "RuntimeError: planted step failure"
    assert any("planted step failure" in line for line in failure.traceback)
    with pytest.raises(steps.StepsFailed, match=step):
        steps.finish(run)
    validate_artifact(json.loads((run.out / steps.ARTIFACT_FILE).read_text()))
    placed = load_run(run.out)
    assert [f.step for f in placed.failed_steps] == [step]
    ref = placed.results["reference"]
    assert ref.status == "ran" and ref.batch_invariance.all_rows.sizes[7].fwd_differ == 0
    assert not [p for p in run.out.parent.iterdir() if p.name.startswith(".")], "no staging folder left"


def test_a_step_that_leaves_what_the_artifact_refuses_is_dropped(backends_done: steps.Run, tmp_path: Path) -> None:
    run = _resume(backends_done, tmp_path)

    def body() -> None:
        run.result.quick = "yes"  # type: ignore[assignment] - the schema wants a bool

    steps.run_step(run, "page", body)
    assert run.result.quick is True and run.result.failed_steps[0].step == "page"
    load_artifact(run.out / steps.ARTIFACT_FILE)


def test_plots_are_listed_relative_to_the_run_folder(backends_done: steps.Run, tmp_path: Path) -> None:
    run = _resume(backends_done, tmp_path)

    def make_plots(result, folder: Path) -> dict[str, Path]:
        folder.mkdir()
        (folder / "verdict.png").write_bytes(b"\x89PNG")
        return {"verdict": folder / "verdict.png"}

    steps.run_plots(run, make_plots)
    steps.finish(run)
    placed = load_run(run.out)
    assert placed.plots == {"verdict": "plots/verdict.png"} and placed.resolve("plots/verdict.png").is_file()


# -- before any work -------------------------------------------------------------------------------------------------
def test_is_quick() -> None:
    assert steps.is_quick(RunParams()) is False
    assert steps.is_quick(load_params({"coverage": "sampled", "timing_iters": 5})) is False
    assert steps.is_quick(load_params({"accuracy_rows": 1024})) is True


def test_cuda_device_without_a_gpu_stops_before_any_work(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ParamsError, match="device: 'cuda'"):
        steps.start_run(load_params({**TINY, "device": "cuda", "output_dir": str(tmp_path / "r")}))
    assert not (tmp_path / "r").exists()


def test_a_malformed_commit_variable_stops_the_run_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = load_params({**TINY, "output_dir": str(tmp_path / "r")})
    for var, value in (("RLNORM_COMMIT", "not-a-hash"), ("RLNORM_TREE_DIRTY", "maybe")):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(ValueError, match=var):
                steps.start_run(params)
        assert not (tmp_path / "r").exists() and not list(tmp_path.iterdir())
    monkeypatch.setenv("RLNORM_COMMIT", "abcdef0")
    monkeypatch.setenv("RLNORM_TREE_DIRTY", "1")
    run = steps.start_run(params)
    monkeypatch.delenv("RLNORM_COMMIT")  # read once, at the start: the artifact says what the run started with
    steps.write(run)
    art = load_artifact(run.out / steps.ARTIFACT_FILE)
    assert (art.commit, art.tracked_tree_dirty) == ("abcdef0", True)


def test_an_interrupt_while_starting_the_next_process_closes_the_one_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[FakeWorker] = []

    class FakeWorker:
        def __init__(self, spec: str, *args: object) -> None:
            if made:  # the next backend's process, started ahead on the CPU
                raise KeyboardInterrupt
            self.closed = False
            made.append(self)

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(steps, "BackendWorker", FakeWorker)
    run = steps.start_run(load_params({**TINY, "backends": ["reference", "rlnorm"], "output_dir": str(tmp_path / "r")}))
    with pytest.raises(KeyboardInterrupt):
        steps.run_backends(run)
    assert len(made) == 1 and made[0].closed
