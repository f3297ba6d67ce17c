"""`python -m rlnorm bench`: the speed table, a variant's line beside it, another commit's kernel against
this tree's, and the rows for the results table.

    python -m rlnorm bench [--quick | --smoke] [--d 128 256] [--rows 262144] [--small-rows 32 512 4096]
                           [--backends KEY ...] [--variant fwd.NAME=VALUE ...] [--base REV]
                           [--graph-max-rows N] [--out FILE.json] [--force] [--no-progress]
                           [--append-results [CSV]] [--allow-cpu]

Every ratio is to a `torch.add` of the same shape timed the same way in the same run (8/3 of it for
forward+backward); docs/benchmarking.md says why, and what each clock measures.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from rlnorm.bench import base as base_mod
from rlnorm.bench import results, runner, variants
from rlnorm.bench.files import (
    EXIT_EXISTS,
    EXIT_USAGE,
    add_out_arguments,
    command_line,
    out_taken,
    timing_args,
    write_table,
)
from rlnorm.bench.table import format_base, format_footer, format_markdown
from rlnorm.kit.artifact import jsonable, write_artifact

PROG = "python -m rlnorm bench"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    shapes = p.add_argument_group("shapes")
    shapes.add_argument("--d", type=int, nargs="+", default=[128, 256], help="row widths")
    shapes.add_argument("--rows", type=int, nargs="+", default=[262144], help="large row counts")
    shapes.add_argument("--small-rows", type=int, nargs="*", default=[32, 512, 4096], help="decode-sized row counts")
    what = p.add_argument_group("what is timed")
    what.add_argument(
        "--backends", nargs="+", default=None, help=f"registered keys or module:attr (default {runner.PEERS})"
    )
    what.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="fwd.NAME=VALUE",
        help="rlnorm under kernel switches, a line of its own beside rlnorm (repeatable; join switches of one "
        "variant with commas: fwd.EXACT=0,bwd.STAGES=1)",
    )
    what.add_argument(
        "--base",
        default=None,
        metavar="REV",
        help="time the kernel of commit REV (or of a folder holding rlnorm/kernel/) against this tree's, each in "
        "a process of its own; rlnorm alone",
    )
    how = p.add_argument_group("how")
    how.add_argument("--device", default=None, help="default: cuda if available, else cpu (no timing claims)")
    how.add_argument("--quick", action="store_true", help="fewer repetitions: every shape and backend in minutes")
    how.add_argument(
        "--smoke", action="store_true", help="one call of each: checks that every path runs, times nothing"
    )
    how.add_argument("--graph-calls", type=int, default=None, help="calls captured per CUDA graph")
    how.add_argument("--graph-max-rows", type=int, default=None, help="shapes up to this many rows use graphs")
    out = p.add_argument_group("output")
    add_out_arguments(out, "write the table as JSON here (atomic)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar (per-shape tables still print)")
    results.add_results_arguments(out, command=False)
    return p


def _settings(p: argparse.ArgumentParser, a: argparse.Namespace) -> runner.Settings:
    if a.quick and a.smoke:
        p.error("--quick and --smoke: give one")
    settings = runner.SMOKE if a.smoke else runner.QUICK if a.quick else runner.Settings()
    overrides = (("graph_calls", a.graph_calls), ("graph_max_rows", a.graph_max_rows))
    changes = {k: v for k, v in overrides if v is not None}
    if changes:
        settings = runner.Settings(**{**asdict(settings), **changes})
    for name, v in asdict(settings).items():
        if v < 1:
            p.error(f"{name}: expected >= 1, got {v}")
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    a = p.parse_args(argv)
    if out_taken(a.out, a.force):
        return EXIT_EXISTS
    settings = _settings(p, a)
    if a.base is not None and (a.variant or a.backends):
        p.error("--base times rlnorm alone, in two trees: leave out --variant and --backends")
    try:
        wanted = variants.parse_variants(a.variant)
        variants.validate(wanted)
    except variants.VariantError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.append_results is not None:
        try:
            results.results_path(a.append_results)
        except results.ResultsError as exc:
            print(str(exc), file=sys.stderr)
            return EXIT_USAGE
    if a.append_results is not None and not a.allow_cpu and not device.startswith("cuda"):
        print(
            f"--append-results: this run is on {device!r}, whose clock makes no speed claim; "
            "pass --allow-cpu to append its rows anyway",
            file=sys.stderr,
        )
        return EXIT_USAGE
    command = command_line(PROG, argv, a)
    partial = Path(f"{a.out}.partial") if a.out and a.base is None else None

    if a.base is not None:
        try:
            doc = base_mod.run_base(a.base, timing_args(argv, a, drop=("--base",)))
        except base_mod.BaseError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        doc["command"] = command
        print(format_base(doc))
        print("\n" + format_footer(doc["head"]["run"]))
    else:

        def keep_partial(doc: dict) -> None:  # a run cut short (timeout) still leaves every finished shape
            if partial is not None:
                write_artifact(jsonable(doc, "$"), partial, overwrite=True, validate=False)

        doc = runner.run(
            a.d,
            [*a.rows, *a.small_rows],
            a.backends or runner.PEERS,
            a.device,
            settings=settings,
            progress=not a.no_progress,
            on_shape=keep_partial,
            variants=wanted,
            command=command,
        )
        print(format_markdown(doc["shapes"]))
        print("\n" + format_footer(doc))
    if a.out:
        if write_table(doc, a.out, a.force) != 0:
            return EXIT_EXISTS
        if partial is not None:
            partial.unlink(missing_ok=True)
    if a.append_results is not None:
        return results.append_docs([doc], a.append_results, a.allow_cpu)
    return 0
