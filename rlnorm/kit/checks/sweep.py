"""Probe rows placed first, in the middle and last in batches of many sizes, against the row alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from rlnorm.inputs import make_case
from rlnorm.kit.backends import describe_error
from rlnorm.kit.records import sweep_batch_rows, sweep_perm_seed
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend
from rlnorm.kit.checks.common import (
    TRAIL,
    CheckResult,
    Recorder,
    backend_key,
    call,
    case_spec,
    check_common,
    check_int,
    check_ints,
    differ_rows,
    has_backward,
)


def default_sweep_sizes(n: int = 4097) -> list[int]:
    """1..9 and 2^k-1, 2^k, 2^k+1 for k = 4..12, those <= n (36 sizes for n = 4097)."""
    sizes = list(range(1, 10)) + [m for k in range(4, 13) for m in (2**k - 1, 2**k, 2**k + 1)]
    return [m for m in sizes if m <= n]


def default_probe_rows(n: int = 4097) -> list[int]:
    """0 and n-1 plus 515, 1027, ..., 3075 (those below n)."""
    return sorted({0, n - 1} | {512 * j + 3 for j in range(1, 7) if 512 * j + 3 < n})


def sweep_positions(m: int) -> list[tuple[str, int]]:
    """The distinct probe positions {0, (m-1)//2, m-1} in a batch of m, named first/mid/last."""
    out: list[tuple[str, int]] = []
    for name, p in (("first", 0), ("mid", (m - 1) // 2), ("last", m - 1)):
        if p not in [q for _, q in out]:
            out.append((name, p))
    return out


def batch_size_sweep(
    backend: Backend,
    opts: OpOptions | None = None,
    device: str = "cpu",
    n: int = 4097,
    seeds: Sequence[int] = (3, 4, 5),
    sizes: Sequence[int] | None = None,
    probe_rows: Sequence[int] | None = None,
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    max_records: int | None = None,
    progress: bool = True,
) -> CheckResult:
    """Each probe row placed at positions {0, (m-1)//2, m-1} among m-1 seeded-random other rows,
    for every size m, compared bitwise (output, dx, dz) with the probe alone.

    Summary: the report's {batch_sizes, probe_rows, comparisons, differ} plus NEW fwd_differ and
    rowgrad_differ (comparisons whose y / whose dx or dz differ; None for a forward-only backend).
    """
    check_int("n", n, 1)
    seeds = check_ints("seeds", seeds)
    sizes = check_ints("sizes", default_sweep_sizes(n) if sizes is None else sizes, 1)
    probes = check_ints("probe_rows", default_probe_rows(n) if probe_rows is None else probe_rows)
    if max(sizes) > n:
        raise ValueError(f"sizes: every size must be <= n={n}, got {max(sizes)}")
    if max(probes) >= n:
        raise ValueError(f"probe_rows: every probe must be < n={n}, got {max(probes)}")
    opts = check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    with_grad = has_backward(backend)
    plan = [(m, p, name, pos) for m in sizes for p in probes for name, pos in sweep_positions(m)]
    summary: dict[str, Any] = {
        "batch_sizes": list(sizes),
        "probe_rows": list(probes),
        "comparisons": len(plan) * len(seeds),
        "differ": 0,
        "fwd_differ": 0,
        "rowgrad_differ": 0 if with_grad else None,
    }
    rec = Recorder(backend, "batch_size_sweep", opts, max_records)
    bar = tqdm(total=len(plan) * len(seeds), desc=f"{backend_key(backend)} batch_size_sweep", disable=not progress)
    try:
        for seed in seeds:
            case = make_case(n, d, seed, dtype, wdt, device)
            cs = case_spec(n, d, seed, dtype, wdt)
            TRAIL.at_case("batch_size_sweep", cs, opts)
            alone = {}
            for p in probes:
                TRAIL.at_batch({"kind": "slice", "start": p, "size": 1})
                got = call(
                    backend,
                    case.x[p : p + 1],
                    None if case.z is None else case.z[p : p + 1],
                    case.w,
                    case.dy[p : p + 1] if with_grad else None,
                    opts,
                    with_grad,
                )
                alone[p] = tuple(None if t is None else t.detach() for t in got)
            perms = {(m, p): sweep_perm_seed(seed, m, p) for m, p, _, _ in plan}
            # every batch's row indices built on the host first and moved once (no copy/sync per call)
            batch_idx = [sweep_batch_rows(n, m, p, pos, perms[(m, p)]) for m, p, _, pos in plan]
            offsets = [0]
            for t in batch_idx:
                offsets.append(offsets[-1] + len(t))
            idx_all = torch.cat(batch_idx).to(case.x.device)
            # the probe's row out of each batch, copied into preallocated buffers (a view would keep
            # every batch's whole output alive)
            d_out = case.x.shape[1]
            in_batch = (
                torch.empty(len(plan), d_out, dtype=case.x.dtype, device=case.x.device),
                torch.empty(len(plan), d_out, dtype=case.x.dtype, device=case.x.device) if with_grad else None,
                torch.empty(len(plan), d_out, dtype=case.x.dtype, device=case.x.device)
                if with_grad and case.z is not None
                else None,
            )
            for i, (m, p, _name, pos) in enumerate(plan):
                TRAIL.at_batch({"kind": "sweep", "m": m, "probe": p, "position": pos, "perm_seed": perms[(m, p)]})
                idx = idx_all[offsets[i] : offsets[i + 1]]
                bx = case.x.index_select(0, idx)
                bz = None if case.z is None else case.z.index_select(0, idx)
                bdy = case.dy.index_select(0, idx) if with_grad else None
                out = call(backend, bx, bz, case.w, bdy, opts, with_grad)
                with torch.no_grad():
                    for buf, t in zip(in_batch, out, strict=True):
                        if buf is not None and t is not None:
                            buf[i].copy_(t.detach()[pos])
                bar.update()
            ref = tuple(
                torch.cat([alone[p][i] for _, p, _, _ in plan]) if alone[probes[0]][i] is not None else None
                for i in range(3)
            )
            # compare comparison-by-comparison: "row" i of these tensors is comparison i of the plan
            masks = {
                name: differ_rows(b, a)
                for name, b, a in zip(("y", "dx", "dz"), in_batch, ref, strict=True)
                if b is not None and a is not None
            }
            any_mask = torch.zeros_like(masks["y"])
            grad_mask = torch.zeros_like(masks["y"])
            for name, mk in masks.items():
                any_mask |= mk
                if name != "y":
                    grad_mask |= mk
            summary["differ"] += int(any_mask.sum())
            summary["fwd_differ"] += int(masks["y"].sum())
            if with_grad:
                summary["rowgrad_differ"] += int(grad_mask.sum())
            for name, b, a in zip(("y", "dx", "dz"), in_batch, ref, strict=True):
                if name not in masks or not bool(masks[name].any()):
                    continue
                ci = masks[name].nonzero().flatten()
                sel = [plan[i] for i in ci.tolist()]
                rec.add_rows(
                    seed=seed,
                    tensor=name,
                    in_batch=b.index_select(0, ci),
                    alone=a.index_select(0, ci),
                    rows=[p for _, p, _, _ in sel],
                    cases=[f"m={m}/pos={nm}/probe={p}" for m, p, nm, _ in sel],
                    batch_starts=[None] * len(sel),
                    batch_sizes=[m for m, _, _, _ in sel],
                    positions=[pos for _, _, _, pos in sel],
                    case_spec=cs,
                    batches=[
                        {"kind": "sweep", "m": m, "probe": p, "position": pos, "perm_seed": perms[(m, p)]}
                        for m, p, _, pos in sel
                    ],
                )
    except Exception as exc:
        summary["error"] = describe_error(exc)
    finally:
        bar.close()
    rec.note(summary)
    return CheckResult(summary, rec.records)
