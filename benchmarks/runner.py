"""Timing shapes: the add by every clock, then every backend's forward and forward+backward.

The clocks are `rlnorm.timing`'s (shared with the checks); docs/benchmarking.md says what each measures
and why every ratio is to a same-run `torch.add` (8/3 of it for forward+backward). Nothing here parses
arguments (`benchmarks.run` does) or formats (`benchmarks.table`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benchmarks.table import format_markdown
from benchmarks.variants import Variant, VariantBackend
from rlnorm.checkout import PACKAGE_DIR
from rlnorm.kit import environment as env
from rlnorm.kit.backends import load_backends
from rlnorm.options import OpOptions
from rlnorm.timing import (
    CpuClock,
    CudaClock,
    GraphUnavailable,
    Timing,
    describe_error,
    make_sets,
    summarize,
    verify_graph,
)

FWD_TENSORS = 3  # read x, z; write y
FWD_BWD_TENSORS = 8  # forward's 3, then read x, z, dy; write dx, dz (dweight: [D], negligible)

RUN = "rlnorm.bench"  # the JSON kind of one process's run
PEERS = (
    "rlnorm vllm vllm_native_compiled fla_fused_norm_gate fla_layernorm_gated torch_compile reference transformers"
).split()
MODES = ("fwd", "fwd_bwd")


@dataclass(frozen=True)
class Settings:
    """How hard to time. QUICK keeps a GPU run of every shape and backend within minutes."""

    reps: int = 50  # events: timed eager calls
    warmup: int = 5  # calls before any timing (compile, autotune, allocator)
    graph_calls: int = 50  # calls captured in one graph
    graph_replays: int = 20  # timed replays of it
    wall_calls: int = 50  # back-to-back calls per wall round
    wall_rounds: int = 5  # several: the host path varies by tens of percent between rounds on a shared VM
    graph_max_rows: int = 4096  # shapes up to this many rows get the graph clock


QUICK = Settings(reps=20, warmup=3, graph_calls=20, graph_replays=10, wall_calls=30, wall_rounds=5)
# one call of each: whether every path runs (a tree checked on the CPU); its times mean nothing
SMOKE = Settings(reps=1, warmup=1, graph_calls=2, graph_replays=1, wall_calls=1, wall_rounds=1)


def floor_us(add_us: float | None, mode: str) -> float | None:
    """The same-method floor: the add (fwd), or 8/3 of it (fwd_bwd moves 8 tensors to the add's 3)."""
    if not add_us:
        return None
    return add_us * (FWD_BWD_TENSORS / FWD_TENSORS if mode == "fwd_bwd" else 1.0)


def wall_time(clock: CpuClock, fn: Callable[[], Any], calls: int, rounds: int) -> Timing:
    """Host wall clock per call over `calls` back-to-back calls, `rounds` times (the clock syncs each round)."""
    fn()
    clock.sync()
    ts = []
    for _ in range(max(1, rounds)):
        t0 = time.perf_counter()
        for _ in range(max(1, calls)):
            fn()
        clock.sync()
        ts.append((time.perf_counter() - t0) * 1e6 / max(1, calls))
    return summarize(ts)


def entry(name: str, mode: str, status: str = "ok", reason: str = "", t: Timing | None = None, **more: Any) -> dict:
    """One table line. `more`: add_us, wall, add_wall_us, method, method_reason. ratio = GPU time / the floor of
    the add timed by the same method (8/3 of it for fwd_bwd); wall_ratio likewise by the wall clock."""
    wall, floor = more.get("wall"), floor_us(more.get("add_us"), mode)
    wfloor = floor_us(more.get("add_wall_us"), mode)
    e = {"name": name, "mode": mode, "status": status, "reason": reason, "method": more.get("method")}
    e |= {"method_reason": more.get("method_reason", ""), "host_bound": t.host_bound if t else None}
    e |= {"add_us": more.get("add_us"), "us": t and t.us, "us_p20": t and t.p20, "us_p80": t and t.p80}
    e |= {"ratio": t.us / floor if t and floor else None}
    e |= {"wall_us": wall and wall.us, "wall_p20": wall and wall.p20, "wall_p80": wall and wall.p80}
    e |= {"wall_ratio": wall.us / wfloor if wall and wfloor else None}
    return e


def time_gpu(
    step: Callable[[Any], Any], sets: Sequence[Any], clock: CpuClock, s: Settings, use_graph: bool, why_not: str
) -> tuple[Timing, str, str]:
    """(timing, method, why not a graph): the graph clock if asked and it replays what eager calls give,
    else events. Graph call i reads input set i mod len(sets) (static buffers)."""
    if use_graph:
        try:
            calls = [lambda a=a: step(a) for a in (sets * s.graph_calls)[: s.graph_calls]]
            cap = clock.capture(calls, s.warmup)
            try:
                verify_graph(cap, calls, clock.sync)
                t = clock.events(cap.replay, s.graph_replays, 1)
            finally:
                del cap
            n = len(calls)  # one replay runs every captured call
            return Timing(t.us / n, t.p20 / n, t.p80 / n, t.host_bound), "graph", ""
        except GraphUnavailable as exc:
            why_not = str(exc)
        except Exception as exc:  # anything else in capture or replay: fall back, and say why
            why_not = f"graph failed: {describe_error(exc)}"
    return clock.events(_cycling(step, sets), s.reps, s.warmup), "events", why_not


def _cycling(step: Callable[[Any], Any], sets: Sequence[Any]) -> Callable[[], Any]:
    """step on the next set each call: consecutive calls never share buffers."""
    i = [0]

    def call() -> Any:
        i[0] = (i[0] + 1) % len(sets)
        return step(sets[i[0]])

    return call


def bench_shape(
    rows: int,
    d: int,
    backends: Sequence[Any],
    device: str,
    clock: CpuClock,
    settings: Settings = QUICK,
    dtype: torch.dtype = torch.bfloat16,
    on_backend: Callable[[str], None] | None = None,
) -> dict:
    """The add by every clock, then every backend's forward and forward+backward on one shape.

    Never raises for a backend: unavailable, unsupported and failing ones are entries with a reason."""
    opts, s = OpOptions(), settings
    sets = make_sets(rows, d, dtype, device)
    use_graph = rows <= s.graph_max_rows and clock.graphs
    why_not = "" if use_graph else f"rows {rows} > graph_max_rows {s.graph_max_rows}: launch cost is small here"
    if not clock.graphs:
        why_not = "no CUDA graphs on this clock (CPU run)"

    add_sets = [(x, z, torch.empty_like(x)) for x, z, _, _ in sets]

    def add_step(a: tuple) -> Any:
        return torch.add(a[0], a[1], out=a[2])

    add = {"wall": wall_time(clock, _cycling(add_step, add_sets), s.wall_calls, s.wall_rounds)}
    add["events"] = clock.events(_cycling(add_step, add_sets), s.reps, s.warmup)
    add_notes = {}
    if use_graph:
        t, method, reason = time_gpu(add_step, add_sets, clock, s, True, "")
        if method == "graph":
            add["graph"] = t
        else:
            add_notes["graph"] = reason
    primary = "graph" if "graph" in add else "events"
    why = add_notes.get("graph", why_not) if primary == "events" else ""
    yardstick = {"add_us": add[primary].us, "wall": add["wall"], "add_wall_us": add["wall"].us}
    entries = [entry("torch.add", "fwd", "ok", "", add[primary], method=primary, method_reason=why, **yardstick)]

    def timed(b: Any, mode: str) -> dict:
        """One available backend's entry for one mode (a failure is an entry, never raised)."""
        if mode == "fwd_bwd" and not getattr(b, "has_backward", True):
            return entry(b.key, mode, "unavailable", "no backward")

        def step(a: tuple) -> Any:
            return b.forward(*a[:3], opts) if mode == "fwd" else b.forward_backward(*a, opts)

        try:
            # the wall clock first: it is also the warm-up (compile, autotune) before any graph
            wall = wall_time(clock, _cycling(step, sets), s.wall_calls, s.wall_rounds)
            t, method, reason = time_gpu(step, sets, clock, s, use_graph, why_not)
            if method not in add:  # the add itself could not be graph-timed: no same-method yardstick
                reason = f"{reason}; no graph-timed add" if reason else "no graph-timed add"
            add_us = add[method].us if method in add else None
            more = {"wall": wall, "add_wall_us": add["wall"].us, "method": method, "method_reason": reason}
            return entry(b.key, mode, "ok", "", t, add_us=add_us, **more)
        except Exception as exc:  # one backend failing never stops the table
            with contextlib.suppress(Exception):
                clock.sync()
            return entry(b.key, mode, "failed", describe_error(exc))

    for b in backends:
        if on_backend:
            on_backend(b.key)
        ok, why = b.available(device)
        status = "unavailable"
        if ok:
            ok, why = b.supports(opts)
            status = "unsupported"
        if not ok:
            entries += [entry(b.key, m, status, why) for m in MODES]
            continue
        with getattr(b, "context", contextlib.nullcontext)():  # a variant's switches, entered once, not timed
            entries += [timed(b, mode) for mode in MODES]
    return {
        "rows": rows,
        "d": d,
        "dtype": str(dtype).replace("torch.", ""),
        "graph_tried": use_graph,
        "add_us": add[primary].us,
        "add": {m: asdict(t) for m, t in add.items()},
        "add_notes": add_notes,
        "entries": entries,
        "fastest_peer": fastest_peer(entries),
    }


def is_peer(name: str) -> bool:
    """Whether a table line is another implementation: not the add, not rlnorm, not an rlnorm variant."""
    return name not in ("torch.add", "rlnorm") and not name.startswith("rlnorm[")


def fastest_peer(entries: Sequence[dict]) -> dict:
    """Per mode: the fastest peer that ran and rlnorm's time over it (>1: rlnorm slower), by GPU time and,
    under `wall`, by eager host-inclusive time (the decode target reads either way)."""
    out: dict[str, Any] = {}
    for mode in MODES:
        ok = [e for e in entries if e["mode"] == mode and e["status"] == "ok" and e["us"] is not None]
        peers = [e for e in ok if is_peer(e["name"])]
        mine = next((e for e in ok if e["name"] == "rlnorm"), None)
        out[mode] = None
        if not peers:
            continue
        best = min(peers, key=lambda e: e["us"])
        out[mode] = {
            "name": best["name"],
            "us": best["us"],
            "method": best["method"],
            "rlnorm_us": mine["us"] if mine else None,
            "rlnorm_over_fastest": mine["us"] / best["us"] if mine else None,
            "same_method": mine["method"] == best["method"] if mine else None,
            "wall": None,
        }
        walled = [e for e in peers if e.get("wall_us") is not None]
        if walled:
            bw = min(walled, key=lambda e: e["wall_us"])
            mw = mine.get("wall_us") if mine else None
            over = mw / bw["wall_us"] if mw is not None and bw["wall_us"] > 0 else None
            out[mode]["wall"] = {"name": bw["name"], "us": bw["wall_us"], "rlnorm_us": mw, "rlnorm_over_fastest": over}
    return out


def code_version() -> dict:
    """commit and tracked_tree_dirty: what the caller states ($RLNORM_COMMIT, $RLNORM_TREE_DIRTY) wins over
    git, because a copy of the tree sent to a GPU machine may carry a .git that is not the code's."""
    git_head, git_dirty = env.git_commit(), env.tracked_tree_dirty()
    stated = env.commit_from_env()  # validated $RLNORM_COMMIT, or None
    if stated is None:
        return {"commit": git_head, "tracked_tree_dirty": git_dirty, "commit_source": "git"}
    dirty = os.environ.get(env.DIRTY_ENV, "").strip().lower()
    if dirty not in ("", "0", "1", "true", "false"):
        raise ValueError(f"{env.DIRTY_ENV}: expected 0 or 1, got {dirty!r}")
    return {
        "commit": stated,
        "tracked_tree_dirty": None if not dirty else dirty in ("1", "true"),
        "commit_source": env.COMMIT_ENV,
        "git_head": git_head,
        "git_dirty": git_dirty,
    }


def run(
    ds: Sequence[int],
    rows: Sequence[int],
    keys: Sequence[str] = PEERS,
    device: str | None = None,
    settings: Settings = QUICK,
    progress: bool = True,
    on_shape: Callable[[dict], None] | None = None,
    variants: Sequence[Variant] = (),
    command: str | None = None,
    clock: CpuClock | None = None,
) -> dict:
    """Every (rows, D) shape's table, as a JSON-ready dict with the environment and the commit.

    on_shape(doc so far) after each shape (a run cut short keeps its finished shapes). Variants are lines of
    their own right after plain rlnorm (added if `keys` lacks it), so their ratios are to the same add."""
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    clock = clock or (CudaClock(device) if device.startswith("cuda") else CpuClock())
    t0 = time.time()
    if variants and "rlnorm" not in keys:
        keys = ["rlnorm", *keys]
    backends = load_backends(keys)
    at = next((i + 1 for i, b in enumerate(backends) if b.key == "rlnorm"), len(backends))
    backends[at:at] = [VariantBackend(v) for v in variants]
    doc: dict[str, Any] = {
        "kind": RUN,
        "command": command,
        "environment": env.collect_environment(device),
        **code_version(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_time_s": None,
        "complete": False,
        "clock": clock.name,
        "settings": asdict(settings),
        "variants": {v.label: v.switches for v in variants},
        "package_dir": str(PACKAGE_DIR),  # which tree ran (a --base run's is a temporary copy)
        "backend_sources": {b.key: b.source for b in backends},
        "shapes": [],
    }
    bar = tqdm(total=len(ds) * len(rows) * len(backends), disable=not progress, desc="bench", leave=False)
    for d in ds:
        for r in rows:

            def tick(key: str, r: int = r, d: int = d) -> None:
                bar.set_postfix_str(f"rows={r} D={d} {key}")
                bar.update(1)

            shape = bench_shape(r, d, backends, device, clock, settings, on_backend=tick)
            doc["shapes"].append(shape)
            tqdm.write(format_markdown([shape]) + "\n")  # the tables are the progress a log keeps
            doc["wall_time_s"] = round(time.time() - t0, 1)
            if on_shape:
                on_shape(doc)
    bar.close()
    doc["complete"] = True
    return doc
