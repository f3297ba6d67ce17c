"""Each row inside a batch against the same row computed alone (all_rows) or in a contiguous sub-batch
(full_vs_sub_batches). `AloneRunner` makes the many small calls affordable: results stay on the device in
preallocated buffers, and on CUDA many calls replay as one CUDA graph where that replay is bitwise the eager calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import Case
from rlnorm.kit.checks.common import NO_TRAIL, Check, CheckOutcome, Place, Trail, caught, check_int, check_ints
from rlnorm.kit.results import AllRows, RowsAtSize, SubBatches
from rlnorm.options import OpOptions
from rlnorm.timing import Captured, CudaClock, GraphMismatch, describe_error, verify_graph

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend

_Graph = tuple[Captured, Case]  # k calls of one tile size held by a CUDA graph, and the static case they read


@dataclass
class AloneRunner:
    """Runs equal-size contiguous sub-batches of one case, each as its own backend call: `run(case, starts, size)`
    gives (y, dx, dz) in tile order; on CUDA `graph_rows // size` calls are captured into one graph per size."""

    check: Check
    use_graphs: bool = True
    graph_rows: int = 4096
    paths: dict[int, str] = field(default_factory=dict, init=False)  # size -> the path its last run took
    _graphs: dict[int, _Graph] = field(default_factory=dict, init=False)
    _no_graph: dict[int, str] = field(default_factory=dict, init=False)  # size -> why the graph path is not used

    def run(self, case: Case, starts: Tensor, size: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
        x = case.x
        n_tiles = int(starts.numel())
        y = torch.empty(n_tiles * size, x.shape[1], dtype=x.dtype, device=x.device)
        outs = (y, torch.empty_like(y), torch.empty_like(y)) if self.check.with_grad else (y, None, None)
        k = self.graph_rows // size
        if self.use_graphs and x.device.type == "cuda" and k >= 8 and n_tiles >= k and size not in self._no_graph:
            try:
                if size not in self._graphs:  # one check's cases share their width and dtype
                    self._graphs[size] = self._capture(case, starts, size, k)
                self._fill(case, starts, size, outs, self._graphs[size])
                self.paths[size] = "cuda_graph"
                return outs
            except GraphMismatch as exc:
                self._no_graph[size] = f"eager ({exc})"
            except Exception as exc:
                self._no_graph[size] = f"eager (graph capture failed: {describe_error(exc)})"
            self._graphs.pop(size, None)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(x.device)
        self._fill(case, starts, size, outs)
        self.paths[size] = self._no_graph.get(size, "eager")
        return outs

    def _fill(
        self, case: Case, starts: Tensor, size: int, outs: tuple[Tensor | None, ...], graph: _Graph | None = None
    ) -> None:
        """Each tile's outputs into `outs`, a chunk at a time: eager calls, or a replay of `graph` for k tiles."""
        c, n_tiles = self.check, int(starts.numel())
        k = len(graph[0].outs) if graph else max(1, 4096 // size)
        if graph:
            cap, static = graph
            static.w.copy_(case.w)
            idx = (starts.view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(case.x.device)
        desc = f"{c.key} {c.name} size {size}" + (" (graph)" if graph else "")
        with tqdm(total=n_tiles, desc=desc, disable=not c.progress, leave=False) as bar:
            for first in range(0, n_tiles, k):
                t0 = min(first, n_tiles - k) if graph else first  # a graph's last chunk overlaps the one before
                c.trail.batch({"kind": "slice", "start": int(starts[t0]), "size": size})
                if graph:
                    sel = idx[t0 * size : (t0 + k) * size]
                    for name in ("x", "z", "dy"):
                        torch.index_select(getattr(case, name), 0, sel, out=getattr(static, name))
                    cap.replay()
                    got = cap.outs
                else:
                    got = [c.call(case.rows(slice(s, s + size))) for s in starts[t0 : t0 + k].tolist()]
                with torch.no_grad():
                    for i, out in enumerate(outs):
                        if out is not None:
                            torch.cat([t[i].detach() for t in got], out=out[t0 * size : (t0 + len(got)) * size])
                bar.update(min(k, n_tiles - first))

    def _capture(self, case: Case, starts: Tensor, size: int, k: int) -> _Graph:
        self.check.trail.batch({"kind": "slice", "start": int(starts[0]), "size": size})
        static = case.rows((starts[:k].view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(case.x.device))
        static.w = case.w.clone()
        calls = [lambda i=i: self.check.call(static.rows(slice(i * size, (i + 1) * size))) for i in range(k)]
        clock = CudaClock(str(case.x.device))
        cap = clock.capture(calls, warmup=3)
        # the graph's results are the backend's only if its replay writes bitwise what an eager call gives
        verdict = verify_graph(cap, calls, clock.sync)
        if verdict != "bitwise":
            raise GraphMismatch(f"graph replay differed from eager calls ({verdict})")
        return cap, static


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
) -> CheckOutcome:
    """Every row computed alone vs inside its batch of n, bitwise (output; dx and dz with a backward); per n:
    rows, fwd_differ, rowgrad_differ (None for a forward-only backend), alone_path."""
    sizes = check_ints("all_rows_sizes", all_rows_sizes, 1)
    seeds = check_ints("all_rows_seeds", all_rows_seeds)
    c = Check("all_rows", backend, opts, device, d, weight_dtype, trail, progress, max_records)
    runner = AloneRunner(c)
    summary = AllRows()
    with caught(summary), c.bar(len(sizes) * len(seeds)) as bar:
        for n in sizes:
            entry = summary.sizes[n] = RowsAtSize(0, 0, 0 if c.with_grad else None, "eager")
            whole = {"kind": "slice", "start": 0, "size": n}
            for seed in seeds:
                case = c.case(n, seed)
                batch = c.call(case)
                alone = runner.run(case, torch.arange(n), 1)
                entry.alone_path = runner.paths.get(1, "eager")
                c.record_differing(batch, alone, lambda r, n=n, w=whole: (r, f"n={n}", 0, n, r, w), entry)
                entry.rows += n
                bar.update()
            entry.records_dropped = c.dropped_since()
    return c.outcome(summary)


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


def _sub_place(starts: list[int], m: int) -> Callable[[int], Place]:
    """Where row i of tiles of m rows starting at `starts` (in order) sat: its tile and position."""

    def place(i: int) -> Place:
        s, pos = starts[i // m], i % m
        return s + pos, f"sub={m}@{s}", s, m, pos, {"kind": "slice", "start": s, "size": m}

    return place


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
) -> CheckOutcome:
    """Contiguous sub-batches vs the full batch, bitwise; fwd_differ and rowgrad_differ count row comparisons
    over seeds and sizes (rowgrad_differ None for a forward-only backend)."""
    full_rows = check_int("sub_batches_rows", sub_batches_rows, 1)
    sizes = check_ints("sub_batch_sizes", sub_batch_sizes, 1)
    seeds = check_ints("sub_batches_seeds", sub_batches_seeds)
    plans = {size: sub_batch_plan(full_rows, size, coverage, sample_stride) for size in sizes}
    c = Check("full_vs_sub_batches", backend, opts, device, d, weight_dtype, trail, progress, max_records)
    n_subs = sum(len(p) for p in plans.values()) * len(seeds)
    summary = SubBatches(full_rows, list(sizes), n_subs, 0, 0 if c.with_grad else None, coverage, 0, alone_path={})
    runner = AloneRunner(c, use_graphs)
    full_batch = {"kind": "slice", "start": 0, "size": full_rows, "label": "full batch"}
    with caught(summary), c.bar(len(seeds) * len(sizes)) as bar:
        for seed in seeds:
            case = c.case(full_rows, seed)
            full = c.call(case)
            for size in sizes:
                # (tile starts, tile rows, their outputs): the whole tiles in one go, then each partial one alone
                whole = [s for s, m in plans[size] if m == size]
                pieces = [(whole, size, runner.run(case, torch.tensor(whole), size))] if whole else []
                pieces += [([s], m, c.pieces(case, [(s, m)])) for s, m in plans[size] if m != size]
                for starts, m, out in pieces:
                    rows = (torch.tensor(starts).view(-1, 1) + torch.arange(m)).reshape(-1).to(case.x.device)
                    in_full = tuple(None if t is None else t.index_select(0, rows) for t in full)
                    c.record_differing(in_full, out, _sub_place(starts, m), summary, other=full_batch)
                    summary.rows_compared += len(rows)
                bar.update()
    summary.alone_path = {str(size): path for size, path in runner.paths.items()}
    summary.records_dropped = c.dropped_since()
    return c.outcome(summary)
