"""From parameter files and overrides to the runs they ask for, in papermill's order: each FILE, then `-y` (a YAML
mapping), then `-p KEY VALUE` (its value read as YAML). A list for a key that takes one value makes a matrix: one
run per combination, each in `outputs/NAME/<combination>/`."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlnorm.kit.params import (
    CLI_KEYS,
    LIST_KEYS,
    NOTEBOOK_PARAMETERS,
    ParamsError,
    RunParams,
    file_params,
    load_params,
    read_params_file,
)


class PlanError(ValueError):
    """The command line or a parameter file cannot make a run; the message says which part and why."""


def parse_value(text: str) -> Any:
    """A `-p` value as YAML reads it (`256` -> 256, `true` -> True, `[a, b]` -> a list, `silu` -> "silu")."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


@dataclass(frozen=True)
class Combination:
    """One run: its parameters (validated), where its folder goes, and which matrix values made it."""

    params: RunParams
    folder: Path
    values: dict[str, Any]
    source: str  # the parameter file(s) and overrides it came from, for messages

    @property
    def label(self) -> str:
        return self.folder.name if not self.values else f"{self.folder.parent.name}/{self.folder.name}"

    def notebook_parameters(self) -> dict[str, Any]:
        """The notebook's parameters cell for this run: its file, its name, and what differs from that file."""
        p = self.params
        # a matrix file's axis (a list for a one-value key) always differs: the notebook gets this run's value
        base = {**RunParams().as_dict(), **(read_params_file(p.params_file) if p.params_file else {})}
        differ = {k: v for k, v in p.as_dict().items() if k not in NOTEBOOK_PARAMETERS and v != base[k]}
        return {"params_file": p.params_file, "name": p.name, "overwrite": p.overwrite, "overrides": differ}


@dataclass(frozen=True)
class Plan:
    """Every run the command line asks for, in order; `matrices` maps a matrix's folder to its combinations."""

    runs: list[Combination]
    matrices: dict[Path, list[Combination]]


def _value_text(v: Any) -> str:
    text = "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)  # as YAML writes them
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def combination_name(values: Mapping[str, Any]) -> str:
    """The folder name of one combination: `d-256_activation-sigmoid` (safe in every shell and file system)."""
    return "_".join(f"{k}-{_value_text(v)}" for k, v in values.items())


def _merge(files: Sequence[str], yaml_text: str | None, overrides: Sequence[tuple[str, str]]) -> list[tuple[str, dict]]:
    """(source, raw mapping) per FILE, each with the -y and -p overrides applied on top."""
    extra: dict[str, Any] = {}
    if yaml_text:
        try:
            extra = yaml.safe_load(yaml_text)
        except yaml.YAMLError as exc:
            raise PlanError(f"-y: not YAML ({exc})") from exc
        if not isinstance(extra, Mapping):
            raise PlanError(f"-y: expected a YAML mapping of parameters, got {type(extra).__name__}")
    extra = {**extra, **{key: parse_value(value) for key, value in overrides}}
    if bad := sorted(k for k in extra if k in CLI_KEYS):
        raise PlanError(f"{', '.join(bad)}: set by the command line (--name, --outputs, --force), not a parameter")
    out = []
    for f in files or [None]:
        try:
            raw = file_params(f) if f is not None else {}
        except ParamsError as exc:
            raise PlanError(f"{f}: {exc}") from exc
        out.append((f or "the command line", {**raw, **extra}))
    return out


def expand(files: Sequence[str], yaml_text: str | None = None, overrides: Sequence[tuple[str, str]] = (), *,
           outputs: str | Path = "outputs", name: str | None = None, device: str | None = None,
           progress: bool | None = None) -> Plan:  # fmt: skip
    """Every run the arguments ask for; every problem of every run reported at once, before any work."""
    runs: list[Combination] = []
    matrices: dict[Path, list[Combination]] = {}
    errors: list[str] = []
    for source, raw in _merge(files, yaml_text, overrides):
        given = {"name": name or None, "device": device or None, "progress": progress}
        raw.update({k: v for k, v in given.items() if v is not None})
        axes = {k: v for k, v in raw.items() if isinstance(v, list) and k not in LIST_KEYS}
        errors += [f"{source}: {k}: an empty list gives no run" for k, v in axes.items() if not v]
        base = Path(outputs) / str(raw.get("name", "run"))
        combos = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
        made = []
        for values in combos:
            label = combination_name(values)  # a matrix's combination: its name and folder
            folder = base / label if axes else base
            try:
                p = load_params({**raw, **values, **({"name": label} if axes else {}), "output_dir": str(folder)})
                p.resolved_device()
            except ParamsError as exc:
                where = f" ({label})" if axes else ""
                lines = [ln.strip() for ln in str(exc).splitlines()[1:]] or [str(exc)]  # past the header line
                errors.extend(f"{source}{where}: {line}" for line in lines if line)
                continue
            made.append(Combination(p, folder, values, source))
        runs.extend(made)
        if axes and made:
            matrices[base] = made
    if errors:
        raise PlanError("invalid run parameters:\n  " + "\n  ".join(dict.fromkeys(errors)))
    folders = [c.folder for c in runs]
    if dup := sorted({str(f) for f in folders if folders.count(f) > 1}):
        raise PlanError(f"two runs would write the same folder: {', '.join(dup)} (give each a different name)")
    return Plan(runs, matrices)
