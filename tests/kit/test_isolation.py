"""Each backend's checks run in a process of their own: a planted backend that segfaults, exits, hangs or leaves
the GPU in an error state past some batch size is recorded with its cause and the batch it died on, keeps the
checks it finished, and the other backends' results stand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_SIZES

from rlnorm.kit import isolation, steps
from rlnorm.kit.artifact import read_artifact, validate_artifact
from rlnorm.kit.backends import device_lost
from rlnorm.kit.backends.local import ExactReferenceBackend
from rlnorm.kit.checks import CheckResult
from rlnorm.kit.gates import run_gates
from rlnorm.kit.params import load_params
from rlnorm.kit.records import rebuild_case
from rlnorm.kit.worker import AGREEMENT_FILE, EXIT_DEVICE_ERROR, RESULT_FILE, TRAIL_FILE, Worker
from tests.faults import GATE_CHILD_ENV, DeviceErrorPastRows, HangPastRows

SEGFAULT = "tests.faults:SegfaultPastRows"
EXIT = "tests.faults:ExitPastRows"
EXACT = "rlnorm.kit.backends.local:ExactReferenceBackend"  # a correct backend, run after a crash
DEVICE_ERROR = "tests.faults:DeviceErrorPastRows"
CHECKS = ["all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep", "accuracy_latency", "agreement"]
# TINY_SIZES' batches stay at 15 rows or fewer until accuracy_latency's 63: the planted faults (past 50 rows) die there
FINISHED = ["all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep"]


class HangPastEightRows(HangPastRows):
    """Hangs at full_vs_sub_batches' 15-row batch: early, so the test's time limit can be short."""

    key = "test_isolation:HangPastEightRows"
    limit = 8


PLANTED_DEVICE_ERROR = "CUDA error: an illegal memory access was encountered (planted)"


class DeviceErrorOnTheCpu(DeviceErrorPastRows):
    """DeviceErrorPastRows as its worker sees it on a GPU, without one: past `limit` rows the check raises the CUDA
    error and the worker's question to the device (`Backend.device_lost`) gets that error back. The worker's own
    code then records it and exits with EXIT_DEVICE_ERROR, which the parent turns into the crash record."""

    key = "test_isolation:DeviceErrorOnTheCpu"

    def __init__(self) -> None:
        super().__init__()
        self.lost: str | None = None

    def device_lost(self, device: str) -> str | None:
        return self.lost

    def _fail(self, rows: int) -> None:
        self.lost = f"{PLANTED_DEVICE_ERROR} on a batch of {rows} rows"
        raise RuntimeError(self.lost)


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


HANG_LINE = "planted fault: hanging on a batch of 15 rows"


@pytest.mark.slow
def test_a_hang_is_ended_at_the_time_limit(tmp_path: Path) -> None:
    params = load_params(_params(tmp_path, [HangPastEightRows.key], backends=[], backend_timeout_s=5.0))
    hanging = threading.Event()

    def relay(line: str) -> None:
        if HANG_LINE in line:
            hanging.set()

    proc = isolation.BackendProcess(HangPastEightRows.key, params.as_dict(), "cpu", relay)
    try:
        proc.release()
        # the limit starts once the child is in the planted hang, so a machine slow to import cannot reach the
        # limit first: what ends the process is the hang, and the trail says where it was
        assert hanging.wait(timeout=300), "no planted hang within 300 s:\n" + "\n".join(proc.tail)
        out = proc.finish(params.backend_timeout_s)
    finally:
        proc.close()
    r = out.result
    assert r["status"] == "timed_out" and r["crash"]["timed_out"] is True
    assert r["crash"]["cause"] == "timed out after 5 s" and out.seconds >= 5
    assert HANG_LINE in r["crash"]["stderr_tail"]
    assert r["crash"]["finished_checks"] == ["all_rows", "dweight_repeatable"]
    assert r["crash"]["check"] == "full_vs_sub_batches" and r["crash"]["batch_size"] == 15
    assert r["skip_reason"] == "timed out after 5 s in full_vs_sub_batches at a batch of 15 rows"


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


@pytest.mark.slow
def test_a_device_error_is_recorded_and_the_next_backend_runs(tmp_path: Path) -> None:
    """The worker's device-error exit, read back by the parent: the cause is the device's error (not "exited with
    code 70"), the check and batch are where it happened, and the next backend's process runs as if nothing had."""
    run = steps.start_run(load_params(_params(tmp_path, [DeviceErrorOnTheCpu.key, EXACT], backends=[])))
    steps.run_backends(run)
    bad, ref = run.results[DeviceErrorOnTheCpu.key], run.results[EXACT]
    assert bad["status"] == "crashed", bad
    crash = bad["crash"]
    assert crash["cause"] == f"device error: {PLANTED_DEVICE_ERROR} on a batch of 63 rows"
    assert crash["exit_code"] == EXIT_DEVICE_ERROR and crash["signal"] is None and crash["timed_out"] is False
    assert crash["check"] == "accuracy_latency" and crash["batch_size"] == 63
    assert crash["finished_checks"] == FINISHED
    assert bad["batch_invariance"]["all_rows"]["7"]["fwd_differ"] == 0  # what it finished stands
    assert ref["status"] == "ran" and ref["batch_invariance"]["batch_invariant"] is True
    assert ref["accuracy_latency"]["rows"] == 63 and not ref["errors"]


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


def _job(tmp_path: Path, backend: str, **kw: object) -> dict:
    params = load_params(_params(tmp_path, [], **kw))
    return {"backend": backend, "device": params.device, "folder": str(tmp_path), "params": params.as_dict()}


def test_a_held_worker_whose_parent_is_gone_runs_no_check(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(_job(tmp_path, "reference", checks=["all_rows"])))
    argv = [sys.executable, "-m", "rlnorm.kit.worker", str(job), "--hold"]
    # end of input where the "go" line would come: what a held worker reads once its parent has died
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / RESULT_FILE).read_text())
    assert saved["result"]["status"] == "ran" and saved["finished"] == []  # probed, then nothing
    assert not (tmp_path / TRAIL_FILE).exists()


def test_a_record_is_filed_under_the_workers_backend_and_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = {"7": {"rows": 7, "fwd_differ": 1, "rowgrad_differ": 0}}
    planted = CheckResult(summary, [{"backend": "someone else", "check": "another", "row": 3}])
    monkeypatch.setattr("rlnorm.kit.worker.check_calls", lambda params, device: {"all_rows": lambda b: planted})
    w = Worker(_job(tmp_path, "reference", checks=["all_rows"]))
    assert w.run() == 0
    assert w.records == [{"backend": "reference", "check": "all_rows", "row": 3}]


def test_a_half_written_agreement_output_is_that_backends_error(tmp_path: Path) -> None:
    path = tmp_path / AGREEMENT_FILE
    torch.save(torch.ones(64, 8), path)
    path.write_bytes(path.read_bytes()[:200])  # what a process killed while saving leaves
    got, why = isolation.load_agreement(path)
    assert got is None and why is not None and why.startswith("its agreement output does not load: ")


def test_run_child_says_how_its_child_ended_and_reads_only_whole_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    end = isolation.run_child(
        [sys.executable, "-c", f"open({str(out)!r}, 'w').write('{{\"a\": 1}}')"], 120, result_file=out
    )
    assert (end.returncode, end.timed_out, end.result) == (0, False, {"a": 1})
    out.write_text('{"a": ')
    code = "import sys; print('first', file=sys.stderr); print('last', file=sys.stderr); sys.exit(3)"
    end = isolation.run_child([sys.executable, "-c", code], 120, result_file=out)
    assert (end.returncode, end.result, end.stderr_tail(1)) == (3, None, "last")
    end = isolation.run_child([sys.executable, "-c", "import time; time.sleep(600)"], 2)
    assert end.timed_out and end.returncode == -signal.SIGKILL


def test_run_child_leaves_no_child_behind_when_the_parent_is_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    pids: list[int] = []

    def interrupted(self: subprocess.Popen, *args: object, **kwargs: object) -> None:
        pids.append(self.pid)
        raise KeyboardInterrupt  # as Ctrl-C arrives while the parent waits

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        isolation.run_child([sys.executable, "-c", "import time; time.sleep(600)"], 600)
    monkeypatch.undo()
    (pid,) = pids
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


class HangingForwardNoisyGradient(ExactReferenceBackend):
    """In a gate child: the forward gate hangs; the gradient gate first writes more to stderr than a pipe holds."""

    key = "test_isolation:HangingForwardNoisyGradient"

    def forward(self, x, z, w, opts):
        if os.environ.get(GATE_CHILD_ENV) == "1":
            time.sleep(3600)
        return super().forward(x, z, w, opts)

    def forward_backward(self, x, z, w, dy, opts):
        if os.environ.get(GATE_CHILD_ENV) == "1" and not getattr(type(self), "noisy", False):
            type(self).noisy = True
            sys.stderr.write("noise\n" * 50_000)  # 300 KB: a pipe nobody reads fills and blocks the writer
            sys.stderr.flush()
        return super().forward_backward(x, z, w, dy, opts)


@pytest.mark.slow
def test_a_gate_waited_on_second_is_not_blocked_by_its_own_output() -> None:
    res = run_gates(HangingForwardNoisyGradient.key, None, "cpu", timeout_s=30, heads=1, d=32)
    assert res["forward"]["timed_out"] is True
    grad = res["gradient"]
    assert grad["timed_out"] is False and grad["passed"] is True, grad["stderr_tail"]


@pytest.mark.gpu
def test_an_error_that_mentions_cuda_leaves_a_device_that_answers_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def planted(backend: object) -> None:
        raise RuntimeError("CUDA error: planted text; the device itself is fine")

    fine = CheckResult({"dweight_repeatable": True}, [])
    calls = {"all_rows": planted, "dweight_repeatable": lambda b: fine}
    monkeypatch.setattr("rlnorm.kit.worker.check_calls", lambda params, device: calls)
    w = Worker({**_job(tmp_path, "reference", checks=list(calls)), "device": "cuda"})
    assert w.run() == 0 and w.device_error is None
    assert w.finished == ["all_rows", "dweight_repeatable"] and "CUDA error" in w.result["errors"]["all_rows"]
    assert device_lost("cuda") is None
