"""Stand-ins the bench tests share: clocks that return fixed times, a fake CUDA graph, planted backends."""

from __future__ import annotations

from unittest import mock

import torch

from rlnorm import timing
from rlnorm.bench import runner
from rlnorm.kit.backends import Backend

TINY = runner.Settings(reps=2, warmup=1, graph_calls=3, graph_replays=2, wall_calls=2, wall_rounds=2, graph_max_rows=64)


class FixedClock(timing.CpuClock):
    """Runs every timed function (so failures surface) and returns fixed times: the logic, not the clock."""

    def __init__(self, us: float = 10.0, wall_us: float = 30.0) -> None:
        self.us, self.wall_us = us, wall_us

    def events(self, fn, reps, warmup):
        fn()
        return timing.Timing(self.us, self.us * 0.9, self.us * 1.1)

    def wall(self, fn, calls, rounds):
        fn()
        return timing.Timing(self.wall_us, self.wall_us * 0.9, self.wall_us * 1.1)


class FakeGraphClock(FixedClock):
    """A stand-in for CUDA graph capture on the CPU.

    Capture runs the calls with `torch.cuda.is_current_stream_capturing()` True, as real capture
    does, so a backend that refuses to run under capture (host syncs) fails here as it would on the
    GPU. Replay recomputes every call and writes into the captured outputs, like a real graph
    writing its static buffers; `lazy=True` plants a graph that replays nothing.
    """

    graphs = True

    def __init__(self, us: float = 10.0, wall_us: float = 30.0, per_call_us: float = 2.0, lazy: bool = False):
        super().__init__(us, wall_us)
        self.per_call_us, self.lazy = per_call_us, lazy

    def capture(self, calls, warmup):
        for c in calls[:warmup]:
            c()
        with mock.patch("torch.cuda.is_current_stream_capturing", return_value=True):
            try:
                outs = [c() for c in calls]
            except Exception as exc:
                raise timing.GraphUnavailable(f"capture failed: {timing.describe_error(exc)}") from exc

        def replay():
            if self.lazy:
                return
            for c, o in zip(calls, outs, strict=True):
                for (_, dst), (_, src) in zip(timing._tensors(o), timing._tensors(c()), strict=True):
                    dst.copy_(src)

        self.n_calls = len(calls)
        return timing.Captured(outs, replay)

    def events(self, fn, reps, warmup):
        fn()
        if getattr(fn, "__name__", "") == "replay":  # a graph replay: n_calls calls' worth of time
            t = self.per_call_us * self.n_calls
            return timing.Timing(t, t, t)
        return super().events(fn, reps, warmup)


class Eager(Backend):
    key = "eager_test"
    source = "test"

    def _fn(self, x, z, w, opts):
        from rlnorm.reference import rms_norm_gated_reference

        return rms_norm_gated_reference(x, z, w, opts)


class Broken(Eager):
    key = "broken_test"

    def forward(self, x, z, w, opts):
        raise RuntimeError("planted failure")

    def _probe(self, device):
        return True, ""


class ForwardOnly(Eager):
    key = "fwd_only_test"
    has_backward = False


class HostSync(Eager):
    """Planted: reads a value back to the host each call, which no CUDA graph can hold."""

    key = "host_sync_test"

    def _fn(self, x, z, w, opts):
        try:
            capturing = torch.cuda.is_current_stream_capturing()
        except RuntimeError:  # a CPU build of torch has no such query outside the fake capture
            capturing = False
        if capturing:
            raise RuntimeError("planted: operation not permitted when stream is capturing (.item())")
        return super()._fn(x, z, w, opts)


def by_key(shape):
    return {(e["name"], e["mode"]): e for e in shape["entries"]}


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return False

    def elapsed_time(self, other) -> float:
        return 0.004  # ms


class FakeStream:
    def __init__(self, *a, **k) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass


class FakeGraph:
    def replay(self) -> None:  # replays nothing: verify_graph must refuse it
        pass
