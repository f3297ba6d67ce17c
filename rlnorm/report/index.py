"""Across runs (a matrix of params, or folders gathered from a cluster's array tasks): a summary table, one line
per run and backend, and an index page linking every run's page. The run folders are only read."""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from rlnorm.kit.artifact import write_atomic
from rlnorm.kit.results import RunResult
from rlnorm.report.compare import OP_KEYS as OP
from rlnorm.report.runs import open_run, param
from rlnorm.report.verdict import STATE_COLORS, State, run_verdicts

INDEX_FILE = "index.html"
SUMMARY_FILE = "summary.csv"
OP_KEYS = (*OP, "device")  # the parameters that define the op a run computed: what a matrix varies
# summary.csv's column -> the accuracy_latency field it shows
MEASURED = {"correctly_rounded": "fwd_correctly_rounded", "fwd_us": "fwd_us", "fwd_x_add": "fwd_roofline_ratio",
            "fwd_bwd_us": "fwd_bwd_us"}  # fmt: skip


def summary_table(runs: Sequence[str | Path | RunResult]) -> pd.DataFrame:
    """One line per run and backend: where the run is, the op it computed, and each backend's verdict."""
    rows = []
    for source in runs:
        run = open_run(source)
        folder = run.folder or Path(".")
        base = {"run": folder.name, "folder": str(folder), "gpu": run.device_name, "commit": (run.commit or "")[:9],
                **{k: param(run, k) for k in OP_KEYS}}  # fmt: skip
        for key, v in run_verdicts(run).items():
            r, gate = run.results[key], v.checks["gradient_gate"].state
            measured = {name: getattr(r.accuracy_latency, field, None) for name, field in MEASURED.items()}
            rows.append({**base, "backend": key, "status": r.status, "state": v.overall.value, "verdict": v.headline,
                         "why": v.why, **measured,
                         "gradient_gate": None if gate is State.NOT_RUN else gate is State.PASSED})  # fmt: skip
    return pd.DataFrame(rows)


def _cell(r: pd.Series) -> str:
    text = html.escape(r["verdict"])
    if r["status"] == "ran" and pd.notna(r["correctly_rounded"]):
        text += f"<br><small>correctly rounded {r['correctly_rounded']:.6f}</small>"
    elif r["status"] != "ran" and r["why"]:
        text += f"<br><small>{html.escape(str(r['why'])[:140])}</small>"
    return f'<td style="background:{STATE_COLORS[State(r["state"])]}">{text}</td>'


def write_index(runs: Sequence[str | Path], out_dir: str | Path, title: str | None = None) -> tuple[Path, Path]:
    """`index.html` (a table of runs x backends, each run linking its page) and `summary.csv`, in `out_dir`."""
    out = Path(out_dir)
    table = summary_table(runs)
    csv = out / SUMMARY_FILE
    write_atomic(csv, table.to_csv(index=False))
    varies = [k for k in OP_KEYS if k in table and table[k].astype(str).nunique() > 1]
    backends = list(dict.fromkeys(table["backend"])) if not table.empty else []
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["run", *varies, "GPU", "commit", *backends])
    body = []
    for folder, group in table.groupby("folder", sort=False) if not table.empty else []:
        first = group.iloc[0]
        page = Path(folder) / "reuse_check.html"
        name = html.escape(first["run"])
        link = f'<a href="{html.escape(os.path.relpath(page, out))}">{name}</a>' if page.is_file() else name
        cells = [f"<td>{link}</td>", *(f"<td>{html.escape(str(first[k]))}</td>" for k in varies)]
        cells += [f"<td>{html.escape(str(first['gpu']))}</td>", f"<td><code>{html.escape(first['commit'])}</code></td>"]
        by_backend = {r["backend"]: r for _, r in group.iterrows()}
        cells += [_cell(by_backend[b]) if b in by_backend else "<td></td>" for b in backends]
        body.append("<tr>" + "".join(cells) + "</tr>")
    n = table["folder"].nunique() if not table.empty else 0
    heading = html.escape(title or f"{n} reuse-check runs")
    write_atomic(
        out / INDEX_FILE,
        f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{heading}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}th{{background:#fafafa}}</style></head>
<body><h1>{heading}</h1>
<p>{n} runs; {"varying " + ", ".join(varies) if varies else "the same op"}. Each run's page has the evidence;
<code>{SUMMARY_FILE}</code> has one line per run and backend.</p>
<table><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table></body></html>
""",
    )
    return out / INDEX_FILE, csv
