"""`python -m rlnorm`: run the reuse check and read what it wrote (each command's options: its --help).

Exit status: 0 done; 1 a notebook cell failed (the partial run is placed, the cell named); 2 bad arguments or
parameters (nothing ran); 3 the run folder exists (pass --force); 4 the run is complete but a backend could not be
loaded, crashed, timed out or raised in a check; 5 a backend named by --require is not invariant (each named
with why); 130 interrupted (nothing written). `validate`: 0 valid, 1 invalid (each problem named), 2 nothing to
read at that path.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlnorm.cli.notebook import execute
from rlnorm.cli.plan import PlanError, expand
from rlnorm.cli.runs import (
    EXIT_CELL_FAILED,
    EXIT_EXISTS,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    MATRIX_CHILD_ENV,
    REQUIRABLE,
    exit_status,
    run_many,
    run_one,
    verdict_status,
    workers,
)
from rlnorm.kit.artifact import load_artifact, write_atomic
from rlnorm.kit.params import ParamsError, load_params
from rlnorm.kit.results import RunResult
from rlnorm.report.compare import digest_table, write_index
from rlnorm.report.runs import open_run, records_of, resolve


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _err(text: str) -> None:
    _say(f"error: {text}")


def cmd_run(args: argparse.Namespace) -> int:
    try:
        if not args.files and not args.parameter and not args.yaml:
            raise PlanError("run: give a parameter file (params/quick.yaml) or parameters (-p KEY VALUE / -y YAML)")
        if args.jobs < 1:
            raise PlanError(f"--jobs: expected a positive number, got {args.jobs}")
        require = {}  # --require BACKEND=STATE, each checked
        for spec in args.require:
            key, eq, state = spec.partition("=")
            if not eq or not key or state not in REQUIRABLE:
                raise PlanError(f"--require: expected BACKEND=STATE with STATE one of {list(REQUIRABLE)}, got {spec!r}")
            require[key] = state
        plan = expand(args.files, args.yaml, [tuple(p) for p in args.parameter], outputs=args.outputs, name=args.name,
                      device=args.device, progress=False if args.no_progress else None)  # fmt: skip
        if args.list:
            for k, c in enumerate(plan.runs):
                print(f"{k}\t{c.folder}\t{c.source}")
            return 0
        if args.only is not None and not 0 <= args.only < len(plan.runs):
            raise PlanError(f"--only: expected 0..{len(plan.runs) - 1} (see --list), got {args.only}")
    except PlanError as exc:
        _err(str(exc))
        return EXIT_USAGE
    gpus = [g.strip() for g in (args.gpus or "").split(",") if g.strip()]
    runs = plan.runs if args.only is None else [plan.runs[args.only]]
    exists = [c for c in runs if c.folder.exists() and not args.force]
    for c in exists:
        _err(f"{c.folder} already exists: pass --force to replace it, or --name NAME")
    if exists:
        return EXIT_EXISTS
    progress, t0 = not args.no_progress, time.time()
    if len(runs) == 1:
        combo = runs[0]
        if gpus and not os.environ.get(MATRIX_CHILD_ENV):  # a matrix's child runs on the GPU its parent gave it
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]
        _say(f"rlnorm: running {combo.source} into {combo.folder}/")
        code, message = run_one(combo, force=args.force, progress=progress, require=require)
        written = "written" if code != EXIT_EXISTS else "not written"
        _say(f"rlnorm: {combo.folder}/ {written} in {time.time() - t0:.0f} s")
        if message:
            print(message, file=sys.stderr if code else sys.stdout)
    else:
        _say(f"rlnorm: {len(runs)} runs, {workers(args.jobs, gpus, len(runs))} at a time")
        codes = run_many(runs, args.argv, jobs=args.jobs, gpus=gpus, progress=progress)  # runs is plan.runs
        for c, code in zip(runs, codes, strict=True):
            if code:
                _err(f"{c.label}: exit {code} (see its folder {c.folder})")
        code = exit_status(codes)
        _say(f"rlnorm: {codes.count(0)} of {len(runs)} runs clean in {time.time() - t0:.0f} s")
    if args.only is None:
        for base, combos in plan.matrices.items():
            if placed := [c.folder for c in combos if c.folder.is_dir() and any(c.folder.glob("*.json"))]:
                index, _ = write_index(placed, base, title=f"{base.name}: {len(placed)} runs")
                _say(f"rlnorm: index of {len(placed)} runs: {index}")
    elif plan.matrices and not os.environ.get(MATRIX_CHILD_ENV):
        _say(f"rlnorm: one combination ran; when all have, build the index with `python -m rlnorm index "
             f"{next(iter(plan.matrices))}/*/`")  # fmt: skip
    return code


def _open(source: str) -> RunResult | None:
    try:
        return open_run(source)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        _err(f"{source}: {exc}")
        return None


def cmd_index(args: argparse.Namespace) -> int:
    runs = [_open(r) for r in args.runs]
    folders = [r.folder for r in runs if r is not None and r.folder is not None]
    if len(folders) != len(runs):
        return EXIT_USAGE
    out = Path(args.out) if args.out else Path(os.path.commonpath([str(f.resolve()) for f in folders]))
    if out in [f.resolve() for f in folders]:  # a single run: the index goes beside it
        out = out.parent
    index, csv = write_index(folders, out)
    print(f"{index}\n{csv}")
    return 0


def _page_beside(notebook: str, params: dict[str, Any], folder: Path, stem: str, title: str) -> int:
    """Execute a report notebook and put its page in `folder` as `stem.html` (one rename; nothing else touched)."""
    with tempfile.TemporaryDirectory(prefix=f"rlnorm-{notebook}-") as tmp:
        _, failure = execute(notebook, params, Path(tmp), progress=False, title=title)
        page = Path(tmp) / f"{notebook}.html"
        if not page.is_file():
            _err(failure or f"{notebook}: no page was made")
            return EXIT_CELL_FAILED
        target = write_atomic(folder / f"{stem}.html", page.read_bytes())
        os.chmod(target, 0o644)  # beside the run's files, readable as they are
    print(str(target))
    if failure:
        _err(f"{failure}\n  the page shows how far it got: {target}")
        return EXIT_CELL_FAILED
    return 0


def cmd_investigate(args: argparse.Namespace) -> int:
    run = _open(args.run)
    if run is None or run.folder is None:
        return EXIT_USAGE
    given = {k: getattr(args, k) for k in ("backend", "check", "row") if getattr(args, k) not in (None, "")}
    params = {"run": str(run.folder.resolve()), "device": args.device, **given}
    stem = "-".join(["investigate", *map(str, given.values())])
    stem = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in stem)
    return _page_beside("investigate_rows", params, run.folder, stem, f"rlnorm: rows of {run.folder.name}")


def cmd_compare(args: argparse.Namespace) -> int:
    a, b = _open(args.run_a), _open(args.run_b)
    if a is None or b is None or a.path is None or b.path is None or b.folder is None:
        return EXIT_USAGE
    label = "seed" if args.run_a == "seed" else a.path.parent.name
    table = digest_table(a, b)  # the same bits, backend by backend, on the terminal too
    for key, same, why in zip(table.index, table["same bits"], table["why"], strict=True):
        word = "cannot tell" if same is None else "same bits" if same else "DIFFERENT bits"
        print(f"{key}: {word} ({why})")
    params = {"artifact_a": str(a.path.resolve()), "artifact_b": str(b.path.resolve())}
    return _page_beside("compare_runs", params, b.folder, f"compare-{label}", f"rlnorm: {label} vs {b.folder.name}")


def _folder_problems(run: RunResult) -> list[str]:
    """What a run folder holds that does not agree with its artifact."""
    named = [(rel, run.resolve(rel)) for rel in [run.records, *(run.plots or {}).values()] if rel]
    problems = [f"{rel}: named by the artifact, missing" for rel, at in named if at is None or not at.exists()]
    try:
        records = records_of(run)
    except Exception as exc:  # a file that lacks a column is refused
        problems.append(f"{run.records}: cannot be read: {exc}")
    else:
        if strangers := sorted(set(records["backend"] if records is not None else ()) - set(run.results)):
            problems.append(f"{run.records}: rows of backends the artifact does not have: {strangers}")
    for page in ("reuse_check.html", "reuse_check.ipynb") if run.created_at and run.folder is not None else ():
        p = run.folder / page
        if p.is_file() and run.created_at not in p.read_text(encoding="utf-8", errors="replace"):
            problems.append(f"{page}: written by another run than this artifact ({run.created_at})")
    return problems


def cmd_validate(args: argparse.Namespace) -> int:
    path = resolve(args.path)
    if not path.exists():
        _err(f"{args.path}: no such file or folder")
        return EXIT_USAGE
    if path.suffix in (".yaml", ".yml"):
        try:
            load_params(path)
        except ParamsError as exc:
            _err(f"{path}: {exc}")
            return 1
        print(f"{path}: valid run parameters")
        return 0
    try:  # its file against the schema, as written: a misspelled key would not survive the typing
        run = load_artifact(open_run(path).path)
    except Exception as exc:
        _err(f"{path}: {exc}")
        return 1
    print(f"{run.path}: valid artifact (schema {run.schema_version}, {run.device_name})")
    print("\n".join(verdict_status(run, {})[1]))  # the verdicts, and the backends that failed or died
    problems = [] if run.is_seed else _folder_problems(run)
    for p in problems:
        _err(p)
    return 1 if problems else 0


# `--d 256` is refused, not taken for `--device`; argparse exits 2 (EXIT_USAGE) on a usage error
_Parser = functools.partial(argparse.ArgumentParser, allow_abbrev=False)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m rlnorm", formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="Check gated-RMSNorm implementations for reuse in RL, and time the rlnorm kernel.",
                     epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    devices = ["auto", "cpu", "cuda"]

    run = sub.add_parser("run", help="run the reuse check into outputs/NAME/ (a list value makes a matrix: one run per "
                         "combination)", description="Run the reuse-check notebook. Parameters come from each FILE, "
                         "then -y, then -p (papermill's order); a key that takes one value may be given a list, making "
                         "one run per combination in outputs/NAME/<combination>/ with an index page.")  # fmt: skip
    run.add_argument("files", nargs="*", metavar="FILE", help="parameter files (params/quick.yaml, ...)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"), help="one "
                     "parameter, its value read as YAML (-p d 256, -p activation '[silu, sigmoid]')")  # fmt: skip
    run.add_argument("-y", "--yaml", metavar="YAML", help="parameters as a YAML mapping ('{d: 256, eps: 1e-5}')")
    run.add_argument("--name", help="run folder name under --outputs (default: the file's `name`, else its stem)")
    run.add_argument("--outputs", default="outputs", help="folder holding run folders (default: outputs)")
    run.add_argument("--force", action="store_true", help="replace existing run folders (each in one rename)")
    run.add_argument("--device", choices=devices, help="override the parameters' device")
    run.add_argument("--jobs", type=int, default=1, help="combinations run at once, as separate processes")
    run.add_argument("--gpus", help="comma-separated GPU ids: one combination per GPU at a time (sets --jobs)")
    run.add_argument("--only", type=int, metavar="K", help="run only combination K (0-based; see --list)")
    run.add_argument("--list", action="store_true", help="list the combinations with their K and exit")
    run.add_argument("--no-progress", action="store_true", help="no progress lines")
    run.add_argument("--require", action="append", default=[], metavar="BACKEND=invariant", help="exit 5 (naming "
                     "it and why) unless BACKEND's verdict is invariant; repeatable, any backend")  # fmt: skip
    run.set_defaults(func=cmd_run)

    idx = sub.add_parser("index", help="index page and summary.csv across run folders")
    idx.add_argument("runs", nargs="+", metavar="RUN", help="run folders (outputs/NAME/...)")
    idx.add_argument("--out", help="where index.html and summary.csv go (default: the runs' common parent)")
    idx.set_defaults(func=cmd_index)

    inv = sub.add_parser("investigate", help="explain differing rows: RUN/investigate.html")
    inv.add_argument("run", metavar="RUN", help="run folder or artifact JSON")
    inv.add_argument("--backend", help="backend to look at (default: the first with differing rows, or a crashed one)")
    inv.add_argument("--check", help="check to look at (default: the first with differing rows)")
    inv.add_argument("--row", type=int, help="the case row to explain (default: the first differing one)")
    inv.add_argument("--device", choices=devices, default="auto", help="where to recompute")
    inv.set_defaults(func=cmd_investigate)

    cmp = sub.add_parser("compare", help="two runs side by side: RUN_B/compare-<A>.html")
    cmp.add_argument("run_a", metavar="RUN_A", help="run folder or artifact; 'seed' for the reference B200 report")
    cmp.add_argument("run_b", metavar="RUN_B", help="run folder or artifact; the page goes beside it")
    cmp.set_defaults(func=cmd_compare)

    val = sub.add_parser("validate", help="check a run folder, an artifact or a parameter file")
    val.add_argument("path")
    val.set_defaults(func=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)  # None: sys.argv[1:]
        args.argv = list(sys.argv[1:] if argv is None else argv)  # what each run of a matrix is started with
    except SystemExit as exc:
        return int(exc.code or 0)
    # SIGTERM (a CI timeout, a scheduler's kill) unwinds like Ctrl-C: staging folders and kernels are cleaned up
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        # the notebook's kernel died with the run: asyncio's and nbclient's complaints about it are not news
        for name in ("asyncio", "traitlets", "papermill"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        print("rlnorm: interrupted; nothing was written (run folders are as they were)", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
