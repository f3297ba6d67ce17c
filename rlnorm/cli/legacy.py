"""`python -m rlnorm`: run the reuse-check notebook into a run folder, or validate what a run wrote.

    python -m rlnorm run params/quick.yaml [--name NAME] [--force] [--device auto|cpu|cuda]
    python -m rlnorm validate outputs/NAME/rms_norm_gated_reuse_check.json   (or a params .yaml)

`run` executes notebooks/reuse_check.py with papermill into a staging folder beside the run
folder and moves it into place at the end, so `outputs/NAME/` is either absent, the previous run
(untouched), or a complete new run: never half of one. A failing cell still leaves the partial
executed notebook and its HTML there, and the exit status is non-zero with the cell named.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlnorm.checkout import CHECKOUT
from rlnorm.kit.artifact import read_artifact, resolve_path
from rlnorm.kit.params import ParamsError, load_params

__all__ = ["main", "render_html", "run_notebook"]

NOTEBOOK = "reuse_check"
EXIT_CELL_FAILED = 1
EXIT_USAGE = 2
EXIT_EXISTS = 3


class RunFailed(RuntimeError):
    """A cell of the notebook raised; the message names the cell."""


def notebook_source(name: str = NOTEBOOK) -> Path:
    """The jupytext source of a notebook of this checkout."""
    path = (CHECKOUT or Path.cwd()) / "notebooks" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"notebook source {path} not found (run from a checkout: pip install -e .)")
    return path


def _cell_label(cell: Any, index: int) -> str:
    title = cell.get("metadata", {}).get("title")
    if title:
        return f"cell {index} {title!r}"
    first = next((ln for ln in cell.get("source", "").splitlines() if ln.strip()), "")
    return f"cell {index} ({first[:60]!r})"


@contextlib.contextmanager
def _echo_progress(path: Path, enabled: bool) -> Iterator[None]:
    """Copy what the kernel writes to `path` (its tqdm bars) to our stderr while the notebook runs."""
    stop = threading.Event()
    path.touch()

    def pump() -> None:
        with open(path, encoding="utf-8", errors="replace") as f:
            while True:
                chunk = f.read()
                if chunk:
                    sys.stderr.write(chunk)
                    sys.stderr.flush()
                elif stop.is_set():
                    return
                else:
                    time.sleep(0.2)

    thread = threading.Thread(target=pump, daemon=True) if enabled else None
    if thread:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread:
            thread.join(timeout=5)


def _make_engine(verbose: bool, started: list[str]) -> str:
    """A papermill engine that prints each cell's title as it starts (cell progress on the terminal)
    and appends its label to `started`, so a kernel that dies mid-cell still has that cell named."""
    from papermill.engines import NBClientEngine, papermill_engines

    class _TitledEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
            original = nb_man.cell_start
            code_cells = [c for c in nb_man.nb.cells if c.cell_type == "code"]

            def cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
                if cell.cell_type == "code" and cell in code_cells:
                    started.append(_cell_label(cell, code_cells.index(cell) + 1))
                if verbose and cell.cell_type == "code":
                    n = code_cells.index(cell) + 1 if cell in code_cells else "?"
                    title = cell.metadata.get("title") or (
                        "injected parameters" if "injected-parameters" in cell.metadata.get("tags", []) else ""
                    )
                    print(f"[{n}/{len(code_cells)}] {title}", file=sys.stderr, flush=True)
                return original(cell, cell_index, **kw)

            nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    papermill_engines.register("rlnorm", _TitledEngine)
    return "rlnorm"


def render_html(executed: Path, html: Path, title: str) -> Path:
    """The executed notebook as HTML without the code: what an RFC reader opens."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    tmp = html.with_suffix(".html.tmp")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, html)
    return html


def _failing_cell(executed: Path) -> str:
    """Name the cell that failed (or was running when the kernel died), from the partial notebook."""
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception:
        return "an unknown cell (no executed notebook was written)"
    code = [c for c in nb.cells if c.cell_type == "code"]
    for status in ("failed", "running"):  # papermill's own bookkeeping, per cell
        for i, cell in enumerate(code, 1):
            if cell.get("metadata", {}).get("papermill", {}).get("status") == status:
                return _cell_label(cell, i)
    for i, cell in enumerate(code, 1):
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
            return _cell_label(cell, i)
    return "an unknown cell"


def run_notebook(
    params: dict[str, Any],
    run_dir: Path,
    *,
    force: bool = False,
    progress: bool = True,
    notebook: str = NOTEBOOK,
) -> Path:
    """Execute the notebook with `params` into `run_dir` (atomically placed). Raises RunFailed naming
    the failing cell (the partial run is still placed), FileExistsError if run_dir exists and not force."""
    import jupytext
    import nbformat
    import papermill as pm
    import torch

    run_dir = Path(run_dir)
    if run_dir.exists() and not force:
        raise FileExistsError(f"{run_dir} already exists: pass --force to replace it, or --name to pick another")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.partial-", dir=run_dir.parent))
    progress_file = Path(tempfile.mkstemp(prefix="rlnorm-progress-", suffix=".log")[1])
    env_before = dict(os.environ)
    failure: str | None = None
    started: list[str] = []
    try:
        source = jupytext.read(notebook_source(notebook))
        source.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        input_nb = staging / f".{notebook}.input.ipynb"
        nbformat.write(source, input_nb)
        executed = staging / f"{notebook}.ipynb"
        injected = {**params, "output_dir": str(run_dir), "staging_dir": str(staging)}
        # the kernel must be this interpreter, whatever `python` a system kernelspec names
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        if params.get("device") == "cpu" or not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"  # Triton only runs on the CPU interpreted
        os.environ["RLNORM_PROGRESS_FILE"] = str(progress_file)
        # inline, so display(fig) puts PNGs in the notebook whatever MPLBACKEND the shell has
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        try:
            with _echo_progress(progress_file, progress):
                pm.execute_notebook(
                    str(input_nb),
                    str(executed),
                    parameters=injected,
                    kernel_name="python3",
                    engine_name=_make_engine(progress, started),
                    progress_bar=False,
                    log_output=False,
                    cwd=os.getcwd(),
                )
        except pm.PapermillExecutionError as exc:
            failure = f"{_failing_cell(executed)} failed: {exc.ename}: {exc.evalue}"
        except Exception as exc:  # the kernel died (out of memory, a crash in native code) or would not start
            where = started[-1] if started else "the kernel start"
            failure = f"{where} did not finish: {type(exc).__name__}: {str(exc).strip()[:500]}"
        input_nb.unlink(missing_ok=True)
        if executed.exists():
            render_html(executed, staging / f"{notebook}.html", f"rlnorm reuse check: {run_dir.name}")
        if run_dir.exists() and not force:  # another run took the name meanwhile: keep both
            raise FileExistsError(f"{run_dir} appeared while this run was going; this run is kept in {staging}")
        _place(staging, run_dir)
    except FileExistsError:
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.environ.clear()
        os.environ.update(env_before)
        progress_file.unlink(missing_ok=True)
    if failure:
        raise RunFailed(f"{failure}\n  the partial notebook is in {run_dir / (notebook + '.ipynb')}")
    return run_dir


def _place(staging: Path, run_dir: Path) -> None:
    """Move the staged run into place; an existing run is swapped out whole, then deleted."""
    old = None
    if run_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.old-", dir=run_dir.parent))
        os.replace(run_dir, old / run_dir.name)
    try:
        os.replace(staging, run_dir)
    except BaseException:
        if old is not None:  # put the previous run back rather than leave nothing
            os.replace(old / run_dir.name, run_dir)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _cmd_run(args: argparse.Namespace) -> int:

    overrides: dict[str, Any] = {}
    if args.name:
        overrides["name"] = args.name
    if args.device:
        overrides["device"] = args.device
    if args.no_progress:
        overrides["progress"] = False
    try:
        params = load_params(args.params, **overrides)
        if "name" not in overrides and params.name == "run":
            params = load_params(args.params, **overrides, name=Path(args.params).stem)
        params.resolved_device()
    except ParamsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    run_dir = Path(args.outputs) / params.name
    if run_dir.exists() and not args.force:
        print(f"error: {run_dir} already exists: pass --force to replace it, or --name NAME", file=sys.stderr)
        return EXIT_EXISTS
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the staging folder and the kernel are cleaned up
    signal.signal(signal.SIGTERM, _raise_interrupt)
    print(f"rlnorm: running {NOTEBOOK} with {args.params} into {run_dir}/", file=sys.stderr)
    t0 = time.time()
    try:
        run_notebook(params.as_dict(), run_dir, force=args.force, progress=params.progress)
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CELL_FAILED
    wall = time.time() - t0
    print(f"rlnorm: done in {wall:.0f} s: {run_dir}/", file=sys.stderr)
    for f in sorted(run_dir.rglob("*")):
        if f.is_file():
            print(f"  {f.relative_to(run_dir)}", file=sys.stderr)
    artifact = run_dir / "rms_norm_gated_reuse_check.json"
    if artifact.is_file():
        import json

        print("verdicts (read the HTML for the why):", file=sys.stderr)
        _print_verdicts(json.loads(artifact.read_text()), sys.stderr)
    return 0


def _print_verdicts(doc: dict[str, Any], stream: Any) -> None:
    """One line per backend: status, batch_invariant, and why it did not run."""
    for key, r in (doc.get("results") or {}).items():
        bi = (r.get("batch_invariance") or {}).get("batch_invariant")
        status = r.get("status", "ran")
        why = f" ({r.get('skip_reason')})" if status != "ran" and r.get("skip_reason") else ""
        errors = f" errors in {', '.join(r['errors'])}" if r.get("errors") else ""
        print(f"  {key:<24} {status:<8} batch_invariant={bi}{why}{errors}", file=stream)


def _cmd_validate(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.suffix in (".yaml", ".yml"):
        try:
            load_params(path)
        except ParamsError as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 1
        print(f"{path}: valid run parameters")
        return 0

    try:
        doc = read_artifact(path)
    except Exception as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 1
    missing = []
    for rel in [doc.get("records"), *(doc.get("plots") or {}).values()]:
        if rel:
            target = resolve_path(path, rel)
            if target is None or not target.exists():
                missing.append(rel)
    print(f"{path}: valid artifact (schema {doc.get('schema_version')}, {doc.get('environment', {}).get('gpu')})")
    _print_verdicts(doc, sys.stdout)
    if missing:
        print(f"error: files the artifact names are missing: {missing}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlnorm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute the reuse-check notebook into outputs/NAME/")
    run.add_argument("params", help="a parameters YAML file, e.g. params/quick.yaml")
    run.add_argument("--name", help="run folder name under --outputs (default: the file's `name`)")
    run.add_argument("--force", action="store_true", help="replace an existing run folder (atomically)")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override the file's device")
    run.add_argument("--outputs", default="outputs", help="folder holding run folders (default: outputs)")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.set_defaults(func=_cmd_run)
    val = sub.add_parser("validate", help="check an artifact .json (schema, files it names) or a params .yaml")
    val.add_argument("path")
    val.set_defaults(func=_cmd_validate)
    for name, what in BENCH_COMMANDS.items():
        cmd = sub.add_parser(name, help=what, add_help=False)
        cmd.add_argument("args", nargs=argparse.REMAINDER)
    return parser


# the benchmark's own command lines, reached through `python -m rlnorm NAME ...` (their --help says the rest)
BENCH_COMMANDS = {
    "bench": "time rlnorm and its peers against a same-run torch.add (GPU); see docs/benchmarking.md",
    "bench-merge": "merge bench runs from separate processes into one table of medians",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in BENCH_COMMANDS:
        # imported here: the benchmark pulls in every peer's adapter, which `run` and `validate` never need
        from rlnorm import bench
        from rlnorm.bench import merge

        return int((bench.main if argv[0] == "bench" else merge.main)(argv[1:]))
    args = build_parser().parse_args(argv)
    return int(args.func(args))
