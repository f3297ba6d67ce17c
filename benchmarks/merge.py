"""Runs of separate processes merged into one table of medians, with the spread.

At decode sizes the peers' times move between processes (torch.compile recompiles, FLA's autotuner keys
on the row count): one run can make rlnorm look faster or slower than it is. Every ratio stays a same-run
ratio: each run's time is divided by that run's own add before the median is taken. The verdict per shape
and mode says in how many runs rlnorm was no slower than that run's fastest peer. Runs of different GPUs
are refused, and of different commits unless the mix is meant (a median over different code answers nothing).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.runner import MODES, fastest_peer

MERGED = "rlnorm.bench.merged"


class MergeError(ValueError):
    """Runs that cannot be merged: the message says why."""


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def merge_entries(runs: list[list[dict]]) -> list[dict]:
    """One entry per (backend, mode): medians over the runs where it ran (ratios per run first)."""
    merged = []
    for name, mode in dict.fromkeys((e["name"], e["mode"]) for entries in runs for e in entries):
        got = [e for entries in runs for e in entries if (e["name"], e["mode"]) == (name, mode)]
        ok = [e for e in got if e["status"] == "ok" and e.get("us") is not None]
        us = [e["us"] for e in ok]
        walls = [e["wall_us"] for e in ok if e.get("wall_us") is not None]
        merged.append(
            {
                "name": name,
                "mode": mode,
                "status": "ok" if ok else got[0]["status"],
                "reason": "" if ok else got[0].get("reason", ""),
                "method": "/".join(sorted({e["method"] for e in ok if e.get("method")})) or None,
                "method_reason": "",
                "host_bound": any(e.get("host_bound") for e in ok),
                "us": _median(us),
                "us_p20": min(us, default=None),  # the fastest run's median
                "us_p80": max(us, default=None),  # the slowest run's median
                "ratio": _median([e["ratio"] for e in ok if e.get("ratio") is not None]),
                "wall_us": _median(walls),
                "wall_p20": min(walls, default=None),
                "wall_p80": max(walls, default=None),
                "wall_ratio": _median([e["wall_ratio"] for e in ok if e.get("wall_ratio") is not None]),
                "runs_ok": len(ok),
                "runs": len(got),
            }
        )
    return merged


def verdicts(shapes: list[dict]) -> dict[str, Any]:
    """Per mode: rlnorm over the fastest peer IN EACH RUN (peers ranked inside their own run)."""
    out: dict[str, Any] = {}
    for mode in MODES:
        per_run = [
            {"ratio": fp["rlnorm_over_fastest"], "peer": fp["name"], "peer_us": fp["us"]}
            for sh in shapes
            if (fp := (sh.get("fastest_peer") or {}).get(mode)) and fp.get("rlnorm_over_fastest") is not None
        ]
        out[mode] = None
        if per_run:
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
    """The merged document: every shape of any run, with medians, spread and verdicts."""
    if len(docs) < 2:
        raise MergeError(f"--merge: expected at least 2 runs, got {len(docs)}")
    gpus = {str((d.get("environment") or {}).get("gpu")) for d in docs}
    if len(gpus) > 1:
        raise MergeError(f"--merge: expected runs of one GPU, got {sorted(gpus)} in {list(paths)}")
    commits = {(d.get("commit"), d.get("tracked_tree_dirty")) for d in docs}
    if len(commits) > 1 and not allow_mixed_commits:
        raise MergeError(
            f"--merge: expected runs of one commit, got {sorted(map(str, commits))}; "
            "pass --allow-mixed-commits if that is meant"
        )
    shapes = []
    for key in dict.fromkeys((sh["rows"], sh["d"], sh.get("dtype")) for d in docs for sh in d["shapes"]):
        runs = [sh for d in docs for sh in d["shapes"] if (sh["rows"], sh["d"], sh.get("dtype")) == key]
        entries = merge_entries([sh["entries"] for sh in runs])
        shapes.append(
            {
                "rows": key[0],
                "d": key[1],
                "dtype": key[2],
                "graph_tried": any(sh.get("graph_tried") for sh in runs),
                "add_us": _median([sh["add_us"] for sh in runs if sh.get("add_us") is not None]),
                "runs": len(runs),
                "entries": entries,
                "fastest_peer": fastest_peer(entries),  # by the medians
                "verdict": verdicts(runs),  # by each run's own ranking
            }
        )
    sources = [
        {k: d.get(k) for k in ("commit", "tracked_tree_dirty", "created_at", "complete", "command")} | {"path": p}
        for p, d in zip(paths, docs, strict=True)
    ]
    return {
        "kind": MERGED,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sources": sources,
        "environment": docs[0].get("environment"),
        "command": command,
        "note": "us = median over runs of each run's median; us_p20/us_p80 = fastest/slowest run; ratio = "
        "median of per-run ratios (each to its own run's add, 8/3 of it for fwd_bwd); wall likewise",
        "shapes": shapes,
    }


def format_verdicts(merged: dict) -> str:
    """rlnorm against each run's fastest peer, per shape and mode."""
    lines = []
    for sh in merged["shapes"]:
        for mode, v in sh["verdict"].items():
            if v:
                spread = ", ".join(f"{r['ratio']:.2f}x ({r['peer']} {r['peer_us']:.1f} us)" for r in v["per_run"])
                lines.append(
                    f"- rows={sh['rows']} D={sh['d']} {mode}: no slower than the fastest peer in "
                    f"{v['runs_no_slower']} of {v['runs']} runs; median {v['median_ratio']:.2f}x [{spread}]"
                )
    return "\n".join(lines)
