"""One backend's checks in a process of its own, so a crash, a hang or a poisoned device stays with that backend.

    python -m rlnorm.kit.worker JOB.json [--hold | --batch]

`rlnorm.kit.steps.run_backends` writes JOB.json (the run's parameters, one backend spec, the device, a folder)
and starts this module in a fresh interpreter, one per backend. It loads and probes the backend, runs every
selected check, and writes into the folder as it goes:

- `trail.json`: where the checks are, as a rebuild spec (`rlnorm.kit.records.rebuild_case` regenerates it):
  rewritten before each batch a check gives the backend, except that the many small calls of a row-alone pass
  (`rlnorm.kit.checks.alone`) rewrite it once per chunk of calls, naming the chunk's first call; so after a crash
  it names the batch it died on, or the first call of the chunk it died in;
- `result.json`: the backend's entry of the artifact and its records, rewritten after every check, so the checks
  it finished stand if it dies in the next one;
- `agreement.pt`: its forward output on the agreement inputs, for the parent to form the matrix.

With `--batch` the job is one rebuilt batch (`run_batch`): how a crash is reproduced without the run.
With `--hold` it loads and probes the backend, then waits for the line `go` on stdin before its checks: the parent
starts the next backend's process while this one works, so imports overlap checks on the CPU. End of input instead
(the parent died, or closed the pipe without releasing it) ends the worker with its checks not run.

A check that raises is a recorded finding and the next check runs. A device left in an error state is not: the
process's CUDA context is lost, so every later check would fail for that reason and not its own. The worker then
records the error and exits with `EXIT_DEVICE_ERROR`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlnorm.kit import checks
from rlnorm.kit.backends import describe_error, load_backend
from rlnorm.kit.params import RunParams, load_params
from rlnorm.kit.records import rebuild_case

__all__ = [
    "AGREEMENT_FILE",
    "EXIT_DEVICE_ERROR",
    "RESULT_FILE",
    "TRAIL_FILE",
    "Worker",
    "blank_result",
    "check_calls",
    "main",
]

# set by the command line when its output is not a terminal: progress as lines, never redrawn bars
PLAIN_ENV = "RLNORM_PROGRESS_PLAIN"
RESULT_FILE = "result.json"
TRAIL_FILE = "trail.json"
AGREEMENT_FILE = "agreement.pt"
EXIT_DEVICE_ERROR = 70  # the device is in an error state; what was finished is in result.json
# the checks a worker runs, in the order a run reports them (agreement and the gates are not per-backend checks)
CHECK_ORDER = (*checks.INVARIANCE_CHECKS, "accuracy_latency")


def blank_result(key: str, backend: Any | None) -> dict[str, Any]:
    """A backend's artifact entry before anything has run."""
    return {
        "source": getattr(backend, "source", "") or key,
        "backward": "full" if getattr(backend, "has_backward", False) else "none",
        "status": "skipped",
        "skip_reason": "",
        "batch_invariance": {},
        "accuracy_latency": None,
        "contract_gates": None,
        "errors": {},
    }


def check_calls(params: RunParams, device: str) -> dict[str, Callable[[Any], Any]]:
    """check name -> f(backend) calling rlnorm.kit.checks with the run's sizes and seeds."""
    p = params
    common = {
        "opts": p.op_options(),
        "device": device,
        "d": p.d,
        "weight_dtype": getattr(torch, p.weight_dtype),
        "progress": p.progress and os.environ.get(PLAIN_ENV) != "1",
    }
    capped = {**common, "max_records": p.max_records}
    return {
        "all_rows": lambda b: checks.all_rows(b, ns=p.all_rows_sizes, seeds=p.all_rows_seeds, **capped),
        "dweight_repeatable": lambda b: checks.dweight_repeatable(
            b, rows=p.dweight_rows, seed=p.dweight_seed, **capped
        ),
        "full_vs_sub_batches": lambda b: checks.full_vs_sub_batches(
            b,
            full_rows=p.sub_batches_rows,
            sub_sizes=p.sub_batch_sizes,
            seeds=p.sub_batches_seeds,
            coverage=p.coverage,
            **capped,
        ),
        "batch_size_sweep": lambda b: checks.batch_size_sweep(
            b, n=p.sweep_n, sizes=p.sweep_sizes, probe_rows=p.sweep_probe_rows, seeds=p.sweep_seeds, **capped
        ),
        "accuracy_latency": lambda b: checks.accuracy_latency(
            b,
            rows=p.accuracy_rows,
            seed=p.accuracy_seed,
            timing=p.timing,
            warmup=p.timing_warmup,
            iters=p.timing_iters,
            **common,
        ),
    }


def _replace_whole(path: Path, write: Callable[[Path], None]) -> None:
    """Whole or not at all: a reader (the parent, after this process died) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def _write_json(path: Path, doc: Any) -> None:
    _replace_whole(path, lambda tmp: tmp.write_text(json.dumps(doc, allow_nan=True), encoding="utf-8"))


class Worker:
    """The child's side: one backend, its checks, and the files the parent reads back."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.spec: str = job["backend"]
        self.device: str = job["device"]
        self.folder = Path(job["folder"])
        self.params = load_params(job["params"])
        self.result = blank_result(self.spec, None)
        self.records: list[dict[str, Any]] = []
        self.finished: list[str] = []
        self.timings: dict[str, float] = {}
        self.device_error: dict[str, str] | None = None

    def save(self) -> None:
        _write_json(
            self.folder / RESULT_FILE,
            {
                "result": self.result,
                "records": self.records,
                "finished": self.finished,
                "timings": self.timings,
                "device_error": self.device_error,
            },
        )

    def say(self, text: str) -> None:
        if self.params.progress:
            print(f"{self.spec}: {text}", file=sys.stderr, flush=True)

    def probe(self) -> Any | None:
        """The loaded backend when it can run here; else the result says why and None."""
        try:
            backend = load_backend(self.spec)
        except Exception as exc:  # a custom path that does not resolve: its own finding, never the run's end
            self.result["status"] = "failed"
            self.result["skip_reason"] = f"cannot load: {describe_error(exc)}"
            return None
        self.result = blank_result(self.spec, backend)
        opts = self.params.op_options()
        try:
            ok, why = backend.available(self.device)
            if ok:
                ok, why = backend.supports(opts)
                why = f"does not support {opts.as_dict()}: {why}" if not ok else ""
        except Exception as exc:  # available() promises not to raise; a custom one might
            ok, why = False, f"probe raised {describe_error(exc)}"
        if not ok:
            self.result["skip_reason"] = why
            return None
        self.result["status"] = "ran"
        return backend

    def run(self, hold: bool = False) -> int:
        trail = self.folder / TRAIL_FILE
        backend = self.probe()
        self.save()
        if backend is None:
            return 0
        # started ahead of its turn: imports and probe are done, the checks wait for the parent's "go"; end of input
        # means the parent is gone, and a worker nobody reads must not run every check
        if hold and sys.stdin.readline().strip() != "go":
            return 0
        selected = [c for c in CHECK_ORDER if c in self.params.checks]
        calls = check_calls(self.params, self.device)
        summaries: dict[str, Any] = {}
        with checks.following(lambda spec: _write_json(trail, spec)):
            for i, name in enumerate(selected, 1):
                self.say(f"[{i}/{len(selected)}] {name}")
                t0 = time.time()
                try:
                    result = calls[name](backend)
                except Exception as exc:
                    self.result["errors"][name] = describe_error(exc)
                else:
                    self._keep(name, result, summaries)
                self.timings[name] = round(time.time() - t0, 2)
                lost = backend.device_lost(self.device)
                if lost is not None:
                    self.device_error = {"check": name, "error": lost}
                    self.save()
                    return EXIT_DEVICE_ERROR
                self.finished.append(name)
                self.save()
            if "agreement" in self.params.checks:
                self._agreement(backend)
        if any(c in selected for c in checks.INVARIANCE_CHECKS):
            self.result["batch_invariance"]["batch_invariant"] = checks.batch_invariant(
                *(summaries.get(name) for name in checks.INVARIANCE_CHECKS)
            )
        self.save()
        return 0

    def _keep(self, name: str, result: Any, summaries: dict[str, Any]) -> None:
        summary = result.summary
        if isinstance(summary, dict) and summary.get("error"):
            self.result["errors"][name] = str(summary["error"])  # a check that caught its own failure
        if name == "accuracy_latency":
            self.result["accuracy_latency"] = summary
        elif name == "dweight_repeatable":
            summaries[name] = summary
            self.result["batch_invariance"][name] = summary.get("dweight_repeatable")
        else:
            summaries[name] = summary
            self.result["batch_invariance"][name] = summary
        # the worker's own names win: a record that names another backend or check would be filed under it
        self.records.extend({**r, "backend": self.spec, "check": name} for r in result.records)

    def _agreement(self, backend: Any) -> None:
        p = self.params
        self.say("agreement output")
        try:
            y = checks.agreement_output(
                backend,
                p.op_options(),
                self.device,
                rows=p.agreement_rows,
                seed=p.agreement_seed,
                d=p.d,
                weight_dtype=getattr(torch, p.weight_dtype),
            )
            _replace_whole(self.folder / AGREEMENT_FILE, lambda tmp: torch.save(y.cpu(), tmp))
        except Exception as exc:
            self.result["errors"]["agreement"] = describe_error(exc)


def run_batch(job: dict[str, Any]) -> int:
    """One batch, rebuilt from a rebuild spec (a crashed backend's trail), given to one backend the way a check
    gives it: the forward, then forward and backward where the backend has one. Exit 0 if it survives."""
    backend = load_backend(job["backend"])
    rb = rebuild_case(job["rebuild"], device=job["device"])
    batch = rb.batch
    print(f"{job['backend']}: a batch of {batch.x.shape[0]} rows from {rb.check}", file=sys.stderr, flush=True)
    backend.forward(batch.x, batch.z, batch.w, rb.opts)
    if getattr(backend, "has_backward", False):
        backend.forward_backward(batch.x, batch.z, batch.w, batch.dy, rb.opts)
    if torch.device(job["device"]).type == "cuda":
        torch.cuda.synchronize(job["device"])
    print(f"{job['backend']}: the batch ran to the end", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    hold = "--hold" in args
    batch = "--batch" in args
    args = [a for a in args if a not in ("--hold", "--batch")]
    if len(args) != 1:
        print("usage: python -m rlnorm.kit.worker JOB.json [--hold | --batch]", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    return run_batch(job) if batch else Worker(job).run(hold)


if __name__ == "__main__":
    sys.exit(main())
