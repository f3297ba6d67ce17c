"""Each row inside a batch against the same row computed in another batch: alone (all_rows) or in
the full batch against contiguous sub-batches (full_vs_sub_batches).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import make_case
from rlnorm.kit.checks.alone import AloneRunner
from rlnorm.kit.checks.common import (
    NO_TRAIL,
    X_DTYPE,
    CheckOutcome,
    Recorder,
    Trail,
    backend_key,
    call,
    call_rows,
    case_spec,
    check_common,
    check_int,
    check_ints,
    compare_rows,
    has_backward,
)
from rlnorm.kit.results import AllRows, RowsAtSize, SubBatches
from rlnorm.options import OpOptions
from rlnorm.timing import describe_error

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend

COVERAGES = ("all", "sampled")


def all_rows(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    all_rows_sizes: Sequence[int],
    all_rows_seeds: Sequence[int],
    d: int,
    weight_dtype: str | torch.dtype,
    max_records: int | None = None,
    trail: Trail = NO_TRAIL,
    progress: bool = True,
    use_graphs: bool = True,
    graph_rows: int = 4096,
) -> CheckOutcome:
    """Every row computed alone vs inside its batch of n, bitwise (output; dx and dz with a backward); per n:
    rows, fwd_differ, rowgrad_differ (None for a forward-only backend), alone_path."""
    sizes = check_ints("all_rows_sizes", all_rows_sizes, 1)
    seeds = check_ints("all_rows_seeds", all_rows_seeds)
    opts, wdt = check_common(backend, opts, device, d, weight_dtype)
    with_grad = has_backward(backend)
    key = backend_key(backend)
    rec = Recorder(backend, "all_rows", opts, max_records)
    runner = AloneRunner(backend, opts, with_grad, use_graphs, graph_rows, progress, f"{key} all_rows", trail)
    summary = AllRows()
    bar = tqdm(total=len(sizes) * len(seeds), desc=f"{key} all_rows", disable=not progress)
    try:
        for n in sizes:
            entry = summary.sizes[n] = RowsAtSize(0, 0, 0 if with_grad else None, "eager")
            for seed in seeds:
                case = make_case(n, d, seed, X_DTYPE, wdt, device)
                spec = case_spec(n, d, seed, wdt)
                trail.case("all_rows", spec, opts)
                trail.batch({"kind": "slice", "start": 0, "size": n})
                batch = call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
                alone = runner.run(case, torch.arange(n), 1)
                entry.alone_path = runner.paths.get(1, "eager")
                rows = torch.arange(n, device=case.x.device)
                fwd, grad = compare_rows(
                    rec, seed, batch, alone, rows, case_label=lambda r, n=n: f"n={n}", where=lambda r, n=n: (0, n, r),
                    case_spec=spec,
                )  # fmt: skip
                entry.rows += n
                entry.fwd_differ += fwd
                if with_grad:
                    entry.rowgrad_differ += grad
                bar.update()
            entry.records_dropped = rec.dropped_since(None)
    except Exception as exc:
        summary.error = describe_error(exc)
    finally:
        bar.close()
    return CheckOutcome(summary, rec.records, summary.error)


def sub_batch_plan(full_rows: int, size: int, coverage: str = "all", sample_stride: int = 512) -> list[tuple[int, int]]:
    """(start, size) of each contiguous sub-batch of `size` compared with the full batch: "all" tiles the batch
    (the last one partial); "sampled" (the seed report) starts sizes below `sample_stride` every that many rows."""
    check_int("full_rows", full_rows, 1)
    check_int("size", size, 1)
    check_int("sample_stride", sample_stride, 1)
    if coverage not in COVERAGES:
        raise ValueError(f"coverage: expected one of {COVERAGES}, got {coverage!r}")
    step = sample_stride if coverage == "sampled" and size < sample_stride else size
    return [(s, min(size, full_rows - s)) for s in range(0, full_rows, step)]


def full_vs_sub_batches(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    sub_batches_rows: int,
    sub_batch_sizes: Sequence[int],
    sub_batches_seeds: Sequence[int],
    coverage: str,
    d: int,
    weight_dtype: str | torch.dtype,
    max_records: int | None = None,
    trail: Trail = NO_TRAIL,
    progress: bool = True,
    sample_stride: int = 512,
    use_graphs: bool = True,
    graph_rows: int = 4096,
) -> CheckOutcome:
    """Contiguous sub-batches vs the full batch, bitwise; fwd_differ and rowgrad_differ count row comparisons
    over seeds and sizes (rowgrad_differ None for a forward-only backend)."""
    full_rows = check_int("sub_batches_rows", sub_batches_rows, 1)
    sizes = check_ints("sub_batch_sizes", sub_batch_sizes, 1)
    seeds = check_ints("sub_batches_seeds", sub_batches_seeds)
    plans = {size: sub_batch_plan(full_rows, size, coverage, sample_stride) for size in sizes}
    opts, wdt = check_common(backend, opts, device, d, weight_dtype)
    with_grad = has_backward(backend)
    key = backend_key(backend)
    summary = SubBatches(
        full_batch=full_rows,
        sub_batch_sizes=list(sizes),
        sub_batches=sum(len(p) for p in plans.values()) * len(seeds),
        fwd_differ=0,
        rowgrad_differ=0 if with_grad else None,
        coverage=coverage,
        rows_compared=0,
        alone_path={},
    )
    rec = Recorder(backend, "full_vs_sub_batches", opts, max_records)
    runner = AloneRunner(backend, opts, with_grad, use_graphs, graph_rows, progress, f"{key} sub-batches", trail)
    bar = tqdm(total=len(seeds) * len(sizes), desc=f"{key} full_vs_sub_batches", disable=not progress)
    try:
        for seed in seeds:
            case = make_case(full_rows, d, seed, X_DTYPE, wdt, device)
            spec = case_spec(full_rows, d, seed, wdt)
            trail.case("full_vs_sub_batches", spec, opts)
            trail.batch({"kind": "slice", "start": 0, "size": full_rows})
            full = call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
            for size in sizes:
                plan = plans[size]
                whole = [s for s, m in plan if m == size]
                pieces: list[tuple[Tensor, tuple[Tensor | None, ...]]] = []
                if whole:
                    starts = torch.tensor(whole, dtype=torch.int64)
                    out = runner.run(case, starts, size)
                    summary.alone_path[str(size)] = runner.paths.get(size, "eager")
                    pieces.append(((starts.view(-1, 1) + torch.arange(size)).reshape(-1), out))
                for s, m in plan:  # a partial tile: one more call of its own size
                    if m != size:
                        trail.batch({"kind": "slice", "start": s, "size": m})
                        pieces.append((torch.arange(s, s + m), call_rows(backend, case, s, m, opts, with_grad)))
                # tiles never overlap, so a row's tile is the last one starting at or before it
                tile_starts = [s for s, _ in plan]

                def where(r: int, ts: list[int] = tile_starts, plan: list = plan) -> tuple[int, int, int]:
                    start, m = plan[bisect.bisect_right(ts, r) - 1]
                    return start, m, r - start

                for rows_idx, out in pieces:
                    fwd, grad = compare_rows(
                        rec, seed, full, out, rows_idx.to(case.x.device),
                        case_label=lambda r, w=where: "sub={1}@{0}".format(*w(r)), where=where, case_spec=spec,
                        other={"kind": "slice", "start": 0, "size": full_rows, "label": "full batch"},
                    )  # fmt: skip
                    summary.fwd_differ += fwd
                    if with_grad:
                        summary.rowgrad_differ += grad
                    summary.rows_compared += len(rows_idx)
                bar.update()
    except Exception as exc:
        summary.error = describe_error(exc)
    finally:
        bar.close()
    summary.records_dropped = rec.dropped_since(None)
    return CheckOutcome(summary, rec.records, summary.error)
