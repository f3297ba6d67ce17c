"""The steps of a run, one function each, so the notebook stays a thin narrative.

`run_backends` runs each backend in a process of its own (`rlnorm.kit.worker`); every later step runs inside
`run_step`, so one that raises is recorded in `failed_steps` and costs no result that stands.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from rlnorm.kit import artifact
from rlnorm.kit.artifact import write_artifact
from rlnorm.kit.backends import describe_error
from rlnorm.kit.checks.digests import agreement_from_outputs
from rlnorm.kit.environment import collect_environment, git_commit, tracked_tree_dirty
from rlnorm.kit.params import RunParams
from rlnorm.kit.process import run_child
from rlnorm.kit.results import (
    ARTIFACT_KIND,
    OP,
    SCHEMA_VERSION,
    Record,
    RunResult,
    StackPair,
    StackPairs,
    StepFailure,
    from_json,
)
from rlnorm.kit.worker import BackendWorker

ARTIFACT_FILE = "rms_norm_gated_reuse_check.json"
RECORDS_FILE = "records.csv"
PLOTS_DIR = "plots"
# the CLI points this at a file it echoes to the terminal, so progress stays out of the notebook
PROGRESS_ENV = "RLNORM_PROGRESS_FILE"
TRACEBACK_LINES = 12
# the parameters that set the protocol's size: a run that changes any of them is a "quick" run
PROTOCOL_FIELDS = ("all_rows_sizes", "all_rows_seeds", "dweight_rows", "sub_batches_rows", "sub_batch_sizes")
PROTOCOL_FIELDS += ("sub_batches_seeds", "sweep_n", "sweep_sizes", "sweep_probe_rows", "sweep_seeds", "accuracy_rows")


class StepsFailed(RuntimeError):
    """A step after the backends raised; the run folder holds every result that stands, and says which."""


@dataclass
class Run:
    """A run in progress: its typed result so far, and the (staging) folder its files go to."""

    params: RunParams
    device: str
    result: RunResult
    out: Path  # where files go while the run is in progress (a staging folder)
    place_at: Path | None = None  # where `finish` moves `out`, when this process staged the folder itself
    records: list[Record] = field(default_factory=list)
    agreement_outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # key -> its agreement output
    timings: dict[str, float] = field(default_factory=dict)  # step (or backend:check) -> seconds
    started: float = field(default_factory=time.time)


@contextlib.contextmanager
def _progress_stream() -> Iterator[TextIO]:
    """Where progress goes: the CLI's echo file when run from the CLI, else stderr (the notebook)."""
    try:
        f = open(os.environ[PROGRESS_ENV], "a", buffering=1)
    except (KeyError, OSError):
        yield sys.stderr
        return
    with f, contextlib.redirect_stderr(f):  # the checks' own tqdm bars follow sys.stderr too
        yield f


def is_quick(params: RunParams) -> bool:
    """The artifact's `quick`: the run's sizes are not the full protocol's (docs/spec.md §4-5)."""
    return any(getattr(params, f) != getattr(RunParams(), f) for f in PROTOCOL_FIELDS)


def start_run(params: RunParams) -> Run:
    """Resolve the device, stage the run folder (refusing an existing run unless asked), read the environment.
    The command line stages the folder itself (`staging_dir`); run any other way, `finish` places it."""
    device = params.resolved_device()
    commit, dirty = git_commit(), tracked_tree_dirty()  # ValueError naming the variable when one is malformed
    place_at = None
    if params.staging_dir:
        out = Path(params.staging_dir)
        out.mkdir(parents=True, exist_ok=True)
    else:
        place_at = params.run_dir
        out = artifact.staging_for(place_at, params.overwrite)
    result = RunResult(
        schema_version=SCHEMA_VERSION,
        kind=ARTIFACT_KIND,
        rfc=params.rfc,
        op=OP,
        commit=commit,
        tracked_tree_dirty=dirty,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        param_set=params.name,
        environment=collect_environment(device),
        quick=is_quick(params),
        checks=list(params.checks),
        params={k: v for k, v in params.as_dict().items() if k != "staging_dir"},
        records=RECORDS_FILE,
        plots={},
        results={},
        path=out / ARTIFACT_FILE,
    )
    return Run(params=params, device=device, result=result, out=out, place_at=place_at)


def write(run: Run) -> Path:
    """The records CSV and the artifact (validated), each written whole; the artifact's path."""
    run.result.wall_time_s = round(time.time() - run.started, 1)
    artifact.write_records(run.records, run.out / RECORDS_FILE)
    run.result.path = write_artifact(run.result, run.out / ARTIFACT_FILE)
    return run.result.path


def run_backends(run: Run) -> None:
    """Every backend in a process of its own within the run's time limit, then the artifact written. On the CPU the
    next backend's process imports meanwhile (on a GPU nothing runs beside a backend being timed)."""
    specs = [*run.params.backends, *run.params.custom_backends]
    ahead = run.device == "cpu"
    t0 = time.time()
    with _progress_stream() as stream:
        relay = stream.write if run.params.progress else None
        started: dict[int, BackendWorker] = {}
        try:
            for i, spec in enumerate(specs):
                for j in (i, i + 1) if ahead else (i,):
                    if j < len(specs) and j not in started:
                        started[j] = BackendWorker(specs[j], run.params, run.device, relay)
                if run.params.progress:
                    print(f"[{i + 1}/{len(specs)}] {spec}: in its own process", file=stream, flush=True)
                report = started.pop(i).finish(run.params.backend_timeout_s)
                run.result.results[spec] = r = report.result
                run.records.extend(report.records)
                run.timings.update({f"{spec}:{k}": v for k, v in report.timings.items()})
                run.timings[spec] = report.seconds
                if report.agreement_output is not None:
                    run.agreement_outputs[spec] = report.agreement_output
                if run.params.progress:
                    why = f": {r.skip_reason}" if r.status != "ran" else ""
                    print(f"[{i + 1}/{len(specs)}] {spec}: {r.status}{why} ({report.seconds:.1f} s)", file=stream)
        finally:
            for worker in started.values():  # interrupted: no process outlives the run
                worker.close()
    run.timings["backends"] = time.time() - t0
    write(run)


def run_step(run: Run, step: str, body: Callable[[], Any]) -> Any:
    """`body()` as step `step`: its value; or, where it raised or left a result the artifact refuses, None, the step
    in `failed_steps` with its traceback's tail and its changes to the result dropped."""
    before, t0 = copy.deepcopy(run.result), time.time()
    try:
        value = body()
        write(run)
    except Exception as exc:
        tail = traceback.format_exc().strip().splitlines()[-TRACEBACK_LINES:]
        run.result = before
        run.result.failed_steps = [*(before.failed_steps or []), StepFailure(step, describe_error(exc), tail)]
        with _progress_stream() as stream:
            print(f"{step}: failed: {describe_error(exc)} (recorded; the run goes on)", file=stream)
        write(run)
        value = None
    run.timings[step] = time.time() - t0
    return value


def run_agreement(run: Run) -> None:
    """Fraction of forward outputs bitwise equal between each pair of backends, from each one's own process."""
    if "agreement" not in run.params.checks or not run.agreement_outputs:
        return

    def body() -> None:
        p, results = run.params, run.result.results
        errors = {k: r.errors["agreement"] for k, r in results.items() if "agreement" in (r.errors or {})}
        run.result.agreement = agreement_from_outputs(run.agreement_outputs, p.agreement_rows, p.agreement_seed, errors)

    run_step(run, "agreement", body)


# a pair may import vLLM, whose import patches torch's compiler for the rest of a process
STACK_PAIR_CHILD = "import sys; from rlnorm.kit.checks.stack_pairs import main; sys.exit(main(sys.argv[1:]))"


def run_stack_pairs(run: Run, pairs: list[str] | None = None) -> None:
    """Each pair of `checks.stack_pairs.PAIRS` (or those named) in a process of its own within `backend_timeout_s`,
    so a crash or a hang is that pair's error."""
    if "stack_pairs" not in run.params.checks:
        return
    from rlnorm.kit.checks.stack_pairs import PAIRS

    p = run.params
    job = {"d": p.d, "rows": p.agreement_rows, "seed": p.agreement_seed, "device": run.device}
    job |= {"weight_dtype": p.weight_dtype, "opts": p.op_options().as_dict()}
    names = pairs or [spec.name for spec in PAIRS]

    def one(name: str) -> StackPair:
        with tempfile.TemporaryDirectory(prefix="rlnorm-stack-pair-") as tmp:
            out_path = Path(tmp) / "pair.json"
            argv = [sys.executable, "-c", STACK_PAIR_CHILD, json.dumps({**job, "pair": name}), str(out_path)]
            ended, row = run_child(argv, p.backend_timeout_s), artifact.read_json(out_path)
        if not ended.ok or not isinstance(row, dict):
            last = ended.stderr_tail.strip().splitlines()[-1:] or ["(no stderr)"]
            why = ended.cause if not ended.ok else "it left no readable result"
            row = {"name": name, "status": "error", "reason": f"its process: {why}; last line: {last[0][:300]}"}
        return from_json(StackPair, row)

    def body() -> None:
        table = StackPairs(rows=p.agreement_rows, d=p.d, seed=p.agreement_seed, device=run.device)
        with _progress_stream() as stream:
            for i, name in enumerate(names, 1):
                table.pairs.append(one(name))
                if p.progress:
                    print(f"[pair {i}/{len(names)}] {name}: {table.pairs[-1].status}", file=stream, flush=True)
        run.result.stack_pairs = table

    run_step(run, "stack_pairs", body)


def run_plots(run: Run, make_plots: Callable[[RunResult, Path], dict[str, Path]]) -> dict[str, Path]:
    """The figures, `make_plots(result, folder)` -> {name: PNG}, listed in the artifact; {} when it raised."""

    def body() -> dict[str, Path]:
        paths, out = make_plots(run.result, run.out / PLOTS_DIR), run.out.resolve()
        run.result.plots = {name: Path(path).resolve().relative_to(out).as_posix() for name, path in paths.items()}
        return paths

    return run_step(run, "plots", body) or {}


def finish(run: Run) -> RunResult:
    """Write the artifact a last time and place the run folder (where this process staged it); `StepsFailed`
    (after placing it) where a step failed, so the notebook's executor exits non-zero."""
    run.timings["total"] = time.time() - run.started
    write(run)
    if run.place_at is not None:
        artifact.place(run.out, run.place_at, overwrite=run.params.overwrite)
        run.out, run.place_at = run.place_at, None
        run.result.path = run.out / ARTIFACT_FILE
    if run.result.failed_steps:
        said = "; ".join(f"{f.step}: {f.error}" for f in run.result.failed_steps)
        raise StepsFailed(f"{len(run.result.failed_steps)} step(s) failed ({said}); the run folder holds the rest")
    return run.result
