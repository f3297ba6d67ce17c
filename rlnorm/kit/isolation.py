"""Child processes that can crash, hang or poison their device without costing the parent anything.

The per-backend workers (`rlnorm.kit.worker`), the contract gates and every other child (`run_child`: a rebuilt
batch, the trainer-vs-sampler check) run this way: a fresh interpreter (so the child starts clean for the device in
use, never a fork of a process holding a CUDA context), in a session of its own (so a crash cannot signal the
parent's group, and a kill reaches whatever the child started), with the parent's import path (so a user's backend
module imports there too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlnorm.kit.backends import describe_error
from rlnorm.kit.worker import AGREEMENT_FILE, EXIT_DEVICE_ERROR, RESULT_FILE, TRAIL_FILE

__all__ = [
    "BackendOutcome",
    "BackendProcess",
    "ChildEnd",
    "child_env",
    "describe_exit",
    "kill_group",
    "load_agreement",
    "run_backend",
    "run_batch",
    "run_child",
]

STDERR_TAIL_LINES = 30


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment, its import path, unbuffered output, plus `extra`."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and anything it started (compile workers): its own process group, by id."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def describe_exit(returncode: int | None) -> tuple[str, str | None]:
    """('killed by SIGSEGV (signal 11)' or 'exited with code 3', the signal's name or None)."""
    if returncode is None:
        return "did not exit", None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (signal {-returncode})", name
    return f"exited with code {returncode}", None


def _start(argv: list[str], stdin: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`argv` in a session of its own, its stderr (progress, tracebacks) piped, its stdout dropped."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=stdin,
        text=True,
        errors="replace",
        env=child_env(env),
        start_new_session=True,
    )


def _worker_argv(job: Path, mode: str) -> list[str]:
    return [sys.executable, "-m", "rlnorm.kit.worker", str(job), mode]


@dataclass
class ChildEnd:
    """How a child started by `run_child` ended, and the JSON it left (None where it left none that parses)."""

    returncode: int | None
    timed_out: bool
    stderr: str
    seconds: float
    result: Any = None

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return "\n".join(self.stderr.splitlines()[-lines:])


def run_child(
    argv: list[str], timeout_s: float, *, result_file: Path | None = None, env: dict[str, str] | None = None
) -> ChildEnd:
    """Run `argv` in a session of its own for at most `timeout_s` seconds and read back `result_file`'s JSON.

    Past the limit, and when the parent is interrupted while it waits, the child's process group (the child and
    whatever it started) is killed, so no child outlives the wait. Never raises for what the child did.
    """
    t0 = time.monotonic()
    proc = _start(argv, subprocess.DEVNULL, env)
    timed_out = False
    try:
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
            _, err = proc.communicate()
    finally:
        if proc.poll() is None:  # interrupted: take the child down with the parent
            kill_group(proc)
            proc.wait()
    return ChildEnd(
        returncode=proc.returncode,
        timed_out=timed_out,
        stderr=err or "",
        seconds=round(time.monotonic() - t0, 2),
        result=None if result_file is None else _read_json(result_file),
    )


@dataclass
class BackendOutcome:
    """What one backend's worker left behind; `result` is its artifact entry (status set here if it ended early)."""

    result: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    agreement_output: Any = None  # its forward on the agreement inputs (a CPU tensor), if it got that far
    seconds: float = 0.0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def load_agreement(path: Path) -> tuple[Any, str | None]:
    """(the saved agreement output, None), or (None, why) when the file does not load: one backend's bad file is
    that backend's missing output, never the run's end."""
    try:
        return torch.load(path, map_location="cpu"), None
    except Exception as exc:
        return None, f"its agreement output does not load: {describe_error(exc)}"


def _blank(spec: str) -> dict[str, Any]:
    return {
        "source": spec,
        "backward": "none",
        "status": "failed",
        "skip_reason": "",
        "batch_invariance": {},
        "accuracy_latency": None,
        "contract_gates": None,
        "errors": {},
    }


class BackendProcess:
    """One backend's worker: started (its imports and probe may run ahead, held before its checks), released,
    and finished within a time limit counted from its release."""

    def __init__(
        self,
        spec: str,
        params: dict[str, Any],
        device: str,
        relay: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self._tmp = tempfile.TemporaryDirectory(prefix="rlnorm-backend-")
        self.folder = Path(self._tmp.name)
        job = self.folder / "job.json"
        job.write_text(json.dumps({"backend": spec, "device": device, "folder": str(self.folder), "params": params}))
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._lines: list[str] = []  # held until released, so the progress shows in run order
        self._relay = relay
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.proc = _start(_worker_argv(job, "--hold"), subprocess.PIPE, env)
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            # relayed under the lock, so a line read while `release` relays the held ones waits its turn
            with self._lock:
                self.tail.append(line.rstrip("\n"))
                if not self._released.is_set():
                    self._lines.append(line)
                elif self._relay is not None:
                    self._relay(line)

    def release(self) -> None:
        """Let the worker start its checks (it may still be importing: it starts them when it gets there)."""
        with self._lock:
            self._released.set()
            held, self._lines = self._lines, []
            if self._relay is not None:
                for line in held:
                    self._relay(line)
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass  # it has already ended: finish() says how

    def finish(self, timeout_s: float) -> BackendOutcome:
        """Wait at most `timeout_s` seconds after release; never raises for what the child did."""
        t0 = time.monotonic()
        if not self._released.is_set():
            self.release()
        timed_out = False
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(self.proc)
            self.proc.wait()
        finally:
            if self.proc.poll() is None:  # the parent itself is being interrupted: take the child down with it
                self.close()
        self._reader.join(timeout=5)
        try:
            return self._outcome(timed_out, timeout_s, round(time.monotonic() - t0, 2))
        finally:
            self._tmp.cleanup()

    def close(self) -> None:
        """End the worker and its folder, whatever state it is in."""
        if self.proc.poll() is None:
            kill_group(self.proc)
            self.proc.wait()
        self._tmp.cleanup()

    def _outcome(self, timed_out: bool, timeout_s: float, seconds: float) -> BackendOutcome:
        saved = _read_json(self.folder / RESULT_FILE) or {}
        result = saved.get("result") or _blank(self.spec)
        outcome = BackendOutcome(
            result=result,
            records=list(saved.get("records") or []),
            timings={f"{self.spec}:{k}": v for k, v in (saved.get("timings") or {}).items()},
            seconds=seconds,
        )
        agreement = self.folder / AGREEMENT_FILE
        if agreement.is_file():
            outcome.agreement_output, why = load_agreement(agreement)
            if why is not None:
                result.setdefault("errors", {})["agreement"] = why
        code = self.proc.returncode
        if timed_out or code != 0:
            _ended_early(outcome, saved, _read_json(self.folder / TRAIL_FILE), code, timed_out, timeout_s, self.tail)
        elif not saved:
            result["skip_reason"] = "its process exited without writing a result"
        return outcome


def run_backend(
    spec: str,
    params: dict[str, Any],
    device: str,
    timeout_s: float,
    relay: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
) -> BackendOutcome:
    """Run one backend's checks in its own process (`python -m rlnorm.kit.worker`), at most `timeout_s` seconds.

    Never raises for what the child does: a crash, an exit, a hang past the limit or a device left in an error
    state becomes status `crashed` / `timed_out` with a `crash` entry (cause, the check and batch it was on,
    the checks it finished, the end of its stderr), and the checks it finished are kept. `relay` receives each
    line the child prints (its progress).
    """
    return BackendProcess(spec, params, device, relay, env).finish(timeout_s)


def _ended_early(
    outcome: BackendOutcome,
    saved: dict[str, Any],
    trail: dict[str, Any] | None,
    returncode: int | None,
    timed_out: bool,
    timeout_s: float,
    tail: deque[str],
) -> None:
    """Mark the result crashed or timed out, with where it was: the trail's batch, unless the device said more."""
    result = outcome.result
    finished = list(saved.get("finished") or [])
    device_error = saved.get("device_error")
    if timed_out:
        cause, sig = f"timed out after {timeout_s:g} s", None
    elif returncode == EXIT_DEVICE_ERROR and device_error:
        cause, sig = f"device error: {device_error['error']}", None
    else:
        cause, sig = describe_exit(returncode)
    batch = (trail or {}).get("batch") or {}
    size = batch.get("size")
    if size is None and batch.get("kind") == "sweep":
        size = batch.get("m")
    check = (device_error or {}).get("check") or (trail or {}).get("check")
    if check is None and not finished and result.get("status") != "ran":
        check = "loading the backend"
    result["status"] = "timed_out" if timed_out else "crashed"
    where = f" in {check}" + (f" at a batch of {size} rows" if size is not None else "") if check else ""
    result["skip_reason"] = f"{cause}{where}"
    result["crash"] = {
        "cause": cause,
        "signal": sig,
        "exit_code": None if timed_out or returncode is None or returncode < 0 else returncode,
        "timed_out": timed_out,
        "check": check,
        "batch_size": None if size is None else int(size),
        "rebuild": trail,
        "finished_checks": finished,
        "seconds": outcome.seconds,
        "stderr_tail": "\n".join(tail),
    }


def run_batch(spec: str, rebuild: dict[str, Any], device: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Give one backend one rebuilt batch in a process of its own; say how that process ended.

    {"survived": bool, "cause": "killed by SIGSEGV (signal 11)" | "timed out after N s" | "exited with code 3" |
    "ran to the end", "signal", "exit_code", "stderr_tail", "seconds"}."""
    with tempfile.TemporaryDirectory(prefix="rlnorm-batch-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"backend": spec, "device": device, "rebuild": rebuild}))
        end = run_child(_worker_argv(job, "--batch"), timeout_s)
    code = end.returncode
    cause, sig = (f"timed out after {timeout_s:g} s", None) if end.timed_out else describe_exit(code)
    survived = not end.timed_out and code == 0
    return {
        "survived": survived,
        "cause": "ran to the end" if survived else cause,
        "signal": sig,
        "exit_code": None if end.timed_out or code is None or code < 0 else code,
        "stderr_tail": end.stderr_tail(),
        "seconds": end.seconds,
    }
