"""What every check shares: argument checks, bitwise row comparison, the record writer, the verdict."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlnorm.kit.records import REBUILD_VERSION, dtype_name
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend


@dataclass
class CheckResult:
    """What a check returns: the report's summary fields and the per-row records of differences."""

    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


def check_int(name: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")
    return value


def check_ints(name: str, values: Any, low: int = 0) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}: expected a sequence of ints, got {values!r}")
    if len(values) == 0:
        raise ValueError(f"{name}: expected at least one value")
    return [check_int(f"{name}[{i}]", v, low) for i, v in enumerate(values)]


def check_common(backend: Any, opts: Any, device: Any, d: int) -> OpOptions:
    for attr in ("forward", "forward_backward"):
        if not callable(getattr(backend, attr, None)):
            raise TypeError(f"backend: expected a rlnorm Backend (with .{attr}), got {type(backend).__name__}")
    if opts is None:
        opts = OpOptions()
    if not isinstance(opts, OpOptions):
        raise TypeError(f"opts: expected rlnorm.options.OpOptions, got {type(opts).__name__}")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: expected a torch device string, got {device!r}") from exc
    check_int("d", d, 1)
    opts.check_width(d)
    return opts


def backend_key(backend: Any) -> str:
    return str(getattr(backend, "key", "") or type(backend).__name__)


def has_backward(backend: Any) -> bool:
    return bool(getattr(backend, "has_backward", False))


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def call(
    backend: Backend, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor | None, opts: OpOptions, with_grad: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One launch of the backend: (y, dx, dz); forward-only gives (y, None, None)."""
    if with_grad:
        g = backend.forward_backward(x, z, w, dy, opts)
        return g.y, g.dx, g.dz
    return backend.forward(x, z, w, opts), None, None


def bits(t: Tensor) -> Tensor:
    """Integer view for bitwise comparison (NaN payloads and signed zeros count as different)."""
    t = t.detach().contiguous()
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def differ_rows(a: Tensor, b: Tensor) -> Tensor:
    """bool[rows]: the row is not bitwise equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {tuple(a.shape)} {a.dtype} with {tuple(b.shape)} {b.dtype}")
    return (bits(a) != bits(b)).reshape(a.shape[0], -1).any(dim=1)


def diff_stats(a: Tensor, b: Tensor) -> tuple[list[int], list[float], list[int]]:
    """Per row of [k, D] tensors: columns differing, max |a - b|, max ulp distance."""
    cols = (bits(a) != bits(b)).reshape(a.shape[0], -1).sum(dim=1)
    diff = (a.double() - b.double()).abs().reshape(a.shape[0], -1)
    max_abs = torch.where(diff.isnan().any(dim=1), math.nan, diff.nan_to_num(nan=0.0).amax(dim=1))
    if a.dtype in (torch.bfloat16, torch.float16, torch.float32):
        max_ulp = ulp_distance(a.detach(), b.detach()).reshape(a.shape[0], -1).amax(dim=1).tolist()
    else:
        max_ulp = [None] * a.shape[0]
    return cols.tolist(), max_abs.tolist(), max_ulp


def case_spec(rows: int, d: int, seed: int, dtype: torch.dtype, weight_dtype: torch.dtype) -> dict[str, Any]:
    return {"rows": rows, "d": d, "seed": seed, "dtype": dtype_name(dtype), "weight_dtype": dtype_name(weight_dtype)}


class _Trail:
    """Where the checks are: the batch a backend is about to be given, for a process that may die in that call.

    A check names its case (`at_case`) and then each batch before the backend sees it (`at_batch`); a follower
    (`following`) receives a rebuild spec in the records' format, so `records.rebuild_case` regenerates the very
    batch a crashed backend died on. The many small calls of a row-alone pass (`alone.AloneRunner`) are marked once
    per chunk of calls, by the chunk's first: a crash inside the chunk names that call. With no follower, marking
    costs one attribute test.
    """

    def __init__(self) -> None:
        self.sink: Callable[[dict[str, Any]], None] | None = None
        self.where: dict[str, Any] = {}

    def at_case(self, check: str, case: dict[str, Any], opts: OpOptions) -> None:
        if self.sink is not None:
            self.where = {"v": REBUILD_VERSION, "check": check, "case": case, "opts": opts.as_dict()}

    def at_batch(self, batch: dict[str, Any]) -> None:
        if self.sink is not None and self.where:
            self.sink({**self.where, "batch": batch})


TRAIL = _Trail()


@contextlib.contextmanager
def following(sink: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """Call `sink(spec)` wherever a check marks a batch (`_Trail`), inside the block."""
    previous, TRAIL.sink = TRAIL.sink, sink
    try:
        yield
    finally:
        TRAIL.sink, TRAIL.where = previous, {}


class Recorder:
    """Collects records (optionally capped) for one check of one backend."""

    def __init__(self, backend: Any, check: str, opts: OpOptions, max_records: int | None) -> None:
        self.key = backend_key(backend)
        self.check = check
        self.opts = opts.as_dict()
        self.max_records = max_records
        self.records: list[dict[str, Any]] = []
        self.dropped = 0
        self._noted = 0

    def add_rows(
        self,
        *,
        seed: int,
        tensor: str,
        in_batch: Tensor,
        alone: Tensor,
        rows: list[int],
        cases: list[str],
        batch_starts: list[int | None],
        batch_sizes: list[int],
        positions: list[int],
        case_spec: dict[str, Any],
        batches: list[dict[str, Any]],
        other: dict[str, Any] | None = None,
    ) -> None:
        """One record per row of the [k, D] tensors `in_batch` / `alone` (rows already known to differ)."""
        k = len(rows)
        if k == 0:
            return
        room = k if self.max_records is None else max(0, min(k, self.max_records - len(self.records)))
        self.dropped += k - room
        if room == 0:
            return
        cols, max_abs, max_ulp = diff_stats(in_batch[:room], alone[:room])
        for i in range(room):
            spec = {
                "v": REBUILD_VERSION,
                "check": self.check,
                "case": case_spec,
                "opts": self.opts,
                "batch": batches[i],
                "row": rows[i],
                "position": positions[i],
                "tensor": tensor,
            }
            if other is not None:
                spec["other"] = other
            self.records.append(
                {
                    "backend": self.key,
                    "check": self.check,
                    "seed": seed,
                    "case": cases[i],
                    "batch_start": batch_starts[i],
                    "batch_size": batch_sizes[i],
                    "position": positions[i],
                    "row": rows[i],
                    "tensor": tensor,
                    "cols_differ": cols[i],
                    "max_abs": max_abs[i],
                    "max_ulp": max_ulp[i],
                    "rebuild": json.dumps(spec, separators=(",", ":")),
                }
            )

    def note(self, summary: dict[str, Any]) -> None:
        """Say in `summary` how many differing (row, tensor) pairs `max_records` left unrecorded since the last note."""
        new = self.dropped - self._noted
        self._noted = self.dropped
        if new:
            summary["records_dropped"] = summary.get("records_dropped", 0) + new


def compare_rows(
    rec: Recorder,
    seed: int,
    batch: tuple[Tensor, Tensor | None, Tensor | None],
    alone: tuple[Tensor, Tensor | None, Tensor | None],
    rows: Tensor,
    *,
    case_label: Any,
    where: Any,
    batch_spec: Any,
    case_spec: dict[str, Any],
    other: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Compare `batch` tensors gathered at `rows` (case-row indices) with `alone` (aligned to `rows`).

    Records each differing (row, tensor); returns (rows whose y differs, rows whose dx or dz differs).
    `where(row) -> (batch_start, batch_size, position)`.
    """
    masks: dict[str, Tensor] = {}
    for name, b, a in zip(("y", "dx", "dz"), batch, alone, strict=True):
        if b is None or a is None:
            continue
        masks[name] = differ_rows(b.index_select(0, rows), a)
    grad_mask = None
    for name in ("dx", "dz"):
        if name in masks:
            grad_mask = masks[name] if grad_mask is None else grad_mask | masks[name]
    fwd = int(masks["y"].sum())
    grad = 0 if grad_mask is None else int(grad_mask.sum())
    for name, b, a in zip(("y", "dx", "dz"), batch, alone, strict=True):
        if name not in masks or not bool(masks[name].any()):
            continue
        pos_idx = masks[name].nonzero().flatten()
        case_rows = rows.index_select(0, pos_idx).tolist()
        wh = [where(r) for r in case_rows]
        rec.add_rows(
            seed=seed,
            tensor=name,
            in_batch=b.index_select(0, rows.index_select(0, pos_idx)),
            alone=a.index_select(0, pos_idx),
            rows=case_rows,
            cases=[case_label(r) for r in case_rows],
            batch_starts=[w_[0] for w_ in wh],
            batch_sizes=[w_[1] for w_ in wh],
            positions=[w_[2] for w_ in wh],
            case_spec=case_spec,
            batches=[batch_spec(r) for r in case_rows],
            other=other,
        )
    return fwd, grad


# the checks whose verdicts make `batch_invariant`, in the report's order
INVARIANCE_CHECKS = ("all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep")


def batch_invariant(
    all_rows_summary: dict[str, Any] | None,
    dweight_summary: dict[str, Any] | None,
    sub_batches_summary: dict[str, Any] | None,
    sweep_summary: dict[str, Any] | None,
) -> bool | None:
    """False on any difference (or a non-repeatable dweight); None if a check is missing or raised; else True."""
    parts = [all_rows_summary, dweight_summary, sub_batches_summary, sweep_summary]
    counts: list[int] = []
    if all_rows_summary:
        # rowgrad_differ is None where gradients were not compared (a forward-only backend)
        counts += [
            (v.get("fwd_differ") or 0) + (v.get("rowgrad_differ") or 0)
            for v in all_rows_summary.values()
            if isinstance(v, dict)
        ]
    for s in (sub_batches_summary, sweep_summary):
        if s:
            counts += [s.get(k) or 0 for k in ("fwd_differ", "rowgrad_differ", "differ")]
    if any(c > 0 for c in counts) or (dweight_summary or {}).get("dweight_repeatable") is False:
        return False
    if any(p is None or "error" in p for p in parts):
        return None
    return True
