"""Running reuse checks from the command line: one run in this process, several as independent processes
(`python -m rlnorm run FILE --only K`, the command a scheduler's array task runs), at most N at a time."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from subprocess import PIPE, STDOUT

from rlnorm.cli.notebook import execute
from rlnorm.cli.plan import Combination
from rlnorm.kit import artifact
from rlnorm.kit.results import RunResult, load_run
from rlnorm.kit.steps import ARTIFACT_FILE
from rlnorm.report.verdict import State, backend_verdict, summary_lines

NOTEBOOK = "reuse_check"
EXIT_CELL_FAILED = 1  # a cell or a step raised, or the kernel died; the run is placed for reading
EXIT_USAGE = 2  # bad arguments or parameters: nothing ran
EXIT_EXISTS = 3  # the run folder exists and --force was not given: nothing ran
EXIT_BACKEND = 4  # the run is complete, but a backend could not be loaded, crashed, timed out or a check raised
EXIT_REQUIRED = 5  # the run is complete, but a backend `--require` names is not what it requires
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: nothing was written
# seconds an interrupted matrix waits for each running combination to end: on its own (Ctrl-C), then after SIGTERM
INTERRUPT_GRACE_S = (5.0, 60.0)
# the worst first, for a batch's own exit status
SEVERITY = (EXIT_INTERRUPTED, EXIT_CELL_FAILED, EXIT_EXISTS, EXIT_REQUIRED, EXIT_BACKEND)
REQUIRABLE = ("invariant",)  # what `--require BACKEND=STATE` may ask for


def run_one(combo: Combination, *, force: bool, progress: bool, require: dict[str, str]) -> tuple[int, str]:
    """One run in this process, staged and placed whole with its page: its exit status and what to tell about it."""
    run_dir, staging = combo.folder, None
    # Triton runs on CPU tensors only interpreted, GPU or not
    env = {"TRITON_INTERPRET": "1"} if combo.params.resolved_device() == "cpu" else None
    try:
        staging = artifact.staging_for(run_dir, force)
        params = {**combo.notebook_parameters(), "output_dir": str(run_dir), "staging_dir": str(staging)}
        executed, failure = execute(NOTEBOOK, params, staging, progress=progress,
                                    title=f"rlnorm reuse check: {run_dir.name}", env=env)  # fmt: skip
        artifact.place(staging, run_dir, overwrite=force)
    except artifact.RunExists as exc:  # there before the run, or placed by another meanwhile: nothing replaced
        return EXIT_EXISTS, str(exc)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    artifact_path = run_dir / ARTIFACT_FILE
    run = load_run(artifact_path) if artifact_path.is_file() else None
    if failure:
        # a step after the backends that raised is in the artifact, with every result that stands
        failed = [f"  {f.step}: {f.error}" for f in (run.failed_steps if run else None) or []]
        said = "\n".join(["steps that failed (the artifact holds every other result):", *failed]) if failed else failure
        return EXIT_CELL_FAILED, f"{said}\n  the partial notebook is in {run_dir / executed.name}"
    code, lines = verdict_status(run, require)
    return code, "\n".join(lines)


def verdict_status(run: RunResult | None, require: dict[str, str]) -> tuple[int, list[str]]:
    """A complete run's exit status and summary: EXIT_REQUIRED, else EXIT_BACKEND (failed, died, raised), else 0."""
    results = run.results if run else {}
    problems = [f"  {k}: {r.status}: {r.skip_reason}" for k, r in results.items()
                if r.status in ("failed", "crashed", "timed_out")]  # fmt: skip
    # a check that raised is no clean exit either: its backend has no verdict from that check
    problems += [f"  {k}: raised in {', '.join(r.errors)}" for k, r in results.items()
                 if r.status == "ran" and r.errors]  # fmt: skip
    verdicts = {k: backend_verdict(k, results[k]) for k in require if k in results}
    missing = [f"  {k}: required {want}, " + (f"is {verdicts[k].sentence()}" if k in verdicts else
               "but it is not in this run") for k, want in require.items()
               if k not in verdicts or verdicts[k].overall is not State.PASSED]  # fmt: skip
    lines = ["verdicts (the page says why):", *(summary_lines(run) if run else [])]
    if missing:
        lines += ["required backends that are not what --require asks:", *missing]
    if problems:
        lines += ["backends a script must know about (the run is complete):", *problems]
    return (EXIT_REQUIRED if missing else EXIT_BACKEND if problems else 0), lines


# set in each combination's own process: its parent builds the index, so the child gives no hint about it
MATRIX_CHILD_ENV = "RLNORM_MATRIX_CHILD"


def _child_command(index: int, argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "rlnorm", *argv, "--only", str(index)]


def run_many(combos: Sequence[Combination], argv: Sequence[str], *, jobs: int, gpus: Sequence[str],
             progress: bool) -> list[int]:  # fmt: skip
    """Each combination K as its own `python -m rlnorm ARGV --only K` process, at most `jobs` at a time; with
    `gpus`, each process sees one of them (CUDA_VISIBLE_DEVICES). Lines it prints are prefixed with its label."""
    free: queue.Queue[str] = queue.Queue()
    for gpu in gpus:
        free.put(gpu)
    lock = threading.Lock()
    running: list[subprocess.Popen[str]] = []
    done = itertools.count(1)

    def say(text: str) -> None:
        with lock:
            print(text, file=sys.stderr, flush=True)

    def one(index: int, combo: Combination) -> int:
        gpu = free.get() if gpus else None
        env = dict(os.environ, **{MATRIX_CHILD_ENV: "1"}, **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}))
        say(f"rlnorm: [{combo.label}] starting" + (f" on GPU {gpu}" if gpu is not None else ""))
        t0 = time.time()
        with lock:
            running.append(proc := subprocess.Popen(_child_command(index, argv), stdout=PIPE, stderr=STDOUT, text=True,
                                                    errors="replace", env=env))  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            if progress or not line.startswith("  "):
                say(f"[{combo.label}] {line.rstrip()}")
        code = proc.wait()
        if gpu is not None:
            free.put(gpu)
        seconds, ended = time.time() - t0, "done" if code == 0 else f"exit {code}"
        say(f"rlnorm: [{next(done)}/{len(combos)}] {combo.label}: {ended} in {seconds:.0f} s")
        return code

    pool = ThreadPoolExecutor(max_workers=workers(jobs, gpus, len(combos)))
    try:
        return list(pool.map(one, range(len(combos)), combos))
    except BaseException:
        # interrupted: a terminal's Ctrl-C reached every process of the group already; a SIGTERM sent to this one
        # alone did not, so those still running are told, and each unwinds its own staging folder
        pool.shutdown(wait=False, cancel_futures=True)
        for grace, sig in zip(INTERRUPT_GRACE_S, (None, signal.SIGTERM), strict=True):
            with lock:
                alive = [proc for proc in running if proc.poll() is None]
            for proc in alive if sig is not None else ():
                proc.send_signal(sig)
            for proc in alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
        raise
    finally:
        with contextlib.suppress(Exception):
            pool.shutdown(wait=True, cancel_futures=True)


def workers(jobs: int, gpus: Sequence[str], total: int) -> int:
    """Processes at once: one per GPU when GPUs are given (whatever --jobs says), else `jobs`."""
    return max(1, min(len(gpus) if gpus else jobs, total))


def exit_status(codes: Sequence[int]) -> int:
    """A batch's exit status: the worst of its runs'."""
    return next((code for code in SEVERITY if code in codes), max(codes, default=0))
