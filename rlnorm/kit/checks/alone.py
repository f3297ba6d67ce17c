"""Rows computed alone or in small batches, fast: one launch per row, so results stay on the device in
preallocated buffers; on CUDA many calls are captured into one CUDA graph, used only where `timing.verify_graph`
finds its replay bitwise equal to eager calls. `paths[size]` says which ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import Case
from rlnorm.kit.checks.common import NO_TRAIL, Trail, call, call_rows
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


class AloneRunner:
    """Runs equal-size contiguous sub-batches of one case, each as its own backend call: `run(case, starts, size)`
    gives (y, dx, dz) in tile order; on CUDA `graph_rows // size` calls are captured into one graph per size."""

    def __init__(
        self,
        backend: Backend,
        opts: OpOptions,
        with_grad: bool,
        use_graphs: bool,
        graph_rows: int,
        progress: bool,
        desc: str,
        trail: Trail = NO_TRAIL,
    ) -> None:
        self.backend, self.opts, self.with_grad = backend, opts, with_grad
        self.use_graphs, self.graph_rows, self.progress, self.desc = use_graphs, graph_rows, progress, desc
        self.trail = trail
        self.paths: dict[int, str] = {}
        self._graphs: dict[int, _Graph] = {}
        self._no_graph: dict[int, str] = {}  # size -> why the graph path is not used

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
            try:
                torch.cuda.synchronize(x.device)
            except Exception:
                pass
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
            torch.index_select(x, 0, sel, out=g.x)
            if g.z is not None and z is not None:
                torch.index_select(z, 0, sel, out=g.z)
            if g.dy is not None:
                torch.index_select(dy, 0, sel, out=g.dy)
            g.replay()
            for i, out in enumerate(outs):
                if out is not None:
                    torch.cat([o[i] for o in g.outs], out=out[t0 * size : (t0 + k) * size])
            bar.update(min(k, n_tiles - c * k))
        bar.close()
