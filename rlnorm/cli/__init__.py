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
import signal
import sys
from collections.abc import Sequence

from rlnorm.cli import commands
from rlnorm.cli.runs import EXIT_INTERRUPTED

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
    run.set_defaults(func=commands.cmd_run)

    idx = sub.add_parser("index", help="index page and summary.csv across run folders")
    idx.add_argument("runs", nargs="+", metavar="RUN", help="run folders (outputs/NAME/...)")
    idx.add_argument("--out", help="where index.html and summary.csv go (default: the runs' common parent)")
    idx.set_defaults(func=commands.cmd_index)

    inv = sub.add_parser("investigate", help="explain differing rows: RUN/investigate.html")
    inv.add_argument("run", metavar="RUN", help="run folder or artifact JSON")
    inv.add_argument("--backend", help="backend to look at (default: the first with differing rows, or a crashed one)")
    inv.add_argument("--check", help="check to look at (default: the first with differing rows)")
    inv.add_argument("--row", type=int, help="the case row to explain (default: the first differing one)")
    inv.add_argument("--device", choices=devices, default="auto", help="where to recompute")
    inv.set_defaults(func=commands.cmd_investigate)

    cmp = sub.add_parser("compare", help="two runs side by side: RUN_B/compare-<A>.html")
    cmp.add_argument("run_a", metavar="RUN_A", help="run folder or artifact; 'seed' for the reference B200 report")
    cmp.add_argument("run_b", metavar="RUN_B", help="run folder or artifact; the page goes beside it")
    cmp.set_defaults(func=commands.cmd_compare)

    val = sub.add_parser("validate", help="check a run folder, an artifact or a parameter file")
    val.add_argument("path")
    val.set_defaults(func=commands.cmd_validate)
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
