"""Each row inside a batch against the same row computed in another batch: alone (all_rows) or in
the full batch against contiguous sub-batches (full_vs_sub_batches).

Rows computed alone or in small batches go fast through `AloneRunner`: one launch per row, so results stay on the
device in preallocated buffers; on CUDA many calls are captured into one CUDA graph, used only where
`timing.verify_graph` finds its replay bitwise equal to eager calls. `paths[size]` says which ran.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import Case
from rlnorm.kit.checks.common import (
    NO_TRAIL,
    CheckOutcome,
    Place,
    Recorder,
    Trail,
    backend_key,
    call,
    call_rows,
    caught,
    check_common,
    check_int,
    check_ints,
    has_backward,
    new_case,
    record_differing,
    run_pieces,
)
from rlnorm.kit.results import AllRows, RowsAtSize, SubBatches
from rlnorm.options import OpOptions
from rlnorm.timing import CudaClock, GraphMismatch, describe_error, verify_graph

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend


@dataclass
class _Graph:
    """k calls of one tile size held by a CUDA graph, with the static buffers they read and write."""

    replay: Any
    keep: list[Any]
    k: int
    size: int
    x: Tensor
    z: Tensor | None
    dy: Tensor | None
    w: Tensor
    outs: list[tuple[Tensor | None, ...]]


@dataclass
class AloneRunner:
    """Runs equal-size contiguous sub-batches of one case, each as its own backend call: `run(case, starts, size)`
    gives (y, dx, dz) in tile order; on CUDA `graph_rows // size` calls are captured into one graph per size."""

    backend: Backend
    opts: OpOptions
    with_grad: bool
    use_graphs: bool
    graph_rows: int
    progress: bool
    desc: str
    trail: Trail = NO_TRAIL
    paths: dict[int, str] = field(default_factory=dict, init=False)  # size -> the path its last run took
    _graphs: dict[int, _Graph] = field(default_factory=dict, init=False)
    _no_graph: dict[int, str] = field(default_factory=dict, init=False)  # size -> why the graph path is not used

    def run(self, case: Case, starts: Tensor, size: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
        x = case.x
        n_tiles = int(starts.numel())
        out_y = torch.empty(n_tiles * size, x.shape[1], dtype=x.dtype, device=x.device)
        out_dx = torch.empty_like(out_y) if self.with_grad else None
        out_dz = torch.empty_like(out_y) if self.with_grad and case.z is not None else None
        outs = (out_y, out_dx, out_dz)
        if n_tiles == 0:
            return outs
        k = self.graph_rows // size
        if self.use_graphs and x.device.type == "cuda" and k >= 8 and n_tiles >= k and size not in self._no_graph:
            try:
                g = self._graphs.get(size)
                if g is None or g.x.shape[1] != x.shape[1] or g.x.dtype != x.dtype:
                    g = self._graphs[size] = self._capture(case, starts, size, k)
                self._run_graph(g, case, starts, outs)
                self.paths[size] = "cuda_graph"
                return outs
            except GraphMismatch as exc:
                self._no_graph[size] = f"eager ({exc})"
            except Exception as exc:
                self._no_graph[size] = f"eager (graph capture failed: {describe_error(exc)})"
            self._graphs.pop(size, None)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(x.device)
        self._run_eager(case, starts, size, outs)
        self.paths[size] = self._no_graph.get(size, "eager")
        return outs

    def _run_eager(self, case: Case, starts: Tensor, size: int, outs: tuple[Tensor | None, ...]) -> None:
        starts_l = starts.tolist()
        chunk = max(1, 4096 // size)
        bar = tqdm(total=len(starts_l), desc=f"{self.desc} size {size}", disable=not self.progress, leave=False)
        for c0 in range(0, len(starts_l), chunk):
            self.trail.batch({"kind": "slice", "start": starts_l[c0], "size": size})
            got = [call_rows(self.backend, case, s, size, self.opts, self.with_grad) for s in starts_l[c0 : c0 + chunk]]
            r0, r1 = c0 * size, (c0 + len(got)) * size
            with torch.no_grad():
                for i, out in enumerate(outs):
                    if out is not None:
                        torch.cat([t[i].detach() for t in got], out=out[r0:r1])
            bar.update(len(got))
        bar.close()

    def _capture(self, case: Case, starts: Tensor, size: int, k: int) -> _Graph:
        x, z, dy = case.x, case.z, case.dy
        self.trail.batch({"kind": "slice", "start": int(starts[0]), "size": size})
        first = (starts[:k].view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(x.device)
        sx = x.index_select(0, first)
        sz = None if z is None else z.index_select(0, first)
        sdy = dy.index_select(0, first) if self.with_grad else None
        sw = case.w.clone()

        def tile(i: int) -> Any:
            sl = slice(i * size, (i + 1) * size)
            sub_z = None if sz is None else sz[sl]
            return call(self.backend, sx[sl], sub_z, sw, None if sdy is None else sdy[sl], self.opts, self.with_grad)

        calls = [lambda i=i: tile(i) for i in range(k)]
        clock = CudaClock(str(x.device))
        cap = clock.capture(calls, warmup=3)
        # the graph's results are the backend's only if its replay writes bitwise what an eager call gives
        verdict = verify_graph(cap, calls, clock.sync)
        if verdict != "bitwise":
            raise GraphMismatch(f"graph replay differed from eager calls ({verdict})")
        return _Graph(cap.replay, cap.keep, k, size, sx, sz, sdy, sw, cap.outs)

    def _run_graph(self, g: _Graph, case: Case, starts: Tensor, outs: tuple[Tensor | None, ...]) -> None:
        x, z, dy = case.x, case.z, case.dy
        size, k = g.size, g.k
        n_tiles = int(starts.numel())
        idx = (starts.view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(x.device)
        g.w.copy_(case.w)
        bar = tqdm(total=n_tiles, desc=f"{self.desc} size {size} (graph)", disable=not self.progress, leave=False)
        for c in range(math.ceil(n_tiles / k)):
            t0 = min(c * k, n_tiles - k)  # the last chunk overlaps the one before: same values rewritten
            self.trail.batch({"kind": "slice", "start": int(starts[t0]), "size": size})
            sel = idx[t0 * size : (t0 + k) * size]
            for src, static in ((x, g.x), (z, g.z), (dy, g.dy)):
                if src is not None and static is not None:
                    torch.index_select(src, 0, sel, out=static)
            g.replay()
            for i, out in enumerate(outs):
                if out is not None:
                    torch.cat([o[i] for o in g.outs], out=out[t0 * size : (t0 + k) * size])
            bar.update(min(k, n_tiles - c * k))
        bar.close()


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
    with caught(summary), tqdm(total=len(sizes) * len(seeds), desc=f"{key} all_rows", disable=not progress) as bar:
        for n in sizes:
            entry = summary.sizes[n] = RowsAtSize(0, 0, 0 if with_grad else None, "eager")
            for seed in seeds:
                case, spec = new_case(trail, "all_rows", n, d, seed, wdt, device, opts, whole=True)
                batch = call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
                alone = runner.run(case, torch.arange(n), 1)
                entry.alone_path = runner.paths.get(1, "eager")
                whole = {"kind": "slice", "start": 0, "size": n}
                record_differing(
                    rec, seed, batch, alone, spec, lambda r, n=n, w=whole: (r, f"n={n}", 0, n, r, w), entry
                )
                entry.rows += n
                bar.update()
            entry.records_dropped = rec.dropped_since()
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
    n_subs = sum(len(p) for p in plans.values()) * len(seeds)
    summary = SubBatches(full_rows, list(sizes), n_subs, 0, 0 if with_grad else None, coverage, 0, alone_path={})
    rec = Recorder(backend, "full_vs_sub_batches", opts, max_records)
    runner = AloneRunner(backend, opts, with_grad, use_graphs, graph_rows, progress, f"{key} sub-batches", trail)
    bar = tqdm(total=len(seeds) * len(sizes), desc=f"{key} full_vs_sub_batches", disable=not progress)
    full_batch = {"kind": "slice", "start": 0, "size": full_rows, "label": "full batch"}
    with caught(summary), bar:
        for seed in seeds:
            case, spec = new_case(trail, "full_vs_sub_batches", full_rows, d, seed, wdt, device, opts, whole=True)
            full = call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
            for size in sizes:
                # (tile starts, tile rows, their outputs): the whole tiles in one go, then each partial one alone
                whole = [s for s, m in plans[size] if m == size]
                pieces = [(whole, size, runner.run(case, torch.tensor(whole), size))] if whole else []
                pieces += [([s], m, run_pieces(backend, case, [(s, m)], opts, with_grad, trail))
                           for s, m in plans[size] if m != size]  # fmt: skip
                for starts, m, out in pieces:
                    rows = (torch.tensor(starts).view(-1, 1) + torch.arange(m)).reshape(-1).to(case.x.device)
                    in_full = tuple(None if t is None else t.index_select(0, rows) for t in full)
                    record_differing(rec, seed, in_full, out, spec, _sub_place(starts, m), summary, other=full_batch)
                    summary.rows_compared += len(rows)
                bar.update()
    summary.alone_path = {str(size): path for size, path in runner.paths.items()}
    summary.records_dropped = rec.dropped_since()
    return CheckOutcome(summary, rec.records, summary.error)
