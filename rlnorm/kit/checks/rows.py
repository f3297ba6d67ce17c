"""The batch-invariance checks, whose verdicts make `batch_invariant`: each row inside a batch against the same row
computed alone (all_rows, batch_size_sweep) or in a contiguous sub-batch (full_vs_sub_batches), and a batch's dweight
against the same batch's again (dweight_repeatable).
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
from rlnorm.kit.checks.common import (
    Check,
    CheckOutcome,
    Dweight,
    Place,
    Trail,
    caught,
    check_int,
    check_ints,
    differ_rows,
)
from rlnorm.kit.records import sweep_batch_rows, sweep_perm_seed
from rlnorm.kit.results import AllRows, RowsAtSize, SubBatches, Sweep
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
        k = len(graph[0].outs) if graph else max(1, self.graph_rows // size)
        if graph:
            cap, static = graph
            static.w.copy_(case.w)
            idx = (starts.view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(case.x.device)
        desc = f"{c.key} {c.name} size {size}" + (" (graph)" if graph else "")
        with tqdm(total=n_tiles, desc=desc, disable=not c.progress, leave=False) as bar:
            for first in range(0, n_tiles, k):
                t0 = min(first, n_tiles - k) if graph else first  # a graph's last chunk overlaps the one before
                c.mark({"kind": "slice", "start": int(starts[t0]), "size": size})
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
        self.check.mark({"kind": "slice", "start": int(starts[0]), "size": size})
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
    trail: Trail | None = None,
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
            dropped = c.dropped  # before this size's cases
            for seed in seeds:
                case = c.case(n, seed)
                batch = c.call(case)
                alone = runner.run(case, torch.arange(n), 1)
                entry.alone_path = runner.paths.get(1, "eager")
                c.record_differing(batch, alone, lambda r, n=n, w=whole: (r, f"n={n}", 0, n, r, w), entry)
                entry.rows += n
                bar.update()
            entry.records_dropped = (c.dropped - dropped) or None
    return c.outcome(summary)


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
    trail: Trail | None = None,
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
    summary.records_dropped = c.dropped or None
    return c.outcome(summary)


def sub_batch_plan(full_rows: int, size: int, coverage: str = "all", sample_stride: int = 512) -> list[tuple[int, int]]:
    """(start, size) of each contiguous sub-batch of `size` compared with the full batch: "all" tiles the batch
    (the last one partial); "sampled" (the seed report) starts sizes below `sample_stride` every that many rows."""
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
    trail: Trail | None = None,
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
    summary.records_dropped = c.dropped or None
    return c.outcome(summary)


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
    trail: Trail | None = None,
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
            batches = torch.cat(batch_idx).to(case.x.device).split([len(t) for t in batch_idx])
            # the probe's row out of each batch, copied into preallocated buffers (a view would keep every batch's
            # whole output alive)
            y = torch.empty(len(plan), d, dtype=case.x.dtype, device=case.x.device)
            in_batch = (y, torch.empty_like(y), torch.empty_like(y)) if c.with_grad else (y, None, None)
            for i, (idx, place) in enumerate(zip(batches, places, strict=True)):
                c.mark(place[5])
                out = c.call(case.rows(idx))
                with torch.no_grad():
                    for buf, t in zip(in_batch, out, strict=True):
                        if buf is not None and t is not None:
                            buf[i].copy_(t.detach()[place[4]])
                bar.update()
            # each comparison's probe alone (a probe named twice: its last run, as each is run in turn)
            last = {p: i for i, p in enumerate(probes)}
            pick = torch.tensor([last[p] for _, p, _, _ in plan], device=case.x.device)
            ref = tuple(None if t is None else t.index_select(0, pick) for t in alone)
            # "row" i of these tensors is comparison i of the plan
            summary.differ += c.record_differing(in_batch, ref, places.__getitem__, summary)
    summary.records_dropped = c.dropped or None
    return c.outcome(summary)
