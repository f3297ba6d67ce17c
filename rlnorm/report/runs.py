"""Where runs are: a run folder or artifact named from the repository root, from `notebooks/` or from anywhere
inside a checkout, the newest run, and the reference report. Reading one is `rlnorm.kit.results.load_run`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.checkout import CHECKOUT, seed_report_path
from rlnorm.kit.artifact import read_records
from rlnorm.kit.results import RunResult, load_run


def resolve(source: str | Path) -> Path:
    """A path as given when it exists, else relative to the checkout's root (JupyterLab runs a notebook in
    notebooks/, where `outputs/NAME` means the repository's outputs/NAME)."""
    path = Path(source)
    if path.exists() or path.is_absolute() or CHECKOUT is None:
        return path
    in_checkout = CHECKOUT / path
    return in_checkout if in_checkout.exists() else path


def open_run(source: str | Path | RunResult) -> RunResult:
    """A run from its folder or artifact path ('seed': the reference B200 report); a RunResult as it is."""
    if isinstance(source, RunResult):
        return source
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source: expected a run folder or an artifact path, got {type(source).__name__}")
    path = resolve(seed_report_path() if str(source) == "seed" else source)
    if not path.exists():
        where = f" (nor under the checkout {CHECKOUT})" if CHECKOUT is not None else ""
        raise ValueError(f"source: {source} does not exist in {Path.cwd()}{where}")
    return load_run(path)


def latest_run() -> Path:
    """The most recently written run folder holding an artifact (../outputs: a notebook runs in notebooks/)."""
    roots = [Path("outputs"), Path("..") / "outputs", *([CHECKOUT / "outputs"] if CHECKOUT is not None else [])]
    for r in roots:
        if folders := [p for p in r.glob("*") if p.is_dir() and any(p.glob("*.json"))]:
            return max(folders, key=lambda p: p.stat().st_mtime)
    looked = ", ".join(str(r.resolve()) for r in roots)
    raise ValueError(f"run: no run folder with an artifact under {looked}; pass run=PATH")


def records_of(run: RunResult) -> pd.DataFrame | None:
    """The run's per-row records (None where it kept none: the reference report, or no file)."""
    path = run.resolve(run.records)
    return read_records(path) if path is not None and path.is_file() else None


def param(run: RunResult, name: str, default: Any = None) -> Any:
    """A parameter the run used; `default` where it names none (the reference report names no parameters)."""
    return (run.params or {}).get(name, default)


def run_label(run: RunResult) -> str:
    """'NVIDIA H200 · commit 1a2b3c4 · params quick': where a figure's numbers come from."""
    short = (run.commit or "no commit")[:7] + ("+dirty" if run.tracked_tree_dirty else "")
    what = "B200 reference report" if run.is_seed else f"params {run.param_set or 'unnamed'}"
    return f"{run.device_name} · commit {short} · {what}" + (" (quick)" if run.quick and not run.is_seed else "")


def check_parameters(namespace: Mapping[str, Any], before: Iterable[str], declared: Iterable[str]) -> None:
    """Stop a notebook on a parameter it does not declare: papermill injects unknown names and only warns, so a
    misspelt `row_idx=3` would silently explain row 0 instead."""
    skip = {"In", "Out", "exit", "quit", "get_ipython"}
    if unknown := sorted(n for n in set(namespace) - set(before) - set(declared) - skip if not n.startswith("_")):
        raise ValueError(f"parameters: unknown {unknown}; this notebook takes {sorted(declared)}")
