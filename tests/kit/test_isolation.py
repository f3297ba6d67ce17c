"""Each backend's checks run in a process of their own: a planted backend that segfaults, exits, hangs or leaves
the GPU in an error state past some batch size is recorded with its cause and the batch it died on, keeps the
checks it finished, and the other backends' results stand."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_SIZES

from rlnorm.kit import isolation, steps
from rlnorm.kit.artifact import read_artifact, validate_artifact
from rlnorm.kit.faults import HangPastRows
from rlnorm.kit.params import load_params
from rlnorm.kit.records import rebuild_case

SEGFAULT = "rlnorm.kit.faults:SegfaultPastRows"
EXIT = "rlnorm.kit.faults:ExitPastRows"
EXACT = "rlnorm.kit.backends.local:ExactReferenceBackend"  # a correct backend, run after a crash
DEVICE_ERROR = "rlnorm.kit.faults:DeviceErrorPastRows"
CHECKS = ["all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep", "accuracy_latency", "agreement"]
# TINY_SIZES' batches stay at 15 rows or fewer until accuracy_latency's 63: the planted faults (past 50 rows) die there
FINISHED = ["all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep"]


class HangPastEightRows(HangPastRows):
    """Hangs at full_vs_sub_batches' 15-row batch: early, so the test's time limit can be short."""

    key = "test_isolation:HangPastEightRows"
    limit = 8


def _params(tmp_path: Path, custom: list[str], **kw) -> dict:
    return {
        "name": "iso",
        "device": "cpu",
        "progress": False,
        "backends": ["reference"],
        "custom_backends": custom,
        "checks": CHECKS,
        **TINY_SIZES,
        "output_dir": str(tmp_path / "run"),
        **kw,
    }


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory: pytest.TempPathFactory) -> steps.Run:
    run = steps.start_run(load_params(_params(tmp_path_factory.mktemp("iso"), [SEGFAULT, EXACT, EXIT])))
    steps.run_backends(run)
    steps.run_agreement(run)
    steps.write_artifact_and_records(run)
    return run


@pytest.mark.slow
def test_a_segfault_is_recorded_with_its_signal_check_and_batch(crashed_run: steps.Run) -> None:
    r = crashed_run.results[SEGFAULT]
    assert r["status"] == "crashed"
    crash = r["crash"]
    assert crash["signal"] == "SIGSEGV" and crash["cause"] == "killed by SIGSEGV (signal 11)"
    assert crash["check"] == "accuracy_latency" and crash["batch_size"] == 63
    assert crash["finished_checks"] == FINISHED
    assert "reading address 0 on a batch of 63 rows" in crash["stderr_tail"]
    assert r["skip_reason"] == "killed by SIGSEGV (signal 11) in accuracy_latency at a batch of 63 rows"
    # what it finished before it died stands
    assert r["batch_invariance"]["all_rows"]["7"]["fwd_differ"] == 0
    assert r["batch_invariance"]["full_vs_sub_batches"]["rows_compared"] == 30  # sizes 1 and 7 over 15 rows
    assert r["accuracy_latency"] is None


@pytest.mark.slow
def test_an_exit_is_recorded_with_its_code(crashed_run: steps.Run) -> None:
    crash = crashed_run.results[EXIT]["crash"]
    assert crashed_run.results[EXIT]["status"] == "crashed"
    assert crash["exit_code"] == 3 and crash["signal"] is None and crash["cause"] == "exited with code 3"
    assert crash["check"] == "accuracy_latency" and crash["batch_size"] == 63


@pytest.mark.slow
def test_the_other_backends_complete_and_the_artifact_validates(crashed_run: steps.Run) -> None:
    for key in ("reference", EXACT):  # before the crashes, and between them
        ref = crashed_run.results[key]
        assert ref["status"] == "ran" and ref["batch_invariance"]["batch_invariant"] is True and not ref["errors"]
        assert ref["accuracy_latency"]["rows"] == 63
    assert crashed_run.agreement["backends"] == ["reference", EXACT], "a backend that died first has no row"
    assert crashed_run.agreement["equal_fraction"] == [[1.0, 1.0], [1.0, 1.0]]
    art = read_artifact(crashed_run.artifact_path)
    validate_artifact(art)
    assert art["results"][SEGFAULT]["crash"]["signal"] == "SIGSEGV"


@pytest.mark.slow
def test_the_trail_rebuilds_the_batch_it_died_on(crashed_run: steps.Run) -> None:
    spec = crashed_run.results[SEGFAULT]["crash"]["rebuild"]
    rb = rebuild_case(spec)
    assert rb.check == "accuracy_latency" and rb.batch.x.shape == (63, 128)
    assert isolation.describe_exit(-signal.SIGSEGV) == ("killed by SIGSEGV (signal 11)", "SIGSEGV")


@pytest.mark.slow
def test_a_hang_is_ended_at_the_time_limit(tmp_path: Path) -> None:
    params = load_params(_params(tmp_path, [HangPastEightRows.key], backends=[], backend_timeout_s=20.0))
    out = isolation.run_backend(HangPastEightRows.key, params.as_dict(), "cpu", params.backend_timeout_s)
    r = out.result
    assert r["status"] == "timed_out" and r["crash"]["timed_out"] is True
    assert r["crash"]["cause"] == "timed out after 20 s" and 20 <= out.seconds < 60
    # a slow machine may still be importing when the limit comes; where it got that far, the trail says where
    if r["crash"]["finished_checks"] == ["all_rows", "dweight_repeatable"]:
        assert r["crash"]["check"] == "full_vs_sub_batches" and r["crash"]["batch_size"] == 15


def test_a_backend_that_cannot_load_fails_in_its_own_process_with_the_reason(tmp_path: Path) -> None:
    params = load_params(_params(tmp_path, ["no_such_module_xyz:f"], backends=[]))
    out = isolation.run_backend("no_such_module_xyz:f", params.as_dict(), "cpu", 120.0)
    assert out.result["status"] == "failed" and "cannot load" in out.result["skip_reason"]
    assert "crash" not in out.result


def test_the_exit_of_a_child_is_described() -> None:
    assert isolation.describe_exit(3) == ("exited with code 3", None)
    assert isolation.describe_exit(-9) == ("killed by SIGKILL (signal 9)", "SIGKILL")
    assert isolation.describe_exit(-200)[1] == "signal 200"


def test_a_planted_device_error_is_the_exact_reference_on_the_cpu() -> None:
    from rlnorm.inputs import make_case
    from rlnorm.kit.backends import load_backend
    from rlnorm.options import OpOptions

    c = make_case(63, 128, seed=1)
    fault, exact = load_backend(DEVICE_ERROR), load_backend(EXACT)
    assert torch.equal(fault.forward(c.x, c.z, c.w, OpOptions()), exact.forward(c.x, c.z, c.w, OpOptions()))


@pytest.mark.gpu
def test_a_device_error_leaves_the_next_backend_intact(tmp_path: Path) -> None:
    run = steps.start_run(load_params({**_params(tmp_path, [DEVICE_ERROR, EXACT], backends=[]), "device": "cuda"}))
    steps.run_backends(run)
    bad, ref = run.results[DEVICE_ERROR], run.results[EXACT]
    assert bad["status"] == "crashed" and bad["crash"]["cause"].startswith("device error:")
    assert "illegal memory access" in bad["crash"]["cause"] and bad["crash"]["check"] == "accuracy_latency"
    assert bad["crash"]["finished_checks"] == FINISHED
    assert ref["status"] == "ran" and ref["batch_invariance"]["batch_invariant"] is True
    assert ref["accuracy_latency"]["rows"] == 63 and not ref["errors"]


def test_the_worker_refuses_a_bad_command_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "rlnorm.kit.worker"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "usage: python -m rlnorm.kit.worker JOB.json" in proc.stderr
