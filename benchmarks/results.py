"""The one results table, benchmarks/results.csv: every timing worth keeping, one row each, append-only.

A row is one backend, shape, mode and clock of one run (or of a merge of runs): when and where it ran, the
times (p20 / p50 / p80 microseconds) and the ratio to the same run's add, whether the GPU queue ran dry
(`host_bound`), and the command that made it. Rows are only ever appended, never twice; a CPU run's rows
are refused unless asked (`--allow-cpu`): its clock makes no speed claim.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = tuple(
    "date gpu torch triton commit shape backend mode clock runs p20_us p50_us p80_us ratio_to_add host_bound "
    "command".split()
)
DEFAULT_CSV = Path(__file__).resolve().parent / "results.csv"


class ResultsError(ValueError):
    """Rows that cannot go into the table: the message says why and what would let them."""


def _num(v: Any, digits: int) -> str:
    return "" if v is None else f"{float(v):.{digits}f}"


def _commit(doc: dict) -> str:
    return (str(doc.get("commit"))[:7] if doc.get("commit") else "unknown") + (
        "-dirty" if doc.get("tracked_tree_dirty") else ""
    )


def _times(e: dict, p50: str, p20: str, p80: str, ratio: str) -> dict[str, str]:
    return {"p20_us": _num(e.get(p20), 3), "p50_us": _num(e[p50], 3), "p80_us": _num(e.get(p80), 3)} | {
        "ratio_to_add": _num(e.get(ratio), 4)
    }


def _entry_rows(e: dict, runs: int) -> list[dict[str, str]]:
    """The GPU clock's row (graph or events) and the wall clock's, of one entry that ran."""
    if e.get("status") != "ok" or e.get("us") is None:
        return []
    common = {"backend": e["name"], "mode": e["mode"], "runs": str(e.get("runs_ok", runs))}
    host_bound = "" if e.get("host_bound") is None else str(bool(e["host_bound"])).lower()
    out = [
        {**common, "clock": e.get("method") or "", "host_bound": host_bound}
        | _times(e, "us", "us_p20", "us_p80", "ratio")
    ]
    if e.get("wall_us") is not None:
        out.append({**common, "clock": "wall"} | _times(e, "wall_us", "wall_p20", "wall_p80", "wall_ratio"))
    return out


def rows_from_doc(doc: dict, command: str | None = None) -> list[dict[str, str]]:
    """The table's rows for a benchmark document of any kind; `command` overrides what it records."""
    kind = doc.get("kind")
    if kind == "rlnorm.bench.base":
        return [r for side in ("base", "head") for r in rows_from_doc(doc[side]["run"], command or doc.get("command"))]
    if kind == "rlnorm.bench":
        cmd, date, commit, runs = command or doc.get("command"), doc.get("created_at"), _commit(doc), 1
    elif kind == "rlnorm.bench.merged":
        sources = doc.get("sources") or []
        cmds = [s.get("command") for s in sources]
        cmd = command
        if cmd is None and doc.get("command") and all(cmds):
            cmd = " ; ".join(dict.fromkeys(cmds)) + f" (in {len(cmds)} processes); merged by {doc['command']}"
        date = max((s["created_at"] for s in sources if s.get("created_at")), default=doc.get("created_at"))
        commit, runs = "/".join(dict.fromkeys(_commit(s) for s in sources)), len(sources)
    else:
        raise ResultsError(f"results: a document of kind {kind!r} has no rows")
    if not cmd:
        raise ResultsError("results: the file records no command; say how its numbers were made with --command")
    env = doc.get("environment") or {}
    libs = env.get("libraries") or {}
    common = {
        "date": str(date or ""),
        "gpu": str(env.get("gpu") or ""),
        "torch": str(libs.get("torch") or ""),
        "triton": str(libs.get("triton") or ""),
        "commit": commit,
        "command": cmd,
    }
    rows = []
    for sh in doc["shapes"]:
        shape = f"{sh['rows']}x{sh['d']}" + ("" if sh.get("dtype") in (None, "bfloat16") else f" {sh['dtype']}")
        rows += [{**common, "shape": shape, **r} for e in sh["entries"] for r in _entry_rows(e, runs)]
    return [{c: r.get(c, "") for c in COLUMNS} for r in rows]


def _csv_line(values: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def append_rows(path: str | os.PathLike[str], rows: Sequence[dict[str, str]], allow_cpu: bool = False) -> int:
    """Append rows to the table at path (created with its header if absent); return how many were new.

    The existing bytes are never touched: rows go after them, a row already present is skipped, and a table
    with other columns is refused."""
    if not allow_cpu and any(r["gpu"] in ("", "cpu") for r in rows):
        raise ResultsError(
            "results: these rows come from a CPU run, whose clock makes no speed claim; "
            "pass --allow-cpu to append them anyway"
        )
    path = Path(path)
    if path.suffix != ".csv":
        raise ResultsError(f"--append-results: {str(path)!r} is not a .csv table")
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    lines = csv.reader(io.StringIO(text))
    header = next(lines, None)
    if header is not None and header != list(COLUMNS):
        raise ResultsError(f"results: {str(path)!r} has the columns {header}, expected {list(COLUMNS)}")
    have = {tuple(r) for r in lines}
    new = [
        line
        for line in dict.fromkeys(_csv_line([r[c] for c in COLUMNS]) for r in rows)
        if tuple(next(csv.reader([line]))) not in have
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", newline="") as f:
        f.write(_csv_line(COLUMNS) if header is None else "" if text.endswith("\n") else "\n")
        f.writelines(new)
    return len(new)
