"""Whether the same batch gives bitwise the same dweight when run again."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlnorm.kit.checks.common import NO_TRAIL, Check, CheckOutcome, Dweight, Trail, caught, check_int, differ_rows
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
    c = Check("dweight_repeatable", backend, opts, device, d, weight_dtype, trail, progress, max_records)
    summary = Dweight()
    if not c.with_grad:
        return c.outcome(summary)
    with caught(summary), c.bar(repeats) as bar:
        case = c.case(rows, seed)
        dws = []
        for _ in range(repeats):
            dw = c.backend.forward_backward(case.x, case.z, case.w, case.dy, c.opts).dw
            if dw is None:
                return c.outcome(summary)
            dws.append(dw.detach().clone().reshape(1, -1))
            bar.update()
        whole = {"kind": "slice", "start": 0, "size": rows}
        differ = [i for i in range(1, repeats) if bool(differ_rows(dws[i], dws[0]).any())]
        for i in differ:  # no row or position: the rebuild is the whole batch against itself
            c.add_rows("dweight", dws[i], dws[0], [(None, f"repeat={i}", 0, rows, None, whole)])
        summary.dweight_repeatable = not differ
    summary.records_dropped = c.dropped_since()
    return c.outcome(summary)
