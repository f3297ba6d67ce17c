"""Every launch configuration a backend's kernels could pick, run against each other (docs/spec.md §5): the row
checks see only what this process's autotuner or row-count heuristic picked. Each value is forced
(`Backend.configurations`), and the full batch under a is compared bitwise with its rows alone and in sub-batches
under b for every ordered pair (a, b), dweight too. A parameter no pair changes a bit of is cleared; one whose
values cannot all be forced here is unexercised, with why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rlnorm.inputs import Case
from rlnorm.kit.backends.pins import Setting
from rlnorm.kit.checks.common import (
    NO_TRAIL,
    Check,
    CheckOutcome,
    Trail,
    bits,
    caught,
    check_int,
    check_ints,
    differ_masks,
)
from rlnorm.kit.checks.rows import sub_batch_plan
from rlnorm.kit.results import ConfigPair, Configurations
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend

# what one setting gave: the full batch's (y, dx, dz), its dweight, and per sub-batch size the rows' (y, dx, dz)
_Run = tuple[tuple[Tensor | None, ...], Tensor | None, dict[int, tuple[Tensor | None, ...]]]


def _run(setting: Setting, c: Check, case: Case, sizes: list[int]) -> _Run:
    assert setting.pin is not None
    rows = case.x.shape[0]
    with setting.pin():
        c.trail.batch({"kind": "slice", "start": 0, "size": rows})
        g = c.backend.forward_backward(case.x, case.z, case.w, case.dy, c.opts) if c.with_grad else None
        full = c.call(case, grad=False) if g is None else (g.y, g.dx, g.dz)
        parts = {size: c.pieces(case, sub_batch_plan(rows, size)) for size in sizes}
    return tuple(None if t is None else t.detach() for t in full), None if g is None else g.dw, parts


def _pair(kernel: str, parameter: str, a: Setting, b: Setting, ra: _Run, rb: _Run) -> ConfigPair:
    """The full batch under a against the rows alone / sub-batches under b; dweight of the full batch a vs b."""
    (full, dw_a, _), (_, dw_b, parts) = ra, rb
    fwd = grad = 0
    for piece in parts.values():
        masks, grad_mask = differ_masks(full, piece)
        fwd, grad = fwd + int(masks["y"].sum()), grad + int(grad_mask.sum())
    both = a is not b and dw_a is not None and dw_b is not None
    dweight = bool(torch.equal(bits(dw_a), bits(dw_b))) if both else None
    return ConfigPair(kernel, parameter, a.value, b.value, fwd, None if full[1] is None else grad, dweight)


def configurations(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    configurations_rows: int,
    configurations_sizes: Sequence[int],
    configurations_seed: int,
    d: int,
    weight_dtype: str | torch.dtype,
    trail: Trail = NO_TRAIL,
    progress: bool = True,
) -> CheckOutcome:
    """Each launch parameter the backend's kernels pick by row count or autotuner, at each of its values: the
    full batch of `configurations_rows` under one value against its rows in sub-batches of each of
    `configurations_sizes` (1: alone) under another, for every ordered pair of values."""
    rows = check_int("configurations_rows", configurations_rows, 1)
    sizes = check_ints("configurations_sizes", configurations_sizes, 1)
    seed = check_int("configurations_seed", configurations_seed)
    if any(s > rows for s in sizes):
        raise ValueError(f"configurations_sizes: expected sizes no larger than configurations_rows={rows}, got {sizes}")
    c = Check("configurations", backend, opts, device, d, weight_dtype, trail, progress)
    summary = Configurations()
    with caught(summary):
        groups: dict[str, list[Setting]] = {}
        for s in backend.configurations(c.opts, device, d):
            groups.setdefault(s.key, []).append(s)
            if s.pin is not None:
                summary.values.setdefault(s.key, []).append(s.value)
            for name, value in s.implies.items():
                implied = summary.values.setdefault(name, [])
                if value not in implied:
                    implied.append(value)
        for key, group in groups.items():
            unrun = [s for s in group if s.pin is None]
            if unrun:
                whys = "; ".join(dict.fromkeys(str(s.why) for s in unrun))
                summary.unexercised[key] = f"{whys} ({len(unrun)} of its {len(group)} values not run)"
        if not groups:
            return c.outcome(summary)
        case = c.case(rows, seed, whole=False)
        for key, group in groups.items():
            pinned = [s for s in group if s.pin is not None]
            if not pinned:
                continue
            runs = [_run(s, c, case, sizes) for s in pinned]
            kernel, parameter = pinned[0].kernel, pinned[0].parameter
            pairs = [_pair(kernel, parameter, a, b, ra, rb) for a, ra in zip(pinned, runs, strict=True)
                     for b, rb in zip(pinned, runs, strict=True)]  # fmt: skip
            summary.pairs += pairs
            clean = all(p.fwd_differ == 0 and not p.rowgrad_differ and p.dweight_equal is not False for p in pairs)
            if clean and key not in summary.unexercised:
                implied = {n for s in group for n in s.implies}
                summary.cleared += [key, *sorted(implied - set(summary.cleared))]
    return c.outcome(summary)
