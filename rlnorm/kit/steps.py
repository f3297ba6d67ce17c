"""The steps of the reuse-check notebook, each one function, so the notebook stays a thin narrative.

A run never stops because one backend misbehaves: a backend that cannot run here is recorded as
skipped with its reason, a check that raises is recorded in `results.<backend>.errors` and the
other checks go on. Only bad parameters stop a run, and they stop it before any work is done.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
from tqdm import tqdm

from rlnorm.kit import artifact as art
from rlnorm.kit import checks, gates
from rlnorm.kit import records as rec
from rlnorm.kit.backends import describe_error, load_backend
from rlnorm.kit.environment import collect_environment, git_commit, tracked_tree_dirty
from rlnorm.kit.params import RunParams, load_params

__all__ = [
    "BI_CHECKS",
    "RECORDS_FILE",
    "Run",
    "batch_invariant_verdict",
    "finish",
    "load_and_probe_backends",
    "params_from_namespace",
    "run_agreement",
    "run_checks",
    "run_gates",
    "start_run",
    "write_artifact_and_records",
]

ARTIFACT_FILE = "rms_norm_gated_reuse_check.json"
RECORDS_FILE = "records.csv"
PLOTS_DIR = "plots"
# the checks that decide `batch_invariant`, in the report's order
BI_CHECKS = ("all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep")
# tqdm.auto (used by peers) warns in a kernel without ipywidgets; its text bars are what we want anyway
warnings.filterwarnings("ignore", message="IProgress not found")
# the CLI points this at a file it echoes to the terminal, so progress bars stay out of the notebook
PROGRESS_ENV = "RLNORM_PROGRESS_FILE"


@dataclass
class Run:
    """What one run has found so far; each notebook step adds to it."""

    params: RunParams
    device: str
    started: float = field(default_factory=time.time)
    backends: dict[str, Any] = field(default_factory=dict)  # key -> Backend (those that ran)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> results.<key> of the artifact
    records: list[dict[str, Any]] = field(default_factory=list)
    agreement: dict[str, Any] | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    artifact: dict[str, Any] | None = None
    artifact_path: Path | None = None
    plots: dict[str, str] = field(default_factory=dict)  # plot name -> path relative to the run folder
    timings: dict[str, float] = field(default_factory=dict)  # step -> seconds

    @property
    def opts(self):
        return self.params.op_options()

    @property
    def out(self) -> Path:
        return self.params.write_dir

    def ran(self) -> list[str]:
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


def _bar(run: Run, total: int, desc: str, stream: TextIO) -> tqdm:
    return tqdm(total=total, desc=desc, file=stream, disable=not run.params.progress, mininterval=1.0, leave=True)


# -- steps ---------------------------------------------------------------------------------------
def start_run(params: RunParams) -> Run:
    """Resolve the device, create the output folder, read the environment."""
    device = params.resolved_device()
    if device == "cpu" and not torch.cuda.is_available():
        # Triton only runs on the CPU interpreted; rlnorm's import set this unless the user chose otherwise
        os.environ.setdefault("TRITON_INTERPRET", "1")
    run = Run(params=params, device=device)
    run.out.mkdir(parents=True, exist_ok=True)

    run.environment = collect_environment(device)
    return run


def _blank_result(key: str, backend: Any | None) -> dict[str, Any]:
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


def load_and_probe_backends(run: Run) -> None:
    """Load every requested backend and probe it on the run's device; those that cannot run are skipped."""

    opts = run.opts
    specs = [*run.params.backends, *run.params.custom_backends]
    with _progress_stream() as stream:
        bar = _bar(run, len(specs), "probe backends", stream)
        for spec in specs:
            bar.set_postfix_str(spec)
            try:
                backend = load_backend(spec)
            except Exception as exc:  # a custom path that does not resolve: say why, go on
                res = _blank_result(spec, None)
                res["status"] = "failed"
                res["skip_reason"] = f"cannot load: {describe_error(exc)}"
                run.results[spec] = res
                bar.update()
                continue
            res = _blank_result(spec, backend)
            try:
                ok, why = backend.available(run.device)
                if ok:
                    ok, why = backend.supports(opts)
                    why = f"does not support {opts.as_dict()}: {why}" if not ok else ""
            except Exception as exc:  # available() promises not to raise; a custom one might
                ok, why = False, f"probe raised {describe_error(exc)}"
            if ok:
                res["status"] = "ran"
                run.backends[spec] = backend
            else:
                res["skip_reason"] = why
            run.results[spec] = res
            bar.update()
        bar.close()


def _check_calls(run: Run) -> dict[str, Callable[[Any], Any]]:
    """check name -> f(backend) calling rlnorm.kit.checks with this run's sizes and seeds."""

    p = run.params
    common = {
        "opts": run.opts,
        "device": run.device,
        "d": p.d,
        "weight_dtype": getattr(torch, p.weight_dtype),
        "progress": p.progress,
    }
    capped = {**common, "max_records": p.max_records}
    return {
        "all_rows": lambda b: checks.all_rows(b, sizes=p.all_rows_sizes, seeds=p.all_rows_seeds, **capped),
        "dweight_repeatable": lambda b: checks.dweight_repeatable(
            b, rows=p.dweight_rows, seed=p.dweight_seed, **capped
        ),
        "full_vs_sub_batches": lambda b: checks.full_vs_sub_batches(
            b,
            rows=p.sub_batches_rows,
            sub_batch_sizes=p.sub_batch_sizes,
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


def batch_invariant_verdict(summaries: dict[str, Any]) -> bool | None:
    """False on any difference; None when a batch-invariance check was not run or raised; else True.

    `summaries`: check name -> the check's summary (dweight_repeatable's full summary dict)."""

    return checks.batch_invariant(*(summaries.get(name) for name in BI_CHECKS))


def run_checks(run: Run) -> None:
    """Every selected check on every backend that ran; a check that raises is recorded, never fatal."""

    calls = _check_calls(run)
    selected = [c for c in run.params.checks if c in calls]
    pairs = [(k, c) for k in run.backends for c in selected]
    summaries: dict[str, dict[str, Any]] = {k: {} for k in run.backends}
    t0 = time.time()
    with _progress_stream() as stream:
        for i, (key, name) in enumerate(pairs, 1):
            if run.params.progress:
                print(f"[{i}/{len(pairs)}] {key}: {name}", file=stream, flush=True)
            backend, res = run.backends[key], run.results[key]
            t_check = time.time()
            try:
                result = calls[name](backend)
            except Exception as exc:
                res["errors"][name] = describe_error(exc)
                continue
            finally:
                run.timings[f"{key}:{name}"] = round(time.time() - t_check, 2)
            summary = result.summary
            if isinstance(summary, dict) and summary.get("error"):
                res["errors"][name] = str(summary["error"])  # a check that caught its own failure
            if name == "accuracy_latency":
                res["accuracy_latency"] = summary
            elif name == "dweight_repeatable":
                summaries[key][name] = summary
                res["batch_invariance"][name] = summary.get("dweight_repeatable")
            else:
                summaries[key][name] = summary
                res["batch_invariance"][name] = summary
            run.records.extend({"backend": key, "check": name, **r} for r in result.records)
    if any(c in selected for c in BI_CHECKS):
        for key in run.backends:
            run.results[key]["batch_invariance"]["batch_invariant"] = batch_invariant_verdict(summaries[key])
    run.timings["checks"] = time.time() - t0


def run_gates(run: Run) -> None:
    """The contract gates of every backend that ran, each in a child process (crash or hang = failed gate)."""

    if "contract_gates" not in run.params.checks:
        return

    t0 = time.time()
    with _progress_stream() as stream:
        bar = _bar(run, len(run.backends), "contract gates", stream)
        for key in run.backends:
            bar.set_postfix_str(key)
            res = run.results[key]
            try:
                res["contract_gates"] = gates.run_gates(
                    key, opts=run.opts, device=run.device, timeout_s=run.params.gate_timeout_s, d=run.params.d
                )
            except Exception as exc:
                res["errors"]["contract_gates"] = describe_error(exc)
            bar.update()
        bar.close()
    run.timings["gates"] = time.time() - t0


def run_agreement(run: Run) -> None:
    """Fraction of forward outputs bitwise equal between each pair of backends, same inputs."""
    if "agreement" not in run.params.checks or not run.backends:
        return

    p = run.params
    try:
        with _progress_stream():
            run.agreement = checks.agreement_matrix(
                list(run.backends.values()),
                opts=run.opts,
                device=run.device,
                rows=p.agreement_rows,
                seed=p.agreement_seed,
                d=p.d,
                weight_dtype=getattr(torch, p.weight_dtype),
                progress=p.progress,
            ).summary
    except Exception as exc:
        run.agreement = {"error": describe_error(exc)}


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
        commit=git_commit(),
        dirty=tracked_tree_dirty(),
        param_set=run.params.name,
        rfc=run.params.rfc,
        wall_time_s=round(time.time() - run.started, 1),
    )
    run.artifact_path = out / ARTIFACT_FILE
    art.write_artifact(run.artifact, run.artifact_path, overwrite=True)
    return run.artifact_path


def finish(run: Run) -> dict[str, Any]:
    """What the run wrote, for the notebook's last cell and the CLI's summary."""
    run.timings["total"] = time.time() - run.started
    return {
        "run_dir": str(run.params.run_dir),
        "artifact": ARTIFACT_FILE,
        "records": RECORDS_FILE,
        "plots": sorted(run.plots.values()),
        "backends": {k: r["status"] for k, r in run.results.items()},
        "seconds": round(run.timings["total"], 1),
        "seconds_per_step": {k: round(v, 1) for k, v in run.timings.items() if k != "total"},
    }
