"""The bench's files: JSON written atomically and never replaced unless asked, and read back by kind."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlnorm.kit.artifact import jsonable, write_artifact

EXIT_EXISTS = 3  # like `python -m rlnorm run`: the output is there and --force was not given
EXIT_USAGE = 2

RUN = "rlnorm.bench"  # one process's run (`python -m rlnorm bench --out`)
MERGED = "rlnorm.bench.merged"  # several runs merged (`python -m rlnorm bench-merge --out`)
BASE = "rlnorm.bench.base"  # two trees' kernels compared (`python -m rlnorm bench --base REV --out`)
KINDS = (RUN, MERGED, BASE)


class BenchFileError(ValueError):
    """A file that is not what was expected: the message names it."""


def add_out_arguments(p: argparse.ArgumentParser, help_out: str) -> None:
    """--out and --force, as every table-writing command takes them."""
    p.add_argument("--out", default=None, help=help_out)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def out_taken(out: str | None, force: bool) -> bool:
    """True (said on stderr) if out exists and force is not given: checked before any work is done."""
    if out and Path(out).exists() and not force:
        print(f"--out: {out!r} already exists; pass --force to replace it", file=sys.stderr)
        return True
    return False


def write_table(doc: dict, out: str | Path, force: bool) -> int:
    """doc as JSON at out, atomically: 0, or EXIT_EXISTS (said on stderr) if out exists and not force."""
    try:
        write_artifact(jsonable(doc, "$"), out, overwrite=force, validate=False)
    except FileExistsError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_EXISTS
    print(f"wrote {out}")
    return 0


def load_doc(path: str | Path, kinds: Iterable[str] = (RUN,)) -> dict:
    """A bench file of one of `kinds`, or BenchFileError naming the file and what it is not."""
    kinds = tuple(kinds)
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchFileError(f"runs: cannot read {str(path)!r}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") not in kinds:
        what = " or ".join(repr(k) for k in kinds)
        raise BenchFileError(f"runs: {str(path)!r} is not a bench file of kind {what}")
    if doc["kind"] != BASE and not isinstance(doc.get("shapes"), list):
        raise BenchFileError(f"runs: {str(path)!r} has no list of shapes")
    return doc


# options that say where results go, not how they were timed: left out of the recorded command
_VALUED = ("--out", "--command")
_FLAGS = ("--force", "--no-progress", "--allow-cpu")


def timing_args(argv: Sequence[str], a: argparse.Namespace, drop: Sequence[str] = ()) -> list[str]:
    """argv without the output options (--out, --force, --no-progress, --append-results, --allow-cpu,
    --command) and without the valued options in `drop`: how the numbers were timed, and nothing else."""
    keep: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        i += 1
        if name in _FLAGS:
            continue
        if name in _VALUED or name in drop:
            i += 0 if eq else 1
            continue
        if name == "--append-results":
            # argparse took the next token as the table's path exactly when it is that path
            if not eq and i < len(args) and args[i] == getattr(a, "append_results", None):
                i += 1
            continue
        keep.append(args[i - 1])
    return keep


def command_line(prog: str, argv: Sequence[str], a: argparse.Namespace) -> str:
    """The command that made the numbers, as the results table records it."""
    keep = timing_args(argv, a)
    return f"{prog} {shlex.join(keep)}".strip()
