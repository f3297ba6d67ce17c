"""Probe rows placed first, in the middle and last in batches of many sizes, against the row alone."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from rlnorm.kit.checks.common import NO_TRAIL, Check, CheckOutcome, Place, Trail, caught, check_int, check_ints
from rlnorm.kit.records import sweep_batch_rows, sweep_perm_seed
from rlnorm.kit.results import Sweep
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend


def sweep_positions(m: int) -> list[tuple[str, int]]:
    """The distinct probe positions {0, (m-1)//2, m-1} in a batch of m, named first/mid/last."""
    named = {p: name for name, p in reversed((("first", 0), ("mid", (m - 1) // 2), ("last", m - 1)))}
    return sorted(((name, p) for p, name in named.items()), key=lambda np: np[1])


def batch_size_sweep(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    sweep_n: int,
    sweep_sizes: Sequence[int],
    sweep_probe_rows: Sequence[int],
    sweep_seeds: Sequence[int],
    d: int,
    weight_dtype: str | torch.dtype,
    max_records: int | None = None,
    trail: Trail = NO_TRAIL,
    progress: bool = True,
) -> CheckOutcome:
    """Each probe row at positions {0, (m-1)//2, m-1} among m-1 seeded-random other rows of `sweep_n`, for every
    size m, compared bitwise (output, dx, dz) with the probe alone; rowgrad_differ None for a forward-only backend."""
    n = check_int("sweep_n", sweep_n, 1)
    seeds = check_ints("sweep_seeds", sweep_seeds)
    sizes = check_ints("sweep_sizes", sweep_sizes, 1)
    probes = check_ints("sweep_probe_rows", sweep_probe_rows)
    if max(sizes) > n:
        raise ValueError(f"sweep_sizes: every size must be <= sweep_n={n}, got {max(sizes)}")
    if max(probes) >= n:
        raise ValueError(f"sweep_probe_rows: every probe must be < sweep_n={n}, got {max(probes)}")
    c = Check("batch_size_sweep", backend, opts, device, d, weight_dtype, trail, progress, max_records)
    plan = [(m, p, name, pos) for m in sizes for p in probes for name, pos in sweep_positions(m)]
    summary = Sweep(list(sizes), list(probes), len(plan) * len(seeds), 0, 0, 0 if c.with_grad else None)
    with caught(summary), c.bar(len(plan) * len(seeds)) as bar:
        for seed in seeds:
            case = c.case(n, seed, whole=False)
            alone = c.pieces(case, [(p, 1) for p in probes])
            perms = {(m, p): sweep_perm_seed(seed, m, p) for m, p, _, _ in plan}
            places: list[Place] = [
                (p, f"m={m}/pos={nm}/probe={p}", None, m, pos,
                 {"kind": "sweep", "m": m, "probe": p, "position": pos, "perm_seed": perms[(m, p)]})
                for m, p, nm, pos in plan
            ]  # fmt: skip
            # every batch's row indices built on the host first and moved once (no copy/sync per call)
            batch_idx = [sweep_batch_rows(n, m, p, pos, perms[(m, p)]) for m, p, _, pos in plan]
            offsets = [0, *itertools.accumulate(len(t) for t in batch_idx)]
            idx_all = torch.cat(batch_idx).to(case.x.device)
            # the probe's row out of each batch, copied into preallocated buffers (a view would keep every batch's
            # whole output alive)
            y = torch.empty(len(plan), d, dtype=case.x.dtype, device=case.x.device)
            in_batch = (y, torch.empty_like(y), torch.empty_like(y)) if c.with_grad else (y, None, None)
            for i, (_m, _p, _name, pos) in enumerate(plan):
                trail.batch(places[i][5])
                idx = idx_all[offsets[i] : offsets[i + 1]]
                out = c.call(case.rows(idx))
                with torch.no_grad():
                    for buf, t in zip(in_batch, out, strict=True):
                        if buf is not None and t is not None:
                            buf[i].copy_(t.detach()[pos])
                bar.update()
            # each comparison's probe alone (a probe named twice: its last run, as each is run in turn)
            last = {p: i for i, p in enumerate(probes)}
            pick = torch.tensor([last[p] for _, p, _, _ in plan], device=case.x.device)
            ref = tuple(None if t is None else t.index_select(0, pick) for t in alone)
            # "row" i of these tensors is comparison i of the plan
            summary.differ += c.record_differing(in_batch, ref, places.__getitem__, summary)
    summary.records_dropped = c.dropped_since()
    return c.outcome(summary)
