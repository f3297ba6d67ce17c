"""Find and load run folders: the one place reports, notebooks and the command line locate runs.

A run is named by its folder (`outputs/NAME/`) or its artifact JSON. A relative path is tried as
given, then against the checkout's root, so `outputs/h200-full` works from the repository root, from
`notebooks/` (JupyterLab's working directory there), and from anywhere inside a checkout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rlnorm.checkout import CHECKOUT
from rlnorm.kit.artifact import normalize_artifact, read_artifact
from rlnorm.kit.records import read_records, records_frame
from rlnorm.options import OpOptions


@dataclass
class RunLocation:
    """Where a run's pieces are: its folder, its artifact JSON and its per-row records (or None)."""

    folder: Path
    artifact: Path
    records: Path | None


def is_artifact(path: Path) -> bool:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("results"), dict)


def locate_run(source: str | Path) -> RunLocation:
    """A run folder (`outputs/NAME/`) or an artifact JSON path -> the artifact and records paths."""
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source: expected a run folder or an artifact JSON path, got {type(source).__name__}")
    path = resolve(source)
    if path.is_dir():
        candidates = sorted(p for p in path.glob("*.json") if is_artifact(p))
        if not candidates:
            raise ValueError(f"source: no artifact JSON (a file with a 'results' mapping) in folder {path}")
        # prefer a file named like the folder or 'artifact', else the first
        preferred = [p for p in candidates if p.stem in (path.name, "artifact") or "artifact" in p.stem]
        artifact = (preferred or candidates)[0]
    elif path.is_file():
        if not is_artifact(path):
            raise ValueError(f"source: {path} is not an artifact JSON (no 'results' mapping)")
        artifact = path
    else:
        where = (
            f" (nor under the checkout {CHECKOUT})" if CHECKOUT is not None and not Path(source).is_absolute() else ""
        )
        raise ValueError(f"source: {source} does not exist in {Path.cwd()}{where}")
    folder = artifact.parent
    with open(artifact) as f:
        data = json.load(f)
    records = None
    rel = data.get("records")
    if isinstance(rel, str) and rel:
        cand = Path(rel) if Path(rel).is_absolute() else folder / rel
        if cand.is_file():
            records = cand
    if records is None:
        found = sorted(folder.glob("*records*.csv")) + sorted(folder.glob("*records*.parquet"))
        records = found[0] if found else None
    return RunLocation(folder=folder, artifact=artifact, records=records)


def _run_roots() -> list[Path]:
    """Where run folders live: ./outputs (CLI, papermill), ../outputs (a notebook run from notebooks/), then the
    checkout's outputs/."""
    roots = [Path("outputs"), Path("..") / "outputs"]
    if CHECKOUT is not None:
        roots.append(CHECKOUT / "outputs")
    return roots


def resolve(source: str | Path) -> Path:
    """A path as given when it exists, else relative to the checkout's root (JupyterLab runs a notebook
    in notebooks/, where `outputs/NAME` means the repository's outputs/NAME)."""
    path = Path(source)
    if path.exists() or path.is_absolute() or CHECKOUT is None:
        return path
    in_checkout = CHECKOUT / path
    return in_checkout if in_checkout.exists() else path


def latest_run(root: str | Path | None = None) -> Path:
    """The most recently written run folder holding an artifact (a default for notebooks).

    root: the folder that holds run folders; None looks in ./outputs, then the checkout's outputs/.
    """
    roots = _run_roots() if root is None else [Path(root)]
    for r in roots:
        folders = [p for p in r.glob("*") if p.is_dir() and any(is_artifact(j) for j in p.glob("*.json"))]
        if folders:
            return max(folders, key=lambda p: p.stat().st_mtime)
    looked = ", ".join(str(r.resolve()) for r in roots)
    raise ValueError(f"run: no run folder with an artifact under {looked}; pass run=PATH")


def load_records(path: str | Path | None) -> pd.DataFrame:
    """The per-row record table (typed and empty when the run wrote none)."""
    return records_frame([]) if path is None else read_records(path)


@dataclass
class Run:
    """A loaded run: where it is, its artifact (dict) and its records (DataFrame)."""

    location: RunLocation
    artifact: dict[str, Any]
    records: pd.DataFrame

    @property
    def opts(self) -> OpOptions:
        return run_options(self.artifact)

    @property
    def ran_backends(self) -> list[str]:
        """Backends whose checks ran in this run, in artifact order."""
        res = self.artifact.get("results") or {}
        return [k for k, v in res.items() if (v or {}).get("status", "ran") == "ran"]


def load_run(source: str | Path) -> Run:
    """Locate and read a run folder or artifact path."""
    loc = locate_run(source)
    return Run(location=loc, artifact=load_artifact(loc.artifact), records=load_records(loc.records))


def run_options(artifact: Mapping[str, Any]) -> OpOptions:
    """The op options a run used (from its parameters), defaults where it names none (the seed report)."""
    params = artifact.get("params") or {}
    src = params.get("op") if isinstance(params.get("op"), Mapping) else params
    keys = ("eps", "group_size", "norm_before_gate", "activation")
    return OpOptions(**{k: src[k] for k in keys if k in src})


def check_parameters(namespace: Mapping[str, Any], before: Iterable[str], declared: Iterable[str]) -> None:
    """Stop a notebook on a parameter it does not declare: papermill injects unknown names and only
    warns, so a misspelt `row_idx=3` would silently explain row 0 instead."""
    skip = {"In", "Out", "exit", "quit", "get_ipython"}
    new = set(namespace) - set(before) - set(declared) - skip
    unknown = sorted(n for n in new if not n.startswith("_"))
    if unknown:
        raise ValueError(f"parameters: unknown {unknown}; this notebook takes {sorted(declared)}")


def load_artifact(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """An artifact as a dict from a dict, a JSON path or a run folder (its artifact JSON).

    Reads through `rlnorm.kit.artifact.read_artifact`, so our artifacts and the seed report arrive in
    one shape (a dict is normalised, not validated).
    """
    if isinstance(source, Mapping):
        return normalize_artifact(source)
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source: expected an artifact dict, a JSON path or a run folder, got {type(source).__name__}")
    return read_artifact(locate_run(source).artifact)


# what defines the op a run computed; the seed report computed the defaults (D = 128, bf16, silu after the norm)
OP_DEFAULTS: dict[str, Any] = {
    "d": 128,
    "eps": 1e-6,
    "group_size": None,
    "norm_before_gate": True,
    "activation": "silu",
    "weight_dtype": "bfloat16",
}


def run_device(art: Mapping[str, Any]) -> str:
    """Where a run's numbers come from: its GPU's name, else the device it ran on ('cpu')."""
    env = art.get("environment") or {}
    return str(env.get("gpu") or env.get("device") or "cpu")


def artifact_label(art: Mapping[str, Any], fallback: str) -> str:
    """A short name for column headers: the GPU (or 'cpu') plus the run name when known."""
    name = art.get("name") or (art.get("params") or {}).get("name")
    return f"{fallback}: {run_device(art)}" + (f" ({name})" if name else "")
