"""Across runs: a summary table (one line per run and backend) and an index page linking every run's page.

What a matrix of runs (`d: [128, 256]`, `activation: [silu, sigmoid]`) or run folders gathered from a cluster's
array tasks are read through: each run folder stays as it is, the index only reads their artifacts.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.report.runs import OP_DEFAULTS, load_artifact, locate_run, run_device
from rlnorm.report.verdicts import NOT_RUN, PASSED, gate_cell

__all__ = ["INDEX_FILE", "OP_KEYS", "SUMMARY_FILE", "summary_table", "write_index"]

INDEX_FILE = "index.html"
SUMMARY_FILE = "summary.csv"
# the parameters that define the op a run computed: the ones a matrix usually varies
OP_KEYS = (*OP_DEFAULTS, "device")


def _verdict(r: dict) -> str:
    status = r.get("status", "ran")
    if status != "ran":
        return status.replace("_", " ")
    bi = (r.get("batch_invariance") or {}).get("batch_invariant")
    return {True: "batch invariant", False: "NOT batch invariant", None: "no verdict"}[bi]


def _gate_passed(gate: Any) -> bool | None:
    """True or False for a gate the backend took; None where it could not (no backward) or it did not run."""
    state = gate_cell(gate).state
    return None if state == NOT_RUN else state == PASSED


def summary_table(runs: Sequence[str | Path]) -> pd.DataFrame:
    """One line per run and backend: where the run is, the op it computed, and each backend's verdict."""
    rows = []
    for source in runs:
        loc = locate_run(source)
        art = load_artifact(loc.artifact)
        params = art.get("params") or {}
        base = {
            "run": loc.folder.name,
            "folder": str(loc.folder),
            "gpu": run_device(art),
            "commit": (art.get("commit") or "")[:9],
            **{k: params.get(k) for k in OP_KEYS},
        }
        for key, r in (art.get("results") or {}).items():
            acc = r.get("accuracy_latency") or {}
            gates = r.get("contract_gates") or {}
            rows.append(
                {
                    **base,
                    "backend": key,
                    "status": r.get("status", "ran"),
                    "verdict": _verdict(r),
                    "why": r.get("skip_reason") or "",
                    "correctly_rounded": acc.get("fwd_correctly_rounded"),
                    "fwd_us": acc.get("fwd_us"),
                    "fwd_x_add": acc.get("fwd_roofline_ratio"),
                    "fwd_bwd_us": acc.get("fwd_bwd_us"),
                    "gradient_gate": _gate_passed(gates.get("gradient")),
                }
            )
    return pd.DataFrame(rows)


def _cell(r: pd.Series) -> str:
    text = html.escape(r["verdict"])
    if r["status"] == "ran" and pd.notna(r["correctly_rounded"]):
        text += f"<br><small>correctly rounded {r['correctly_rounded']:.6f}</small>"
    elif r["status"] != "ran" and r["why"]:
        text += f"<br><small>{html.escape(str(r['why'])[:140])}</small>"
    colour = {"batch invariant": "#e8f5e9", "NOT batch invariant": "#ffebee"}.get(r["verdict"], "#f5f5f5")
    if r["status"] in ("crashed", "timed_out", "failed"):
        colour = "#fff3e0"
    return f'<td style="background:{colour}">{text}</td>'


def write_index(runs: Sequence[str | Path], out_dir: str | Path, title: str | None = None) -> tuple[Path, Path]:
    """`index.html` (a table of runs x backends, each run linking its page) and `summary.csv`, in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = summary_table(runs)
    csv = out / SUMMARY_FILE
    tmp = csv.with_name(f".{csv.name}.tmp")
    table.to_csv(tmp, index=False)
    os.replace(tmp, csv)
    varies = [k for k in OP_KEYS if k in table and table[k].astype(str).nunique() > 1]
    backends = list(dict.fromkeys(table["backend"])) if not table.empty else []
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["run", *varies, "GPU", "commit", *backends])
    body = []
    for folder, group in table.groupby("folder", sort=False) if not table.empty else []:
        first = group.iloc[0]
        page = Path(folder) / "reuse_check.html"
        link = os.path.relpath(page, out) if page.is_file() else None
        name = html.escape(first["run"])
        cells = [f'<td><a href="{html.escape(link)}">{name}</a></td>' if link else f"<td>{name}</td>"]
        cells += [f"<td>{html.escape(str(first[k]))}</td>" for k in varies]
        cells += [f"<td>{html.escape(str(first['gpu']))}</td>", f"<td><code>{html.escape(first['commit'])}</code></td>"]
        by_backend = {r["backend"]: r for _, r in group.iterrows()}
        cells += [_cell(by_backend[b]) if b in by_backend else "<td></td>" for b in backends]
        body.append("<tr>" + "".join(cells) + "</tr>")
    n = table["folder"].nunique() if not table.empty else 0
    heading = html.escape(title or f"{n} reuse-check runs")
    page_html = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{heading}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}th{{background:#fafafa}}</style></head>
<body><h1>{heading}</h1>
<p>{n} runs; {"varying " + ", ".join(varies) if varies else "the same op"}. Each run's page has the evidence;
<code>{SUMMARY_FILE}</code> has one line per run and backend.</p>
<table><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table></body></html>
"""
    index = out / INDEX_FILE
    tmp = index.with_name(f".{index.name}.tmp")
    tmp.write_text(page_html, encoding="utf-8")
    os.replace(tmp, index)
    return index, csv
