"""Timing shapes: the add by every clock, then every backend's forward and forward+backward.

The clocks and why every ratio is to a same-run `torch.add` are in docs/benchmarking.md; the clocks
themselves are `rlnorm.timing`'s (shared with the checks). Nothing here prints or parses arguments:
`rlnorm.bench.cli` does, and `rlnorm.bench.table` formats what `run` returns.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from rlnorm.bench.files import RUN
from rlnorm.bench.table import format_table
from rlnorm.bench.variants import Variant, VariantBackend
from rlnorm.bench.variants import describe as describe_variants
from rlnorm.checkout import PACKAGE_DIR
from rlnorm.kit import environment as env
from rlnorm.kit.backends import load_backends
from rlnorm.kit.environment import collect_environment
from rlnorm.options import OpOptions
from rlnorm.timing import (
    FWD_BWD_TENSORS,
    FWD_TENSORS,
    CpuClock,
    CudaClock,
    GraphUnavailable,
    Timing,
    describe_error,
    floor_us,
    make_sets,
    rotating,
    verify_graph,
)

PEERS = [
    "rlnorm",
    "vllm",
    "vllm_native_compiled",
    "fla_fused_norm_gate",
    "fla_layernorm_gated",
    "torch_compile",
    "reference",
    "transformers",
]


@dataclass(frozen=True)
class Settings:
    """How hard to time. QUICK keeps a GPU run of every shape and backend within minutes."""

    reps: int = 50  # events: timed eager calls
    warmup: int = 5  # calls before any timing (compile, autotune, allocator)
    graph_calls: int = 50  # calls captured in one graph
    graph_replays: int = 20  # timed replays of it
    wall_calls: int = 50  # back-to-back calls per wall round
    wall_rounds: int = 5
    graph_max_rows: int = 4096  # shapes up to this many rows get the graph clock


# wall: 5 rounds, because the host path varies by tens of percent between rounds on a shared VM
QUICK = Settings(reps=20, warmup=3, graph_calls=20, graph_replays=10, wall_calls=30, wall_rounds=5)
# one call of each: whether every path runs (tests, a tree checked on the CPU); its times mean nothing
SMOKE = Settings(reps=1, warmup=1, graph_calls=2, graph_replays=1, wall_calls=1, wall_rounds=1)


def entry(
    name: str,
    mode: str,
    times: Timing | None,
    add_us: float | None,
    nbytes: int,
    status: str = "ok",
    reason: str = "",
    method: str | None = None,
    method_reason: str = "",
    wall: Timing | None = None,
    add_wall_us: float | None = None,
    graph_check: str | None = None,
) -> dict:
    """One table line. ratio = GPU time / floor of the add timed by the same method; wall likewise."""
    e: dict[str, Any] = {
        "name": name,
        "mode": mode,
        "status": status,
        "reason": reason,
        "method": method,
        "method_reason": method_reason,
        "graph_check": graph_check,
        "host_bound": bool(times.host_bound) if times else None,
        "add_us": add_us,
    }
    floor = floor_us(add_us, mode)
    if times is None:
        e.update(us=None, us_p20=None, us_p80=None, ratio=None, gbps=None)
    else:
        e.update(
            us=times.us,
            us_p20=times.p20,
            us_p80=times.p80,
            ratio=(times.us / floor) if floor else None,
            gbps=(nbytes / (times.us * 1e-6) / 1e9) if times.us > 0 else None,
        )
    wfloor = floor_us(add_wall_us, mode)
    e.update(
        wall_us=wall.us if wall else None,
        wall_p20=wall.p20 if wall else None,
        wall_p80=wall.p80 if wall else None,
        wall_ratio=(wall.us / wfloor) if wall and wfloor else None,
    )
    return e


def _calls(step: Callable[[Any], Any], sets: Sequence[Any], n: int) -> list[Callable[[], Any]]:
    """n calls of step, call i on input set i mod len(sets) (static buffers for a graph)."""
    k = len(sets)
    return [lambda s=sets[i % k]: step(s) for i in range(n)]


def _cycling(step: Callable[[Any], Any], sets: Sequence[Any]) -> Callable[[], Any]:
    """One call of step per invocation, each on the next input set."""
    nxt = rotating(sets)
    return lambda: step(nxt())


def time_gpu(
    step: Callable[[Any], Any], sets: Sequence[Any], clock: CpuClock, s: Settings, use_graph: bool, why_not: str
) -> tuple[Timing, str, str, str | None]:
    """(timing, method, method_reason, graph_check): the graph clock if asked and it works, else events."""
    if use_graph:
        try:
            calls = _calls(step, sets, s.graph_calls)
            cap = clock.capture(calls, s.warmup)
            try:
                check = verify_graph(cap, calls, clock.sync)
                t = clock.events(cap.replay, s.graph_replays, 1)
            finally:
                del cap
            return t.scaled(1.0 / len(calls)), "graph", "", check
        except GraphUnavailable as exc:
            why_not = str(exc)
        except Exception as exc:  # anything else in capture/replay: fall back, and say why
            why_not = f"graph failed: {describe_error(exc)}"
    return clock.events(_cycling(step, sets), s.reps, s.warmup), "events", why_not, None


def bench_shape(
    rows: int,
    d: int,
    backends: Sequence[Any],
    device: str,
    clock: CpuClock,
    settings: Settings = QUICK,
    dtype: torch.dtype = torch.bfloat16,
    opts: OpOptions | None = None,
    on_backend: Callable[[str], None] | None = None,
) -> dict:
    """The add by every clock, then every backend's forward and forward+backward on one shape.

    Never raises for a backend: unavailable, unsupported and failing ones are entries with a reason.
    """
    opts = opts or OpOptions()
    s = settings
    sets = make_sets(rows, d, dtype, device)
    elem = torch.empty((), dtype=dtype).element_size()
    nbytes = {"fwd": FWD_TENSORS * rows * d * elem, "fwd_bwd": FWD_BWD_TENSORS * rows * d * elem}
    use_graph = rows <= s.graph_max_rows
    why_not = "" if use_graph else f"rows {rows} > graph_max_rows {s.graph_max_rows}: launch cost is small here"
    if use_graph and not clock.graphs:
        use_graph, why_not = False, "no CUDA graphs on this clock (CPU run)"

    add_sets = [(x, z, torch.empty_like(x)) for x, z, _, _ in sets]

    def add_step(a: tuple) -> Tensor:
        return torch.add(a[0], a[1], out=a[2])

    add: dict[str, Timing] = {}
    add_notes: dict[str, str] = {}
    add_check = None
    add["wall"] = clock.wall(_cycling(add_step, add_sets), s.wall_calls, s.wall_rounds)
    add["events"] = clock.events(_cycling(add_step, add_sets), s.reps, s.warmup)
    if use_graph:
        t, method, reason, add_check = time_gpu(add_step, add_sets, clock, s, True, "")
        if method == "graph":
            add["graph"] = t
        else:
            add_notes["graph"] = reason
    primary = "graph" if "graph" in add else "events"
    entries = [
        entry(
            "torch.add",
            "fwd",
            add[primary],
            add[primary].us,
            nbytes["fwd"],
            method=primary,
            method_reason=add_notes.get("graph", why_not if primary == "events" else ""),
            wall=add["wall"],
            add_wall_us=add["wall"].us,
            graph_check=add_check,
        )
    ]
    for b in backends:
        key = getattr(b, "key", repr(b))
        if on_backend:
            on_backend(key)
        ok, why = b.available(device)
        if not ok:
            entries += [entry(key, m, None, None, nbytes[m], "unavailable", why) for m in ("fwd", "fwd_bwd")]
            continue
        ok, why = b.supports(opts)
        if not ok:
            entries += [entry(key, m, None, None, nbytes[m], "unsupported", why) for m in ("fwd", "fwd_bwd")]
            continue

        # a backend timed under kernel switches (a --variant) holds them for all its calls, so that entering
        # them is not timed; plain backends have no context
        with getattr(b, "context", contextlib.nullcontext)():
            entries += _time_backend(key, b, sets, nbytes, clock, s, use_graph, why_not, add, add_notes, opts)
    del sets, add_sets
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


def _time_backend(
    key: str,
    b: Any,
    sets: Sequence[Any],
    nbytes: dict[str, int],
    clock: CpuClock,
    s: Settings,
    use_graph: bool,
    why_not: str,
    add: dict[str, Timing],
    add_notes: dict[str, str],
    opts: OpOptions,
) -> list[dict]:
    """One available backend's forward and forward+backward entries (failures are entries, never raised)."""
    entries: list[dict] = []

    def fwd(a: tuple) -> Tensor:
        return b.forward(a[0], a[1], a[2], opts)

    def fwd_bwd(a: tuple) -> Any:
        return b.forward_backward(a[0], a[1], a[2], a[3], opts)

    for mode, step, wanted in (
        ("fwd", fwd, True),
        ("fwd_bwd", fwd_bwd, bool(getattr(b, "has_backward", True))),
    ):
        if not wanted:
            entries.append(entry(key, mode, None, None, nbytes[mode], "unavailable", "no backward"))
            continue
        try:
            # the wall clock first: it is also the warm-up (compile, autotune) before any graph
            wall = clock.wall(_cycling(step, sets), s.wall_calls, s.wall_rounds)
            t, method, reason, check = time_gpu(step, sets, clock, s, use_graph, why_not)
            add_t = add.get(method)
            if add_t is None:  # the add itself could not be graph-timed: no same-method yardstick
                reason = (reason + "; " if reason else "") + f"no graph-timed add ({add_notes.get('graph')})"
            entries.append(
                entry(
                    key,
                    mode,
                    t,
                    add_t.us if add_t else None,
                    nbytes[mode],
                    method=method,
                    method_reason=reason,
                    wall=wall,
                    add_wall_us=add["wall"].us,
                    graph_check=check,
                )
            )
        except Exception as exc:  # one backend failing never stops the table
            entries.append(entry(key, mode, None, None, nbytes[mode], "failed", describe_error(exc)))
            with contextlib.suppress(Exception):
                clock.sync()
    return entries


NOT_PEERS = ("torch.add", "rlnorm")


def is_peer(name: str) -> bool:
    """Whether a table line is another implementation: not the add, not rlnorm, not an rlnorm variant."""
    return name not in NOT_PEERS and not name.startswith("rlnorm[")


def fastest_peer(entries: Sequence[dict]) -> dict:
    """Per mode: the fastest peer that ran and rlnorm's time over it (>1: rlnorm slower).

    By GPU time (`us`, graph or events clock) and, under `wall`, by eager host-inclusive time: the
    decode target ("no slower than the fastest peer") reads either way, so both are kept.
    """
    out: dict[str, Any] = {}
    for mode in ("fwd", "fwd_bwd"):
        ok = [e for e in entries if e["mode"] == mode and e["status"] == "ok" and e["us"] is not None]
        peers = [e for e in ok if is_peer(e["name"])]
        mine = next((e for e in ok if e["name"] == "rlnorm"), None)
        if not peers:
            out[mode] = None
            continue
        best = min(peers, key=lambda e: e["us"])
        res: dict[str, Any] = {
            "name": best["name"],
            "us": best["us"],
            "method": best["method"],
            "rlnorm_us": mine["us"] if mine else None,
            "rlnorm_over_fastest": (mine["us"] / best["us"]) if mine else None,
            "same_method": (mine["method"] == best["method"]) if mine else None,
            "wall": None,
        }
        walled = [e for e in peers if e.get("wall_us") is not None]
        if walled:
            bw = min(walled, key=lambda e: e["wall_us"])
            mw = mine.get("wall_us") if mine else None
            res["wall"] = {
                "name": bw["name"],
                "us": bw["wall_us"],
                "rlnorm_us": mw,
                "rlnorm_over_fastest": (mw / bw["wall_us"]) if mw is not None and bw["wall_us"] > 0 else None,
            }
        out[mode] = res
    return out


def code_version() -> dict:
    """commit, tracked_tree_dirty, commit_source: what the caller states ($RLNORM_COMMIT /
    $RLNORM_TREE_DIRTY) wins over git, because a copy of the tree sent to a GPU machine may carry a .git
    that is not the code's; what git says is kept beside it."""

    # git's HEAD where a checkout is present (else environment falls back to $RLNORM_COMMIT itself)
    git_head, git_dirty = env.git_commit(), env.tracked_tree_dirty()
    stated = env.commit_from_env()  # validated $RLNORM_COMMIT, or None
    if stated is None:
        return {"commit": git_head, "tracked_tree_dirty": git_dirty, "commit_source": "git"}
    dirty_raw = os.environ.get(env.DIRTY_ENV, "").strip().lower()
    if dirty_raw not in ("", "0", "1", "true", "false"):
        raise ValueError(f"{env.DIRTY_ENV}: expected 0 or 1, got {dirty_raw!r}")
    return {
        "commit": stated,
        "tracked_tree_dirty": None if not dirty_raw else dirty_raw in ("1", "true"),
        "commit_source": env.COMMIT_ENV,
        "git_head": git_head,
        "git_dirty": git_dirty,
    }


def run(
    ds: Sequence[int],
    rows: Sequence[int],
    keys: Sequence[str] = PEERS,
    device: str | None = None,
    clock: CpuClock | None = None,
    settings: Settings = QUICK,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    on_shape: Callable[[dict], None] | None = None,
    variants: Sequence[Variant] = (),
    command: str | None = None,
) -> dict:
    """Every (rows, D) shape's table, as a JSON-ready dict with the environment and the commit.

    on_shape(doc so far) after each shape: lets the CLI keep a partial file should the run be cut.
    variants: rlnorm under kernel switches, each a line of its own right after plain rlnorm (added
    if `keys` lacks it), so each variant's ratio is to the same run's add.
    """
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    clock = clock or (CudaClock(device) if device.startswith("cuda") else CpuClock())
    t0 = time.time()
    if variants and "rlnorm" not in keys:
        keys = ["rlnorm", *keys]
    backends = load_backends(keys)
    if variants:
        at = next(i for i, b in enumerate(backends) if getattr(b, "key", None) == "rlnorm") + 1
        backends[at:at] = [VariantBackend(v) for v in variants]
    shapes: list[dict] = []
    doc = {
        "kind": RUN,
        "command": command,
        "environment": collect_environment(device),
        **code_version(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_time_s": None,
        "complete": False,
        "clock": clock.name,
        "settings": asdict(settings),
        "variants": describe_variants(variants),
        "package_dir": str(PACKAGE_DIR),  # which tree ran (a --base run's is a temporary copy)
        "backend_sources": {getattr(b, "key", "?"): getattr(b, "source", "") for b in backends},
        "shapes": shapes,
    }
    bar = tqdm(total=len(ds) * len(rows) * len(backends), disable=not progress, desc="bench", leave=False)
    for d in ds:
        for r in rows:
            shape = bench_shape(
                r,
                d,
                backends,
                device,
                clock,
                settings,
                dtype,
                on_backend=lambda k, r=r, d=d: (bar.set_postfix_str(f"rows={r} D={d} {k}"), bar.update(1)),
            )
            shapes.append(shape)
            tqdm.write(format_table(shape) + "\n")  # the tables are the progress a log keeps
            doc["wall_time_s"] = round(time.time() - t0, 1)
            if on_shape:
                on_shape(doc)
    bar.close()
    doc["wall_time_s"] = round(time.time() - t0, 1)
    doc["complete"] = True
    return doc
