"""Rebuilding a recorded comparison from its record alone: its `rebuild` JSON holds the case, dtypes, options and
the slice or the sweep's seeded permutation, so a notebook reaches one failing row in one backend call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from rlnorm.inputs import Case, dtype_from_name, make_case
from rlnorm.kit.results import REBUILD_VERSION
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend


# the batch_size_sweep permutation, shared by the check and the rebuild
def sweep_perm_seed(seed: int, m: int, probe: int) -> int:
    """Seed of the permutation that draws the m-1 companions of `probe` (one per seed, size, probe)."""
    return (int(seed) * 1_000_003 + int(m)) * 1_000_033 + int(probe)


def sweep_batch_rows(n: int, m: int, probe: int, position: int, perm_seed: int) -> torch.Tensor:
    """Case-row indices of the sweep batch: m-1 other rows drawn by a seeded permutation, probe at `position`."""
    if not 1 <= m <= n:
        raise ValueError(f"m: expected 1 <= m <= n={n}, got {m}")
    if not 0 <= probe < n:
        raise ValueError(f"probe: expected 0 <= probe < n={n}, got {probe}")
    if not 0 <= position < m:
        raise ValueError(f"position: expected 0 <= position < m={m}, got {position}")
    others = torch.cat([torch.arange(0, probe), torch.arange(probe + 1, n)])
    g = torch.Generator().manual_seed(perm_seed)
    chosen = others[torch.randperm(n - 1, generator=g)[: m - 1]]
    return torch.cat([chosen[:position], torch.tensor([probe]), chosen[position:]])


@dataclass
class RebuiltCase:
    """The two sides of a recorded comparison, regenerated: `batch.x[position]` is the recorded row in its batch,
    `other.x[other_position]` what it was compared with (the row alone, the full batch, or for dweight records the
    same batch again, where `position`, `other_position` and `row` are -1); `alone` is the row as a batch of one."""

    batch: Case
    position: int
    alone: Case
    row: int
    other: Case
    other_position: int
    other_label: str  # "alone", "full batch" or "same batch"
    batch_rows: torch.Tensor  # indices into the generated case, in batch order
    opts: OpOptions
    check: str
    spec: dict[str, Any]

    def run(self, backend: Backend, tensor: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Recompute `tensor` with `backend` as the check called it, on CPU: the row inside `batch` and inside `other`
        (dweight: the first and second run of the same batch)."""
        sides, name = (self.batch, self.other), ("dw" if tensor == "dweight" else tensor)
        if backend.has_backward or tensor != "y":
            got = [getattr(backend.forward_backward(c.x, c.z, c.w, c.dy, self.opts), name) for c in sides]
        else:
            got = [backend.forward(c.x, c.z, c.w, self.opts) for c in sides]
        if got[0] is None or got[1] is None:
            raise ValueError(f"backend: gave no {tensor}, so a {tensor} record cannot be recomputed with it")
        if tensor == "dweight":
            return got[0].detach().cpu(), got[1].detach().cpu()
        return got[0][self.position].detach().cpu(), got[1][self.other_position].detach().cpu()


def _spec_of(record: Mapping[str, Any] | pd.Series | str) -> dict[str, Any]:
    """The rebuild spec of a record, of its `rebuild` JSON, or a spec itself (a crashed backend's trail)."""
    if isinstance(record, (Mapping, pd.Series)) and "rebuild" not in record:
        if not ("case" in record and "batch" in record):
            raise ValueError("record: has no 'rebuild' field")
        return dict(record)
    if not isinstance(record, (Mapping, pd.Series, str)):
        raise TypeError(f"record: expected a record or its rebuild JSON string, got {type(record).__name__}")
    text = record if isinstance(record, str) else record["rebuild"]
    try:
        spec = json.loads(str(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"record: 'rebuild' is not JSON ({exc})") from exc
    if not isinstance(spec, dict) or spec.get("v") != REBUILD_VERSION:
        raise ValueError(f"record: 'rebuild' is not a version-{REBUILD_VERSION} rebuild spec: {text!r:.200}")
    return spec


def rebuild_case(record: Mapping[str, Any] | pd.Series | str, device: str | torch.device = "cpu") -> RebuiltCase:
    """The exact batch compared and the row alone, from the record's `rebuild` JSON (or a rebuild spec itself)."""
    spec = _spec_of(record)
    try:
        c, batch_spec, opts, check = spec["case"], spec["batch"], OpOptions(**spec["opts"]), spec["check"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"record: rebuild spec lacks a field ({exc}): {spec}") from exc
    dtypes = dtype_from_name(c["dtype"]), dtype_from_name(c["weight_dtype"])
    case = make_case(int(c["rows"]), int(c["d"]), int(c["seed"]), *dtypes, device="cpu")
    rows = _batch_rows(case, batch_spec)
    row, position = int(spec.get("row", -1)), int(spec.get("position", -1))
    batch = case.rows(rows).to(device)
    if row >= 0 and not (0 <= position < len(rows) and int(rows[position]) == row):
        raise ValueError(f"record: position {position} of the rebuilt batch does not hold row {row}")
    alone = case.rows(slice(row, row + 1)).to(device) if row >= 0 else batch
    other_spec = spec.get("other")
    if other_spec is None:  # the row alone, or (dweight) the same batch again
        other, other_position, label = (alone, 0, "alone") if row >= 0 else (batch, -1, "same batch")
    else:
        other_rows = _batch_rows(case, other_spec)
        hits = (other_rows == row).nonzero().flatten()
        if row < 0 or len(hits) != 1:
            raise ValueError(f"record: the compared batch {other_spec} does not hold row {row} exactly once")
        other, other_position = case.rows(other_rows).to(device), int(hits[0])
        label = str(other_spec.get("label", "full batch"))
    return RebuiltCase(batch, position, alone, row, other, other_position, label, rows, opts, check, spec)


def _batch_rows(case: Case, batch_spec: Mapping[str, Any]) -> torch.Tensor:
    """Case-row indices of a batch described by a rebuild spec's "batch" / "other" entry."""
    n_case = case.x.shape[0]
    kind = batch_spec.get("kind")
    if kind == "slice":
        start, size = int(batch_spec["start"]), int(batch_spec["size"])
        if not (start >= 0 and size >= 1 and start + size <= n_case):
            raise ValueError(f"record: slice {start}+{size} outside a case of {n_case} rows")
        return torch.arange(start, start + size)
    if kind == "sweep":
        return sweep_batch_rows(n_case, *(int(batch_spec[k]) for k in ("m", "probe", "position", "perm_seed")))
    raise ValueError(f"record: unknown batch kind {kind!r} (expected 'slice' or 'sweep')")
