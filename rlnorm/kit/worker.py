"""One backend's checks in a process of its own: a crash, a hang or a poisoned device stays with it.

`result.json` is rewritten after every check (what finished stands if the next one dies), `trail.json` names the
batch being given (a crash names it). `--hold` lets the next backend import meanwhile; `--batch` gives one rebuilt
batch (`run_batch`). A lost device ends the worker (`EXIT_DEVICE_ERROR`): every later check would fail for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlnorm.kit import checks, gates
from rlnorm.kit.artifact import read_json, write_atomic
from rlnorm.kit.backends import Backend, describe_error, load_backend
from rlnorm.kit.checks import common
from rlnorm.kit.checks.digests import agreement_output, output_digests
from rlnorm.kit.checks.launch import LAUNCH_ENV
from rlnorm.kit.params import RunParams, check_kwargs, load_params
from rlnorm.kit.process import Child, Ended, run_child
from rlnorm.kit.records import rebuild_case
from rlnorm.kit.results import BackendResult, BatchInvariance, Crash, Record, from_json, to_json

# set by the command line when its output is not a terminal: progress as lines, never redrawn bars
PLAIN_ENV = "RLNORM_PROGRESS_PLAIN"
RESULT_FILE = "result.json"
TRAIL_FILE = "trail.json"
AGREEMENT_FILE = "agreement.pt"
EXIT_DEVICE_ERROR = 70  # the device is in an error state; what was finished is in result.json


@dataclass
class WorkerReport:
    """What one backend's process hands back."""

    result: BackendResult
    records: list[Record] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # check -> seconds
    finished: list[str] = field(default_factory=list)  # the checks that ran to their end, in order
    device_error: dict[str, str] | None = None  # {check, error}: the device was lost in that check
    seconds: float = 0.0  # the process, from release to its end
    agreement_output: Any = field(default=None, metadata={"json": False})  # a CPU tensor, from agreement.pt


# -- the worker's side -----------------------------------------------------------------------------------------------
def _probe(spec: str, params: RunParams, device: str, report: WorkerReport) -> Backend | None:
    """The loaded backend when it can run here; else the result says why, and None."""
    try:
        backend = load_backend(spec)
    except Exception as exc:  # a custom path that does not resolve: its own finding, never the run's end
        report.result.skip_reason = f"cannot load: {describe_error(exc)}"
        return None
    backward = "full" if backend.has_backward else "none"
    report.result = BackendResult(source=backend.source or spec, backward=backward, status="skipped", errors={})
    opts = params.op_options()
    try:
        ok, why = backend.available(device)
        if ok:
            ok, why = backend.supports(opts)
            why = f"does not support {opts.as_dict()}: {why}" if not ok else ""
    except Exception as exc:  # available() promises not to raise; a custom one might
        ok, why = False, f"probe raised {describe_error(exc)}"
    if not ok:
        report.result.skip_reason = why or "no reason given"
        return None
    report.result.status = "ran"
    return backend


def work(job: dict[str, Any], hold: bool = False) -> int:
    """One backend's checks, agreement output and gates, as the job says; the worker's exit status."""
    spec, device, folder = job["backend"], job["device"], Path(job["folder"])
    params = load_params(job["params"])
    opts = params.op_options()
    report = WorkerReport(BackendResult(source=spec, backward="none", status="failed", errors={}))

    def save() -> None:
        write_atomic(folder / RESULT_FILE, json.dumps(to_json(report)))

    backend = _probe(spec, params, device, report)
    save()
    # held: imports and probe are done; end of input means the parent is gone, and nobody would read the checks
    if backend is None or (hold and sys.stdin.readline().strip() != "go"):
        return 0
    result, errors = report.result, report.result.errors
    assert errors is not None

    def trail(spec: dict[str, Any]) -> None:
        write_atomic(folder / TRAIL_FILE, json.dumps(spec))

    # progress bars redraw a line: not where the output is a file (the command line says so), lines only there
    bars = dataclasses.replace(params, progress=params.progress and os.environ.get(PLAIN_ENV) != "1")
    selected = [c for c in checks.CHECKS if c in params.checks]
    if any(c in common.INVARIANCE_CHECKS for c in selected):
        result.batch_invariance = BatchInvariance()
    # a verdict needs every invariance check: one not selected leaves it open (None), as one that raised does
    unrun = {c: "not run" for c in (*common.INVARIANCE_CHECKS, "launch") if c not in selected}

    def step(name: str) -> None:
        if name == "agreement":
            y = agreement_output(backend, opts, device, trail=trail, **check_kwargs(agreement_output, params))
            write_atomic(folder / AGREEMENT_FILE, lambda fh: torch.save(y.cpu(), fh))
        elif name == "digests":
            result.digests = output_digests(backend, opts, device, d=params.d)
        elif name == "contract_gates":
            result.contract_gates = gates.run_gates(backend, opts, device, d=params.d, trail=trail)
        else:
            check = checks.CHECKS[name]
            out = check(backend, opts, device, trail=trail, **check_kwargs(check, bars))
            if out.error:
                errors[name] = out.error
            owner = result.batch_invariance if name in common.INVARIANCE_CHECKS else result
            value = out.summary.dweight_repeatable if name == "dweight_repeatable" else out.summary  # type: ignore[union-attr]
            setattr(owner, {"launch": "launches"}.get(name, name), value)
            for r in out.records:  # the worker's own names win: a record naming another backend would be filed there
                r.backend, r.check = spec, name
            report.records.extend(out.records)

    names = [*selected, *(n for n in ("agreement", "digests", "contract_gates") if n in params.checks)]
    for i, name in enumerate(names, 1):
        if params.progress:
            print(f"{spec}: [{i}/{len(names)}] {name}", file=sys.stderr, flush=True)
        t0 = time.time()
        try:
            step(name)
        except Exception as exc:  # a check raised outside what it catches itself: its finding, the next one runs
            errors[name] = describe_error(exc)
        report.timings[name] = round(time.time() - t0, 2)
        lost = backend.device_lost(device)
        if lost is not None:
            report.device_error = {"check": name, "error": lost}
            save()
            return EXIT_DEVICE_ERROR
        report.finished.append(name)
        if result.batch_invariance is not None:
            inv, said = result.batch_invariance, {**unrun, **errors}
            inv.verdict = common.verdict(result, said)
            inv.batch_invariant = None if inv.verdict is None else inv.verdict == common.INVARIANT
        save()
    return 0


def _batch(job: dict[str, Any]) -> int:
    """One rebuilt batch given to one backend as a check gives it (forward, then backward where it has one)."""
    backend = load_backend(job["backend"])
    rb = rebuild_case(job["rebuild"], device=job["device"])
    batch = rb.batch
    print(f"{job['backend']}: a batch of {batch.x.shape[0]} rows from {rb.check}", file=sys.stderr, flush=True)
    backend.forward(batch.x, batch.z, batch.w, rb.opts)
    if backend.has_backward:
        backend.forward_backward(batch.x, batch.z, batch.w, batch.dy, rb.opts)
    if torch.device(job["device"]).type == "cuda":
        torch.cuda.synchronize(job["device"])
    print(f"{job['backend']}: the batch ran to the end", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[1:] not in ([], ["--hold"], ["--batch"]):
        print("usage: python -m rlnorm.kit.worker JOB [--hold | --batch]", file=sys.stderr)
        return 2
    job = json.loads(args[0])
    return _batch(job) if args[1:] == ["--batch"] else work(job, hold=args[1:] == ["--hold"])


# -- the parent's side -----------------------------------------------------------------------------------------------
def _argv(job: dict[str, Any], mode: str) -> list[str]:
    return [sys.executable, "-m", "rlnorm.kit.worker", json.dumps(job), mode]


class BackendWorker:
    """One backend's worker: started at once (its imports and probe may run ahead of its turn, held before its
    checks), then finished within a time limit counted from its release."""

    def __init__(self, spec: str, params: RunParams, device: str, relay: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self._tmp = tempfile.TemporaryDirectory(prefix="rlnorm-backend-")
        self.folder = Path(self._tmp.name)
        job = {"backend": spec, "device": device, "folder": str(self.folder), "params": params.as_dict()}
        # the `launch` check needs it; every check runs under it, so a backend is timed alike whatever is selected
        self.child = Child(_argv(job, "--hold"), env=LAUNCH_ENV, hold=True, relay=relay)

    def finish(self, timeout_s: float) -> WorkerReport:
        """Wait at most `timeout_s` seconds after release; never raises for what the child did."""
        with self._tmp:
            ended = self.child.wait(timeout_s)
            saved = read_json(self.folder / RESULT_FILE)
            why = "its process exited without writing a result"
            failed = BackendResult(self.spec, "none", "failed", why, errors={})
            report = WorkerReport(failed) if saved is None else from_json(WorkerReport, saved)
            report.seconds = ended.seconds
            if (self.folder / AGREEMENT_FILE).is_file():
                try:
                    report.agreement_output = torch.load(self.folder / AGREEMENT_FILE, map_location="cpu")
                except Exception as exc:  # one backend's bad file is its missing output, never the run's end
                    why = f"its agreement output does not load: {describe_error(exc)}"
                    report.result.errors = {**(report.result.errors or {}), "agreement": why}
            if not ended.ok:
                _ended_early(report, read_json(self.folder / TRAIL_FILE), ended)
            return report

    def close(self) -> None:
        """End the worker and its folder, whatever state it is in."""
        self.child.kill()
        self._tmp.cleanup()


def _ended_early(report: WorkerReport, trail: dict[str, Any] | None, ended: Ended) -> None:
    """Mark the result crashed or timed out, with where it was: the trail's batch, unless the device said more."""
    result, dev = report.result, report.device_error
    cause = ended.cause
    if ended.returncode == EXIT_DEVICE_ERROR and dev and not ended.timed_out:
        cause = f"device error: {dev['error']}"
    batch = (trail or {}).get("batch") or {}
    size = batch.get("m") if batch.get("kind") == "sweep" else batch.get("size")
    check = (dev or {}).get("check") or (trail or {}).get("check")
    if check is None and not report.finished and result.status != "ran":
        check = "loading the backend"
    result.status = "timed_out" if ended.timed_out else "crashed"
    where = f" in {check}" + (f" at a batch of {size} rows" if size is not None else "") if check else ""
    result.skip_reason = f"{cause}{where}"
    result.crash = Crash(
        cause=cause,
        signal=ended.signal,
        exit_code=ended.exit_code,
        timed_out=ended.timed_out,
        check=check,
        batch_size=None if size is None else int(size),
        rebuild=trail,
        finished_checks=list(report.finished),
        seconds=ended.seconds,
        stderr_tail=ended.stderr_tail,
    )


def run_batch(spec: str, rebuild: dict[str, Any], device: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Give one backend one rebuilt batch in a process of its own; say how that process ended:
    {"survived", "cause" ("ran to the end" or how it died), "signal", "exit_code", "stderr_tail", "seconds"}."""
    ended = run_child(_argv({"backend": spec, "device": device, "rebuild": rebuild}, "--batch"), timeout_s)
    said = {k: getattr(ended, k) for k in ("signal", "exit_code", "stderr_tail", "seconds")}
    return {"survived": ended.ok, "cause": "ran to the end" if ended.ok else ended.cause, **said}


if __name__ == "__main__":
    sys.exit(main())
