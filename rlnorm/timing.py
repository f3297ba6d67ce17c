"""Clocks shared by the checks and the benchmark. `CudaClock.events` primes the queue with `torch.cuda._sleep` so its
events bracket GPU time, not the host's enqueue (`host_bound` where the queue still ran dry); `capture` holds calls in
one CUDA graph, checked against an eager call by `verify_graph`. `CpuClock`: the same interface, no timing claims."""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlnorm.inputs import make_case

ROTATE_BYTES = 256 << 20  # enough distinct input sets that their total exceeds the 50 MB L2 several times
MAX_SETS = 64
EVENT_CHUNK = 10  # timed calls per primed chunk: keeps the launch queue (~1000 entries) from filling
MAX_PRIME_US = 500_000.0  # never sleep the GPU longer than this per chunk
MIN_CYCLES_PER_US = 2000.0


@dataclass
class Timing:
    """Microseconds: median, p20, p80 over samples; host_bound only from the events clock."""

    us: float
    p20: float
    p80: float
    host_bound: bool = False


def summarize(samples: Sequence[float], host_bound: bool = False) -> Timing:
    """Median, p20, p80 (linear interpolation between order statistics)."""
    if not samples:
        raise ValueError("samples: expected at least one time")
    s = sorted(samples)

    def q(p: float) -> float:
        lo, frac = divmod(p * (len(s) - 1), 1)
        return s[int(lo)] + (s[min(int(lo) + 1, len(s) - 1)] - s[int(lo)]) * frac

    return Timing(q(0.5), q(0.2), q(0.8), host_bound)


class GraphUnavailable(RuntimeError):
    """This clock or this backend cannot be timed by a CUDA graph here (the reason is recorded)."""


class GraphMismatch(GraphUnavailable):
    """The graph's replay did not reproduce an eager call: its time would not be the backend's."""


@dataclass
class Captured:
    """Calls held by a graph: their outputs (static buffers) and how to replay them all."""

    outs: list[Any]
    replay: Callable[[], None]  # the graph's bound replay, which keeps the graph alive


class CpuClock:
    """perf_counter clocks for CPU runs (tests): no timing claims, no graphs."""

    name = "cpu perf_counter (no timing claims)"
    graphs = False

    def events(self, fn: Callable[[], Any], reps: int, warmup: int) -> Timing:
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(max(1, reps)):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        return summarize(ts)

    def capture(self, calls: Sequence[Callable[[], Any]], warmup: int) -> Captured:
        raise GraphUnavailable("no CUDA device: CUDA graphs need one")

    def sync(self) -> None:
        pass


class CudaClock(CpuClock):
    """CUDA events with a primed queue, and CUDA-graph capture."""

    name = "cuda events (primed queue) / cuda graph replay / host wall clock"
    graphs = True

    def __init__(self, device: str = "cuda") -> None:
        self.device = torch.device(device)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    @functools.cached_property
    def cycles_per_us(self) -> float:
        """GPU clock cycles per microsecond, measured once with `_sleep` (to size the queue prime)."""
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # wake the clocks first
        cycles = 20_000_000
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        self.sync()
        return cycles / max(1.0, a.elapsed_time(b) * 1e3)

    def events(self, fn: Callable[[], Any], reps: int, warmup: int) -> Timing:
        for _ in range(warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()  # GPU idle: this is the host's enqueue time for one call
        host_us = (time.perf_counter() - t0) * 1e6
        self.sync()
        ts: list[float] = []
        host_bound, reps = False, max(1, reps)
        for start in range(0, reps, EVENT_CHUNK):
            n = min(EVENT_CHUNK, reps - start)
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            mark = torch.cuda.Event()
            # the GPU sleeps while the host enqueues the chunk, so each event pair brackets GPU work only
            prime_us = min(MAX_PRIME_US, 3 * n * host_us + 200)
            # at least 2000 cycles/us (H200 boost is 1.98 GHz): a clock calibrated while slow never undersleeps
            torch.cuda._sleep(int(prime_us * max(self.cycles_per_us, MIN_CYCLES_PER_US)))
            mark.record()
            for a, b in ev:
                a.record()
                fn()
                b.record()
            host_bound |= mark.query()  # the sleep ended before the host was done: gaps may be host time
            self.sync()
            ts += [a.elapsed_time(b) * 1e3 for a, b in ev]
        return summarize(ts, host_bound)

    def capture(self, calls: Sequence[Callable[[], Any]], warmup: int) -> Captured:
        """PyTorch's graph rules: warm up on a side stream, then capture every call once."""
        cur = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for c in calls[: max(1, warmup)]:
                c()
        cur.wait_stream(side)
        self.sync()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outs = [c() for c in calls]
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.sync()
            raise GraphUnavailable(f"capture failed: {describe_error(exc)}") from exc
        return Captured(outs, graph.replay)


def describe_error(exc: BaseException) -> str:
    """One line naming an exception: what a skip reason, a record or a capture failure shows."""
    first = next(iter(str(exc).strip().splitlines()), "")
    return f"{type(exc).__name__}: {first}"[:500]


def _tensors(out: Any) -> list[tuple[str, Tensor]]:
    """The tensors a call returned: a forward's y, a Grads' y, dx, dz, dw, or a check's (y, dx, dz)."""
    if isinstance(out, Tensor):
        return [("y", out)]
    if isinstance(out, tuple):
        return [(n, t) for n, t in zip(("y", "dx", "dz"), out, strict=False) if isinstance(t, Tensor)]
    return [(n, getattr(out, n)) for n in ("y", "dx", "dz", "dw") if isinstance(getattr(out, n, None), Tensor)]


def verify_graph(cap: Captured, calls: Sequence[Callable[[], Any]], sync: Callable[[], None]) -> str:
    """Poison the last captured call's outputs, replay, compare with an eager call: 'bitwise' or 'close';
    GraphMismatch where the replay left an output unwritten or wrote something else."""
    if not (got := _tensors(cap.outs[-1])):
        raise GraphMismatch("the captured call returned no tensor")
    for _, t in got:
        if t.is_floating_point():
            t.fill_(float("nan"))
    cap.replay()
    sync()
    got = [(n, t.clone()) for n, t in got]  # the eager call may write the same buffers (out=, caches)
    want = dict(_tensors(calls[-1]()))
    sync()
    verdict = "bitwise"
    for name, g in got:
        w = want.get(name)
        if w is None or w.shape != g.shape:
            raise GraphMismatch(f"replay's {name} has no eager counterpart of its shape")
        if torch.equal(g, w):
            continue
        if torch.allclose(g.float(), w.float(), rtol=1e-2, atol=1e-2):  # NaN (unwritten) never passes
            verdict = "close"
            continue
        diff = (g.float() - w.float()).abs().nan_to_num(float("inf")).max().item()
        raise GraphMismatch(f"replay's {name} differs from an eager call (max abs diff {diff:.3g})")
    return verdict


def make_sets(rows: int, d: int, dtype: torch.dtype, device: str, seed: int = 11) -> list[tuple]:
    """Distinct (x, z, w, dy) sets, as many as fill ROTATE_BYTES (2..MAX_SETS): rotating over them, no timed call
    finds its inputs in L2 because the previous call left them there."""
    c = make_case(rows, d, seed=seed, dtype=dtype, device=device)
    set_bytes = max(1, 3 * rows * d * c.x.element_size())
    n = max(2, min(MAX_SETS, math.ceil(ROTATE_BYTES / set_bytes)))
    return [(c.x.clone(), c.z.clone(), c.w.clone(), c.dy.clone()) for _ in range(n)]
