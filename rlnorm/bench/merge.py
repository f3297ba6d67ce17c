"""Several bench runs (separate processes) merged into one table of medians, with the spread.

    python -m rlnorm bench-merge RUN.json RUN.json ... [--out MERGED.json] [--force] [--allow-mixed-commits]
                                 [--append-results [CSV]] [--allow-cpu] [--command CMD]
    python -m rlnorm bench-merge SAVED.json --append-results [CSV] [--command CMD]

Why: at decode sizes the peers' times move between processes (torch.compile recompiles, FLA's
autotuner keys on the row count): one run can make rlnorm look faster or slower than it is. Run
`python -m rlnorm bench --out runN.json` a few times, then merge. Every ratio stays a same-run
ratio: each run's time is divided by that run's own add before the median is taken, never by an
add from another process. The verdict per shape and mode says in how many runs rlnorm was no
slower than that run's fastest peer, next to the median of the per-run ratios.

Runs of different commits or GPUs are refused (a median over different code answers nothing),
unless --allow-mixed-commits says the mix is meant; the GPU must match regardless. With
--append-results the merged rows go into the results table; one saved file alone (a run, a merge or
a --base comparison) is appended as it is, so an earlier run becomes rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from rlnorm.bench import results
from rlnorm.bench.files import (
    EXIT_EXISTS,
    EXIT_USAGE,
    KINDS,
    MERGED,
    RUN,
    BenchFileError,
    add_out_arguments,
    command_line,
    load_doc,
    out_taken,
    write_table,
)
from rlnorm.bench.runner import fastest_peer
from rlnorm.bench.table import format_footer, format_markdown

PROG = "python -m rlnorm bench-merge"


class MergeError(ValueError):
    """Runs that cannot be merged: the message names the file and what was expected."""


def _load(path: str, kinds: Sequence[str] = (RUN,)) -> dict:
    try:
        return load_doc(path, kinds)
    except BenchFileError as exc:
        raise MergeError(str(exc)) from exc


def _check_compatible(docs: Sequence[dict], paths: Sequence[str], allow_mixed_commits: bool) -> None:
    gpus = {d.get("environment", {}).get("gpu") for d in docs}
    if len(gpus) > 1:
        raise MergeError(f"runs: expected one GPU, got {sorted(map(str, gpus))} in {list(paths)}")
    commits = {(d.get("commit"), d.get("tracked_tree_dirty")) for d in docs}
    if len(commits) > 1 and not allow_mixed_commits:
        raise MergeError(
            f"runs: expected one commit (clean or dirty alike), got {sorted(map(str, commits))}; "
            "pass --allow-mixed-commits if that is meant"
        )


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def merge_entries(runs: list[list[dict]]) -> list[dict]:
    """One entry per (backend, mode): medians over the runs where it ran, per-run ratios first."""
    order: list[tuple[str, str]] = []
    for entries in runs:
        for e in entries:
            if (e["name"], e["mode"]) not in order:
                order.append((e["name"], e["mode"]))
    merged = []
    for name, mode in order:
        got = [e for entries in runs for e in entries if (e["name"], e["mode"]) == (name, mode)]
        ok = [e for e in got if e["status"] == "ok" and e.get("us") is not None]
        ratios = [e["ratio"] for e in ok if e.get("ratio") is not None]
        walls = [e["wall_us"] for e in ok if e.get("wall_us") is not None]
        wall_ratios = [e["wall_ratio"] for e in ok if e.get("wall_ratio") is not None]
        methods = sorted({e.get("method") or "" for e in ok})
        first_bad = next((e for e in got if e not in ok), None)
        merged.append(
            {
                "name": name,
                "mode": mode,
                "status": "ok" if ok else got[0]["status"],
                "reason": "" if ok else got[0].get("reason", ""),
                "method": "/".join(m for m in methods if m) or None,
                "method_reason": "",
                "host_bound": any(e.get("host_bound") for e in ok),
                "us": _median([e["us"] for e in ok]),
                "us_p20": min((e["us"] for e in ok), default=None),  # the fastest run's median
                "us_p80": max((e["us"] for e in ok), default=None),  # the slowest run's median
                "ratio": _median(ratios),
                "wall_us": _median(walls),
                "wall_p20": min(walls, default=None),  # the fastest run's eager median
                "wall_p80": max(walls, default=None),
                "wall_ratio": _median(wall_ratios),
                "runs_ok": len(ok),
                "runs": len(got),
                "not_ok": None if first_bad is None else f"{first_bad['status']}: {first_bad.get('reason', '')}",
            }
        )
    return merged


def verdicts(runs: list[dict]) -> dict[str, Any]:
    """Per mode: rlnorm over the fastest peer IN EACH RUN (peers ranked inside their own run)."""
    out: dict[str, Any] = {}
    for mode in ("fwd", "fwd_bwd"):
        per_run = []
        for sh in runs:
            fp = (sh.get("fastest_peer") or {}).get(mode)
            if fp and fp.get("rlnorm_over_fastest") is not None:
                per_run.append({"ratio": fp["rlnorm_over_fastest"], "peer": fp["name"], "peer_us": fp["us"]})
        if not per_run:
            out[mode] = None
            continue
        out[mode] = {
            "runs": len(per_run),
            "runs_no_slower": sum(r["ratio"] <= 1.0 for r in per_run),
            "median_ratio": statistics.median(r["ratio"] for r in per_run),
            "per_run": per_run,
        }
    return out


def merge(
    docs: Sequence[dict], paths: Sequence[str], allow_mixed_commits: bool = False, command: str | None = None
) -> dict:
    """The merged document: shapes present in any run, each with medians, spread and verdicts."""
    if len(docs) < 2:
        raise MergeError(f"runs: expected at least 2 bench files, got {len(docs)}")
    _check_compatible(docs, paths, allow_mixed_commits)
    keys: list[tuple] = []
    for d in docs:
        for sh in d["shapes"]:
            k = (sh["rows"], sh["d"], sh.get("dtype"))
            if k not in keys:
                keys.append(k)
    shapes = []
    for key in keys:
        runs = [sh for doc in docs for sh in doc["shapes"] if (sh["rows"], sh["d"], sh.get("dtype")) == key]
        rows, d, dtype = key

        entries = merge_entries([sh["entries"] for sh in runs])
        adds = [sh["add_us"] for sh in runs if sh.get("add_us") is not None]
        shapes.append(
            {
                "rows": rows,
                "d": d,
                "dtype": dtype,
                "graph_tried": any(sh.get("graph_tried") for sh in runs),
                "add_us": _median(adds),
                "runs": len(runs),
                "entries": entries,
                "fastest_peer": fastest_peer(entries),  # by the medians
                "verdict": verdicts(runs),  # by each run's own ranking
            }
        )
    return {
        "kind": MERGED,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sources": [
            {
                "path": p,
                "commit": d.get("commit"),
                "tracked_tree_dirty": d.get("tracked_tree_dirty"),
                "created_at": d.get("created_at"),
                "complete": d.get("complete"),
                "command": d.get("command"),
            }
            for p, d in zip(paths, docs, strict=True)
        ],
        "environment": docs[0].get("environment"),
        "command": command,
        "note": "us = median over runs of each run's median; us_p20/us_p80 = fastest/slowest run; ratio = "
        "median of per-run ratios (each to its own run's add, 8/3 of it for fwd_bwd); wall likewise",
        "shapes": shapes,
    }


def format_verdicts(merged: dict) -> str:
    """The lines a closing note needs: rlnorm against each run's fastest peer, per shape and mode."""
    lines = []
    for sh in merged["shapes"]:
        for mode, v in sh["verdict"].items():
            if v is None:
                continue
            spread = ", ".join(f"{r['ratio']:.2f}x ({r['peer']} {r['peer_us']:.1f} us)" for r in v["per_run"])
            lines.append(
                f"- rows={sh['rows']} D={sh['d']} {mode}: no slower than the fastest peer in {v['runs_no_slower']} of "
                f"{v['runs']} runs; median {v['median_ratio']:.2f}x [{spread}]"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="bench JSON files (python -m rlnorm bench --out), one per process")
    add_out_arguments(p, "write the merged table as JSON here (atomic)")
    p.add_argument("--allow-mixed-commits", action="store_true", help="merge runs of different commits")
    results.add_results_arguments(p)
    a = p.parse_args(argv)
    if out_taken(a.out, a.force):
        return EXIT_EXISTS
    try:
        if len(a.runs) == 1 and a.append_results is not None and not a.out:
            saved = _load(a.runs[0], KINDS)  # one saved file: its rows as they are
            print(f"{a.runs[0]}: {saved['kind']}, {format_footer(saved.get('run', saved))}")
            return results.append_docs([saved], a.append_results, a.allow_cpu, a.command)
        merged = merge([_load(r) for r in a.runs], a.runs, a.allow_mixed_commits, command=command_line(PROG, argv, a))
    except MergeError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    print(format_markdown(merged["shapes"]))
    print("\nrlnorm against each run's own fastest peer:\n" + format_verdicts(merged))
    print(f"\n{len(a.runs)} runs; us = median of the runs' medians (ratios: each run's own add)")
    if a.out and write_table(merged, a.out, a.force) != 0:
        return EXIT_EXISTS
    if a.append_results is not None:
        return results.append_docs([merged], a.append_results, a.allow_cpu, a.command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
