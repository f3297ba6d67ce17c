"""Run parameters of the reuse-check notebook: defaults, YAML loading, strict validation.

Papermill only warns about a parameter the notebook does not declare and injects ill-typed values
as they come, so a typo (`coverge: sampled`) would silently run the default protocol. Every run
therefore goes through `load_params`, which stops at once with a message naming each unknown or
ill-typed parameter. The names are flat so that `papermill -p NAME VALUE` and the YAML files use
the same keys as the notebook's `parameters` cell.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from rlnorm.checkout import CHECKOUT
from rlnorm.kit.artifact import DEFAULT_RFC
from rlnorm.kit.backends import REGISTRY
from rlnorm.kit.checks.rows import COVERAGES
from rlnorm.kit.checks.sweep import default_probe_rows, default_sweep_sizes
from rlnorm.options import ACTIVATIONS, OpOptions

__all__ = [
    "ALL_BACKENDS",
    "ALL_CHECKS",
    "DEFAULT_SWEEP_PROBE_ROWS",
    "DEFAULT_SWEEP_SIZES",
    "ParamsError",
    "RunParams",
    "load_params",
]

# the docs/spec.md §6 backends, in the registry's order: one list for the kit, not a second copy here
ALL_BACKENDS = list(REGISTRY)
ALL_CHECKS = [
    "all_rows",
    "dweight_repeatable",
    "full_vs_sub_batches",
    "batch_size_sweep",
    "accuracy_latency",
    "contract_gates",
    "agreement",
    "trainer_sampler",
]
# docs/spec.md §5 batch_size_sweep at n = 4097, as the check itself defaults them: sizes 1..9 and 2^k-1, 2^k,
# 2^k+1 for k = 4..12 (36 sizes); probes 0 and n-1 plus 515, 1027, ..., 3075
DEFAULT_SWEEP_SIZES = default_sweep_sizes(4097)
DEFAULT_SWEEP_PROBE_ROWS = default_probe_rows(4097)

DEVICES = ("auto", "cpu", "cuda")
WEIGHT_DTYPES = ("bfloat16", "float16", "float32")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ParamsError(ValueError):
    """Raised for unknown or ill-typed run parameters; the message names every offending one."""


@dataclass(frozen=True)
class RunParams:
    """One run of the reuse check. Defaults: the full protocol (docs/spec.md §4-5), as `params/full.yaml` has it."""

    # -- the run ------------------------------------------------------------------------------
    name: str = "run"  # the run folder's name under outputs/, and the plots' titles
    # set by `python -m rlnorm run` (CLI_KEYS), never by a parameter file
    output_dir: str = ""  # where the run's files end up; "" = outputs/<name>
    staging_dir: str = ""  # where files are written meanwhile (the CLI's staging folder); "" = a folder of its own
    params_file: str = ""  # which parameter set this came from (shown in plot titles)
    overwrite: bool = False  # replace an existing run folder (the CLI's --force; papermill: -p overwrite True)
    device: str = "auto"  # auto | cpu | cuda
    progress: bool = True  # tqdm bars for the long loops
    rfc: str = DEFAULT_RFC
    # -- the op (docs/spec.md §1) ---------------------------------------------------------------------
    d: int = 128
    eps: float = 1e-6
    group_size: int | None = None
    norm_before_gate: bool = True
    activation: str = "silu"
    weight_dtype: str = "bfloat16"
    # -- what to check --------------------------------------------------------------------------
    backends: list[str] = field(default_factory=lambda: list(ALL_BACKENDS))
    custom_backends: list[str] = field(default_factory=list)  # "package.module:attr"
    checks: list[str] = field(default_factory=lambda: list(ALL_CHECKS))
    # -- sizes and seeds per check (docs/spec.md §5) -----------------------------------------------------
    all_rows_sizes: list[int] = field(default_factory=lambda: [64, 257, 4097])
    all_rows_seeds: list[int] = field(default_factory=lambda: [3, 4, 5])
    dweight_rows: int = 4097
    dweight_seed: int = 3
    sub_batches_rows: int = 262144
    sub_batch_sizes: list[int] = field(default_factory=lambda: [1, 7, 4097, 65536, 131072])
    sub_batches_seeds: list[int] = field(default_factory=lambda: [3, 4])
    coverage: str = "all"  # all: every row of every sub-batch size; sampled: the report's 2188 sub-batches
    sweep_n: int = 4097
    sweep_sizes: list[int] = field(default_factory=lambda: list(DEFAULT_SWEEP_SIZES))
    sweep_probe_rows: list[int] = field(default_factory=lambda: list(DEFAULT_SWEEP_PROBE_ROWS))
    sweep_seeds: list[int] = field(default_factory=lambda: [3, 4, 5])
    accuracy_rows: int = 262144
    accuracy_seed: int = 11
    timing: bool = True  # False: accuracy only, latency fields null (an interpreted kernel's time means nothing)
    timing_warmup: int = 10
    timing_iters: int = 50
    agreement_rows: int = 4097
    agreement_seed: int = 3
    gate_timeout_s: float = 600.0
    # a backend's own process is ended past this (its checks, not its gates); the full protocol takes a few
    # minutes per backend on an H200
    backend_timeout_s: float = 1800.0
    # differing rows recorded per backend and check (the summary's counts are always complete);
    # null = every one, which for a kernel that differs everywhere is millions of CSV lines
    max_records: int | None = 2000

    # ------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        errors = _validate_values(self)
        if errors:
            raise ParamsError(_format_errors(errors))

    def op_options(self) -> OpOptions:
        return OpOptions(
            eps=self.eps,
            group_size=self.group_size,
            norm_before_gate=self.norm_before_gate,
            activation=self.activation,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_dir(self) -> Path:
        """The folder the finished run lives in: output_dir, else outputs/<name> of this checkout (so a
        notebook run cell by cell from notebooks/ in JupyterLab lands where the CLI's runs do)."""
        if self.output_dir:
            return Path(self.output_dir)
        root = CHECKOUT if CHECKOUT is not None and (CHECKOUT / "outputs").is_dir() else Path()
        return root / "outputs" / self.name

    def resolved_device(self) -> str:
        """auto -> cuda when a GPU is visible, else cpu; asking for cuda without one is an error."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ParamsError("device: 'cuda' was asked for but torch sees no CUDA device (use 'auto' or 'cpu')")
        return self.device


_FIELDS = {f.name: f for f in dataclasses.fields(RunParams)}
_HINTS = get_type_hints(RunParams)
# what `python -m rlnorm run` sets: a parameter file that sets them would misstate where its run goes
CLI_KEYS = ("output_dir", "staging_dir", "params_file", "overwrite")


def _type_ok(value: Any, hint: Any) -> bool:
    """Strict check of a parameter against its annotation (bool is not an int; int is accepted as float)."""
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(_type_ok(v, item) for v in value)
    args = get_args(hint)
    if args and type(None) in args:  # X | None
        return value is None or any(_type_ok(value, a) for a in args if a is not type(None))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    raise TypeError(f"unhandled annotation {hint!r}")  # pragma: no cover - a new field needs a rule here


def _type_name(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is list:
        return f"a list of {_type_name(get_args(hint)[0])}"
    args = get_args(hint)
    if args and type(None) in args:
        return " or ".join([_type_name(a) for a in args if a is not type(None)] + ["null"])
    return {bool: "a bool", int: "an int", float: "a number", str: "a string"}.get(hint, str(hint))


def _validate_values(p: RunParams) -> list[str]:
    """Type checks, then range and choice checks of the parameters whose type is right: one message per
    offending parameter, all of them at once."""
    typed = [f"{name}: expected {_type_name(hint)}, got {getattr(p, name)!r}" for name, hint in _HINTS.items()
             if not _type_ok(getattr(p, name), hint)]  # fmt: skip
    if not typed:
        return _range_errors(p)
    # the range checks of the well-typed parameters, with defaults standing in for the ill-typed ones
    stand_in = object.__new__(RunParams)
    defaults = {f.name: getattr(_DEFAULTS, f.name) for f in dataclasses.fields(RunParams)}
    for name in _FIELDS:
        ok = _type_ok(getattr(p, name), _HINTS[name])
        object.__setattr__(stand_in, name, getattr(p, name) if ok else defaults[name])
    return typed + _range_errors(stand_in)


def _range_errors(p: RunParams) -> list[str]:
    errors: list[str] = []

    def bad(name: str, expected: str) -> None:
        errors.append(f"{name}: expected {expected}, got {getattr(p, name)!r}")

    if not _NAME_RE.match(p.name):
        bad("name", "a folder name of letters, digits, '.', '_' or '-'")
    if p.device not in DEVICES:
        bad("device", f"one of {list(DEVICES)}")
    if p.coverage not in COVERAGES:
        bad("coverage", f"one of {list(COVERAGES)}")
    if p.weight_dtype not in WEIGHT_DTYPES:
        bad("weight_dtype", f"one of {list(WEIGHT_DTYPES)}")
    if p.activation not in ACTIVATIONS:
        bad("activation", f"one of {sorted(ACTIVATIONS)}")
    if not p.eps >= 0:  # eps = 0 divides by zero only on an all-zero row (its outputs are NaN, as the peers')
        bad("eps", "a number >= 0")
    if p.d <= 0:
        bad("d", "a positive int")
    if p.group_size is not None and (p.group_size <= 0 or p.d % p.group_size):
        bad("group_size", f"null or a positive divisor of d={p.d}")
    unknown = [b for b in p.backends if b not in ALL_BACKENDS]
    if unknown:
        bad("backends", f"names from {ALL_BACKENDS} (custom ones go in custom_backends); unknown: {unknown}")
    if len(set(p.backends)) != len(p.backends):
        bad("backends", "no repeated names")
    for spec in p.custom_backends:
        if not _IMPORT_PATH_RE.match(spec):
            errors.append(f"custom_backends: expected 'package.module:attr', got {spec!r}")
    unknown = [c for c in p.checks if c not in ALL_CHECKS]
    if unknown:
        bad("checks", f"names from {ALL_CHECKS}; unknown: {unknown}")
    for name in ("all_rows_sizes", "all_rows_seeds", "sub_batch_sizes", "sub_batches_seeds", "sweep_seeds"):
        if not getattr(p, name):
            bad(name, "a non-empty list")
    for name in ("all_rows_sizes", "sub_batch_sizes", "sweep_sizes"):
        if any(v <= 0 for v in getattr(p, name)):
            bad(name, "positive sizes")
    for name in ("dweight_rows", "sub_batches_rows", "sweep_n", "accuracy_rows", "agreement_rows"):
        if getattr(p, name) <= 0:
            bad(name, "a positive int")
    # the checks refuse a negative seed too, but only in each backend's process, as that check's error
    for name in ("all_rows_seeds", "sub_batches_seeds", "sweep_seeds"):
        if any(v < 0 for v in getattr(p, name)):
            bad(name, "seeds >= 0")
    for name in ("dweight_seed", "accuracy_seed", "agreement_seed"):
        if getattr(p, name) < 0:
            bad(name, "an int >= 0")
    if any(s > p.sub_batches_rows for s in p.sub_batch_sizes):
        bad("sub_batch_sizes", f"sizes no larger than sub_batches_rows={p.sub_batches_rows}")
    if any(s > p.sweep_n for s in p.sweep_sizes) or not p.sweep_sizes:
        bad("sweep_sizes", f"a non-empty list of sizes no larger than sweep_n={p.sweep_n}")
    if not p.sweep_probe_rows or any(not 0 <= r < p.sweep_n for r in p.sweep_probe_rows):
        bad("sweep_probe_rows", f"a non-empty list of rows in [0, sweep_n={p.sweep_n})")
    if p.timing_warmup < 0:
        bad("timing_warmup", "an int >= 0")
    if p.timing_iters <= 0:
        bad("timing_iters", "a positive int")
    if p.max_records is not None and p.max_records < 0:
        bad("max_records", "null or an int >= 0")
    if not p.gate_timeout_s > 0:
        bad("gate_timeout_s", "a positive number of seconds")
    if not p.backend_timeout_s > 0:
        bad("backend_timeout_s", "a positive number of seconds")
    return errors


def _format_errors(errors: list[str]) -> str:
    return "invalid run parameters:\n  " + "\n  ".join(errors)


def _read_mapping(source: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(source, Mapping):
        return dict(source), ""
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ParamsError(f"parameters file {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParamsError(f"parameters file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(
            f"parameters file {str(path)!r}: expected a mapping of name: value, got {type(data).__name__}"
        )
    return data, str(path)


def _shown(path: Path) -> str:
    """A parameter file's path as titles show it: relative to the checkout when it lies inside it."""
    try:
        return str(path.resolve().relative_to(CHECKOUT)) if CHECKOUT is not None else str(path)
    except ValueError:
        return str(path)


def read_params_file(path: str | os.PathLike) -> dict[str, Any]:
    """A parameter file's mapping, as written (no defaults); refuses the keys the command line sets."""
    data, where = _read_mapping(path)
    cli = [k for k in CLI_KEYS if k in data]
    if cli:
        raise ParamsError(
            f"parameters file {where!r}: {', '.join(cli)}: set by `python -m rlnorm run`, not by a parameter file"
        )
    return data


def load_params(source: str | os.PathLike | Mapping[str, Any] | None = None, **overrides: Any) -> RunParams:
    """Parameters from a YAML file or a mapping (plus overrides), validated strictly.

    Raises ParamsError naming every unknown parameter (with the closest known name) and every
    ill-typed or out-of-range one, all at once, so one edit fixes a parameter file.
    """
    if source is None:
        data, path = {}, ""
    elif isinstance(source, Mapping):
        data, path = dict(source), ""
    else:
        data, path = read_params_file(source), str(source)
    data.update(overrides)
    if path and not data.get("params_file"):
        data["params_file"] = _shown(Path(path))
    errors: list[str] = []
    for key in data:
        if not isinstance(key, str) or key not in _FIELDS:
            close = difflib.get_close_matches(str(key), list(_FIELDS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append(f"{key}: unknown parameter{hint}")
    known = {k: v for k, v in data.items() if k in _FIELDS}
    candidate = object.__new__(RunParams)
    for name in _FIELDS:
        object.__setattr__(candidate, name, known.get(name, getattr(_DEFAULTS, name)))
    errors += _validate_values(candidate)
    if errors:
        raise ParamsError(_format_errors(errors))
    return RunParams(**known)


_DEFAULTS = RunParams()
