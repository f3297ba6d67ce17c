"""Whether the same batch gives bitwise the same dweight when run again."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from rlnorm.kit.checks.common import (
    NO_TRAIL,
    CheckOutcome,
    Dweight,
    Recorder,
    Trail,
    backend_key,
    caught,
    check_common,
    check_int,
    differ_rows,
    has_backward,
    new_case,
)
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend


def dweight_repeatable(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    dweight_rows: int,
    dweight_seed: int,
    d: int,
    weight_dtype: str | torch.dtype,
    max_records: int | None = None,
    trail: Trail = NO_TRAIL,
    progress: bool = True,
    repeats: int = 2,
) -> CheckOutcome:
    """The same full batch `repeats` times gives bitwise the same dweight (None without a backward); a differing
    repeat is one `dweight` record (no row or position; its rebuild: the batch against itself)."""
    rows = check_int("dweight_rows", dweight_rows, 1)
    seed = check_int("dweight_seed", dweight_seed)
    check_int("repeats", repeats, 2)
    opts, wdt = check_common(backend, opts, device, d, weight_dtype)
    summary = Dweight(None, rows, seed, repeats)
    rec = Recorder(backend, "dweight_repeatable", opts, max_records)
    if not has_backward(backend):
        summary.reason = "no backward"
        return CheckOutcome(summary, [])
    with caught(summary):
        case, spec = new_case(trail, "dweight_repeatable", rows, d, seed, wdt, device, opts, whole=True)
        dws = []
        for _ in tqdm(range(repeats), desc=f"{backend_key(backend)} dweight_repeatable", disable=not progress):
            g = backend.forward_backward(case.x, case.z, case.w, case.dy, opts)
            if g.dw is None:
                summary.reason = "backend gave no dweight"
                return CheckOutcome(summary, [])
            dws.append(g.dw.detach().clone().reshape(1, -1))
        differ = [i for i in range(1, repeats) if bool(differ_rows(dws[i], dws[0]).any())]
        for i in differ:
            whole = {"kind": "slice", "start": 0, "size": rows}
            rec.add_rows(seed, "dweight", dws[i], dws[0], spec, [(None, f"repeat={i}", 0, rows, None, whole)])
        for r in rec.records:  # rebuild: the whole batch against itself
            r.rebuild = json.dumps({**json.loads(r.rebuild), "row": -1, "position": -1}, separators=(",", ":"))
        summary.dweight_repeatable = not differ
    summary.records_dropped = rec.dropped_since()
    return CheckOutcome(summary, rec.records, summary.error)
