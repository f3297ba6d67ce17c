"""A planted backend that segfaults, exits, hangs or loses its device past some batch size, in a check or a gate, is
recorded with its cause and the batch it died on, keeps what it finished, and the other backends' results stand."""

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
from conftest import KIT_CHECKS, ROW_CHECKS, SEGFAULT, TINY_SIZES

from rlnorm.kit import steps
from rlnorm.kit.artifact import load_artifact
from rlnorm.kit.backends import Backend
from rlnorm.kit.params import load_params
from rlnorm.kit.process import Child, run_child
from rlnorm.kit.records import rebuild_case
from rlnorm.kit.worker import EXIT_DEVICE_ERROR, BackendWorker, run_batch
from tests.faults import DeviceErrorPastRows, HangPastRows

EXIT = "tests.faults:ExitPastRows"
EXACT = "rlnorm.kit.backends:ExactReferenceBackend"  # a correct backend, run after a crash
DEVICE_ERROR = "tests.faults:DeviceErrorPastRows"
PLANTED_DEVICE_ERROR = "CUDA error: an illegal memory access was encountered (planted)"


class DeviceErrorOnTheCpu(DeviceErrorPastRows):
    """DeviceErrorPastRows as its worker sees it on a GPU, without one: past `limit` rows the check raises the CUDA
    error and the worker's question to the device (`Backend.device_lost`) gets that error back."""

    key = "test_isolation:DeviceErrorOnTheCpu"

    def __init__(self) -> None:
        super().__init__()
        self.lost: str | None = None

    def device_lost(self, device: str) -> str | None:
        return self.lost

    def _fail(self, rows: int) -> None:
        self.lost = f"{PLANTED_DEVICE_ERROR} on a batch of {rows} rows"
        raise RuntimeError(self.lost)


def _params(tmp_path: Path, custom: list[str], **kw: object):
    raw = {"name": "iso", "device": "cpu", "progress": False, "backends": ["reference"], "custom_backends": custom}
    raw |= {"checks": [*KIT_CHECKS, "agreement"], **TINY_SIZES, "launch_rows": 15, "output_dir": str(tmp_path / "run")}
    return load_params({**raw, **kw})


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory: pytest.TempPathFactory) -> steps.Run:
    # the exact reference between the crashes runs as if nothing had happened before it
    run = steps.start_run(_params(tmp_path_factory.mktemp("iso"), [SEGFAULT, DeviceErrorOnTheCpu.key, EXACT, EXIT]))
    steps.run_backends(run)
    steps.run_agreement(run)
    return run


# the device error: the worker's own exit, read back by the parent as the device's error (not "exited with code 70")
CRASHES = {
    SEGFAULT: ("killed by SIGSEGV (signal 11)", "SIGSEGV", None),
    EXIT: ("exited with code 3", None, 3),
    DeviceErrorOnTheCpu.key: (f"device error: {PLANTED_DEVICE_ERROR} on a batch of 63 rows", None, EXIT_DEVICE_ERROR),
}


@pytest.mark.slow
@pytest.mark.parametrize("key", CRASHES)
def test_a_crash_is_recorded_with_its_cause_check_and_batch_and_keeps_what_it_finished(
    crashed_run: steps.Run, key: str
) -> None:
    r = crashed_run.result.results[key]
    crash = r.crash
    assert r.status == "crashed" and (crash.cause, crash.signal, crash.exit_code) == CRASHES[key]
    assert crash.check == "accuracy_latency" and crash.batch_size == 63 and crash.timed_out is False
    assert r.skip_reason == f"{crash.cause} in accuracy_latency at a batch of 63 rows"
    # TINY_SIZES' batches (and the launch ladder) stay at 15 rows until accuracy_latency's 63: the faults die there
    assert crash.finished_checks == ROW_CHECKS
    assert r.batch_invariance.all_rows.sizes[7].fwd_differ == 0
    assert r.batch_invariance.full_vs_sub_batches.rows_compared == 30  # sizes 1 and 7 over 15 rows
    rb = rebuild_case(crash.rebuild)  # the trail rebuilds the batch it died on
    assert rb.check == "accuracy_latency" and rb.batch.x.shape == (63, 128)
    if key == SEGFAULT:  # its process died mid-check: nothing of accuracy_latency came back
        assert "reading address 0 on a batch of 63 rows" in crash.stderr_tail and r.accuracy_latency is None


@pytest.mark.slow
def test_the_other_backends_complete_and_the_artifact_validates(crashed_run: steps.Run) -> None:
    for key in ("reference", EXACT):  # before the crashes, and between them
        ref = crashed_run.result.results[key]
        assert ref.status == "ran" and ref.batch_invariance.batch_invariant is True and not ref.errors
        assert ref.accuracy_latency.rows == 63
    agreement = crashed_run.result.agreement
    assert agreement.backends == ["reference", EXACT], "a backend that died first has no row"
    assert agreement.equal_fraction == [[1.0, 1.0], [1.0, 1.0]]
    art = load_artifact(crashed_run.result.path)  # written by the steps, validated on reading
    assert art.results[SEGFAULT].crash.signal == "SIGSEGV"


@pytest.mark.slow
def test_a_crash_in_a_contract_gate_is_the_backends_crash(tmp_path: Path) -> None:
    # the gates' workload is 118 rows: past the planted limit, so the forward gate's first cell dies
    out = BackendWorker(SEGFAULT, _params(tmp_path, [], checks=["all_rows", "contract_gates"]), "cpu").finish(300.0)
    r = out.result
    assert r.status == "crashed" and r.crash.signal == "SIGSEGV"
    assert r.crash.check == "contract_gates" and r.crash.batch_size == 118
    assert r.crash.finished_checks == ["all_rows"] and r.batch_invariance.all_rows.sizes[7].fwd_differ == 0
    assert r.crash.rebuild["batch"] == {"kind": "gate", "cell": "BN/full", "size": 118}


@pytest.mark.slow
def test_a_hang_is_ended_at_the_time_limit(tmp_path: Path) -> None:
    """A hang in a contract gate, ended by the backend's time limit."""
    params = _params(tmp_path, [], checks=["contract_gates"], backend_timeout_s=1.0)
    hanging = threading.Event()
    line = "planted fault: hanging on a batch of 118 rows"

    def relay(text: str) -> None:
        if line in text:
            hanging.set()

    worker = BackendWorker(HangPastRows.key, params, "cpu", relay)
    try:
        worker.child.release()
        # the limit starts once the child is in the planted hang, so a machine slow to import cannot reach it first
        assert hanging.wait(timeout=300), "no planted hang within 300 s:\n" + "\n".join(worker.child.tail)
        out = worker.finish(params.backend_timeout_s)
    finally:
        worker.close()
    r = out.result
    assert r.status == "timed_out" and r.crash.timed_out is True
    assert r.crash.cause == "timed out after 1 s" and out.seconds >= 1
    assert line in r.crash.stderr_tail
    assert r.crash.check == "contract_gates" and r.crash.batch_size == 118
    assert r.skip_reason == "timed out after 1 s in contract_gates at a batch of 118 rows"


@pytest.mark.gpu
def test_a_device_error_leaves_the_next_backend_intact(tmp_path: Path) -> None:
    run = steps.start_run(_params(tmp_path, [DEVICE_ERROR, EXACT], backends=[], device="cuda"))
    steps.run_backends(run)
    bad, ref = run.result.results[DEVICE_ERROR], run.result.results[EXACT]
    assert bad.status == "crashed" and bad.crash.cause.startswith("device error:")
    assert "illegal memory access" in bad.crash.cause and bad.crash.check == "accuracy_latency"
    # its bits, not its verdict: on a GPU the verdict also weighs torch's launch shapes, which change with the rows
    sizes = ref.batch_invariance.all_rows.sizes.values()
    assert ref.status == "ran" and not ref.errors and sizes
    assert all(s.fwd_differ == 0 and s.rowgrad_differ == 0 for s in sizes)
    assert Backend().device_lost("cuda") is None


def test_a_held_worker_whose_parent_is_gone_runs_no_check(tmp_path: Path) -> None:
    params = _params(tmp_path, [], checks=["all_rows"])
    job = {"backend": "reference", "device": "cpu", "folder": str(tmp_path), "params": params.as_dict()}
    argv = [sys.executable, "-m", "rlnorm.kit.worker", json.dumps(job), "--hold"]
    # end of input where the "go" line would come: what a held worker reads once its parent has died
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["result"]["status"] == "ran" and saved["finished"] == []  # probed, then nothing
    assert not (tmp_path / "trail.json").exists()


def test_a_rebuilt_batch_is_run_alone_and_its_end_is_said() -> None:
    spec = {"v": 1, "check": "all_rows", "opts": {}, "batch": {"kind": "slice", "start": 0, "size": 63}}
    spec["case"] = {"rows": 63, "d": 128, "seed": 1, "dtype": "bfloat16", "weight_dtype": "bfloat16"}
    died = run_batch(SEGFAULT, spec, "cpu", timeout_s=300)
    assert not died["survived"] and died["signal"] == "SIGSEGV" and "63 rows" in died["stderr_tail"]
    lived = run_batch(EXACT, spec, "cpu", timeout_s=300)
    assert lived["survived"] and lived["cause"] == "ran to the end"


def test_run_child_says_how_its_child_ended() -> None:
    code = "import sys; print('out'); print('first', file=sys.stderr); print('last', file=sys.stderr); sys.exit(3)"
    end = run_child([sys.executable, "-c", code], 120, stdout=True)
    assert (end.returncode, end.exit_code, end.stdout, end.stderr_tail) == (3, 3, "out\n", "first\nlast")
    end = run_child([sys.executable, "-c", "import time; time.sleep(600)"], 1)
    assert end.timed_out and end.returncode == -signal.SIGKILL and end.cause == "timed out after 1 s"


def test_a_child_and_what_it_started_end_when_the_parent_is_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    # the child starts a grandchild in its own process group, then sleeps; an interrupt of the wait ends both
    code = "import subprocess as s, sys, time; print(s.Popen(['sleep', '600']).pid, file=sys.stderr); time.sleep(600)"
    child = Child([sys.executable, "-c", code])
    deadline = time.monotonic() + 120
    while not child.tail and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(child.tail[0])

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as Ctrl-C arrives while the parent waits

    monkeypatch.setattr(child.proc, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        child.wait(600)
    monkeypatch.undo()
    child.proc.wait(timeout=30)
    assert _ended(child.proc.pid) and _ended(grandchild)


def _ended(pid: int) -> bool:
    """The process is gone, or dead and not yet reaped by whoever adopted it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False
