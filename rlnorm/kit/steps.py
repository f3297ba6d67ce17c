"""The steps of the reuse-check notebook, each one function, so the notebook stays a thin narrative.

A run never stops because one backend misbehaves: each backend's checks run in a process of its own
(`rlnorm.kit.worker`), so one that cannot run here is skipped with its reason, a check that raises is recorded
in `results.<backend>.errors`, and a crash, a hang or a poisoned GPU ends only that backend's process, recorded
with its cause. Only bad parameters stop a run, and they stop it before any work is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from rlnorm.kit import artifact as art
from rlnorm.kit import checks, folders, gates, isolation
from rlnorm.kit import records as rec
from rlnorm.kit.backends import describe_error
from rlnorm.kit.environment import collect_environment, git_commit, tracked_tree_dirty
from rlnorm.kit.params import RunParams, load_params
from rlnorm.options import OpOptions

__all__ = [
    "RECORDS_FILE",
    "Run",
    "finish",
    "params_from_namespace",
    "run_agreement",
    "run_backends",
    "run_gates",
    "run_trainer_sampler",
    "start_run",
    "write_artifact_and_records",
]

ARTIFACT_FILE = "rms_norm_gated_reuse_check.json"
RECORDS_FILE = "records.csv"
PLOTS_DIR = "plots"
# the CLI points this at a file it echoes to the terminal, so progress stays out of the notebook
PROGRESS_ENV = "RLNORM_PROGRESS_FILE"


@dataclass
class Run:
    """What one run has found so far; each notebook step adds to it."""

    params: RunParams
    device: str
    started: float = field(default_factory=time.time)
    agreement_outputs: dict[str, Any] = field(default_factory=dict)  # key -> its forward on the agreement inputs
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> results.<key> of the artifact
    records: list[dict[str, Any]] = field(default_factory=list)
    agreement: dict[str, Any] | None = None
    trainer_sampler: dict[str, Any] | None = None  # the trainer-vs-sampler check's summary
    environment: dict[str, Any] = field(default_factory=dict)
    artifact: dict[str, Any] | None = None
    artifact_path: Path | None = None
    plots: dict[str, str] = field(default_factory=dict)  # plot name -> path relative to the run folder
    timings: dict[str, float] = field(default_factory=dict)  # step -> seconds
    out: Path = field(default_factory=Path)  # where files go while the run is in progress (a staging folder)
    place_at: Path | None = None  # where `finish` moves `out`, when this process stages the folder itself
    # the code's commit and whether its tracked files differ, read when the run starts: a malformed
    # RLNORM_COMMIT / RLNORM_TREE_DIRTY stops the run before any work, not at its artifact
    commit: str | None = None
    dirty: bool | None = None

    @property
    def opts(self) -> OpOptions:
        return self.params.op_options()

    def ran(self) -> list[str]:
        """Backends whose checks all ran (not skipped, failed, crashed or timed out)."""
        return [k for k, r in self.results.items() if r["status"] == "ran"]


# -- parameters -----------------------------------------------------------------------------------
def params_from_namespace(namespace: dict[str, Any], before: set[str]) -> RunParams:
    """The notebook's parameters: every declared parameter in the namespace, plus every other public
    name that appeared after the `before` snapshot (taken just above the parameters cell).

    Papermill injects what it is given even when the notebook does not declare it (it only warns),
    so such a name shows up here and is refused by name instead of being silently ignored.
    """
    declared = set(RunParams.__dataclass_fields__)
    raw = {k: namespace[k] for k in declared if k in namespace}
    raw.update(
        (k, v)
        for k, v in namespace.items()
        if k not in before and not k.startswith("_") and k not in ("In", "Out", "exit", "quit", "get_ipython")
    )
    return load_params(raw)


# -- progress ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _progress_stream() -> Iterator[TextIO]:
    """Where tqdm writes: the CLI's echo file when run from the CLI, else stderr (the notebook)."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        yield sys.stderr
        return
    try:
        f = open(path, "a", buffering=1)
    except OSError:
        yield sys.stderr
        return
    try:
        with contextlib.redirect_stderr(f):  # the checks' own tqdm bars follow sys.stderr too
            yield f
    finally:
        f.close()


# -- steps ---------------------------------------------------------------------------------------
def start_run(params: RunParams) -> Run:
    """Resolve the device, refuse to overwrite a run unless asked, stage the run folder, read the environment.

    Under `python -m rlnorm run` the command line stages the folder (`staging_dir`) and places it with the page
    beside it; executed any other way (papermill, JupyterLab) the run stages its own folder and `finish` places
    it, so either way `outputs/NAME/` is written whole or not at all.
    """
    device = params.resolved_device()
    commit, dirty = git_commit(), tracked_tree_dirty()  # ValueError naming the variable when one is malformed
    if device == "cpu" and not torch.cuda.is_available():
        # Triton only runs on the CPU interpreted; rlnorm's import set this unless the user chose otherwise
        os.environ.setdefault("TRITON_INTERPRET", "1")
    run = Run(params=params, device=device, commit=commit, dirty=dirty)
    if params.staging_dir:
        run.out = Path(params.staging_dir)
        run.out.mkdir(parents=True, exist_ok=True)
    else:
        run.place_at = params.run_dir
        run.out = folders.staging_for(run.place_at, params.overwrite)

    run.environment = collect_environment(device)
    return run


def run_backends(run: Run) -> None:
    """Every backend's checks, each backend in a process of its own with the run's time limit.

    A backend that cannot run here is skipped with its reason, one that cannot be loaded failed; one whose
    process crashes, exits, poisons its device or outlives `backend_timeout_s` is recorded as crashed or timed
    out with the cause and the batch it was on, and keeps the checks it finished. The others are untouched.
    """
    specs = [*run.params.backends, *run.params.custom_backends]
    params = run.params.as_dict()
    # on the CPU the next backend's process imports while this one runs its checks; on a GPU nothing runs beside
    # a backend being timed
    ahead = run.device == "cpu"
    t0 = time.time()
    with _progress_stream() as stream:
        relay = (lambda line: stream.write(line)) if run.params.progress else None
        # every started process stays here until it has finished, so an interrupt anywhere closes it
        started: dict[int, isolation.BackendProcess] = {}
        try:
            for i, spec in enumerate(specs):
                if i not in started:
                    started[i] = isolation.BackendProcess(spec, params, run.device, relay)
                if ahead and i + 1 < len(specs):
                    started[i + 1] = isolation.BackendProcess(specs[i + 1], params, run.device, relay)
                if run.params.progress:
                    print(f"[{i + 1}/{len(specs)}] {spec}: in its own process", file=stream, flush=True)
                outcome = started[i].finish(run.params.backend_timeout_s)
                del started[i]
                run.results[spec] = outcome.result
                run.records.extend(outcome.records)
                run.timings.update(outcome.timings)
                run.timings[spec] = outcome.seconds
                if outcome.agreement_output is not None:
                    run.agreement_outputs[spec] = outcome.agreement_output
                if run.params.progress:
                    r = outcome.result
                    why = f": {r['skip_reason']}" if r["status"] != "ran" else ""
                    checks_s = sum(outcome.timings.values())  # the rest is the process: start, imports, probe
                    print(
                        f"[{i + 1}/{len(specs)}] {spec}: {r['status']}{why} ({outcome.seconds:.1f} s, of which checks "
                        f"{checks_s:.1f} s)",
                        file=stream,
                    )
        finally:
            for proc in started.values():  # interrupted: no process outlives the run
                proc.close()
    run.timings["backends"] = time.time() - t0


def run_gates(run: Run) -> None:
    """The contract gates of every backend that ran, each in a child process (crash or hang = failed gate)."""

    if "contract_gates" not in run.params.checks:
        return

    t0 = time.time()
    keys = run.ran()
    with _progress_stream() as stream:
        for i, key in enumerate(keys, 1):
            res = run.results[key]
            t_key = time.time()
            try:
                res["contract_gates"] = gates.run_gates(
                    key, opts=run.opts, device=run.device, timeout_s=run.params.gate_timeout_s, d=run.params.d
                )
            except Exception as exc:
                res["errors"]["contract_gates"] = describe_error(exc)
            if run.params.progress:
                got = res.get("contract_gates") or {}
                said = ", ".join(f"{g} {'passed' if (got.get(g) or {}).get('passed') else 'failed'}" for g in got)
                print(f"[gates {i}/{len(keys)}] {key}: {said or 'not run'} ({time.time() - t_key:.0f} s)", file=stream)
    run.timings["gates"] = time.time() - t0


def run_agreement(run: Run) -> None:
    """Fraction of forward outputs bitwise equal between each pair of backends, from each one's own process."""
    if "agreement" not in run.params.checks or not run.agreement_outputs:
        return
    p = run.params
    errors = {k: r["errors"]["agreement"] for k, r in run.results.items() if "agreement" in (r.get("errors") or {})}
    run.agreement = checks.agreement_from_outputs(
        run.agreement_outputs, p.agreement_rows, p.agreement_seed, errors
    ).summary


# the parameters that set the protocol's size: a run that shrinks any of them is a "quick" run
PROTOCOL_FIELDS = (
    "all_rows_sizes",
    "all_rows_seeds",
    "dweight_rows",
    "sub_batches_rows",
    "sub_batch_sizes",
    "sub_batches_seeds",
    "sweep_n",
    "sweep_sizes",
    "sweep_probe_rows",
    "sweep_seeds",
    "accuracy_rows",
)


def is_quick(params: RunParams) -> bool:
    """True when the run is smaller than the full protocol (docs/spec.md §4-5) (the report's `quick` key)."""
    full = RunParams()
    return any(getattr(params, f) != getattr(full, f) for f in PROTOCOL_FIELDS)


def write_artifact_and_records(run: Run) -> Path:
    """The per-row records CSV and the JSON artifact, both written atomically; the artifact is
    validated against the schema before it is written."""

    out = run.out
    rec.write_records(rec.records_frame(run.records), out / RECORDS_FILE)
    run.artifact = art.build_artifact(
        params={k: v for k, v in run.params.as_dict().items() if k != "staging_dir"},
        environment=run.environment,
        results=run.results,
        agreement=run.agreement,
        records_path=RECORDS_FILE,
        plots=dict(run.plots),
        quick=is_quick(run.params),
        checks=list(run.params.checks),
        commit=run.commit,
        dirty=run.dirty,
        param_set=run.params.name,
        rfc=run.params.rfc,
        wall_time_s=round(time.time() - run.started, 1),
        trainer_sampler=run.trainer_sampler,
    )
    run.artifact_path = out / ARTIFACT_FILE
    art.write_artifact(run.artifact, run.artifact_path, overwrite=True)
    return run.artifact_path


def finish(run: Run) -> dict[str, Any]:
    """Place the run folder (when this process staged it) and say what the run wrote."""
    run.timings["total"] = time.time() - run.started
    if run.place_at is not None:
        folders.place(run.out, run.place_at, overwrite=run.params.overwrite)
        run.out, run.place_at = run.place_at, None
    return {
        "run_dir": str(run.params.run_dir),
        "artifact": ARTIFACT_FILE,
        "records": RECORDS_FILE,
        "plots": sorted(run.plots.values()),
        "backends": {k: r["status"] for k, r in run.results.items()},
        "seconds": round(run.timings["total"], 1),
        "seconds_per_step": {k: round(v, 1) for k, v in run.timings.items() if k != "total"},
    }


# -- trainer against sampler ---------------------------------------------------------------------------------------
TRAINER_SAMPLER_CHILD = "import sys; from rlnorm.kit.checks.trainer_sampler import main; sys.exit(main(sys.argv[1:]))"


def run_trainer_sampler(run: Run) -> None:
    """The same rows through the norm as transformers' and vLLM's Qwen3-Next layers call it, patched with rlnorm and
    not (`rlnorm.kit.checks.trainer_sampler`), at the run's width, eps and agreement rows and seed.

    It runs in a process of its own (it imports vLLM, whose import patches torch's compiler for the rest of a
    process), within `backend_timeout_s`; a crash or a hang becomes the summary's `error`, never the run's end.
    """
    if "trainer_sampler" not in run.params.checks:
        return
    p = run.params
    t0 = time.time()
    job = {
        "d": p.d,
        "eps": p.eps,
        "rows": p.agreement_rows,
        "seed": p.agreement_seed,
        "device": run.device,
        "weight_dtype": p.weight_dtype,
        "opts": run.opts.as_dict(),
    }
    with tempfile.TemporaryDirectory(prefix="rlnorm-trainer-sampler-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        end = isolation.run_child(
            [sys.executable, "-c", TRAINER_SAMPLER_CHILD, str(job_path), str(out_path)],
            p.backend_timeout_s,
            result_file=out_path,
        )
    summary = end.result.get("summary") if isinstance(end.result, dict) else None
    if end.timed_out:
        summary = {"error": f"timed out after {p.backend_timeout_s:g} s"}
    elif not isinstance(summary, dict):
        how, _ = isolation.describe_exit(end.returncode)
        what = "left no readable result" if end.returncode == 0 else how
        tail = [ln for ln in end.stderr.strip().splitlines() if ln.strip()]
        summary = {"error": f"its process {what}; last line: {tail[-1][:500] if tail else '(no stderr)'}"}
    run.trainer_sampler = summary
    run.timings["trainer_sampler"] = time.time() - t0
