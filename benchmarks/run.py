"""The speed benchmark: rlnorm, its variants and every peer that runs here against a same-run `torch.add`.

    python -m benchmarks.run [--quick | --smoke] [--d 128 256] [--rows 262144] [--small-rows 32 512 4096]
                             [--backends KEY ...] [--variant fwd.NAME=VALUE ...] [--base REV]
                             [--out FILE.json] [--force] [--append-results [CSV]] [--allow-cpu]
    python -m benchmarks.run --merge RUN.json RUN.json ... [--out FILE.json] [--append-results [CSV]]
    python -m benchmarks.run --merge SAVED.json --append-results [CSV] [--command CMD]

Every ratio is to a `torch.add` of the same shape timed the same way in the same run (8/3 of it for
forward+backward); docs/benchmarking.md says why, and what each clock measures. --merge merges runs of
separate processes (each ratio still to its own run's add); one saved file of any kind with
--append-results appends its rows as they are.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks import base, merge, results, runner
from benchmarks.table import format_base, format_footer, format_markdown
from benchmarks.variants import VariantError, parse_variants
from rlnorm.kit.artifact import write_atomic
from rlnorm.kit.results import to_json

PROG = "python -m benchmarks.run"
EXIT_USAGE, EXIT_EXISTS = 2, 3  # like `python -m rlnorm run`: the output is there and --force was not given
# options that say where results go, not how they were timed: left out of the recorded command
_OUTPUT_FLAGS = ("--force", "--no-progress", "--allow-cpu")
_OUTPUT_VALUED = ("--out", "--command")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, nargs="+", default=[128, 256], help="row widths")
    p.add_argument("--rows", type=int, nargs="+", default=[262144], help="large row counts")
    p.add_argument("--small-rows", type=int, nargs="*", default=[32, 512, 4096], help="decode-sized row counts")
    p.add_argument(
        "--backends", nargs="+", default=None, help=f"registered keys or module:attr (default {runner.PEERS})"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="fwd.NAME=VALUE",
        help="rlnorm under kernel switches, a line of its own (repeatable; commas join the switches of one "
        "variant: fwd.EXACT=0,bwd.STAGES=1)",
    )
    p.add_argument(
        "--base",
        default=None,
        metavar="REV",
        help="time the kernel of commit REV (or of a folder holding rlnorm/kernel/) against this tree's, "
        "each in a process of its own; rlnorm alone",
    )
    p.add_argument("--merge", nargs="+", default=None, metavar="RUN.json", help="merge runs written by --out")
    p.add_argument("--allow-mixed-commits", action="store_true", help="--merge runs of different commits")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu (no timing claims)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions: every shape and backend in minutes")
    p.add_argument("--smoke", action="store_true", help="one call of each: every path runs, nothing is timed")
    p.add_argument("--graph-max-rows", type=int, default=None, help="shapes up to this many rows use CUDA graphs")
    p.add_argument("--out", default=None, help="write the document as JSON here (atomic)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (per-shape tables still print)")
    p.add_argument(
        "--append-results",
        nargs="?",
        const=str(results.DEFAULT_CSV),
        default=None,
        metavar="CSV",
        help="append the rows to the results table (default benchmarks/results.csv); never rewrites a row",
    )
    p.add_argument(
        "--allow-cpu", action="store_true", help="append a CPU run's rows too (no speed claim rests on them)"
    )
    p.add_argument("--command", default=None, help="the command that made a saved file's numbers (--merge, one file)")
    return p


def timing_args(argv: Sequence[str], drop: Sequence[str] = ()) -> list[str]:
    """argv without the output options and the valued options in `drop`: how the numbers were timed."""
    keep: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        name, eq, _ = arg.partition("=")
        if skip or name in _OUTPUT_FLAGS:
            skip = False
            continue
        if name == "--append-results":  # argparse took the next word as its value where it is a .csv
            skip = not eq and argv[i + 1 : i + 2] != [] and argv[i + 1].endswith(".csv")
        elif name in (*_OUTPUT_VALUED, *drop):
            skip = not eq
        else:
            keep.append(arg)
    return keep


def write(doc: dict, out: str | Path, force: bool) -> None:
    """doc as JSON at out, atomically (a reader never sees half a file)."""
    write_atomic(Path(out), json.dumps(to_json(doc), indent=1), overwrite=force)


def _load(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise merge.MergeError(f"--merge: cannot read {path!r}: {exc}") from exc
    if not isinstance(doc, dict) or not str(doc.get("kind", "")).startswith("rlnorm.bench"):
        raise merge.MergeError(f"--merge: {path!r} is not a benchmark document")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    a = p.parse_args(argv)
    if a.out and Path(a.out).exists() and not a.force:
        print(f"--out: {a.out!r} already exists; pass --force to replace it", file=sys.stderr)
        return EXIT_EXISTS
    if a.quick and a.smoke:
        p.error("--quick and --smoke: give one")
    if (a.base or a.merge) and (a.variant or a.backends or (a.base and a.merge)):
        p.error("--base times rlnorm alone and --merge times nothing: leave out --variant, --backends and the other")
    settings = runner.SMOKE if a.smoke else runner.QUICK if a.quick else runner.Settings()
    if a.graph_max_rows is not None:
        if a.graph_max_rows < 0:
            p.error(f"--graph-max-rows: expected >= 0, got {a.graph_max_rows}")
        settings = replace(settings, graph_max_rows=a.graph_max_rows)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.append_results is not None and not (a.merge or a.allow_cpu or device.startswith("cuda")):
        print(
            f"--append-results: this run is on {device!r}, whose clock makes no speed claim; pass --allow-cpu to "
            "append its rows anyway",
            file=sys.stderr,
        )
        return EXIT_USAGE
    command = f"{PROG} {shlex.join(timing_args(argv))}".strip()
    saved = a.merge is not None and len(a.merge) == 1 and a.append_results is not None
    partial = Path(f"{a.out}.partial") if a.out else None  # a run cut short keeps its finished shapes there
    try:
        wanted = parse_variants(a.variant)
        if saved:  # one saved file of any kind: its rows as they are
            doc = _load(a.merge[0])
            print(f"{a.merge[0]}: {doc['kind']}, {format_footer(doc.get('head', {}).get('run', doc))}")
        elif a.merge:
            doc = merge.merge([_load(f) for f in a.merge], a.merge, a.allow_mixed_commits, command)
            print(format_markdown(doc["shapes"]) + "\n\nrlnorm against each run's own fastest peer:")
            print(merge.format_verdicts(doc))
        elif a.base:
            doc = base.run_base(a.base, timing_args(argv, drop=("--base",)))
            doc["command"] = command
            print(format_base(doc) + "\n\n" + format_footer(doc["head"]["run"]))
        else:
            doc = runner.run(
                a.d,
                [*a.rows, *a.small_rows],
                a.backends or runner.PEERS,
                device,
                settings,
                progress=not a.no_progress,
                variants=wanted,
                command=command,
                on_shape=lambda d: write(d, partial, True) if partial else None,
            )
            print(format_markdown(doc["shapes"]) + "\n\n" + format_footer(doc))
    except (VariantError, merge.MergeError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except base.BaseError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if a.out and not saved:
        write(doc, a.out, a.force)
        print(f"wrote {a.out}")
        if partial:
            partial.unlink(missing_ok=True)
    if a.append_results is not None:
        try:
            rows = results.rows_from_doc(doc, a.command)
            n = results.append_rows(a.append_results, rows, a.allow_cpu)
        except results.ResultsError as exc:
            print(str(exc), file=sys.stderr)
            return EXIT_USAGE
        print(f"appended {n} rows to {a.append_results} ({len(rows) - n} already there)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
