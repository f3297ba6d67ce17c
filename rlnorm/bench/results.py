"""The one results table, `benchmarks/results.csv`: every timing worth keeping, one row each, append-only.

A row is one backend, shape, mode and clock of one run (or of a merge of runs): when and where it ran
(date, GPU, torch, Triton, commit), the times (p20 / p50 / p80 microseconds) and the ratio to the same
run's add, whether the GPU queue ran dry (`host_bound`), and the command that made it. Rows are only
ever appended: a row already in the table is not written twice, and nothing is rewritten. A CPU run's
rows are refused unless asked (`--allow-cpu`): its clock makes no speed claim.

Written by `python -m rlnorm bench --append-results` (this run), `python -m rlnorm bench-merge RUN.json
... --append-results` (the merge), or `python -m rlnorm bench-merge SAVED.json --append-results` (one
saved file of any bench kind, so an earlier run becomes rows).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlnorm.bench.files import BASE, MERGED, RUN
from rlnorm.checkout import CHECKOUT

COLUMNS = (
    "date",
    "gpu",
    "torch",
    "triton",
    "commit",
    "shape",
    "backend",
    "mode",
    "clock",
    "runs",
    "p20_us",
    "p50_us",
    "p80_us",
    "ratio_to_add",
    "host_bound",
    "command",
)
DEFAULT_CSV = Path("benchmarks") / "results.csv"


class ResultsError(ValueError):
    """Rows that cannot go into the table: the message says why and what would let them."""


def default_path() -> Path:
    """benchmarks/results.csv of this checkout (of the working folder without one)."""
    return (CHECKOUT or Path.cwd()) / DEFAULT_CSV


def add_results_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, command: bool = True) -> None:
    """--append-results [CSV] and --allow-cpu, as the bench and the merge take them; --command too where the
    file may not record one (the merge, given saved files)."""
    p.add_argument(
        "--append-results",
        nargs="?",
        const=str(DEFAULT_CSV),
        default=None,
        metavar="CSV",
        help=f"append the rows to the results table (default {DEFAULT_CSV}, of the checkout; put it after any "
        "files, or write --append-results=CSV); never rewrites a row",
    )
    p.add_argument(
        "--allow-cpu", action="store_true", help="append a CPU run's rows too (no speed claim rests on them)"
    )
    if not command:
        return
    p.add_argument(
        "--command",
        default=None,
        help="the command that made the numbers, for the table's command column (default: the one the file records)",
    )


def results_path(value: str) -> Path:
    """The --append-results value: the default name means the checkout's table, anything else as given.
    Not a .csv: ResultsError (argparse gives the option the next word, which may be a bench file)."""
    if Path(value).suffix != ".csv":
        raise ResultsError(f"--append-results: {value!r} is not a .csv table (did a bench file follow the option?)")
    return default_path() if Path(value) == DEFAULT_CSV else Path(value)


def _short(commit: Any) -> str:
    return str(commit)[:7] if commit else "unknown"


def _commit(commit: Any, dirty: Any) -> str:
    return _short(commit) + ("-dirty" if dirty else "")


def _num(v: Any, digits: int) -> str:
    return "" if v is None else f"{float(v):.{digits}f}"


def _flag(v: Any) -> str:
    return "" if v is None else ("true" if v else "false")


def _entry_rows(entry: dict, runs: int) -> list[dict[str, str]]:
    """The GPU clock's row (graph or events) and the wall clock's, of one entry that ran."""
    if entry.get("status") != "ok" or entry.get("us") is None:
        return []
    out = [
        {
            "backend": entry["name"],
            "mode": entry["mode"],
            "clock": entry.get("method") or "",
            "runs": str(entry.get("runs_ok", runs)),
            "p20_us": _num(entry.get("us_p20"), 3),
            "p50_us": _num(entry["us"], 3),
            "p80_us": _num(entry.get("us_p80"), 3),
            "ratio_to_add": _num(entry.get("ratio"), 4),
            "host_bound": _flag(entry.get("host_bound")),
        }
    ]
    if entry.get("wall_us") is not None:
        out.append(
            {
                "backend": entry["name"],
                "mode": entry["mode"],
                "clock": "wall",
                "runs": str(entry.get("runs_ok", runs)),
                "p20_us": _num(entry.get("wall_p20"), 3),
                "p50_us": _num(entry["wall_us"], 3),
                "p80_us": _num(entry.get("wall_p80"), 3),
                "ratio_to_add": _num(entry.get("wall_ratio"), 4),
                "host_bound": "",
            }
        )
    return out


def _shape_rows(doc: dict, common: dict[str, str], runs: int) -> list[dict[str, str]]:
    rows = []
    for sh in doc["shapes"]:
        shape = f"{sh['rows']}x{sh['d']}"
        if sh.get("dtype") not in (None, "bfloat16"):
            shape += f" {sh['dtype']}"
        for e in sh["entries"]:
            rows += [{**common, "shape": shape, **r} for r in _entry_rows(e, runs)]
    return [{c: r.get(c, "") for c in COLUMNS} for r in rows]


def _where(doc: dict) -> dict[str, str]:
    env = doc.get("environment") or {}
    libs = env.get("libraries") or {}
    return {
        "gpu": str(env.get("gpu") or ""),
        "torch": str(libs.get("torch") or ""),
        "triton": str(libs.get("triton") or ""),
    }


def _merged_command(doc: dict) -> str | None:
    """A merge's command: the runs' command (where they recorded one) and the merge's."""
    merge_cmd = doc.get("command")
    cmds = [s.get("command") for s in doc.get("sources") or []]
    if not merge_cmd or not all(cmds):
        return None
    n = len(cmds)
    runs = cmds[0] + f" (in each of {n} processes)" if len(set(cmds)) == 1 else " ; ".join(dict.fromkeys(cmds))
    return f"{runs}; merged by {merge_cmd}"


def rows_from_doc(doc: dict, command: str | None = None) -> list[dict[str, str]]:
    """The table's rows for a bench file of any kind; `command` overrides what the file records."""
    kind = doc.get("kind")
    if kind == BASE:
        rows: list[dict[str, str]] = []
        for side in ("base", "head"):
            rows += rows_from_doc({**doc[side]["run"], "command": doc.get("command")}, command)
        return rows
    if kind == RUN:
        cmd = command or doc.get("command")
        date = doc.get("created_at")
        commit = _commit(doc.get("commit"), doc.get("tracked_tree_dirty"))
        runs = 1
    elif kind == MERGED:
        cmd = command or _merged_command(doc)
        sources = doc.get("sources") or []
        date = max((s["created_at"] for s in sources if s.get("created_at")), default=doc.get("created_at"))
        commit = "/".join(dict.fromkeys(_commit(s.get("commit"), s.get("tracked_tree_dirty")) for s in sources))
        runs = len(sources)
    else:
        raise ResultsError(f"results: a bench file of kind {kind!r} has no rows")
    if not cmd:
        raise ResultsError("results: the file records no command; say how its numbers were made with --command")
    common = {"date": str(date or ""), **_where(doc), "commit": commit, "command": cmd}
    return _shape_rows(doc, common, runs)


def _csv_line(row: dict[str, str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([row[c] for c in COLUMNS])
    return buf.getvalue()


def append_rows(path: str | os.PathLike[str], rows: Sequence[dict[str, str]], allow_cpu: bool = False) -> int:
    """Append rows to the table at path (created with its header if absent); return how many were new.

    The existing bytes are never touched: rows go after them, a row already present is skipped, and a
    table with other columns is refused. CPU rows are refused unless allow_cpu.
    """
    path = Path(path)
    cpu = sorted({r["gpu"] for r in rows if r["gpu"] in ("", "cpu")})
    if cpu and not allow_cpu:
        raise ResultsError(
            "results: these rows come from a CPU run (gpu 'cpu'), whose clock makes no speed claim; "
            "pass --allow-cpu to append them anyway"
        )
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    lines = iter(csv.reader(io.StringIO(text)))
    header = next(lines, None)
    if header is not None and header != list(COLUMNS):
        raise ResultsError(f"results: {str(path)!r} has the columns {header}, expected {list(COLUMNS)}")
    have = {tuple(r) for r in lines}
    new = [r for r in dict.fromkeys(_csv_line(r) for r in rows)]
    new = [line for line in new if tuple(next(csv.reader([line]))) not in have]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", newline="") as f:
        if header is None:
            f.write(_csv_line(dict(zip(COLUMNS, COLUMNS, strict=True))))
        elif not text.endswith("\n"):
            f.write("\n")
        f.writelines(new)
    return len(new)


def append_docs(docs: Iterable[dict], value: str, allow_cpu: bool, command: str | None = None) -> int:
    """The CLI's --append-results: 0 with a line saying how many rows went in, or 2 with the reason."""
    try:
        path = results_path(value)
        rows = [r for doc in docs for r in rows_from_doc(doc, command)]
        n = append_rows(path, rows, allow_cpu)
    except ResultsError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(f"appended {n} rows to {path} ({len(rows) - n} already there)")
    return 0
