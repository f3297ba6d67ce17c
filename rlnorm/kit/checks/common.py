"""What every check shares: the breadcrumb, argument checks, bitwise row comparison, the record writer."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import Case, dtype_name, make_case
from rlnorm.kit import results as res
from rlnorm.kit.results import REBUILD_VERSION, BackendResult, BatchInvariance, Record
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions
from rlnorm.timing import describe_error

X_DTYPE = torch.bfloat16  # the op's activations (docs/spec.md §1); the weight's dtype is a parameter

# where a differing row was: (row, case label, batch_start, batch_size, position in the batch, the batch's spec)
Place = tuple[int | None, str, int | None, int, int | None, dict[str, Any]]


@dataclass
class Dweight:
    """dweight_repeatable's summary (the artifact keeps only the bool)."""

    dweight_repeatable: bool | None = None  # None: no backward, or no dweight
    error: str | None = None
    records_dropped: int | None = None


@dataclass
class CheckOutcome:
    """What a check returns: its summary, the records of differing (row, tensor), and why it raised (if it did:
    the check caught it, and the summary holds what it got before)."""

    summary: res.AllRows | res.SubBatches | res.Sweep | res.Accuracy | Dweight | res.Configurations | res.Launches
    records: list[Record]
    error: str | None = None


# the breadcrumb: a check hands it the rebuild spec (`records.rebuild_case`) of each batch before the backend sees
# it, so a crashed backend's last one is the batch it died on; a row-alone pass marks each chunk of calls by its first
Trail = Callable[[dict[str, Any]], None]


@contextlib.contextmanager
def caught(summary: Any) -> Iterator[None]:
    """A check's body: what it raises becomes `summary.error`, and what it got before stands."""
    try:
        yield
    except Exception as exc:
        summary.error = describe_error(exc)


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


class Check:
    """One check of one backend: the arguments every check takes, checked, and what checks share (its cases, the
    backend's calls, its records, optionally capped, of each differing (row, tensor))."""

    def __init__(
        self,
        name: str,
        backend: Any,
        opts: Any,
        device: Any,
        d: int,
        weight_dtype: Any,
        trail: Trail | None = None,
        progress: bool = False,
        max_records: int | None = None,
    ) -> None:
        for attr in ("forward", "forward_backward"):
            if not callable(getattr(backend, attr, None)):
                raise TypeError(f"backend: expected a rlnorm Backend (with .{attr}), got {type(backend).__name__}")
        opts = OpOptions() if opts is None else opts
        if not isinstance(opts, OpOptions):
            raise TypeError(f"opts: expected rlnorm.options.OpOptions, got {type(opts).__name__}")
        try:
            torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device: expected a torch device string, got {device!r}") from exc
        opts.check_width(check_int("d", d, 1))
        wdt = getattr(torch, weight_dtype, None) if isinstance(weight_dtype, str) else weight_dtype
        if not isinstance(wdt, torch.dtype) or not wdt.is_floating_point:
            raise ValueError(f"weight_dtype: expected a float dtype name such as 'bfloat16', got {weight_dtype!r}")
        self.name, self.backend, self.opts, self.device, self.d, self.wdt = name, backend, opts, device, d, wdt
        self.trail, self.progress, self.max_records = trail, progress, max_records
        self.key = str(getattr(backend, "key", "") or type(backend).__name__)
        self.with_grad = bool(getattr(backend, "has_backward", False))
        self.records: list[Record] = []
        self.dropped = 0  # the differing (row, tensor) pairs `max_records` left unrecorded
        self.where: dict[str, Any] = {}

    def case(self, rows: int, seed: int, whole: bool = True) -> Case:
        """The check's next seeded case (the one its records are of), named on the trail (`whole`: the full batch
        marked as given next)."""
        wdt = dtype_name(self.wdt)
        spec = {"rows": rows, "d": self.d, "seed": seed, "dtype": dtype_name(X_DTYPE), "weight_dtype": wdt}
        self.where = {"v": REBUILD_VERSION, "check": self.name, "case": spec, "opts": self.opts.as_dict()}
        if whole:
            self.mark({"kind": "slice", "start": 0, "size": rows})
        return make_case(rows, self.d, seed, X_DTYPE, self.wdt, self.device)

    def mark(self, batch: dict[str, Any]) -> None:
        """Name the batch on the trail, before the backend sees it, as a rebuild spec of this case."""
        if self.trail is not None:
            self.trail({**self.where, "batch": batch})

    def bar(self, total: int) -> tqdm:
        return tqdm(total=total, desc=f"{self.key} {self.name}", disable=not self.progress)

    def call(self, case: Case, grad: bool | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One launch of the backend on the case: (y, dx, dz), with a backward where it has one (or `grad` says)."""
        if self.with_grad if grad is None else grad:
            g = self.backend.forward_backward(case.x, case.z, case.w, case.dy, self.opts)
            return g.y, g.dx, g.dz
        return self.backend.forward(case.x, case.z, case.w, self.opts), None, None

    def pieces(self, case: Case, plan: Sequence[tuple[int, int]]) -> tuple[Tensor | None, ...]:
        """Rows s..s+m of the case for each (s, m) of `plan`, each a batch of its own marked on the trail before the
        backend sees it: (y, dx, dz) detached, in plan order."""
        got = []
        for s, m in plan:
            self.mark({"kind": "slice", "start": s, "size": m})
            got.append(self.call(case.rows(slice(s, s + m))))
        return tuple(None if got[0][i] is None else torch.cat([g[i].detach() for g in got]) for i in range(3))

    def outcome(self, summary: Any) -> CheckOutcome:
        return CheckOutcome(summary, self.records, summary.error)

    def add_rows(self, tensor: str, in_batch: Tensor, alone: Tensor, places: list[Place], other: Any = None) -> None:
        """One record per row of the [k, D] tensors `in_batch` / `alone` (rows already known to differ), placed by
        `places[i]`; `other` is the rebuild spec of what the row was compared with, where that is not the row alone.
        A place without a row (dweight) rebuilds as row and position -1: the whole batch against itself."""
        cap = len(places) if self.max_records is None else self.max_records - len(self.records)
        room = max(0, min(len(places), cap))
        self.dropped += len(places) - room
        if room == 0:
            return
        cols, max_abs, max_ulp = diff_stats(in_batch[:room], alone[:room])
        seed = self.where["case"]["seed"]
        for i, (row, case, start, size, position, batch) in enumerate(places[:room]):
            spec = {**self.where, "batch": batch, "row": -1 if row is None else row}
            spec.update(position=-1 if position is None else position, tensor=tensor)
            rebuild = json.dumps(spec | ({} if other is None else {"other": other}), separators=(",", ":"))
            self.records.append(
                Record(self.key, self.name, seed, case, start, size, position, row, tensor, cols[i], max_abs[i],
                       max_ulp[i], rebuild)
            )  # fmt: skip

    def record_differing(
        self,
        batch: Sequence[Tensor | None],
        alone: Sequence[Tensor | None],
        place: Callable[[int], Place],
        into: Any,
        other: Any = None,
    ) -> int:
        """Row i of `batch` against row i of `alone`, bitwise: each differing (row, tensor) recorded where `place(i)`
        says; the rows whose y differs added to `into.fwd_differ`, those whose dx or dz differs to
        `into.rowgrad_differ` (None: no gradient compared). Gives the rows where anything differs."""
        masks, grad = differ_masks(batch, alone)
        for name, b, a in zip(("y", "dx", "dz"), batch, alone, strict=True):
            if name in masks and bool(masks[name].any()):
                idx = masks[name].nonzero().flatten()
                places = [place(i) for i in idx.tolist()]
                self.add_rows(name, b.index_select(0, idx), a.index_select(0, idx), places, other)
        into.fwd_differ += int(masks["y"].sum())
        if into.rowgrad_differ is not None:
            into.rowgrad_differ += int(grad.sum())
        return int((masks["y"] | grad).sum())


def bits(t: Tensor) -> Tensor:
    """Integer view for bitwise comparison (NaN payloads and signed zeros count as different)."""
    t = t.detach().contiguous()
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def differ_rows(a: Tensor, b: Tensor) -> Tensor:
    """bool[rows]: the row is not bitwise equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {tuple(a.shape)} {a.dtype} with {tuple(b.shape)} {b.dtype}")
    return (bits(a) != bits(b)).reshape(a.shape[0], -1).any(dim=1)


def diff_stats(a: Tensor, b: Tensor) -> tuple[list[int], list[float], list[int | None]]:
    """Per row of [k, D] tensors: columns differing, max |a - b|, max ulp distance."""
    cols = (bits(a) != bits(b)).reshape(a.shape[0], -1).sum(dim=1)
    diff = (a.double() - b.double()).abs().reshape(a.shape[0], -1)
    max_abs = torch.where(diff.isnan().any(dim=1), math.nan, diff.nan_to_num(nan=0.0).amax(dim=1))
    if a.dtype in (torch.bfloat16, torch.float16, torch.float32):
        max_ulp = ulp_distance(a.detach(), b.detach()).reshape(a.shape[0], -1).amax(dim=1).tolist()
    else:
        max_ulp = [None] * a.shape[0]
    return cols.tolist(), max_abs.tolist(), max_ulp


def differ_masks(batch: Sequence[Tensor | None], alone: Sequence[Tensor | None]) -> tuple[dict[str, Tensor], Tensor]:
    """bool[rows] per tensor ("y", "dx", "dz") both sides have: the row is not bitwise equal; and the rows whose dx
    or dz differs."""
    pairs = zip(("y", "dx", "dz"), batch, alone, strict=True)
    masks = {name: differ_rows(b, a) for name, b, a in pairs if b is not None and a is not None}
    none = torch.zeros_like(masks["y"])
    return masks, masks.get("dx", none) | masks.get("dz", none)


# the checks whose verdicts make `batch_invariant`, in the report's order
INVARIANCE_CHECKS = ("all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep")
# the three verdicts (docs/spec.md §5): rows differ; no row differs but a launch parameter that changes with the
# row count was not run at each of its values; neither
INVARIANT, NOT_INVARIANT, BY_CONSTRUCTION = "invariant", "not_invariant", "not_invariant_by_construction"


def batch_invariant(inv: BatchInvariance, errors: Mapping[str, str] | None = None) -> bool | None:
    """False on any difference (or a non-repeatable dweight); None if a row check is missing or raised (its
    summary's error, or `errors[check]`); else True. A dweight_repeatable of None (no backward) is no verdict."""
    parts = (inv.all_rows, inv.full_vs_sub_batches, inv.batch_size_sweep)
    # per size of all_rows, then the other two; a None count (no gradient compared) is no difference
    counted = [*(inv.all_rows.sizes.values() if inv.all_rows else ()), *(p for p in parts[1:] if p is not None)]
    differs = any(s.fwd_differ or s.rowgrad_differ or getattr(s, "differ", 0) for s in counted)
    if differs or inv.dweight_repeatable is False:
        return False
    if any(p is None or p.error for p in parts) or any(c in (errors or {}) for c in INVARIANCE_CHECKS):
        return None
    return True


def differing_pairs(result: BackendResult) -> list[str]:
    """The configuration pairs (the `configurations` check) under which rows or dweight differ, in words."""
    c = result.configurations
    return [f"{p.kernel}.{p.parameter}: {p.full} (full batch) vs {p.alone} (alone)" for p in (c.pairs if c else [])
            if p.fwd_differ or p.rowgrad_differ or p.dweight_equal is False]  # fmt: skip


def uncleared(result: BackendResult) -> dict[str, str]:
    """ "kernel.param" -> the evidence, for each launch parameter that changes with the row count (`launch`), or
    that the backend says its kernels may pick but the `configurations` check could not run at each value here (an
    autotuner the interpreter cannot time), and that was not run at each of its values without a bit changing."""
    c = result.configurations
    cleared = set(c.cleared) if c else set()
    kernels = result.launches.kernels if result.launches else []
    out = {f"{k.kernel}.{p}": k.evidence or "" for k in kernels for p in k.varying if f"{k.kernel}.{p}" not in cleared}
    unrun = c.unexercised.items() if c else ()
    return out | {key: f"not run at each value here: {why}" for key, why in unrun if key not in cleared}


def verdict(result: BackendResult, errors: Mapping[str, str] | None = None) -> str | None:
    """INVARIANT, NOT_INVARIANT, BY_CONSTRUCTION, or None (a check that decides it is missing or raised)."""
    inv = result.batch_invariance
    rows = None if inv is None else batch_invariant(inv, errors)
    if rows is False or differing_pairs(result):
        return NOT_INVARIANT
    launches = result.launches
    if rows is None or launches is None or launches.error or "launch" in (errors or {}):
        return None
    return BY_CONSTRUCTION if uncleared(result) else INVARIANT
