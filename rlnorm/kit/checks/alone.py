"""Rows computed alone or in small batches, fast: results kept on the device, CUDA graphs where they hold.

"Row alone" means one launch per row (262144 per seed and backend for sub-batch size 1), so per-call
overhead dominates. Results stay on the device in preallocated buffers and are compared once in bulk;
on CUDA many single-row calls are captured into one CUDA graph (inputs gathered into static buffers,
replayed per chunk), with eager fallback whenever capture fails or a replay differs from eager calls.
`summary["alone_path"]` says which path ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import Case
from rlnorm.kit.backends import describe_error
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend
from rlnorm.kit.checks.common import TRAIL, call, differ_rows


class _GraphMismatch(RuntimeError):
    pass


@dataclass
class _Graph:
    """k calls of one tile size captured in a CUDA graph, with the static buffers they read and write."""

    graph: Any
    k: int
    size: int
    x: Tensor
    z: Tensor | None
    dy: Tensor | None
    w: Tensor
    out: tuple[Tensor | None, Tensor | None, Tensor | None]


class AloneRunner:
    """Runs equal-size contiguous sub-batches of one case, each as its own backend call.

    `run(case, starts, size)` returns (y, dx, dz) of shape [len(starts) * size, D] in tile order.
    On CUDA, `graph_rows // size` calls are captured once per size into one graph reading static
    input buffers (x, z, dy rows and w); each chunk of tiles is gathered into those buffers and the
    graph replayed. The graph is used only where it is checked to give bitwise what eager calls
    give; otherwise, and on the CPU, eager calls run. `paths[size]` says which ran.
    """

    def __init__(
        self,
        backend: Backend,
        opts: OpOptions,
        with_grad: bool,
        use_graphs: bool,
        graph_rows: int,
        progress: bool,
        desc: str,
    ) -> None:
        self.backend, self.opts, self.with_grad = backend, opts, with_grad
        self.use_graphs, self.graph_rows, self.progress, self.desc = use_graphs, graph_rows, progress, desc
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
            except _GraphMismatch as exc:
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
        x, z, w, dy = case.x, case.z, case.w, case.dy
        starts_l = starts.tolist()
        chunk = max(1, 4096 // size)
        bar = tqdm(total=len(starts_l), desc=f"{self.desc} size {size}", disable=not self.progress, leave=False)
        for c0 in range(0, len(starts_l), chunk):
            TRAIL.at_batch({"kind": "slice", "start": starts_l[c0], "size": size})
            parts: list[list[Tensor]] = [[], [], []]
            for s in starts_l[c0 : c0 + chunk]:
                got = call(
                    self.backend,
                    x[s : s + size],
                    None if z is None else z[s : s + size],
                    w,
                    dy[s : s + size] if self.with_grad else None,
                    self.opts,
                    self.with_grad,
                )
                for p, t in zip(parts, got, strict=True):
                    if t is not None:
                        p.append(t.detach())
            r0, r1 = c0 * size, (c0 + len(parts[0])) * size
            with torch.no_grad():
                for out, p in zip(outs, parts, strict=True):
                    if out is not None:
                        torch.cat(p, out=out[r0:r1])
            bar.update(len(parts[0]))
        bar.close()

    def _tile_call(
        self, sx: Tensor, sz: Tensor | None, sdy: Tensor | None, sw: Tensor, size: int
    ) -> Callable[[int], tuple[Tensor, Tensor | None, Tensor | None]]:
        """call(i): the backend on tile i of the static buffers."""

        def tile_call(i: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
            sl = slice(i * size, (i + 1) * size)
            return call(
                self.backend,
                sx[sl],
                None if sz is None else sz[sl],
                sw,
                None if sdy is None else sdy[sl],
                self.opts,
                self.with_grad,
            )

        return tile_call

    def _capture(self, case: Case, starts: Tensor, size: int, k: int) -> _Graph:
        x, z, dy = case.x, case.z, case.dy
        dev = x.device
        TRAIL.at_batch({"kind": "slice", "start": int(starts[0]), "size": size})
        first = (starts[:k].view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(dev)
        sx = x.index_select(0, first)
        sz = None if z is None else z.index_select(0, first)
        sdy = dy.index_select(0, first) if self.with_grad else None
        sw = case.w.clone()
        tile = self._tile_call(sx, sz, sdy, sw, size)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up off the capture: JIT compile, autotune, allocator
            for _ in range(3):
                tile(0)
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = [tile(i) for i in range(k)]
            gy = torch.cat([t[0] for t in got])
            gdx = torch.cat([t[1] for t in got]) if self.with_grad else None
            gdz = torch.cat([t[2] for t in got]) if self.with_grad and z is not None else None
        del got
        g = _Graph(graph, k, size, sx, sz, sdy, sw, (gy, gdx, gdz))
        # the graph must give bitwise what eager calls give on the same inputs, or its results are not the backend's
        graph.replay()
        for i in range(min(k, 4)):
            eager = tile(i)
            for name, e, o in zip(("y", "dx", "dz"), eager, g.out, strict=True):
                if e is not None and o is not None and bool(differ_rows(e, o[i * size : (i + 1) * size]).any()):
                    raise _GraphMismatch(f"graph replay differed from eager calls in {name}")
        return g

    def _run_graph(self, g: _Graph, case: Case, starts: Tensor, outs: tuple[Tensor | None, ...]) -> None:
        x, z, dy = case.x, case.z, case.dy
        size, k = g.size, g.k
        n_tiles = int(starts.numel())
        idx = (starts.view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(x.device)
        g.w.copy_(case.w)
        bar = tqdm(total=n_tiles, desc=f"{self.desc} size {size} (graph)", disable=not self.progress, leave=False)
        for c in range(math.ceil(n_tiles / k)):
            t0 = min(c * k, n_tiles - k)  # the last chunk overlaps the one before: same values rewritten
            TRAIL.at_batch({"kind": "slice", "start": int(starts[t0]), "size": size})
            sel = idx[t0 * size : (t0 + k) * size]
            torch.index_select(x, 0, sel, out=g.x)
            if g.z is not None and z is not None:
                torch.index_select(z, 0, sel, out=g.z)
            if g.dy is not None:
                torch.index_select(dy, 0, sel, out=g.dy)
            g.graph.replay()
            for out, o in zip(outs, g.out, strict=True):
                if out is not None and o is not None:
                    out[t0 * size : (t0 + k) * size].copy_(o)
            bar.update(min(k, n_tiles - c * k))
        bar.close()
