"""Typed results: the artifact's dataclasses, and `to_json` / `from_json`, the one place JSON and they meet; every
reader gets a `RunResult` from `load_run`, of this kit or of the reference report (its missing fields read as None)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = "1"
SEED_SCHEMA_VERSION = "seed"  # the reference report, which has no schema_version of its own
ARTIFACT_KIND = "qwen3_next_norm_reuse_check"
OP = "rms_norm_gated"

# a field with this metadata is left out of the JSON while it is None (fields the report never had)
OMIT_NONE = {"omit_none": True}
REBUILD_VERSION = 1  # of a record's `rebuild` spec (kit.records.rebuild_case)


@dataclass
class RowsAtSize:
    """all_rows at one batch size: each row alone against the same row in the whole batch."""

    rows: int
    fwd_differ: int | None = None
    rowgrad_differ: int | None = None  # None: forward-only backend, no gradient compared (never 0 for that)
    alone_path: str | None = field(default=None, metadata=OMIT_NONE)  # "cuda_graph" | "eager" | "eager (why)"
    records_dropped: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass
class AllRows:
    """all_rows: per batch size (the JSON's keys are the sizes, plus `error` where the check raised)."""

    sizes: dict[int, RowsAtSize] = field(default_factory=dict)
    error: str | None = None


@dataclass
class SubBatches:
    """full_vs_sub_batches: every row of the full batch against the same row in contiguous sub-batches."""

    full_batch: int
    sub_batch_sizes: list[int]
    sub_batches: int
    fwd_differ: int | None = None
    rowgrad_differ: int | None = None
    coverage: str | None = field(default=None, metadata=OMIT_NONE)
    rows_compared: int | None = field(default=None, metadata=OMIT_NONE)
    alone_path: dict[str, str] | None = field(default=None, metadata=OMIT_NONE)
    error: str | None = field(default=None, metadata=OMIT_NONE)
    records_dropped: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass
class Sweep:
    """batch_size_sweep: probe rows first, in the middle and last in batches of many sizes, against the row alone."""

    batch_sizes: list[int]
    probe_rows: list[int]
    comparisons: int
    differ: int
    fwd_differ: int | None = field(default=None, metadata=OMIT_NONE)
    rowgrad_differ: int | None = field(default=None, metadata=OMIT_NONE)
    error: str | None = field(default=None, metadata=OMIT_NONE)
    records_dropped: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass
class BatchInvariance:
    all_rows: AllRows | None = None
    dweight_repeatable: bool | None = None
    full_vs_sub_batches: SubBatches | None = None
    batch_size_sweep: Sweep | None = None
    batch_invariant: bool | None = None  # None: a check raised or did not run; True only for verdict "invariant"
    # "invariant" | "not_invariant" | "not_invariant_by_construction" (None: none); kit.checks.common.verdict
    verdict: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass
class Accuracy:
    """accuracy_latency: correct rounding against fp64 rounded once, gradient error, time against a same-run add."""

    rows: int
    fwd_correctly_rounded: float | None = None
    fwd_max_abs_err: float | None = None
    fwd_us: float | None = None
    grad_rel_err: dict[str, float | None] | None = None
    fwd_bwd_us: float | None = None
    fwd_us_p20: float | None = None
    fwd_us_p80: float | None = None
    fwd_bwd_us_p20: float | None = None
    fwd_bwd_us_p80: float | None = None
    fwd_gbps: float | None = None
    fwd_bwd_gbps: float | None = None
    roofline_add_us: float | None = None
    fwd_roofline_ratio: float | None = None  # fwd_us / roofline_add_us
    fwd_bwd_roofline_ratio: float | None = None  # fwd_bwd_us / (8/3 roofline_add_us)
    fwd_ulp_hist: dict[str, int] | None = None  # "0".."15", "16+", "nan"
    fwd_abs_err_hist: dict[str, Any] | None = None  # edges, counts, zero, under, over, nan
    device: str | None = None
    timed: bool | None = None
    host_bound: dict[str, bool] | None = None  # add / fwd / fwd_bwd: the GPU queue ran dry while timing
    error: str | None = field(default=None, metadata=OMIT_NONE)

    def ran_host_bound(self, what: str) -> bool:
        """Whether the time of `what` ("add", "fwd", "fwd_bwd") includes host overhead."""
        return bool(self.host_bound and self.host_bound.get(what.removesuffix("_us")))


@dataclass
class Gate:
    """One contract gate (forward or gradient): its lines and whether every one passed."""

    returncode: int | None
    passed: bool
    failed_lines: list[str] = field(default_factory=list)
    singleton_aggregate: list[str] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)
    timed_out: bool | None = None
    lines: list[str] | None = None


@dataclass
class Crash:
    """How a backend's process ended before its checks did, and the batch it was on."""

    cause: str
    signal: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    check: str | None = None
    batch_size: int | None = None
    rebuild: dict[str, Any] | None = None  # the breadcrumb: `records.rebuild_case` rebuilds the batch
    finished_checks: list[str] = field(default_factory=list)
    seconds: float | None = None
    stderr_tail: str | None = None


@dataclass
class KernelLaunches:
    """One kernel's launch configurations over the row ladder (the `launch` check)."""

    kernel: str  # qualified name, e.g. "fla.modules.fused_norm_gate.layer_norm_gated_fwd_kernel"
    passes: list[str]  # "forward", "backward": where it was launched
    seen_by: str  # "launch_hook" (compiled Triton) | "jit_hook" (Triton interpreter) | "profiler" (CUDA kernels)
    configs: dict[str, list[int]]  # one launch configuration, in words, minus the grid's row extent -> row counts
    varying: list[str]  # the launch parameters whose value changes with the row count (empty: one configuration)
    evidence: str | None = None  # "BT=16 at 1..65536, BT=32 at 262144"
    specializations: dict[str, list[int]] | None = None  # Triton's integer specialisations (e.g. "rows==1") -> rows


@dataclass
class Launches:
    rows: list[int]  # the ladder
    kernels: list[KernelLaunches] = field(default_factory=list)
    unseen: str | None = None  # what this device cannot show
    error: str | None = None


@dataclass
class ConfigPair:
    kernel: str
    parameter: str  # the launch parameter (or autotuner config) that differs between the two runs
    full: str  # the configuration the full batch ran under, in words
    alone: str  # the configuration the rows alone / sub-batches ran under
    fwd_differ: int
    rowgrad_differ: int | None = None
    dweight_equal: bool | None = None


@dataclass
class Configurations:
    """Every configuration a kernel could pick, run against each other (the `configurations` check)."""

    values: dict[str, list[str]] = field(default_factory=dict)  # "kernel.param" -> every value it was run at
    pairs: list[ConfigPair] = field(default_factory=list)  # each pair tried, with what differed (0: nothing)
    cleared: list[str] = field(default_factory=list)  # "kernel.param" run at each value, no bit changed
    unexercised: dict[str, str] = field(default_factory=dict)  # "kernel.param" -> why the kit could not run it
    error: str | None = None


@dataclass
class Digests:
    """sha256 of the bytes of a backend's outputs on the standard case (`checks.digests`): same digest, same bits."""

    case: str  # what was computed: the case and the options
    tensors: dict[str, str]  # "y", and "dx", "dz", "dweight" where the backend has a backward -> hex digest
    error: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass
class BackendResult:
    """Everything one backend's process found: `results.<key>` of the artifact."""

    source: str
    backward: str  # "full" | "none"
    # ran: every selected check was given the backend (a check may still have raised: `errors`); skipped: it
    # cannot run here (reason); failed: it could not be loaded; crashed / timed_out: its process ended early
    status: str = "skipped"
    skip_reason: str | None = None
    batch_invariance: BatchInvariance | None = None
    accuracy_latency: Accuracy | None = None
    contract_gates: dict[str, Gate] | None = None
    errors: dict[str, str] | None = None  # check -> why it raised (None: the reference report did not say)
    crash: Crash | None = field(default=None, metadata=OMIT_NONE)
    launches: Launches | None = field(default=None, metadata=OMIT_NONE)
    configurations: Configurations | None = field(default=None, metadata=OMIT_NONE)
    digests: Digests | None = field(default=None, metadata=OMIT_NONE)

    @property
    def has_backward(self) -> bool:
        return self.backward == "full"


@dataclass
class Agreement:
    """Fraction of forward outputs bitwise equal between each pair of backends on the same inputs."""

    tensor: str
    rows: int
    seed: int
    backends: list[str]
    equal_fraction: list[list[float | None]]
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class StackPair:
    """One trainer/sampler pair an RL stack deploys (`checks.stack_pairs`): bitwise equal or how they differ."""

    name: str
    status: str  # "ran" | "skipped" | "error"
    stack: str | None = None
    model: str | None = None
    trainer: str | None = None  # backend keys
    sampler: str | None = None
    trainer_where: str | None = None  # where the stack's source chooses it (file:line at a pinned version)
    sampler_where: str | None = None
    trainer_calls: list[int] | None = None  # row counts of each call: one packed batch
    sampler_calls: list[int] | None = None  # a prefill, then decode steps
    reason: str | None = field(default=None, metadata=OMIT_NONE)  # why skipped, or the error
    trainer_source: str | None = field(default=None, metadata=OMIT_NONE)
    sampler_source: str | None = field(default=None, metadata=OMIT_NONE)
    bitwise_equal: bool | None = None
    rows_differ: int | None = None
    elements_differ: int | None = None
    max_ulp: int | None = None
    differing_rows: list[int] | None = field(default=None, metadata=OMIT_NONE)


@dataclass
class StackPairs:
    """The stack pairs table: the same rows (seed, rows, d) through every pair."""

    rows: int
    d: int
    seed: int
    device: str
    pairs: list[StackPair] = field(default_factory=list)


@dataclass
class StepFailure:
    """A step after the backends that raised: the run went on and its results stand."""

    step: str
    error: str
    traceback: list[str] = field(default_factory=list)  # its last lines


@dataclass
class Record:
    """One differing (row, tensor) comparison; `rebuild` is what `records.rebuild_case` needs to rebuild it."""

    backend: str
    check: str
    seed: int | None
    case: str
    batch_start: int | None
    batch_size: int | None
    position: int | None
    row: int | None
    tensor: str
    cols_differ: int | None
    max_abs: float | None
    max_ulp: int | None
    rebuild: str


@dataclass(kw_only=True)
class RunResult:
    """One run: the artifact's document, typed (the reference report lacks the keys that default to None)."""

    schema_version: str
    kind: str
    rfc: str | None = None
    op: str
    commit: str | None
    rl_kernel_commit: str | None = None
    tracked_tree_dirty: bool | None = None
    created_at: str | None = None
    wall_time_s: float | None = None
    param_set: str | None = None
    environment: dict[str, Any]
    quick: bool
    checks: list[str]
    params: dict[str, Any] | None = None
    records: str | None = None  # the records CSV, relative to the artifact's folder
    plots: dict[str, str] | None = None  # name -> PNG, relative to the artifact's folder
    agreement: Agreement | None = None
    stack_pairs: StackPairs | None = field(default=None, metadata=OMIT_NONE)
    results: dict[str, BackendResult]
    failed_steps: list[StepFailure] | None = field(default=None, metadata=OMIT_NONE)
    path: Path | None = field(default=None, metadata={"json": False})  # where it was read from

    @property
    def is_seed(self) -> bool:
        return self.schema_version == SEED_SCHEMA_VERSION

    @property
    def device_name(self) -> str:
        """Where the numbers come from: the GPU's name, else the device the run used ('cpu')."""
        return str(self.environment.get("gpu") or self.environment.get("device") or "cpu")

    @property
    def libraries(self) -> dict[str, str | None]:
        """Library -> version (None: not installed), as the run recorded them."""
        return dict(self.environment.get("libraries") or {})

    @property
    def folder(self) -> Path | None:
        return None if self.path is None else self.path.parent

    def resolve(self, relative: str | None) -> Path | None:
        """A path the artifact stores relative to its own folder, as a path a reader can open."""
        return None if relative is None or self.folder is None else self.folder / relative


# the one place where JSON and the dataclasses meet: both ways driven by the fields and their type hints


def to_json(obj: Any) -> Any:
    """A dataclass (recursively) as the artifact's JSON value: NaN and inf (no JSON form) as None, numpy and torch
    scalars as Python ones."""
    if isinstance(obj, AllRows):  # the batch sizes are the object's keys, beside `error`
        return {str(n): to_json(s) for n, s in obj.sizes.items()} | ({} if obj.error is None else {"error": obj.error})
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = {f: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.metadata.get("json", True)}
        return {f.name: to_json(v) for f, v in values.items() if v is not None or not f.metadata.get("omit_none")}
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, (str, bytes)):
        return to_json(obj.item())
    return obj


def from_json(hint: Any, data: Any, where: str = "$") -> Any:
    """`data` (the artifact's JSON value) as `hint` (a dataclass, a list or dict of them...); a value of the wrong
    shape raises naming its key path."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # X | None as X; a union of several values is kept as read
        args = [a for a in args if a is not type(None)]
        return data if data is None or len(args) > 1 else from_json(args[0], data, where)
    if hint is AllRows:  # the batch sizes are the object's keys (strings in JSON), beside `error`
        if bad := [k for k in _of(dict, data, where, "an object of batch sizes") if k != "error" and not k.isdecimal()]:
            raise ValueError(f"{where}: expected batch sizes or 'error' as keys, got {bad[0]!r}")
        sizes = {int(k): from_json(RowsAtSize, v, f"{where}.{k}") for k, v in data.items() if k != "error"}
        return AllRows(dict(sorted(sizes.items())), from_json(str | None, data.get("error"), f"{where}.error"))
    if dataclasses.is_dataclass(hint):
        hints, kwargs = typing.get_type_hints(hint), {}
        _of(dict, data, where, f"an object for {hint.__name__}")
        for f in [f for f in dataclasses.fields(hint) if f.metadata.get("json", True)]:
            if f.name in data:
                kwargs[f.name] = from_json(hints[f.name], data[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}: {hint.__name__} needs {f.name!r}")
        return hint(**kwargs)
    if origin is list:
        return [from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(_of(list, data, where, "a list"))]
    if origin is dict:
        return {k: from_json(args[1], v, f"{where}.{k}") for k, v in _of(dict, data, where).items()}
    if hint is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    # as the schema: None only under `X | None`, and a bool is no count (to Python, it is an int)
    if hint in (int, float, str, bool) and (not isinstance(data, hint) or (hint is int and isinstance(data, bool))):
        raise ValueError(f"{where}: expected {hint.__name__}, got {data!r}")
    return data


def _of(kind: type, data: Any, where: str, expected: str = "an object") -> Any:
    if not isinstance(data, kind):
        raise ValueError(f"{where}: expected {expected}, got {type(data).__name__}")
    return data


# an older artifact's `trainer_sampler` field: its pair -> that pair of `stack_pairs` (name, stack, trainer, sampler)
_TRAINER_SAMPLER_PAIRS = {
    "patched": ("rlnorm_patched", "rlnorm on both sides (patched)", "transformers_rlnorm", "vllm_rlnorm"),
    "unpatched": ("stock_unpatched", "stock layers, unpatched (contrast)", "transformers_model", "vllm_layer"),
}


def _upgrade_trainer_sampler(doc: dict[str, Any]) -> None:
    """An older artifact's `trainer_sampler` as its two pairs of `stack_pairs` (replacing any pairs of those names)."""
    old = doc.pop("trainer_sampler", None)
    if not isinstance(old, dict):
        return  # null or absent: the check did not run
    p, env = doc.get("params") or {}, doc.get("environment") or {}  # the check ran at the agreement rows and seed
    sizes = {"rows": p.get("agreement_rows", 0), "d": p.get("d", 0), "seed": p.get("agreement_seed", 0)}
    table = doc.get("stack_pairs") or {**sizes, "device": env.get("device", "cpu")}
    pairs = list(table.get("pairs", []))
    for key, (name, stack, trainer, sampler) in _TRAINER_SAMPLER_PAIRS.items():
        one = dict((old.get("pairs") or {}).get(key) or {})
        why = one.pop("error", None) or old.get("error")
        status = "ran" if one.get("bitwise_equal") is not None else "error" if why else "skipped"
        why = None if status == "ran" else why or one.pop("skip_reason", None) or old.get("skip_reason") or "not run"
        pairs = [q for q in pairs if q.get("name") != name]  # that run's own pair of the name measured less
        pairs.append({**one, "name": name, "status": status, "stack": stack, "model": "Qwen3-Next", "trainer": trainer,
                      "sampler": sampler, "trainer_source": one.get("trainer"), "sampler_source": one.get("sampler"),
                      "trainer_calls": old.get("trainer_calls"), "sampler_calls": old.get("sampler_calls"),
                      "reason": why})  # fmt: skip
    doc["stack_pairs"] = {**table, "pairs": pairs}


def run_from_doc(doc: dict[str, Any], path: Path | None = None) -> RunResult:
    """An artifact's document (this kit's, or the reference report) as a `RunResult`."""
    if not isinstance(doc, dict):
        raise TypeError(f"doc: expected an artifact (a JSON object), got {type(doc).__name__}")
    doc = dict(doc)
    version = doc.get("schema_version")
    if version is None:  # the reference report: it lists only backends that ran, and predates the kit's fields
        if missing := [k for k in ("kind", "results") if k not in doc]:
            raise ValueError(f"doc: no schema_version, nor the reference report's {' and '.join(missing)}")
        doc["schema_version"] = SEED_SCHEMA_VERSION
        doc.setdefault("commit", doc.get("rl_kernel_commit"))
        doc["results"] = {k: {"status": "ran", "errors": None, **v} for k, v in doc["results"].items()}
    elif version not in (SCHEMA_VERSION, SEED_SCHEMA_VERSION):
        raise ValueError(f"doc: schema_version {version!r} is not this rlnorm's ({SCHEMA_VERSION!r}): upgrade rlnorm")
    _upgrade_trainer_sampler(doc)
    return dataclasses.replace(from_json(RunResult, doc), path=path)


def load_run(path: str | os.PathLike[str]) -> RunResult:
    """A run from its artifact file or its run folder."""
    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob("*.json"))
        if len(found) != 1:
            raise FileNotFoundError(f"path: expected a run folder holding one artifact (*.json), found {len(found)}")
        p = found[0]
    return run_from_doc(json.loads(p.read_text(encoding="utf-8")), p)
