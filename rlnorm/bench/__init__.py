"""Speed table: rlnorm and every available peer against a same-run `torch.add` of the same shape.

    python -m rlnorm.bench [--quick] [--d 128 256] [--rows 262144] [--small-rows 32 512 4096]
                           [--backends KEY ...] [--out FILE.json] [--force] [--no-progress]

Why `torch.add`: the op is memory-bound, so the honest yardstick is the time the same GPU, in the
same process and minute, takes to move the same bytes. Forward moves 3 tensors (read x, z; write
y) like `x + z -> out`; forward+backward moves 8 (x, z, y, dy, dx, dz, and x, z read again), so
its floor is 8/3 of the add. Every backend's ratio divides by the add timed THE SAME WAY.

Three clocks, because one number cannot say both what the kernel costs and what a caller pays:
- `graph` (decode sizes, rows <= --graph-max-rows): N calls captured in one CUDA graph (warm-up
  on a side stream, inputs in static buffers rotating over distinct sets, forward+backward
  captured with its autograd), replays timed with CUDA events: GPU time per call without the
  Python/launch path. The replay is checked against an eager call on poisoned (NaN) outputs, so
  a graph that captured nothing, or something else, is refused rather than timed.
- `events` (large shapes, and any backend a graph cannot hold: host syncs, autotuners that
  benchmark during capture, ...): eager calls with CUDA events around each, the GPU queue primed
  with `torch.cuda._sleep` so the host enqueues ahead and events measure GPU time. If the GPU
  ran dry before the host had enqueued everything, the entry says `host_bound` (times then
  include host overhead).
- `wall` (every shape): eager calls back to back, host clock around them and a final sync:
  what a Python caller pays per call, host overhead included.
Inputs rotate over distinct buffers so no call finds its inputs in L2 because the previous call
put them there: at 262144 rows each set is larger than the 50 MB L2. At decode sizes all sets
together fit in L2, as a real decode step's inputs (just written by the previous op) do; the add
has the same advantage. Median with p20/p80.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlnorm.kit import environment as env
from rlnorm.kit.artifact import jsonable, write_artifact
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
    "fla_fused_norm_gate",
    "fla_layernorm_gated",
    "torch_compile",
    "reference",
    "transformers",
]
LAUNCH_BOUND_US = 10.0  # a graph-timed add shorter than this is a launch, not a memory floor (H200: ~1-3 us)
EXIT_EXISTS = 3  # like `python -m rlnorm run`: the output is there and --force was not given


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

        def fwd(a: tuple, b: Any = b) -> Tensor:
            return b.forward(a[0], a[1], a[2], opts)

        def fwd_bwd(a: tuple, b: Any = b) -> Any:
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


NOT_PEERS = ("torch.add", "rlnorm")


def fastest_peer(entries: Sequence[dict]) -> dict:
    """Per mode: the fastest peer that ran and rlnorm's time over it (>1: rlnorm slower).

    By GPU time (`us`, graph or events clock) and, under `wall`, by eager host-inclusive time: the
    decode target ("no slower than the fastest peer") reads either way, so both are kept.
    """
    out: dict[str, Any] = {}
    for mode in ("fwd", "fwd_bwd"):
        ok = [e for e in entries if e["mode"] == mode and e["status"] == "ok" and e["us"] is not None]
        peers = [e for e in ok if e["name"] not in NOT_PEERS]
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


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _cell(e: dict | None) -> tuple[str, str]:
    if e is None:
        return "", ""
    if e["us"] is None:
        return f"{e['status']}", ""
    star = "*" if e.get("host_bound") else ""
    return f"{e['us']:.1f}{star}", f"{_num(e['ratio'], '.2f')}x"


def format_markdown(shapes: Sequence[dict]) -> str:
    """One markdown table for all shapes (paste into a closing note), then footnotes with every reason."""
    lines = [
        "| rows | D | backend | fwd us | fwd / add | fwd+bwd us | fwd+bwd / (8/3 add) | method | eager fwd us "
        "| eager fwd+bwd us |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    notes: dict[str, list[str]] = {}  # one line per distinct message, with where it applies

    def note(msg: str, where: str) -> None:
        notes.setdefault(msg, []).append(where)

    for sh in shapes:
        names: list[str] = []
        for e in sh["entries"]:
            if e["name"] not in names:
                names.append(e["name"])
        for name in names:
            by = {e["mode"]: e for e in sh["entries"] if e["name"] == name}
            f, fb = by.get("fwd"), by.get("fwd_bwd")
            fus, fr = _cell(f)
            bus, br = _cell(fb) if name != "torch.add" else ("", "")
            methods = "/".join(dict.fromkeys(e["method"] for e in (f, fb) if e and e.get("method")))
            wf = _num(f["wall_us"], ".1f") if f else ""
            wb = _num(fb["wall_us"], ".1f") if fb else ""
            lines.append(
                f"| {sh['rows']} | {sh['d']} | {name} | {fus} | {fr} | {bus} | {br} | {methods} | {wf} | {wb} |"
            )
            for e in (f, fb):
                if e is None:
                    continue
                where = f"{sh['rows']}x{sh['d']} {e['mode']}"
                if e["status"] != "ok":
                    note(f"{name}: {e['status']}: {e['reason']}", where)
                elif e.get("method") == "events" and sh.get("graph_tried"):
                    note(f"{name}: events, not graph: {e['method_reason']}", where)
                if e.get("host_bound"):
                    note(f"{name}: * the GPU queue ran dry while timing, so the time includes host overhead", where)
        for mode, fp in (sh.get("fastest_peer") or {}).items():
            if fp and fp.get("rlnorm_over_fastest") is not None:
                same = "" if fp["same_method"] else " (different clocks)"
                w = fp.get("wall") or {}
                eager = (
                    f"; eager {w['rlnorm_over_fastest']:.2f}x ({w['name']}, {w['us']:.1f} us)"
                    if w.get("rlnorm_over_fastest") is not None
                    else ""
                )
                note(
                    f"rows={sh['rows']} D={sh['d']} {mode}: rlnorm {fp['rlnorm_over_fastest']:.2f}x the fastest peer "
                    f"({fp['name']}, {fp['us']:.1f} us, {fp['method']}){same}{eager}",
                    "",
                )
    everywhere = sorted({f"{sh['rows']}x{sh['d']} {m}" for sh in shapes for m in ("fwd", "fwd_bwd")})

    def places(w: list[str]) -> str:
        if not any(w):
            return ""
        return " [every shape]" if sorted(set(w)) == everywhere else f" [{', '.join(w)}]"

    # the add's graph-timed entry per shape (a run's or a merge's): a graph times large shapes too
    # (--graph-max-rows), and only a short add is a launch rather than a memory floor
    graph_add = {
        f"{sh['rows']}x{sh['d']}": e["us"]
        for sh in shapes
        for e in sh["entries"]
        if e["name"] == "torch.add" and e.get("method") == "graph" and e["us"] is not None
    }
    if graph_add:
        small = [k for k, us in graph_add.items() if us < LAUNCH_BOUND_US]
        large = [k for k, us in graph_add.items() if us >= LAUNCH_BOUND_US]
        if small:
            note(
                f"graph rows, add under {LAUNCH_BOUND_US:g} us ({', '.join(small)}): GPU time per call inside a "
                "CUDA graph; there the add is launch-bound (~1-3 us), so x add ratios compare with one launch, "
                "not a memory floor: read the fastest-peer lines.",
                "",
            )
        if large:
            note(
                f"graph rows, add of {LAUNCH_BOUND_US:g} us or more ({', '.join(large)}): GPU time per call "
                "inside a CUDA graph, with no host time in it; the add there is the memory floor.",
                "",
            )
        note("Eager columns: back-to-back Python calls, host overhead included.", "")
    out = ["", *(f"- {m}{places(w)}" for m, w in notes.items())]
    return "\n".join(lines + (out if notes else []))


def format_table(shape: dict) -> str:
    """A fixed-width table of one shape (the progress print): GPU time, ratio, method, wall."""
    add_bits = ", ".join(f"{m} {t['us']:.2f}" for m, t in shape["add"].items())
    head = f"rows={shape['rows']} D={shape['d']} {shape['dtype']}: torch.add us ({add_bits})"
    lines = [
        head,
        f"{'backend':<22} {'mode':<8} {'us':>9} {'p20':>9} {'p80':>9} {'x floor':>8} {'GB/s':>7} "
        f"{'method':<7} {'wall us':>9}",
    ]
    for e in shape["entries"]:
        if e["us"] is None:
            lines.append(f"{e['name']:<22} {e['mode']:<8} {e['status']}: {e['reason'][:200]}")
            continue
        times = f"{e['us']:>9.2f} {e['us_p20']:>9.2f} {e['us_p80']:>9.2f}"
        hb = "*" if e.get("host_bound") else " "
        lines.append(
            f"{e['name']:<22} {e['mode']:<8} {times} {_num(e['ratio'], '.3f'):>8} {_num(e['gbps'], '.0f'):>7} "
            f"{e['method'] + hb:<7} {_num(e['wall_us'], '.1f'):>9}"
        )
    return "\n".join(lines)


def code_version() -> dict:
    """commit, tracked_tree_dirty, commit_source: what the caller states ($RLNORM_COMMIT /
    $RLNORM_TREE_DIRTY) wins over git, because the GPU machine's copy of the tree may carry a stale
    .git (seen: it reported an earlier commit under later code). git's view is kept too."""

    # git's HEAD where a checkout is present (else environment falls back to $RLNORM_COMMIT itself)
    git_head, git_dirty = env.git_commit(), env.tracked_tree_dirty()
    stated = env._env_commit()  # validated $RLNORM_COMMIT, or None
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
) -> dict:
    """Every (rows, D) shape's table, as a JSON-ready dict with the environment and the commit.

    on_shape(doc so far) after each shape: lets the CLI keep a partial file should the run be cut.
    """
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    clock = clock or (CudaClock(device) if device.startswith("cuda") else CpuClock())
    t0 = time.time()
    backends = load_backends(keys)
    shapes: list[dict] = []
    doc = {
        "kind": "rlnorm.bench",
        "environment": collect_environment(device),
        **code_version(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_time_s": None,
        "complete": False,
        "clock": clock.name,
        "settings": asdict(settings),
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


def add_out_arguments(p: argparse.ArgumentParser, help_out: str) -> None:
    """--out and --force, as every table-writing command takes them."""
    p.add_argument("--out", default=None, help=help_out)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def out_taken(out: str | None, force: bool) -> bool:
    """True (said on stderr) if out exists and force is not given: checked before any work is done."""
    if out and Path(out).exists() and not force:
        print(f"--out: {out!r} already exists; pass --force to replace it", file=sys.stderr)
        return True
    return False


def write_table(doc: dict, out: str, force: bool) -> int:
    """doc as JSON at out, atomically: 0, or EXIT_EXISTS (said on stderr) if out exists and not force."""

    try:
        write_artifact(jsonable(doc, "$"), out, overwrite=force, validate=False)
    except FileExistsError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_EXISTS
    print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlnorm.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, nargs="+", default=[128, 256], help="row widths")
    p.add_argument("--rows", type=int, nargs="+", default=[262144], help="large row counts")
    p.add_argument("--small-rows", type=int, nargs="*", default=[32, 512, 4096], help="decode-sized row counts")
    p.add_argument("--backends", nargs="+", default=PEERS, help=f"registered keys or module:attr (default {PEERS})")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu (no timing claims)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions: every shape and backend in minutes")
    p.add_argument("--graph-calls", type=int, default=None, help="calls captured per CUDA graph")
    p.add_argument("--graph-max-rows", type=int, default=None, help="shapes up to this many rows use graphs")
    add_out_arguments(p, "write the table as JSON here (atomic)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (per-shape tables still print)")
    a = p.parse_args(argv)
    if out_taken(a.out, a.force):
        return EXIT_EXISTS
    settings = QUICK if a.quick else Settings()
    overrides = (("graph_calls", a.graph_calls), ("graph_max_rows", a.graph_max_rows))
    changes = {k: v for k, v in overrides if v is not None}
    if changes:
        settings = Settings(**{**asdict(settings), **changes})
    for name, v in asdict(settings).items():
        if v < 1:
            p.error(f"{name}: expected >= 1, got {v}")

    partial = Path(f"{a.out}.partial") if a.out else None

    def keep_partial(doc: dict) -> None:  # a run cut short (timeout) still leaves every finished shape
        if partial is not None:
            write_artifact(jsonable(doc, "$"), partial, overwrite=True, validate=False)

    result = run(
        a.d,
        [*a.rows, *a.small_rows],
        a.backends,
        a.device,
        settings=settings,
        progress=not a.no_progress,
        on_shape=keep_partial,
    )
    print(format_markdown(result["shapes"]))
    env = result["environment"]
    libs = env.get("libraries", {})
    print(
        f"\n{env.get('gpu')} | torch {libs.get('torch')} | triton {libs.get('triton')} | "
        f"commit {result['commit']}{' (dirty)' if result['tracked_tree_dirty'] else ''} | {result['wall_time_s']} s"
    )
    if a.out:
        if write_table(result, a.out, a.force) != 0:
            return EXIT_EXISTS
        if partial is not None:
            partial.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
