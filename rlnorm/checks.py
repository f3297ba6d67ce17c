"""The reuse checks of SPEC §4: batch invariance per row, dweight repeatability, accuracy and latency.

Every check takes `(backend, opts, device, ...sizes/seeds...)` and returns `CheckResult(summary,
records)`: `summary` holds the seed report's fields for that check (plus the NEW ones), `records`
one dict per differing (row, tensor) in the columns of `rlnorm.records.RECORD_COLUMNS`, each with
the JSON that `rlnorm.records.rebuild_case` needs to rebuild the compared batch. A backend that
raises inside a check ends only that check: its summary carries `error` and the records so far.

Speed. "Row alone" means one launch per row (262144 per seed and backend for sub-batch size 1),
so per-call overhead dominates. Results stay on the device in preallocated buffers and are
compared once in bulk; on CUDA many single-row calls are captured into one CUDA graph (inputs
gathered into static buffers, replayed per chunk), with eager fallback whenever capture fails or
a replay differs from eager calls. `summary["alone_path"]` says which path ran.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from rlnorm.bench import CpuClock, CudaClock
from rlnorm.inputs import Case, make_case
from rlnorm.numerics import round_once, ulp_distance
from rlnorm.options import OpOptions
from rlnorm.records import REBUILD_VERSION, dtype_name, sweep_batch_rows, sweep_perm_seed
from rlnorm.reference import gated_rmsnorm_math

if TYPE_CHECKING:
    from rlnorm.backends import Backend

__all__ = [
    "COVERAGES",
    "CheckResult",
    "accuracy_latency",
    "agreement_matrix",
    "all_rows",
    "batch_invariant",
    "batch_size_sweep",
    "default_probe_rows",
    "default_sweep_sizes",
    "dweight_repeatable",
    "full_vs_sub_batches",
    "sub_batch_plan",
    "sweep_positions",
]

COVERAGES = ("all", "sampled")
ULP_HIST_MAX = 16  # fwd_ulp_hist buckets "0".."15", then "16+"
ABS_ERR_EDGES = [10.0 ** (k / 4) for k in range(-48, 9)]  # 1e-12 .. 1e2, four per decade


@dataclass
class CheckResult:
    """What a check returns: the report's summary fields and the per-row records of differences."""

    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500]


def _check_int(name: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")
    return value


def _check_ints(name: str, values: Any, low: int = 0) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}: expected a sequence of ints, got {values!r}")
    if len(values) == 0:
        raise ValueError(f"{name}: expected at least one value")
    return [_check_int(f"{name}[{i}]", v, low) for i, v in enumerate(values)]


def _check_common(backend: Any, opts: Any, device: Any, d: int) -> OpOptions:
    for attr in ("forward", "forward_backward"):
        if not callable(getattr(backend, attr, None)):
            raise TypeError(f"backend: expected a rlnorm Backend (with .{attr}), got {type(backend).__name__}")
    if opts is None:
        opts = OpOptions()
    if not isinstance(opts, OpOptions):
        raise TypeError(f"opts: expected rlnorm.options.OpOptions, got {type(opts).__name__}")
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: expected a torch device string, got {device!r}") from exc
    _check_int("d", d, 1)
    opts.check_width(d)
    return opts


def _alias(name: str, value: Any, alias_name: str, alias: Any) -> Any:
    """Accept the runner's older keyword (`alias_name`) for `name`; both at once is an error."""
    if alias is None:
        return value
    if value is not None:
        raise TypeError(f"{alias_name}: give either {name} or {alias_name}, not both")
    return alias


def _key(backend: Any) -> str:
    return str(getattr(backend, "key", "") or type(backend).__name__)


def _has_backward(backend: Any) -> bool:
    return bool(getattr(backend, "has_backward", False))


def _sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _call(
    backend: Backend, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor | None, opts: OpOptions, with_grad: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One launch of the backend: (y, dx, dz); forward-only gives (y, None, None)."""
    if with_grad:
        g = backend.forward_backward(x, z, w, dy, opts)
        return g.y, g.dx, g.dz
    return backend.forward(x, z, w, opts), None, None


def _bits(t: Tensor) -> Tensor:
    """Integer view for bitwise comparison (NaN payloads and signed zeros count as different)."""
    t = t.detach().contiguous()
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _differ_rows(a: Tensor, b: Tensor) -> Tensor:
    """bool[rows]: the row is not bitwise equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {tuple(a.shape)} {a.dtype} with {tuple(b.shape)} {b.dtype}")
    return (_bits(a) != _bits(b)).reshape(a.shape[0], -1).any(dim=1)


def _diff_stats(a: Tensor, b: Tensor) -> tuple[list[int], list[float], list[int]]:
    """Per row of [k, D] tensors: columns differing, max |a - b|, max ulp distance."""
    cols = (_bits(a) != _bits(b)).reshape(a.shape[0], -1).sum(dim=1)
    diff = (a.double() - b.double()).abs().reshape(a.shape[0], -1)
    max_abs = torch.where(diff.isnan().any(dim=1), math.nan, diff.nan_to_num(nan=0.0).amax(dim=1))
    if a.dtype in (torch.bfloat16, torch.float16, torch.float32):
        max_ulp = ulp_distance(a.detach(), b.detach()).reshape(a.shape[0], -1).amax(dim=1).tolist()
    else:
        max_ulp = [None] * a.shape[0]
    return cols.tolist(), max_abs.tolist(), max_ulp


def _case_spec(rows: int, d: int, seed: int, dtype: torch.dtype, weight_dtype: torch.dtype) -> dict[str, Any]:
    return {"rows": rows, "d": d, "seed": seed, "dtype": dtype_name(dtype), "weight_dtype": dtype_name(weight_dtype)}


class _Recorder:
    """Collects records (optionally capped) for one check of one backend."""

    def __init__(self, backend: Any, check: str, opts: OpOptions, max_records: int | None) -> None:
        self.key = _key(backend)
        self.check = check
        self.opts = opts.as_dict()
        self.max_records = max_records
        self.records: list[dict[str, Any]] = []
        self.dropped = 0
        self._noted = 0

    def add_rows(
        self,
        *,
        seed: int,
        tensor: str,
        in_batch: Tensor,
        alone: Tensor,
        rows: list[int],
        cases: list[str],
        batch_starts: list[int | None],
        batch_sizes: list[int],
        positions: list[int],
        case_spec: dict[str, Any],
        batches: list[dict[str, Any]],
        other: dict[str, Any] | None = None,
    ) -> None:
        """One record per row of the [k, D] tensors `in_batch` / `alone` (rows already known to differ)."""
        k = len(rows)
        if k == 0:
            return
        room = k if self.max_records is None else max(0, min(k, self.max_records - len(self.records)))
        self.dropped += k - room
        if room == 0:
            return
        cols, max_abs, max_ulp = _diff_stats(in_batch[:room], alone[:room])
        for i in range(room):
            spec = {
                "v": REBUILD_VERSION,
                "check": self.check,
                "case": case_spec,
                "opts": self.opts,
                "batch": batches[i],
                "row": rows[i],
                "position": positions[i],
                "tensor": tensor,
            }
            if other is not None:
                spec["other"] = other
            self.records.append(
                {
                    "backend": self.key,
                    "check": self.check,
                    "seed": seed,
                    "case": cases[i],
                    "batch_start": batch_starts[i],
                    "batch_size": batch_sizes[i],
                    "position": positions[i],
                    "row": rows[i],
                    "tensor": tensor,
                    "cols_differ": cols[i],
                    "max_abs": max_abs[i],
                    "max_ulp": max_ulp[i],
                    "rebuild": json.dumps(spec, separators=(",", ":")),
                }
            )

    def note(self, summary: dict[str, Any]) -> None:
        """Say in `summary` how many differing (row, tensor) pairs `max_records` left unrecorded since the last note."""
        new = self.dropped - self._noted
        self._noted = self.dropped
        if new:
            summary["records_dropped"] = summary.get("records_dropped", 0) + new


# ---------------------------------------------------------------------------------------------
# many small launches: eager, or captured in CUDA graphs
# ---------------------------------------------------------------------------------------------


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


class _AloneRunner:
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
                self._no_graph[size] = f"eager (graph capture failed: {_describe(exc)})"
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
            parts: list[list[Tensor]] = [[], [], []]
            for s in starts_l[c0 : c0 + chunk]:
                got = _call(
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

        def call(i: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
            sl = slice(i * size, (i + 1) * size)
            return _call(
                self.backend,
                sx[sl],
                None if sz is None else sz[sl],
                sw,
                None if sdy is None else sdy[sl],
                self.opts,
                self.with_grad,
            )

        return call

    def _capture(self, case: Case, starts: Tensor, size: int, k: int) -> _Graph:
        x, z, dy = case.x, case.z, case.dy
        dev = x.device
        first = (starts[:k].view(-1, 1) + torch.arange(size).view(1, -1)).reshape(-1).to(dev)
        sx = x.index_select(0, first)
        sz = None if z is None else z.index_select(0, first)
        sdy = dy.index_select(0, first) if self.with_grad else None
        sw = case.w.clone()
        call = self._tile_call(sx, sz, sdy, sw, size)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up off the capture: JIT compile, autotune, allocator
            for _ in range(3):
                call(0)
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = [call(i) for i in range(k)]
            gy = torch.cat([t[0] for t in got])
            gdx = torch.cat([t[1] for t in got]) if self.with_grad else None
            gdz = torch.cat([t[2] for t in got]) if self.with_grad and z is not None else None
        del got
        g = _Graph(graph, k, size, sx, sz, sdy, sw, (gy, gdx, gdz))
        # the graph must give bitwise what eager calls give on the same inputs, or its results are not the backend's
        graph.replay()
        for i in range(min(k, 4)):
            eager = call(i)
            for name, e, o in zip(("y", "dx", "dz"), eager, g.out, strict=True):
                if e is not None and o is not None and bool(_differ_rows(e, o[i * size : (i + 1) * size]).any()):
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


# ---------------------------------------------------------------------------------------------
# all_rows
# ---------------------------------------------------------------------------------------------


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
    sizes: Sequence[int] | None = None,
    use_graphs: bool = True,
    graph_rows: int = 4096,
    max_records: int | None = None,
    progress: bool = True,
) -> CheckResult:
    """Every row computed alone vs inside its batch of n, bitwise (output; dx and dz with a backward).

    Summary: {str(n): {rows, fwd_differ, rowgrad_differ, alone_path}} with rows = n * len(seeds).
    `sizes` is an alias of `ns`.
    """
    ns = _alias("ns", ns, "sizes", sizes)
    ns = _check_ints("ns", (64, 257, 4097) if ns is None else ns, 1)
    seeds = _check_ints("seeds", seeds)
    opts = _check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    with_grad = _has_backward(backend)
    rec = _Recorder(backend, "all_rows", opts, max_records)
    runner = _AloneRunner(backend, opts, with_grad, use_graphs, graph_rows, progress, f"{_key(backend)} all_rows")
    summary: dict[str, Any] = {}
    bar = tqdm(total=len(ns) * len(seeds), desc=f"{_key(backend)} all_rows", disable=not progress)
    try:
        for n in ns:
            entry = {"rows": 0, "fwd_differ": 0, "rowgrad_differ": 0, "alone_path": "eager"}
            summary[str(n)] = entry
            for seed in seeds:
                case = make_case(n, d, seed, dtype, wdt, device)
                batch = _call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
                alone = runner.run(case, torch.arange(n), 1)
                entry["alone_path"] = runner.paths.get(1, "eager")
                fwd, grad = _compare_rows(
                    rec,
                    seed,
                    batch,
                    alone,
                    torch.arange(n, device=case.x.device),
                    case_label=lambda r, n=n: f"n={n}",
                    where=lambda r, n=n: (0, n, r),
                    batch_spec=lambda r, n=n: {"kind": "slice", "start": 0, "size": n},
                    case_spec=_case_spec(n, d, seed, dtype, wdt),
                )
                entry["rows"] += n
                entry["fwd_differ"] += fwd
                entry["rowgrad_differ"] += grad
                bar.update()
            rec.note(entry)
    except Exception as exc:
        summary["error"] = _describe(exc)
    finally:
        bar.close()
    return CheckResult(summary, rec.records)


def _compare_rows(
    rec: _Recorder,
    seed: int,
    batch: tuple[Tensor, Tensor | None, Tensor | None],
    alone: tuple[Tensor, Tensor | None, Tensor | None],
    rows: Tensor,
    *,
    case_label: Any,
    where: Any,
    batch_spec: Any,
    case_spec: dict[str, Any],
    other: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Compare `batch` tensors gathered at `rows` (case-row indices) with `alone` (aligned to `rows`).

    Records each differing (row, tensor); returns (rows whose y differs, rows whose dx or dz differs).
    `where(row) -> (batch_start, batch_size, position)`.
    """
    masks: dict[str, Tensor] = {}
    for name, b, a in zip(("y", "dx", "dz"), batch, alone, strict=True):
        if b is None or a is None:
            continue
        masks[name] = _differ_rows(b.index_select(0, rows), a)
    grad_mask = None
    for name in ("dx", "dz"):
        if name in masks:
            grad_mask = masks[name] if grad_mask is None else grad_mask | masks[name]
    fwd = int(masks["y"].sum())
    grad = 0 if grad_mask is None else int(grad_mask.sum())
    for name, b, a in zip(("y", "dx", "dz"), batch, alone, strict=True):
        if name not in masks or not bool(masks[name].any()):
            continue
        pos_idx = masks[name].nonzero().flatten()
        case_rows = rows.index_select(0, pos_idx).tolist()
        wh = [where(r) for r in case_rows]
        rec.add_rows(
            seed=seed,
            tensor=name,
            in_batch=b.index_select(0, rows.index_select(0, pos_idx)),
            alone=a.index_select(0, pos_idx),
            rows=case_rows,
            cases=[case_label(r) for r in case_rows],
            batch_starts=[w_[0] for w_ in wh],
            batch_sizes=[w_[1] for w_ in wh],
            positions=[w_[2] for w_ in wh],
            case_spec=case_spec,
            batches=[batch_spec(r) for r in case_rows],
            other=other,
        )
    return fwd, grad


# ---------------------------------------------------------------------------------------------
# dweight_repeatable
# ---------------------------------------------------------------------------------------------


def dweight_repeatable(
    backend: Backend,
    opts: OpOptions | None = None,
    device: str = "cpu",
    rows: int = 262144,
    seed: int = 3,
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    repeats: int = 2,
    max_records: int | None = None,
    progress: bool = True,
) -> CheckResult:
    """The same full batch `repeats` times gives bitwise the same dweight; None without a backward.

    Summary: {dweight_repeatable: bool | None, rows, seed, repeats}; a differing run is one
    `dweight` record (row and position empty).
    """
    _check_int("rows", rows, 1)
    _check_int("seed", seed)
    _check_int("repeats", repeats, 2)
    opts = _check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    summary: dict[str, Any] = {"dweight_repeatable": None, "rows": rows, "seed": seed, "repeats": repeats}
    rec = _Recorder(backend, "dweight_repeatable", opts, max_records)
    if not _has_backward(backend):
        summary["reason"] = "no backward"
        return CheckResult(summary, [])
    try:
        case = make_case(rows, d, seed, dtype, wdt, device)
        dws = []
        for _ in tqdm(range(repeats), desc=f"{_key(backend)} dweight_repeatable", disable=not progress):
            g = backend.forward_backward(case.x, case.z, case.w, case.dy, opts)
            if g.dw is None:
                summary["reason"] = "backend gave no dweight"
                return CheckResult(summary, [])
            dws.append(g.dw.detach().clone())
        same = True
        for i, dw in enumerate(dws[1:], start=1):
            if bool(_differ_rows(dw.reshape(1, -1), dws[0].reshape(1, -1)).any()):
                same = False
                rec.add_rows(
                    seed=seed,
                    tensor="dweight",
                    in_batch=dw.reshape(1, -1),
                    alone=dws[0].reshape(1, -1),
                    rows=[None],  # type: ignore[list-item]
                    cases=[f"repeat={i}"],
                    batch_starts=[0],
                    batch_sizes=[rows],
                    positions=[None],  # type: ignore[list-item]
                    case_spec=_case_spec(rows, d, seed, dtype, wdt),
                    batches=[{"kind": "slice", "start": 0, "size": rows}],
                )
        for r in rec.records:  # rebuild: the whole batch against itself
            spec = json.loads(r["rebuild"])
            spec["row"], spec["position"] = -1, -1
            r["rebuild"] = json.dumps(spec, separators=(",", ":"))
        summary["dweight_repeatable"] = same
    except Exception as exc:
        summary["error"] = _describe(exc)
    return CheckResult(summary, rec.records)


# ---------------------------------------------------------------------------------------------
# full_vs_sub_batches
# ---------------------------------------------------------------------------------------------


def sub_batch_plan(full_rows: int, size: int, coverage: str = "all", sample_stride: int = 512) -> list[tuple[int, int]]:
    """(start, size) of each contiguous sub-batch of `size` compared with the full batch.

    "all": the sub-batches tile the batch, the last one partial. "sampled" (the seed report):
    sizes below `sample_stride` start at every `sample_stride`-th row, larger sizes tile.
    """
    _check_int("full_rows", full_rows, 1)
    _check_int("size", size, 1)
    _check_int("sample_stride", sample_stride, 1)
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
    rows: int | None = None,
    sub_batch_sizes: Sequence[int] | None = None,
    sample_stride: int = 512,
    use_graphs: bool = True,
    graph_rows: int = 4096,
    max_records: int | None = None,
    progress: bool = True,
) -> CheckResult:
    """Contiguous sub-batches vs the full batch, bitwise; every differing (row, tensor) recorded.

    Summary: the report's {full_batch, sub_batch_sizes, sub_batches, fwd_differ, rowgrad_differ}
    (differ counts are row comparisons summed over seeds and sizes) plus NEW coverage,
    rows_compared, alone_path {size: path}. `rows` / `sub_batch_sizes` alias `full_rows` / `sub_sizes`.
    """
    full_rows = _alias("full_rows", full_rows, "rows", rows)
    sub_sizes = _alias("sub_sizes", sub_sizes, "sub_batch_sizes", sub_batch_sizes)
    full_rows = _check_int("full_rows", 262144 if full_rows is None else full_rows, 1)
    sub_sizes = _check_ints("sub_sizes", (1, 7, 4097, 65536, 131072) if sub_sizes is None else sub_sizes, 1)
    seeds = _check_ints("seeds", seeds)
    if coverage not in COVERAGES:
        raise ValueError(f"coverage: expected one of {COVERAGES}, got {coverage!r}")
    opts = _check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    with_grad = _has_backward(backend)
    plans = {size: sub_batch_plan(full_rows, size, coverage, sample_stride) for size in sub_sizes}
    summary: dict[str, Any] = {
        "full_batch": full_rows,
        "sub_batch_sizes": list(sub_sizes),
        "sub_batches": sum(len(p) for p in plans.values()) * len(seeds),
        "fwd_differ": 0,
        "rowgrad_differ": 0,
        "coverage": coverage,
        "rows_compared": 0,
        "alone_path": {},
    }
    rec = _Recorder(backend, "full_vs_sub_batches", opts, max_records)
    runner = _AloneRunner(backend, opts, with_grad, use_graphs, graph_rows, progress, f"{_key(backend)} sub-batches")
    bar = tqdm(total=len(seeds) * len(sub_sizes), desc=f"{_key(backend)} full_vs_sub_batches", disable=not progress)
    try:
        for seed in seeds:
            case = make_case(full_rows, d, seed, dtype, wdt, device)
            full = _call(backend, case.x, case.z, case.w, case.dy, opts, with_grad)
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
                    got = _call(
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
                    fwd, grad = _compare_rows(
                        rec,
                        seed,
                        full,
                        out,
                        rows_idx.to(case.x.device),
                        case_label=lambda r, t=tile: "sub={1}@{0}".format(*t(r)),
                        where=lambda r, t=tile: (t(r)[0], t(r)[1], r - t(r)[0]),
                        batch_spec=lambda r, t=tile: {"kind": "slice", "start": t(r)[0], "size": t(r)[1]},
                        case_spec=_case_spec(full_rows, d, seed, dtype, wdt),
                        other={"kind": "slice", "start": 0, "size": full_rows, "label": "full batch"},
                    )
                    summary["fwd_differ"] += fwd
                    summary["rowgrad_differ"] += grad
                    summary["rows_compared"] += len(rows_idx)
                bar.update()
    except Exception as exc:
        summary["error"] = _describe(exc)
    finally:
        bar.close()
    rec.note(summary)
    return CheckResult(summary, rec.records)


# ---------------------------------------------------------------------------------------------
# batch_size_sweep
# ---------------------------------------------------------------------------------------------


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
    rowgrad_differ (comparisons whose y / whose dx or dz differ).
    """
    _check_int("n", n, 1)
    seeds = _check_ints("seeds", seeds)
    sizes = _check_ints("sizes", default_sweep_sizes(n) if sizes is None else sizes, 1)
    probes = _check_ints("probe_rows", default_probe_rows(n) if probe_rows is None else probe_rows)
    if max(sizes) > n:
        raise ValueError(f"sizes: every size must be <= n={n}, got {max(sizes)}")
    if max(probes) >= n:
        raise ValueError(f"probe_rows: every probe must be < n={n}, got {max(probes)}")
    opts = _check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    with_grad = _has_backward(backend)
    plan = [(m, p, name, pos) for m in sizes for p in probes for name, pos in sweep_positions(m)]
    summary: dict[str, Any] = {
        "batch_sizes": list(sizes),
        "probe_rows": list(probes),
        "comparisons": len(plan) * len(seeds),
        "differ": 0,
        "fwd_differ": 0,
        "rowgrad_differ": 0,
    }
    rec = _Recorder(backend, "batch_size_sweep", opts, max_records)
    bar = tqdm(total=len(plan) * len(seeds), desc=f"{_key(backend)} batch_size_sweep", disable=not progress)
    try:
        for seed in seeds:
            case = make_case(n, d, seed, dtype, wdt, device)
            cs = _case_spec(n, d, seed, dtype, wdt)
            alone = {}
            for p in probes:
                got = _call(
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
            for i, (_m, _p, _name, pos) in enumerate(plan):
                idx = idx_all[offsets[i] : offsets[i + 1]]
                bx = case.x.index_select(0, idx)
                bz = None if case.z is None else case.z.index_select(0, idx)
                bdy = case.dy.index_select(0, idx) if with_grad else None
                out = _call(backend, bx, bz, case.w, bdy, opts, with_grad)
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
                name: _differ_rows(b, a)
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
        summary["error"] = _describe(exc)
    finally:
        bar.close()
    rec.note(summary)
    return CheckResult(summary, rec.records)


# ---------------------------------------------------------------------------------------------
# accuracy_latency
# ---------------------------------------------------------------------------------------------


def _clock(device: torch.device) -> CpuClock:
    """The bench's clocks (one timing method for the kit): on a GPU, CUDA events with the queue primed per
    chunk of calls, so events bracket GPU work only, and a flag where the host still outran the prime (the
    time then includes host overhead: a fast kernel behind a slow wrapper looks slow, and the reader must
    know); on a CPU, perf_counter around each call."""
    return CudaClock(str(device)) if device.type == "cuda" else CpuClock()


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _ulp_hist(ulp: Tensor) -> dict[str, int]:
    nan = ulp == torch.iinfo(torch.int64).max
    finite = ulp[~nan]
    counts = torch.bincount(finite.clamp(max=ULP_HIST_MAX), minlength=ULP_HIST_MAX + 1).tolist()
    hist = {str(i): int(counts[i]) for i in range(ULP_HIST_MAX)}
    hist[f"{ULP_HIST_MAX}+"] = int(counts[ULP_HIST_MAX])
    hist["nan"] = int(nan.sum())
    return hist


def _abs_err_hist(err: Tensor) -> dict[str, Any]:
    """Log-spaced histogram of |y - y64|; exact zeros, values below/above the edges and NaN counted apart."""
    edges = torch.tensor(ABS_ERR_EDGES, dtype=torch.float64, device=err.device)
    nan = err.isnan()
    e = err[~nan]
    zero = e == 0
    pos = e[~zero]
    under = pos < edges[0]
    over = pos > edges[-1]
    inside = pos[~under & ~over]
    # bucket i holds edges[i] <= e < edges[i+1] (the top edge closes the last bucket)
    b = (torch.bucketize(inside, edges, right=True) - 1).clamp(0, len(ABS_ERR_EDGES) - 2)
    counts = torch.bincount(b, minlength=len(ABS_ERR_EDGES) - 1).tolist()
    return {
        "edges": ABS_ERR_EDGES,
        "counts": [int(c) for c in counts],
        "zero": int(zero.sum()),
        "under": int(under.sum()),
        "over": int(over.sum()),
        "nan": int(nan.sum()),
    }


def accuracy_latency(
    backend: Backend,
    opts: OpOptions | None = None,
    device: str = "cpu",
    rows: int = 262144,
    seed: int = 11,
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    timing: bool = True,
    warmup: int = 10,
    iters: int = 50,
    progress: bool = True,
) -> CheckResult:
    """Accuracy against fp64 (rounded ONCE for correct rounding) and latency against the same-run
    `torch.add` roofline. Summary fields: DESIGN.md "Fields shared by checks, artifact and plots"."""
    _check_int("rows", rows, 1)
    _check_int("seed", seed)
    _check_int("warmup", warmup)
    _check_int("iters", iters, 1)
    if not isinstance(timing, bool):
        raise TypeError(f"timing: expected a bool, got {timing!r}")
    opts = _check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    dev = torch.device(device)
    with_grad = _has_backward(backend)
    summary: dict[str, Any] = {
        "rows": rows,
        "fwd_correctly_rounded": None,
        "fwd_max_abs_err": None,
        "fwd_us": None,
        "grad_rel_err": None,
        "fwd_bwd_us": None,
        "fwd_us_p20": None,
        "fwd_us_p80": None,
        "fwd_bwd_us_p20": None,
        "fwd_bwd_us_p80": None,
        "fwd_gbps": None,
        "fwd_bwd_gbps": None,
        "roofline_add_us": None,
        "fwd_roofline_ratio": None,
        "fwd_bwd_roofline_ratio": None,
        "fwd_ulp_hist": None,
        "fwd_abs_err_hist": None,
        "device": str(dev),
        "timed": False,
    }
    bar = tqdm(total=4, desc=f"{_key(backend)} accuracy_latency", disable=not progress)
    try:
        case = make_case(rows, d, seed, dtype, wdt, device)
        x, z, w, dy = case.x, case.z, case.w, case.dy
        # -- forward accuracy
        y = backend.forward(x, z, w, opts).detach()
        with torch.no_grad():
            y64 = gated_rmsnorm_math(x, z, w, opts, torch.float64)
            oracle = round_once(y64, y.dtype)
            ulp = ulp_distance(y, oracle)
            summary["fwd_correctly_rounded"] = float((ulp == 0).double().mean())
            err = (y.double() - y64).abs()
            # NaN/inf have no place in JSON: non-finite errors show as None here and in the histograms
            summary["fwd_max_abs_err"] = _finite_or_none(float(err.max()))
            summary["fwd_ulp_hist"] = _ulp_hist(ulp)
            summary["fwd_abs_err_hist"] = _abs_err_hist(err)
            del y64, oracle, ulp, err
        bar.update()
        # -- gradient accuracy against fp64 autograd
        if with_grad:
            g = backend.forward_backward(x, z, w, dy, opts)
            leaves = [
                x.double().requires_grad_(),
                None if z is None else z.double().requires_grad_(),
                w.double().requires_grad_(),
            ]
            with torch.enable_grad():
                r = gated_rmsnorm_math(leaves[0], leaves[1], leaves[2], opts, torch.float64)
                r.backward(dy.double())
            rel: dict[str, float | None] = {}
            for name, got, leaf in (("x", g.dx, leaves[0]), ("z", g.dz, leaves[1]), ("w", g.dw, leaves[2])):
                if got is None or leaf is None or leaf.grad is None:
                    rel[name] = None
                    continue
                ref = leaf.grad
                denom = float(ref.abs().max())
                num = float((got.detach().double() - ref).abs().max())
                rel[name] = _finite_or_none(num / denom if denom > 0 else (0.0 if num == 0 else math.inf))
            summary["grad_rel_err"] = rel
            del g, leaves, r
        bar.update()
        # -- latency
        if timing:
            elem = x.element_size()
            n_el = x.numel()
            out = torch.empty_like(x)
            clock = _clock(dev)
            add_t = clock.events(lambda: torch.add(x, z, out=out), iters, warmup)
            summary["roofline_add_us"] = add_t.us
            host_bound = {"add": add_t.host_bound}
            t = clock.events(lambda: backend.forward(x, z, w, opts), iters, warmup)
            summary.update(fwd_us=t.us, fwd_us_p20=t.p20, fwd_us_p80=t.p80, fwd_gbps=3 * n_el * elem / (t.us * 1e3))
            summary["fwd_roofline_ratio"] = t.us / summary["roofline_add_us"]
            host_bound["fwd"] = t.host_bound
            bar.update()
            if with_grad:
                t = clock.events(lambda: backend.forward_backward(x, z, w, dy, opts), iters, warmup)
                summary.update(
                    fwd_bwd_us=t.us,
                    fwd_bwd_us_p20=t.p20,
                    fwd_bwd_us_p80=t.p80,
                    fwd_bwd_gbps=8 * n_el * elem / (t.us * 1e3),
                )
                summary["fwd_bwd_roofline_ratio"] = t.us / (8 / 3 * summary["roofline_add_us"])
                host_bound["fwd_bwd"] = t.host_bound
            summary["host_bound"] = host_bound  # True: the GPU queue ran dry, the time includes host overhead
            summary["timed"] = True
        bar.update(bar.total - bar.n)
    except Exception as exc:
        summary["error"] = _describe(exc)
    finally:
        bar.close()
    return CheckResult(summary, [])


# ---------------------------------------------------------------------------------------------
# agreement matrix
# ---------------------------------------------------------------------------------------------


def agreement_matrix(
    backends: Sequence[Backend],
    opts: OpOptions | None = None,
    device: str = "cpu",
    rows: int = 4097,
    seed: int = 3,
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    progress: bool = True,
) -> CheckResult:
    """Fraction of forward outputs bitwise equal between each pair of backends on the same inputs.

    Summary: {tensor: "y", rows, seed, backends, equal_fraction (None where a backend raised), errors}.
    """
    if isinstance(backends, (str, bytes)) or not isinstance(backends, Sequence):
        raise TypeError(f"backends: expected a list of Backends, got {type(backends).__name__}")
    _check_int("rows", rows, 1)
    _check_int("seed", seed)
    opts = opts if opts is not None else OpOptions()
    for b in backends:
        opts = _check_common(b, opts, device, d)
    case = make_case(rows, d, seed, dtype, weight_dtype or dtype, device)
    outs: list[Tensor | None] = []
    errors: dict[str, str] = {}
    for b in tqdm(backends, desc="agreement", disable=not progress):
        try:
            y = b.forward(case.x, case.z, case.w, opts)
            if y.shape != case.x.shape or y.dtype != case.x.dtype:
                raise ValueError(f"output {tuple(y.shape)} {y.dtype}, expected {tuple(case.x.shape)} {case.x.dtype}")
            outs.append(_bits(y))
        except Exception as exc:
            outs.append(None)
            errors[_key(b)] = _describe(exc)
    frac: list[list[float | None]] = []
    for a in outs:
        row_f: list[float | None] = []
        for b_ in outs:
            row_f.append(None if a is None or b_ is None else float((a == b_).double().mean()))
        frac.append(row_f)
    summary = {
        "tensor": "y",
        "rows": rows,
        "seed": seed,
        "backends": [_key(b) for b in backends],
        "equal_fraction": frac,
        "errors": errors,
    }
    return CheckResult(summary, [])


# ---------------------------------------------------------------------------------------------
# verdict
# ---------------------------------------------------------------------------------------------


def batch_invariant(
    all_rows_summary: dict[str, Any] | None,
    dweight_summary: dict[str, Any] | None,
    sub_batches_summary: dict[str, Any] | None,
    sweep_summary: dict[str, Any] | None,
) -> bool | None:
    """False on any difference (or a non-repeatable dweight); None if a check is missing or raised; else True."""
    parts = [all_rows_summary, dweight_summary, sub_batches_summary, sweep_summary]
    counts: list[int] = []
    if all_rows_summary:
        counts += [
            v.get("fwd_differ", 0) + v.get("rowgrad_differ", 0)
            for v in all_rows_summary.values()
            if isinstance(v, dict)
        ]
    for s in (sub_batches_summary, sweep_summary):
        if s:
            counts += [s.get("fwd_differ", 0), s.get("rowgrad_differ", 0), s.get("differ", 0)]
    if any(c > 0 for c in counts) or (dweight_summary or {}).get("dweight_repeatable") is False:
        return False
    if any(p is None or "error" in p for p in parts):
        return None
    return True
