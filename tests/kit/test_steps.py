"""The runner's steps on fast CPU backends (no notebook, no gates): one backend failing or one check
raising never stops a run, the verdict is honest about what ran, and what is written is valid."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import TINY_SIZES

from rlnorm.kit import checks, steps
from rlnorm.kit.artifact import read_artifact
from rlnorm.kit.backends import Backend, Grads
from rlnorm.kit.params import ParamsError, RunParams, load_params
from rlnorm.options import OpOptions
from rlnorm.report import tables

FAULT = "tests.faults:BatchSizeDependentOutput"


class ExplodingSweep(Backend):
    """The reference op, except that any batch of 9 rows raises: only batch_size_sweep meets one."""

    key = ""
    source = "test: raises on 9-row batches"

    def _fn(self, x, z, w, opts: OpOptions):
        if x.shape[0] == 9:
            raise RuntimeError("planted: 9 rows")
        from rlnorm.reference import rms_norm_gated_reference

        return rms_norm_gated_reference(x, z, w, opts)


class NoBackwardFault(Backend):
    """Forward only, batch-size dependent: a run must still judge its forward."""

    key = ""
    source = "test: forward only, batch-size dependent"
    has_backward = False

    def forward(self, x, z, w, opts: OpOptions):
        from tests.faults import BatchSizeDependentOutput

        return BatchSizeDependentOutput().forward(x, z, w, opts)

    def forward_backward(self, x, z, w, dy, opts) -> Grads:  # pragma: no cover - never called
        raise AssertionError("no backward")


TINY = {
    "name": "unit",
    "device": "cpu",
    "progress": False,
    **TINY_SIZES,
    "accuracy_rows": 31,
    "checks": [
        "all_rows",
        "dweight_repeatable",
        "full_vs_sub_batches",
        "batch_size_sweep",
        "accuracy_latency",
        "agreement",
    ],
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> steps.Run:
    out = tmp_path_factory.mktemp("run") / "unit"
    params = load_params(
        {
            **TINY,
            "output_dir": str(out),
            "backends": ["reference", "fla_fused_norm_gate"],  # FLA fused cannot run on a CPU
            "custom_backends": [
                FAULT,
                "test_steps:ExplodingSweep",
                "test_steps:NoBackwardFault",
                "test_steps:no_such_attr",
            ],
        }
    )
    run = steps.start_run(params)
    steps.run_backends(run)
    steps.run_gates(run)  # not selected: a no-op that still returns a table
    steps.run_agreement(run)
    tables.make_plots(run)
    steps.finish(run)
    return run


def test_every_backend_is_listed_with_a_status(finished_run: steps.Run) -> None:
    table = tables.backend_table(finished_run)
    assert list(table.index) == [
        "reference",
        "fla_fused_norm_gate",
        FAULT,
        "test_steps:ExplodingSweep",
        "test_steps:NoBackwardFault",
        "test_steps:no_such_attr",
    ]
    assert table.loc["reference", "status"] == "ran"
    assert table.loc["fla_fused_norm_gate", "status"] == "skipped" and table.loc["fla_fused_norm_gate", "why"]
    assert table.loc["test_steps:no_such_attr", "status"] == "failed"
    assert "no attribute" in table.loc["test_steps:no_such_attr", "why"]
    assert table.loc["test_steps:NoBackwardFault", "backward"] == "none"


def test_a_check_that_raises_is_recorded_and_the_run_goes_on(finished_run: steps.Run) -> None:
    res = finished_run.results["test_steps:ExplodingSweep"]
    assert res["status"] == "ran"
    assert "batch_size_sweep" in res["errors"] and "planted: 9 rows" in res["errors"]["batch_size_sweep"]
    bi = res["batch_invariance"]
    assert bi["all_rows"]["7"]["fwd_differ"] == 0, "the checks before and after the failing one still ran"
    assert res["accuracy_latency"]["rows"] == 31
    assert bi["batch_invariant"] is None, "no verdict when a batch-invariance check raised"


def test_verdicts_are_honest(finished_run: steps.Run) -> None:
    r = finished_run.results
    assert r["reference"]["batch_invariance"]["batch_invariant"] is True
    assert r[FAULT]["batch_invariance"]["batch_invariant"] is False
    nb = r["test_steps:NoBackwardFault"]["batch_invariance"]
    assert nb["dweight_repeatable"] is None and nb["batch_invariant"] is False
    fused = r["fla_fused_norm_gate"]
    assert fused["batch_invariance"] == {} and fused["accuracy_latency"] is None


def verdict(summaries: dict) -> bool | None:
    return checks.batch_invariant(*(summaries.get(name) for name in checks.INVARIANCE_CHECKS))


def test_verdict_rule() -> None:
    clean = {
        "all_rows": {"7": {"rows": 7, "fwd_differ": 0, "rowgrad_differ": 0}},
        "dweight_repeatable": {"dweight_repeatable": True},
        "full_vs_sub_batches": {"fwd_differ": 0, "rowgrad_differ": 0},
        "batch_size_sweep": {"differ": 0},
    }
    assert verdict(clean) is True
    assert verdict({**clean, "batch_size_sweep": {"differ": 1}}) is False
    assert verdict({**clean, "dweight_repeatable": {"dweight_repeatable": False}}) is False
    missing = {k: v for k, v in clean.items() if k != "full_vs_sub_batches"}
    assert verdict(missing) is None
    assert verdict({**missing, "all_rows": {"7": {"fwd_differ": 2}}}) is False


def test_artifact_records_and_plots_are_written(finished_run: steps.Run) -> None:
    out = Path(finished_run.params.output_dir)
    art = read_artifact(out / steps.ARTIFACT_FILE)
    assert art["quick"] is True and art["records"] == steps.RECORDS_FILE
    assert "staging_dir" not in art["params"], "a temp path says nothing to a reader"
    assert load_params({k: v for k, v in art["params"].items()}).name == "unit", "the recorded params reload"
    assert set(art["results"]) == set(finished_run.results)
    assert art["agreement"]["backends"] == [k for k, r in finished_run.results.items() if r["status"] == "ran"]
    for rel in art["plots"].values():
        assert (out / rel).read_bytes()[:4] == b"\x89PNG"
    df = pd.read_csv(out / steps.RECORDS_FILE)
    assert set(df["backend"]) == {FAULT, "test_steps:NoBackwardFault"}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_tables_for_the_notebook(finished_run: steps.Run) -> None:
    inv = tables.invariance_table(finished_run)
    assert inv.loc["reference", "batch_invariant"] is True and inv.loc["reference", "all_rows fwd_differ"] == 0
    assert "batch_size_sweep" in inv.loc["test_steps:ExplodingSweep", "errors"]
    acc = tables.accuracy_table(finished_run)
    assert "fla_fused_norm_gate" not in acc.index and acc.loc["reference", "rows"] == 31
    assert "*" not in acc.loc["reference", "fwd us (p20-p80)"]  # the CPU clock never runs host bound
    star = tables._span({"fwd_us": 64.0, "fwd_us_p20": 63.0, "fwd_us_p80": 65.0, "host_bound": {"fwd": True}}, "fwd_us")
    assert star == "64.0* (63.0-65.0)"
    assert tables._span({"fwd_bwd_us": 9.0, "host_bound": {"fwd": True}}, "fwd_bwd_us") == "9.0"
    params = tables.params_table(finished_run)
    assert "staging_dir" not in params.index and params.loc["sweep_n", "full protocol"] == "4097"
    env = tables.environment_table(finished_run)
    assert env.loc["torch", "value"] == torch.__version__ and "commit" in env.index
    verdict = tables.verdict_markdown(finished_run)
    assert "**reference**: batch invariant" in verdict and f"**{FAULT}**: **not** batch invariant" in verdict
    assert "**fla_fused_norm_gate**: skipped" in verdict
    assert "CPU run" in tables.device_notice(finished_run)
    summary = finished_run.timings
    assert summary["backends"] > 0 and "reference:all_rows" in summary and summary["reference"] > 0
    slow = tables.time_table(finished_run, top=3)
    assert len(slow) == 3 and list(slow["seconds"]) == sorted(slow["seconds"], reverse=True)


def test_params_from_namespace_refuses_what_the_notebook_does_not_declare() -> None:
    ns = {"name": "x", "In": [], "_private": 1, "np": None, "bogus": 3}
    before = {"np", "In"}
    with pytest.raises(ParamsError, match="bogus: unknown parameter"):
        steps.params_from_namespace(ns, before)
    ns.pop("bogus")
    assert steps.params_from_namespace(ns, before).name == "x"
    # a re-run in JupyterLab: the declared names already exist before the snapshot and are still read
    assert steps.params_from_namespace({"name": "again"}, {"name"}).name == "again"


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
    assert (run.commit, run.dirty) == ("abcdef0", True)
    steps.write_artifact_and_records(run)
    assert (run.artifact["commit"], run.artifact["tracked_tree_dirty"]) == ("abcdef0", True)


def test_an_interrupt_while_starting_the_next_process_closes_the_one_started(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[FakeProcess] = []

    class FakeProcess:
        def __init__(self, spec: str, *args: object) -> None:
            if made:  # the next backend's process, started ahead on the CPU
                raise KeyboardInterrupt
            self.closed = False
            made.append(self)

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(steps.isolation, "BackendProcess", FakeProcess)
    run = steps.Run(params=load_params({**TINY, "backends": ["reference", "rlnorm"]}), device="cpu")
    with pytest.raises(KeyboardInterrupt):
        steps.run_backends(run)
    assert len(made) == 1 and made[0].closed


def test_a_trainer_sampler_child_that_leaves_half_a_result_is_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # the child writes a result file that is not JSON: the step records that, the run goes on
    monkeypatch.setattr(steps, "TRAINER_SAMPLER_CHILD", "import sys; open(sys.argv[2], 'w').write('{\"summ')")
    run = steps.Run(params=load_params({**TINY, "checks": ["trainer_sampler"]}), device="cpu")
    steps.run_trainer_sampler(run)
    assert run.trainer_sampler == {"error": "its process left no readable result; last line: (no stderr)"}
