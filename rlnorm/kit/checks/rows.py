"""Each row inside a batch against the same row computed in another batch: alone (all_rows) or in
the full batch against contiguous sub-batches (full_vs_sub_batches).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import make_case
from rlnorm.kit.backends import describe_error
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend
from rlnorm.kit.checks.alone import AloneRunner
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
    compare_rows,
    has_backward,
)

COVERAGES = ("all", "sampled")


def all_rows(
    backend: Backend,
    opts: OpOptions | None = None,
    device: str = "cpu",
    ns: Sequence[int] | None = None,
    seeds: Sequence[int] = (3, 4, 5),
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    use_graphs: bool = True,
    graph_rows: int = 4096,
    max_records: int | None = None,
    progress: bool = True,
) -> CheckResult:
    """Every row computed alone vs inside its batch of n, bitwise (output; dx and dz with a backward).

    Summary: {str(n): {rows, fwd_differ, rowgrad_differ, alone_path}} with rows = n * len(seeds);
    rowgrad_differ is None for a forward-only backend (no gradients compared)..
    """
    ns = check_ints("ns", (64, 257, 4097) if ns is None else ns, 1)
    seeds = check_ints("seeds", seeds)
    opts = check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    with_grad = has_backward(backend)
    rec = Recorder(backend, "all_rows", opts, max_records)
    runner = AloneRunner(backend, opts, with_grad, use_graphs, graph_rows, progress, f"{backend_key(backend)} all_rows")
    summary: dict[str, Any] = {}
    bar = tqdm(total=len(ns) * len(seeds), desc=f"{backend_key(backend)} all_rows", disable=not progress)
    try:
        for n in ns:
            entry = {"rows": 0, "fwd_differ": 0, "rowgrad_differ": 0 if with_grad else None, "alone_path": "eager"}
            summary[str(n)] = entry
            for seed in seeds:
                case = make_case(n, d, seed, dtype, wdt, device)
                TRAIL.at_case("all_rows", case_spec(n, d, seed, dtype, wdt), opts)
                TRAIL.at_batch({"kind": "slice", "start": 0, "size": n})
                batch = call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
                alone = runner.run(case, torch.arange(n), 1)
                entry["alone_path"] = runner.paths.get(1, "eager")
                fwd, grad = compare_rows(
                    rec,
                    seed,
                    batch,
                    alone,
                    torch.arange(n, device=case.x.device),
                    case_label=lambda r, n=n: f"n={n}",
                    where=lambda r, n=n: (0, n, r),
                    batch_spec=lambda r, n=n: {"kind": "slice", "start": 0, "size": n},
                    case_spec=case_spec(n, d, seed, dtype, wdt),
                )
                entry["rows"] += n
                entry["fwd_differ"] += fwd
                if with_grad:
                    entry["rowgrad_differ"] += grad
                bar.update()
            rec.note(entry)
    except Exception as exc:
        summary["error"] = describe_error(exc)
    finally:
        bar.close()
    return CheckResult(summary, rec.records)


def sub_batch_plan(full_rows: int, size: int, coverage: str = "all", sample_stride: int = 512) -> list[tuple[int, int]]:
    """(start, size) of each contiguous sub-batch of `size` compared with the full batch.

    "all": the sub-batches tile the batch, the last one partial. "sampled" (the seed report):
    sizes below `sample_stride` start at every `sample_stride`-th row, larger sizes tile.
    """
    check_int("full_rows", full_rows, 1)
    check_int("size", size, 1)
    check_int("sample_stride", sample_stride, 1)
    if coverage not in COVERAGES:
        raise ValueError(f"coverage: expected one of {COVERAGES}, got {coverage!r}")
    if coverage == "sampled" and size < sample_stride:
        return [(s, min(size, full_rows - s)) for s in range(0, full_rows, sample_stride)]
    return [(s, min(size, full_rows - s)) for s in range(0, full_rows, size)]


def full_vs_sub_batches(
    backend: Backend,
    opts: OpOptions | None = None,
    device: str = "cpu",
    full_rows: int | None = None,
    seeds: Sequence[int] = (3, 4),
    sub_sizes: Sequence[int] | None = None,
    coverage: str = "all",
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    sample_stride: int = 512,
    use_graphs: bool = True,
    graph_rows: int = 4096,
    max_records: int | None = None,
    progress: bool = True,
) -> CheckResult:
    """Contiguous sub-batches vs the full batch, bitwise; every differing (row, tensor) recorded.

    Summary: the report's {full_batch, sub_batch_sizes, sub_batches, fwd_differ, rowgrad_differ}
    (differ counts are row comparisons summed over seeds and sizes; rowgrad_differ None for a forward-only
    backend) plus NEW coverage, rows_compared, alone_path {size: path}.
    """
    full_rows = check_int("full_rows", 262144 if full_rows is None else full_rows, 1)
    sub_sizes = check_ints("sub_sizes", (1, 7, 4097, 65536, 131072) if sub_sizes is None else sub_sizes, 1)
    seeds = check_ints("seeds", seeds)
    if coverage not in COVERAGES:
        raise ValueError(f"coverage: expected one of {COVERAGES}, got {coverage!r}")
    opts = check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    with_grad = has_backward(backend)
    plans = {size: sub_batch_plan(full_rows, size, coverage, sample_stride) for size in sub_sizes}
    summary: dict[str, Any] = {
        "full_batch": full_rows,
        "sub_batch_sizes": list(sub_sizes),
        "sub_batches": sum(len(p) for p in plans.values()) * len(seeds),
        "fwd_differ": 0,
        "rowgrad_differ": 0 if with_grad else None,
        "coverage": coverage,
        "rows_compared": 0,
        "alone_path": {},
    }
    rec = Recorder(backend, "full_vs_sub_batches", opts, max_records)
    runner = AloneRunner(
        backend, opts, with_grad, use_graphs, graph_rows, progress, f"{backend_key(backend)} sub-batches"
    )
    bar = tqdm(
        total=len(seeds) * len(sub_sizes), desc=f"{backend_key(backend)} full_vs_sub_batches", disable=not progress
    )
    try:
        for seed in seeds:
            case = make_case(full_rows, d, seed, dtype, wdt, device)
            TRAIL.at_case("full_vs_sub_batches", case_spec(full_rows, d, seed, dtype, wdt), opts)
            TRAIL.at_batch({"kind": "slice", "start": 0, "size": full_rows})
            full = call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
            for size in sub_sizes:
                plan = plans[size]
                whole = [s for s, m in plan if m == size]
                parts = [(s, m) for s, m in plan if m != size]
                pieces: list[tuple[Tensor, tuple[Tensor | None, ...]]] = []
                if whole:
                    starts = torch.tensor(whole, dtype=torch.int64)
                    out = runner.run(case, starts, size)
                    summary["alone_path"][str(size)] = runner.paths.get(size, "eager")
                    pieces.append(((starts.view(-1, 1) + torch.arange(size)).reshape(-1), out))
                for s, m in parts:  # a partial tile: one more call of its own size
                    TRAIL.at_batch({"kind": "slice", "start": s, "size": m})
                    got = call(
                        backend,
                        case.x[s : s + m],
                        None if case.z is None else case.z[s : s + m],
                        case.w,
                        case.dy[s : s + m] if with_grad else None,
                        opts,
                        with_grad,
                    )
                    pieces.append((torch.arange(s, s + m), got))
                # tiles never overlap, so a row's tile is the last one starting at or before it
                tile_starts = [s for s, _ in plan]
                tile_sizes = [m for _, m in plan]

                def tile(r: int, ts: list[int] = tile_starts, tm: list[int] = tile_sizes) -> tuple[int, int]:
                    i = bisect.bisect_right(ts, r) - 1
                    return ts[i], tm[i]

                for rows_idx, out in pieces:
                    fwd, grad = compare_rows(
                        rec,
                        seed,
                        full,
                        out,
                        rows_idx.to(case.x.device),
                        case_label=lambda r, t=tile: "sub={1}@{0}".format(*t(r)),
                        where=lambda r, t=tile: (t(r)[0], t(r)[1], r - t(r)[0]),
                        batch_spec=lambda r, t=tile: {"kind": "slice", "start": t(r)[0], "size": t(r)[1]},
                        case_spec=case_spec(full_rows, d, seed, dtype, wdt),
                        other={"kind": "slice", "start": 0, "size": full_rows, "label": "full batch"},
                    )
                    summary["fwd_differ"] += fwd
                    if with_grad:
                        summary["rowgrad_differ"] += grad
                    summary["rows_compared"] += len(rows_idx)
                bar.update()
    except Exception as exc:
        summary["error"] = describe_error(exc)
    finally:
        bar.close()
    rec.note(summary)
    return CheckResult(summary, rec.records)
