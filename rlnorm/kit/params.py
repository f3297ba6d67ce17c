"""Run parameters: `RunParams` holds each one with its default (the full protocol, docs/spec.md §4-5), params/*.yaml
what differs. Papermill takes unknown names with only a warning, so every run goes through `load_params`, which
names each unknown, ill-typed or out-of-range parameter (a typo would otherwise run the default protocol).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from rlnorm.checkout import CHECKOUT
from rlnorm.kit.artifact import DEFAULT_RFC
from rlnorm.kit.backends import REGISTRY
from rlnorm.kit.checks import CHECKS
from rlnorm.kit.checks.launch import ladder
from rlnorm.kit.checks.rows import COVERAGES
from rlnorm.kit.results import from_json
from rlnorm.options import ACTIVATIONS, OpOptions

# the docs/spec.md §6 backends, in the registry's order: one list for the kit, not a second copy here
ALL_BACKENDS = list(REGISTRY)
ALL_CHECKS = [*CHECKS, "contract_gates", "agreement", "digests", "stack_pairs"]
DEVICES = ("auto", "cpu", "cuda")
WEIGHT_DTYPES = ("bfloat16", "float16", "float32")
# what `python -m rlnorm run` sets: a parameter file that sets them would misstate where its run goes
CLI_KEYS = ("output_dir", "staging_dir", "params_file", "overwrite")
_CHOICES = {"device": DEVICES, "coverage": COVERAGES, "weight_dtype": WEIGHT_DTYPES, "activation": sorted(ACTIVATIONS)}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# the least value of each size, count and seed (a list: of each entry, and the list non-empty)
_SIZES = ["d", "dweight_rows", "sub_batches_rows", "sweep_n", "accuracy_rows", "agreement_rows", "timing_iters",
          "configurations_rows", "launch_rows", "max_records", "all_rows_sizes", "sub_batch_sizes", "sweep_sizes",
          "configurations_sizes"]  # fmt: skip
_SEEDS = ["dweight_seed", "accuracy_seed", "agreement_seed", "configurations_seed", "timing_warmup",
          "all_rows_seeds", "sub_batches_seeds", "sweep_seeds"]  # fmt: skip
_LEAST = {**dict.fromkeys(_SIZES, 1), **dict.fromkeys(_SEEDS, 0), "max_records": 0}
# list -> the parameter its sizes may not exceed
_TOP = {"sub_batch_sizes": "sub_batches_rows", "sweep_sizes": "sweep_n", "configurations_sizes": "configurations_rows"}


def default_probe_rows(n: int = 4097) -> list[int]:
    """0 and n-1 plus 515, 1027, ..., 3075 (those below n)."""
    return sorted({0, n - 1} | {512 * j + 3 for j in range(1, 7) if 512 * j + 3 < n})


class ParamsError(ValueError):
    """Unknown, ill-typed or out-of-range run parameters; the message names every one."""


@dataclass(frozen=True)
class RunParams:
    """One run of the reuse check. Defaults: the full protocol (docs/spec.md §4-5)."""

    # -- the run ------------------------------------------------------------------------------
    name: str = "run"  # the run folder's name under outputs/ (a parameter file's name by default)
    # set by `python -m rlnorm run` (CLI_KEYS), never by a parameter file
    output_dir: str = ""  # where the run's files end up; "" = outputs/<name>
    staging_dir: str = ""  # where files are written meanwhile (the CLI's staging folder); "" = a folder of its own
    params_file: str = ""  # which parameter file this came from (shown in plot titles)
    overwrite: bool = False  # replace an existing run folder (the CLI's --force; papermill: -p overwrite True)
    device: str = "auto"  # auto | cpu | cuda
    progress: bool = True  # tqdm bars for the long loops
    rfc: str = DEFAULT_RFC
    # -- the op (docs/spec.md §1) ---------------------------------------------------------------------
    d: int = 128
    eps: float = 1e-6
    group_size: int | None = None
    norm_before_gate: bool = True
    activation: str = "silu"  # silu (= swish) | sigmoid
    weight_dtype: str = "bfloat16"  # the activations are bf16 (the op's); the weight may be wider
    # -- what to check --------------------------------------------------------------------------
    backends: list[str] = field(default_factory=lambda: list(ALL_BACKENDS))
    custom_backends: list[str] = field(default_factory=list)  # "package.module:attr"
    checks: list[str] = field(default_factory=lambda: list(ALL_CHECKS))
    # -- sizes and seeds per check (docs/spec.md §5) -----------------------------------------------------
    all_rows_sizes: list[int] = field(default_factory=lambda: [64, 257, 4097])  # rows = 3n per case
    all_rows_seeds: list[int] = field(default_factory=lambda: [3, 4, 5])
    dweight_rows: int = 4097
    dweight_seed: int = 3
    sub_batches_rows: int = 262144
    sub_batch_sizes: list[int] = field(default_factory=lambda: [1, 7, 4097, 65536, 131072])
    sub_batches_seeds: list[int] = field(default_factory=lambda: [3, 4])
    coverage: str = "all"  # all: every row of every sub-batch size; sampled: the report's 2188 sub-batches
    # batch_size_sweep: 36 sizes, 8 probes, 3 positions, 3 seeds (2520 comparisons)
    sweep_n: int = 4097
    sweep_sizes: list[int] = field(default_factory=lambda: ladder([], 4097))  # the launch check's ladder
    sweep_probe_rows: list[int] = field(default_factory=lambda: default_probe_rows(4097))
    sweep_seeds: list[int] = field(default_factory=lambda: [3, 4, 5])
    accuracy_rows: int = 262144
    accuracy_seed: int = 11
    timing: bool = True  # False: accuracy only, latency fields null (an interpreted kernel's time means nothing)
    timing_warmup: int = 10
    timing_iters: int = 50  # the median (and p20/p80) of these
    # configurations: each value of every launch parameter a kernel picks by row count or autotuner, the full
    # batch under one value against its rows in sub-batches of each size (1: alone) under another
    configurations_rows: int = 4097
    configurations_sizes: list[int] = field(default_factory=lambda: [1, 7, 257])
    configurations_seed: int = 3
    agreement_rows: int = 4097
    # launch: the row ladder's top (1..9, 2^k-1, 2^k, 2^k+1 and every size the other checks use, up to it);
    # null = the largest batch any check uses
    launch_rows: int | None = None
    agreement_seed: int = 3
    # a backend's own process (its checks, gates and agreement output) is ended past this; the full protocol
    # takes a few minutes per backend on an H200
    backend_timeout_s: float = 1800.0
    # differing rows recorded per backend and check (the summary's counts are always complete);
    # null = every one, which for a kernel that differs everywhere is millions of CSV lines
    max_records: int | None = 2000

    def __post_init__(self) -> None:
        if errors := _problems({name: getattr(self, name) for name in _FIELDS}):
            raise ParamsError(_format_errors(errors))

    def op_options(self) -> OpOptions:
        return OpOptions(**{k: getattr(self, k) for k in ("eps", "group_size", "norm_before_gate", "activation")})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_dir(self) -> Path:
        """output_dir, else outputs/<name> of this checkout (where a notebook run in JupyterLab lands too)."""
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
# the keys that take a list (backends, sizes, seeds...): a list there is the value, not a matrix of runs
LIST_KEYS = {name for name, hint in _HINTS.items() if get_origin(hint) is list}


def check_kwargs(check: Callable[..., Any], params: RunParams) -> dict[str, Any]:
    """The run's value of each parameter `check` names (a check takes its parameters as keywords named as these)."""
    return {k: getattr(params, k) for k in inspect.signature(check).parameters if k in _FIELDS and k != "device"}


def _default(name: str) -> Any:
    f = _FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _type_ok(value: Any, hint: Any) -> bool:
    """The artifact reader's strict typing: a bool is no int, an int is a float, None only under `X | None`."""
    try:
        from_json(hint, value)
    except ValueError:
        return False
    return True


def _type_name(hint: Any) -> str:
    if get_origin(hint) is list:
        return f"a list of {_type_name(get_args(hint)[0])}"
    args = get_args(hint)
    if args and type(None) in args:
        return " or ".join([_type_name(a) for a in args if a is not type(None)] + ["null"])
    return {bool: "a bool", int: "an int", float: "a number", str: "a string"}.get(hint, str(hint))


def _problems(values: Mapping[str, Any]) -> list[str]:
    """One message per ill-typed parameter, then per out-of-range one (defaults stand in for the ill-typed)."""
    ok = {name: _type_ok(values[name], hint) for name, hint in _HINTS.items()}
    typed = [f"{name}: expected {_type_name(_HINTS[name])}, got {values[name]!r}" for name in ok if not ok[name]]
    return typed + _range_errors(SimpleNamespace(**{n: values[n] if ok[n] else _default(n) for n in ok}))


def _range_errors(p: Any) -> list[str]:
    errors: list[str] = []

    def bad(name: str, expected: str) -> None:
        errors.append(f"{name}: expected {expected}, got {getattr(p, name)!r}")

    def unknown(name: str, known: list[str]) -> None:
        if any(v not in known for v in getattr(p, name)):
            bad(name, f"names from {known}; unknown: {[v for v in getattr(p, name) if v not in known]}")

    for name, choices in _CHOICES.items():
        if getattr(p, name) not in choices:
            bad(name, f"one of {list(choices)}")
    if not _NAME_RE.match(p.name):
        bad("name", "a folder name of letters, digits, '.', '_' or '-'")
    if not p.eps >= 0:  # eps = 0 divides by zero only on an all-zero row (its outputs are NaN, as the peers')
        bad("eps", "a number >= 0")
    for name, least in _LEAST.items():
        value = getattr(p, name)
        if isinstance(value, list) and (not value or min(value) < least):
            bad(name, "a non-empty list of " + ("positive sizes" if least else "seeds >= 0"))
        elif isinstance(value, int) and value < least:
            null = "null or " if type(None) in get_args(_HINTS[name]) else ""
            bad(name, null + ("a positive int" if least else "an int >= 0"))
    if p.group_size is not None and (p.group_size <= 0 or p.d % p.group_size):
        bad("group_size", f"null or a positive divisor of d={p.d}")
    unknown("backends", ALL_BACKENDS)  # custom ones go in custom_backends
    if len(set(p.backends)) != len(p.backends):
        bad("backends", "no repeated names")
    for spec in p.custom_backends:
        if not _IMPORT_PATH_RE.match(spec):
            errors.append(f"custom_backends: expected 'package.module:attr', got {spec!r}")
    unknown("checks", ALL_CHECKS)
    for name, top in _TOP.items():
        if any(s > getattr(p, top) for s in getattr(p, name)):
            bad(name, f"sizes no larger than {top}={getattr(p, top)}")
    if not p.sweep_probe_rows or any(not 0 <= r < p.sweep_n for r in p.sweep_probe_rows):
        bad("sweep_probe_rows", f"a non-empty list of rows in [0, sweep_n={p.sweep_n})")
    if not p.backend_timeout_s > 0:
        bad("backend_timeout_s", "a positive number of seconds")
    return errors


def _format_errors(errors: list[str]) -> str:
    return "invalid run parameters:\n  " + "\n  ".join(errors)


def _locate(source: str | os.PathLike[str]) -> Path:
    """A parameter file's path; a relative one not found here is looked for in the checkout."""
    path = Path(source)
    if not path.exists() and not path.is_absolute() and CHECKOUT is not None and (CHECKOUT / path).exists():
        return CHECKOUT / path
    return path


def file_params(source: str | os.PathLike[str]) -> dict[str, Any]:
    """A parameter file's mapping, named after the file unless it says otherwise, and its path as titles show it
    (relative to the checkout when it lies inside it)."""
    path = _locate(source)
    full = path.resolve()
    label = str(full.relative_to(CHECKOUT)) if CHECKOUT is not None and full.is_relative_to(CHECKOUT) else str(path)
    return {"name": path.stem, **read_params_file(path), "params_file": label}


def read_params_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A parameter file's mapping, as written (no defaults); refuses the keys the command line sets."""
    path = _locate(path)
    where = f"parameters file {str(path)!r}"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ParamsError(f"{where} cannot be read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ParamsError(f"{where} is not valid YAML: {exc}") from exc
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ParamsError(f"{where}: expected a mapping of name: value, got {type(data).__name__}")
    if cli := [k for k in CLI_KEYS if k in data]:
        raise ParamsError(f"{where}: {', '.join(cli)}: set by `python -m rlnorm run`, not by a parameter file")
    return data


def load_params(source: str | os.PathLike[str] | Mapping[str, Any] | None = None, **overrides: Any) -> RunParams:
    """Parameters from a YAML file (its stem names the run unless it says otherwise) or a mapping, plus overrides,
    over RunParams' defaults; ParamsError names every unknown (with the closest known name), ill-typed or
    out-of-range parameter at once, so one edit fixes a parameter file."""
    data = dict(source or {}) if source is None or isinstance(source, Mapping) else file_params(source)
    data.update({k: v for k, v in overrides.items() if not (k == "params_file" and not v)})
    known = {k: v for k, v in data.items() if k in _FIELDS}
    if unknown := [k for k in data if k not in known]:  # named beside every other problem, for one edit
        close = {k: difflib.get_close_matches(str(k), list(_FIELDS), n=1) for k in unknown}
        errors = [f"{k}: unknown parameter" + (f" (did you mean {c[0]!r}?)" if c else "") for k, c in close.items()]
        errors += _problems({name: known.get(name, _default(name)) for name in _FIELDS})
        raise ParamsError(_format_errors(errors))
    return RunParams(**known)


# what the notebook's parameters cell declares besides `overrides`; IPython's own names are never parameters
NOTEBOOK_PARAMETERS = ("params_file", "name", "output_dir", "staging_dir", "overwrite")
_IPYTHON = ("In", "Out", "exit", "quit", "get_ipython")


def params_from_namespace(namespace: Mapping[str, Any], before: set[str]) -> RunParams:
    """The notebook's run: `load_params(params_file, **overrides)` with the cell's name and where the run goes;
    a public name that appeared after `before` (papermill injects `-p d 256` as `d`) is one more override, and
    one that is no parameter is refused by name."""
    overrides = namespace.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ParamsError(f"overrides: expected a mapping of parameter: value, got {overrides!r}")
    skip = {*NOTEBOOK_PARAMETERS, "overrides", *_IPYTHON}
    injected = {k: v for k, v in namespace.items() if k not in before and k not in skip and not k.startswith("_")}
    cell = {k: namespace[k] for k in NOTEBOOK_PARAMETERS[1:] if namespace.get(k, "") != ""}
    return load_params(namespace.get("params_file") or None, **{**overrides, **injected, **cell})
