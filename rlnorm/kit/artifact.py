"""The run artifact: build, validate, write atomically, read (the B200 seed report loads too).

One JSON file per run keeps every key of the seed report (`rlnorm/data/rms_norm_gated_b200.json`),
so a run can be laid beside it, plus what a reader needs to trust and reproduce it: the schema
version, the code's commit, the parameters, per-backend status and skip reason, the errors of
checks that raised, and the paths of the per-row records and plots. `read_artifact` brings the
seed report and our artifacts into one shape (fields the report lacks become None), so every
consumer (plots, compare notebook) handles a single shape. The JSON Schema lives in
`rlnorm/kit/schema/artifact.schema.json` and is checked on write and on read.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import functools
import importlib.resources
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

SCHEMA_VERSION = "1"
SEED_SCHEMA_VERSION = "seed"
KIND = "qwen3_next_norm_reuse_check"
OP = "rms_norm_gated"
DEFAULT_RFC = "RL-Align/RL-Kernel#428"

# statuses of a backend whose own process ended before its checks did
ENDED_EARLY = ("crashed", "timed_out")
# accuracy_latency fields that a backend may lack (forward-only, or the seed report predating them)
ACCURACY_OPTIONAL_FIELDS = (
    "grad_rel_err",
    "fwd_bwd_us",
    "fwd_us_p20",
    "fwd_us_p80",
    "fwd_bwd_us_p20",
    "fwd_bwd_us_p80",
    "fwd_gbps",
    "fwd_bwd_gbps",
    "roofline_add_us",
    "fwd_roofline_ratio",
    "fwd_bwd_roofline_ratio",
    "fwd_ulp_hist",
    "fwd_abs_err_hist",
    "device",
    "timed",
    "host_bound",
)
BATCH_INVARIANCE_FIELDS = (
    "all_rows",
    "dweight_repeatable",
    "full_vs_sub_batches",
    "batch_size_sweep",
    "batch_invariant",
)
ENVIRONMENT_NEW_FIELDS = (
    "device",
    "gpu_count",
    "gpu_memory_gib",
    "python",
    "platform",
    "triton_interpret",
    "rlnorm",
    "torch_cuda_available",
)
GATE_NEW_FIELDS = ("timed_out", "lines")


class ArtifactValidationError(ValueError):
    """The document does not match artifact.schema.json; `problems` lists (key path, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        shown = "\n".join(f"  at {path}: {msg}" for path, msg in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        hint = ""
        if any("Additional properties" in msg for _, msg in problems):
            hint = "\n(a misspelled key, or a NEW field that needs its line in the schema and in docs/design.md)"
        super().__init__(
            f"artifact does not match rlnorm/kit/schema/artifact.schema.json ({len(problems)} problem(s)):\n"
            f"{shown}{more}{hint}"
        )


@functools.lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The artifact JSON Schema shipped with the package."""
    text = importlib.resources.files("rlnorm.kit").joinpath("schema/artifact.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    schema = load_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _key_path(parts: Any) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _deepest(err: jsonschema.exceptions.ValidationError) -> jsonschema.exceptions.ValidationError:
    """An anyOf/oneOf error hides its cause in .context: follow the branch that got furthest in."""
    while err.context:
        err = max(err.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
    return err


def validate_artifact(doc: Mapping[str, Any]) -> None:
    """Raise ArtifactValidationError naming each failing key path; return None when `doc` is valid."""
    if not isinstance(doc, Mapping):
        raise TypeError(f"doc: expected a dict (an artifact), got {type(doc).__name__}")
    problems = []
    for err in _validator().iter_errors(doc):
        best = _deepest(err)
        problems.append((_key_path(best.absolute_path), best.message))
    if problems:
        problems.sort()
        raise ArtifactValidationError(problems)


# ---------------------------------------------------------------------------------------------
# normalisation: one shape for our artifacts and the seed report


def jsonable(value: Any, where: str) -> Any:
    """Plain JSON types: numpy scalars/arrays unwrapped, tuples to lists, non-finite floats to None."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    # numpy / torch scalars and arrays without importing either here
    if hasattr(value, "tolist") and callable(value.tolist) and not isinstance(value, (str, bytes)):
        return jsonable(value.tolist(), where)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # JSON has no NaN/inf
    return value  # left for the schema / serializer to reject with a path


def ran_host_bound(acc: Any, field: str) -> bool:
    """Whether the accuracy_latency timing `field` ("fwd_us", "fwd_bwd_us" or "add") ran with the GPU queue dry,
    so its time includes host overhead (tables and plots mark it *); False where nothing says so."""
    flags = acc.get("host_bound") if isinstance(acc, dict) else None
    return bool((flags or {}).get(field.removesuffix("_us")))


def _normalize_accuracy(acc: Any) -> Any:
    if not isinstance(acc, dict):
        return acc
    for key in ACCURACY_OPTIONAL_FIELDS:
        acc.setdefault(key, None)
    return acc


def _normalize_gates(gates: Any) -> Any:
    if not isinstance(gates, dict):
        return gates
    for gate in gates.values():
        if isinstance(gate, dict):
            for key in GATE_NEW_FIELDS:
                gate.setdefault(key, None)
    return gates


def _normalize_backend(entry: Any, seed: bool) -> Any:
    if not isinstance(entry, dict):
        return entry
    if seed:
        entry.setdefault("status", "ran")  # the report lists only backends that ran
        entry.setdefault("errors", None)  # unknown: the report did not record them
    else:
        entry.setdefault("errors", {})
    entry.setdefault("skip_reason", None)
    for key in ("batch_invariance", "accuracy_latency", "contract_gates"):
        entry.setdefault(key, None)
    if isinstance(entry["batch_invariance"], dict):
        for key in BATCH_INVARIANCE_FIELDS:
            entry["batch_invariance"].setdefault(key, None)
    _normalize_accuracy(entry["accuracy_latency"])
    _normalize_gates(entry["contract_gates"])
    order = (
        "source",
        "backward",
        "status",
        "skip_reason",
        "batch_invariance",
        "accuracy_latency",
        "contract_gates",
        "errors",
        "crash",
    )
    ordered = {k: entry[k] for k in order if k in entry}
    ordered.update({k: v for k, v in entry.items() if k not in ordered})
    return ordered


_TOP_ORDER = (
    "schema_version",
    "kind",
    "rfc",
    "op",
    "commit",
    "rl_kernel_commit",
    "tracked_tree_dirty",
    "created_at",
    "wall_time_s",
    "param_set",
    "environment",
    "quick",
    "checks",
    "params",
    "records",
    "plots",
    "agreement",
    "trainer_sampler",
    "results",
)


def normalize_artifact(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `doc` in the current shape: the seed report gains schema_version 'seed', commit
    (= its rl_kernel_commit, the code that produced it), per-backend status 'ran', and None for
    every field it predates. Our own artifacts only gain None for optional fields left out."""
    if not isinstance(doc, Mapping):
        raise TypeError(f"doc: expected a dict (an artifact), got {type(doc).__name__}")
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    version = out.get("schema_version")
    seed = version is None
    if seed:
        if "results" not in out or "kind" not in out:
            raise ValueError(
                "doc: neither an rlnorm artifact (no schema_version) nor the seed report (no kind/results)"
            )
        out["schema_version"] = SEED_SCHEMA_VERSION
        out.setdefault("commit", out.get("rl_kernel_commit"))
        for key in ("param_set", "params", "created_at", "wall_time_s", "records", "plots", "agreement"):
            out.setdefault(key, None)
    elif version not in (SCHEMA_VERSION, SEED_SCHEMA_VERSION):
        raise ValueError(
            f"doc: schema_version {version!r} is not one this rlnorm reads "
            f"({SCHEMA_VERSION!r}, {SEED_SCHEMA_VERSION!r}); upgrade rlnorm"
        )
    out.setdefault("trainer_sampler", None)  # artifacts from before the check had none
    env = out.get("environment")
    if isinstance(env, dict):
        for key in ENVIRONMENT_NEW_FIELDS:
            env.setdefault(key, None)
    results = out.get("results")
    if isinstance(results, dict):
        out["results"] = {k: _normalize_backend(v, seed) for k, v in results.items()}
    ordered = {k: out[k] for k in _TOP_ORDER if k in out}
    ordered.update({k: v for k, v in out.items() if k not in ordered})
    return ordered


# ---------------------------------------------------------------------------------------------
# build


def _relative(path: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None, name: str) -> str:
    """`path` relative to `base_dir` (both taken from the working folder when relative); with no
    base_dir a relative path is kept as given (already relative to the artifact's folder)."""
    p = Path(path)
    if base_dir is not None:
        return Path(os.path.relpath(p.resolve(), Path(base_dir).resolve())).as_posix()
    if p.is_absolute():
        raise ValueError(f"{name}: {str(p)!r} is absolute; pass base_dir (the artifact's folder) to store it relative")
    return p.as_posix()


def build_artifact(
    params: Mapping[str, Any] | None,
    environment: Mapping[str, Any],
    results: Mapping[str, Mapping[str, Any]],
    agreement: Mapping[str, Any] | None,
    records_path: str | os.PathLike[str] | None,
    plots: Mapping[str, str | os.PathLike[str]] | None,
    quick: bool,
    checks: list[str] | tuple[str, ...],
    commit: str | None,
    dirty: bool | None,
    *,
    param_set: str | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    rl_kernel_commit: str | None = None,
    rfc: str | None = DEFAULT_RFC,
    created_at: str | None = None,
    wall_time_s: float | None = None,
    kind: str = KIND,
    op: str = OP,
    trainer_sampler: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble a valid artifact (raises ArtifactValidationError naming the bad key otherwise).

    results: {backend key: {source, backward, status, skip_reason, batch_invariance,
    accuracy_latency, contract_gates, errors}}; absent optional parts become None.
    records_path / plots: paths of the per-row table and the PNGs; absolute ones are stored
    relative to `base_dir` (the artifact's folder). rl_kernel_commit: the RL-Kernel commit whose
    op was checked, if any (the seed report's key; None for a plain rlnorm run). trainer_sampler: the
    trainer-vs-sampler check's summary (`rlnorm.kit.checks.trainer_sampler`), None where it did not run.
    """
    if not isinstance(quick, bool):
        raise TypeError(f"quick: expected bool, got {type(quick).__name__}")
    if isinstance(checks, str) or not all(isinstance(c, str) for c in checks):
        raise TypeError(f"checks: expected a list of check names, got {checks!r}")
    if not isinstance(results, Mapping):
        raise TypeError(f"results: expected a dict {{backend: result}}, got {type(results).__name__}")
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"params: expected a dict or None, got {type(params).__name__}")
    if param_set is None and params is not None:
        name = params.get("param_set", params.get("name"))
        param_set = name if isinstance(name, str) else None
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "rfc": rfc,
        "op": op,
        "commit": commit,
        "rl_kernel_commit": rl_kernel_commit,
        "tracked_tree_dirty": dirty,
        "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": wall_time_s,
        "param_set": param_set,
        "environment": dict(environment),
        "quick": quick,
        "checks": list(checks),
        "params": dict(params) if params is not None else None,
        "records": None if records_path is None else _relative(records_path, base_dir, "records_path"),
        "plots": None if plots is None else {k: _relative(v, base_dir, f"plots[{k!r}]") for k, v in plots.items()},
        "agreement": None if agreement is None else dict(agreement),
        "trainer_sampler": None if trainer_sampler is None else dict(trainer_sampler),
        "results": {k: dict(v) if isinstance(v, Mapping) else v for k, v in results.items()},
    }
    for entry in doc["results"].values():
        if isinstance(entry, dict) and entry.get("status") != "ran" and not entry.get("skip_reason"):
            entry["skip_reason"] = "no reason given"  # say so rather than leave an empty reason
        elif isinstance(entry, dict) and entry.get("status") == "ran" and entry.get("skip_reason") == "":
            entry["skip_reason"] = None
    doc = normalize_artifact(jsonable(doc, "$"))
    validate_artifact(doc)
    return doc


# ---------------------------------------------------------------------------------------------
# write / read


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_artifact(
    doc: Mapping[str, Any], path: str | os.PathLike[str], overwrite: bool = False, *, validate: bool = True
) -> Path:
    """Write `doc` as JSON to `path` atomically; return the path.

    The file appears whole or not at all: JSON goes to a temp file in the same folder, is
    fsynced, then moved into place (os.link when not overwriting, so a file that appeared
    meanwhile is not clobbered; os.replace when overwriting). An existing file is never replaced
    unless overwrite=True. The document is validated first (validate=False skips that, for
    salvaging a run whose artifact fails the schema).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"path: {str(path)!r} already exists; pass overwrite=True to replace it")
    if validate:
        validate_artifact(doc)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # atomic create-if-absent
            except FileExistsError:
                raise FileExistsError(
                    f"path: {str(path)!r} appeared while writing; pass overwrite=True to replace it"
                ) from None
            except OSError:  # filesystem without hard links: check-then-replace
                if path.exists():
                    raise FileExistsError(f"path: {str(path)!r} already exists; pass overwrite=True") from None
                os.replace(tmp, path)
        _fsync_dir(folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def read_artifact(path: str | os.PathLike[str], *, validate: bool = True) -> dict[str, Any]:
    """Load an rlnorm artifact or the seed report into the normalized shape, validated."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        try:
            raw = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"path: {str(path)!r} is not valid JSON ({exc})") from exc
    doc = normalize_artifact(raw)
    if validate:
        try:
            validate_artifact(doc)
        except ArtifactValidationError as exc:
            raise ArtifactValidationError([(f"{path.name}:{p}", m) for p, m in exc.problems]) from None
    return doc


def resolve_path(artifact_path: str | os.PathLike[str], relative: str | None) -> Path | None:
    """Absolute path of a `records`/`plots` entry, which is stored relative to the artifact's folder."""
    if relative is None:
        return None
    return (Path(artifact_path).resolve().parent / relative).resolve()
