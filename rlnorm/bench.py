"""Speed table: rlnorm and every available peer against a same-run `torch.add` of the same shape.

    python -m rlnorm.bench [--d 128 256] [--rows 262144] [--small-rows 32 512 4096] [--out FILE.json]

Why `torch.add`: the op is memory-bound, so the honest yardstick is the time the same GPU, in the
same process and minute, takes to move the same bytes. Forward moves 3 tensors (read x, z; write
y) like `x + z -> out`; forward+backward moves 8 (x, z, y, dy, dx, dz, and x, z read again), so
its floor is 8/3 of the add. Timings are GPU times (CUDA events through triton.testing.do_bench,
which flushes L2 before each repetition), over rotating input buffers so no run finds its
inputs in L2; median with p20/p80.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlnorm.options import OpOptions

PEERS = [
    "rlnorm",
    "vllm",
    "fla_fused_norm_gate",
    "fla_layernorm_gated",
    "torch_compile",
    "reference",
    "transformers",
]
FWD_TENSORS = 3  # read x, z; write y
FWD_BWD_TENSORS = 8  # forward's 3, then read x, z, dy; write dx, dz (dweight: [D], negligible)
ROTATE_BYTES = 256 << 20  # enough distinct input sets that their total exceeds the 50 MB L2 several times
MAX_SETS = 64

Timer = Callable[[Callable[[], Any]], tuple[float, float, float]]


def gpu_timer(warmup_ms: float = 25, rep_ms: float = 100) -> Timer:
    """(median, p20, p80) microseconds via triton.testing.do_bench (CUDA events, L2 flushed per rep)."""

    def timer(fn: Callable[[], Any]) -> tuple[float, float, float]:
        from triton.testing import do_bench

        med, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
        return med * 1e3, p20 * 1e3, p80 * 1e3

    return timer


def cpu_timer(reps: int = 3) -> Timer:
    """Wall-clock timer for CPU runs (tests): the table logic, no timing claims."""

    def timer(fn: Callable[[], Any]) -> tuple[float, float, float]:
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        ts.sort()
        return statistics.median(ts), ts[0], ts[-1]

    return timer


def _rotating(sets: Sequence[tuple]) -> Callable[[], tuple]:
    """A callable returning the next input set each time: consecutive calls never share buffers."""
    state = {"i": 0}

    def nxt() -> tuple:
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]

    return nxt


def make_sets(rows: int, d: int, dtype: torch.dtype, device: str, seed: int = 11) -> list[tuple]:
    """Distinct (x, z, w, dy) sets on `device`, as many as fill ROTATE_BYTES (2..MAX_SETS)."""
    from rlnorm.inputs import make_case

    c = make_case(rows, d, seed=seed, dtype=dtype, device=device)
    set_bytes = max(1, 3 * rows * d * c.x.element_size())
    n = max(2, min(MAX_SETS, math.ceil(ROTATE_BYTES / set_bytes)))
    return [(c.x.clone(), c.z.clone(), c.w.clone(), c.dy.clone()) for _ in range(n)]


def entry(
    name: str,
    mode: str,
    times: tuple[float, float, float] | None,
    add_us: float | None,
    nbytes: int,
    status: str = "ok",
    reason: str = "",
) -> dict:
    """One table line. ratio = time / floor, the floor being the add (fwd) or 8/3 of it (fwd_bwd)."""
    e: dict[str, Any] = {"name": name, "mode": mode, "status": status, "reason": reason}
    if times is None:
        e.update(us=None, us_p20=None, us_p80=None, ratio=None, gbps=None)
        return e
    med, p20, p80 = times
    floor = None
    if add_us:
        floor = add_us * (FWD_BWD_TENSORS / FWD_TENSORS if mode == "fwd_bwd" else 1.0)
    e.update(
        us=med,
        us_p20=p20,
        us_p80=p80,
        ratio=(med / floor) if floor else None,
        gbps=(nbytes / (med * 1e-6) / 1e9) if med > 0 else None,
    )
    return e


def bench_shape(
    rows: int,
    d: int,
    backends: Sequence[Any],
    device: str,
    timer: Timer,
    dtype: torch.dtype = torch.bfloat16,
    opts: OpOptions | None = None,
) -> dict:
    """Time the add, then every backend's forward and forward+backward on one shape. Never raises for a backend."""
    opts = opts or OpOptions()
    sets = make_sets(rows, d, dtype, device)
    elem = torch.empty((), dtype=dtype).element_size()
    fwd_bytes = FWD_TENSORS * rows * d * elem
    fwd_bwd_bytes = FWD_BWD_TENSORS * rows * d * elem
    outs = [torch.empty_like(s[0]) for s in sets]

    nxt_add = _rotating(list(zip(sets, outs, strict=True)))

    def add() -> None:
        (x, z, _, _), out = nxt_add()
        torch.add(x, z, out=out)

    add_times = timer(add)
    add_us = add_times[0]
    entries = [entry("torch.add", "fwd", add_times, add_us, fwd_bytes)]
    entries[0]["ratio_note"] = "roofline: 3 tensors; fwd_bwd floor = 8/3 of it"
    for b in backends:
        key = getattr(b, "key", repr(b))
        ok, why = b.available(device)
        if not ok:
            entries.append(entry(key, "fwd", None, add_us, fwd_bytes, "unavailable", why))
            continue
        ok, why = b.supports(opts)
        if not ok:
            entries.append(entry(key, "fwd", None, add_us, fwd_bytes, "unsupported", why))
            continue
        nxt = _rotating(sets)

        def fwd(b=b, nxt=nxt) -> None:
            x, z, w, _ = nxt()
            b.forward(x, z, w, opts)

        def fwd_bwd(b=b, nxt=nxt) -> None:
            x, z, w, dy = nxt()
            b.forward_backward(x, z, w, dy, opts)

        for mode, fn, nbytes, wanted in (
            ("fwd", fwd, fwd_bytes, True),
            ("fwd_bwd", fwd_bwd, fwd_bwd_bytes, bool(getattr(b, "has_backward", True))),
        ):
            if not wanted:
                entries.append(entry(key, mode, None, add_us, nbytes, "unavailable", "no backward"))
                continue
            try:
                entries.append(entry(key, mode, timer(fn), add_us, nbytes))
            except Exception as exc:  # one backend failing never stops the table
                entries.append(entry(key, mode, None, add_us, nbytes, "failed", f"{type(exc).__name__}: {exc}"[:300]))
    return {"rows": rows, "d": d, "dtype": str(dtype).replace("torch.", ""), "add_us": add_us, "entries": entries}


def format_table(shape: dict) -> str:
    """A fixed-width table of one shape's entries (unavailable ones with their reason)."""
    head = f"rows={shape['rows']} D={shape['d']} {shape['dtype']}: torch.add {shape['add_us']:.1f} us"
    lines = [head, f"{'backend':<24} {'mode':<8} {'us':>9} {'p20':>9} {'p80':>9} {'x floor':>8} {'GB/s':>7}"]
    for e in shape["entries"]:
        if e["us"] is None:
            lines.append(f"{e['name']:<24} {e['mode']:<8} {e['status']}: {e['reason']}")
            continue
        ratio = f"{e['ratio']:.3f}" if e["ratio"] is not None else "-"
        gbps = f"{e['gbps']:.0f}" if e["gbps"] is not None else "-"
        times = f"{e['us']:>9.1f} {e['us_p20']:>9.1f} {e['us_p80']:>9.1f}"
        lines.append(f"{e['name']:<24} {e['mode']:<8} {times} {ratio:>8} {gbps:>7}")
    return "\n".join(lines)


def environment() -> dict:
    env: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"unavailable: {exc}"
    env["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return env


def run(
    ds: Sequence[int],
    rows: Sequence[int],
    keys: Sequence[str] = PEERS,
    device: str | None = None,
    timer: Timer | None = None,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
) -> dict:
    """Every (rows, D) shape's table, as a JSON-ready dict."""
    from rlnorm.backends import load_backends

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    timer = timer or (gpu_timer() if device.startswith("cuda") else cpu_timer())
    backends = load_backends(keys)
    shapes = []
    for d in ds:
        for r in rows:
            shape = bench_shape(r, d, backends, device, timer, dtype)
            shapes.append(shape)
            if progress:
                print(format_table(shape), flush=True)
                print(flush=True)
    return {"kind": "rlnorm.bench", "environment": environment(), "shapes": shapes}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlnorm.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, nargs="+", default=[128, 256], help="row widths")
    p.add_argument("--rows", type=int, nargs="+", default=[262144], help="large row counts")
    p.add_argument("--small-rows", type=int, nargs="*", default=[32, 512, 4096], help="decode-sized row counts")
    p.add_argument("--backends", nargs="+", default=PEERS, help=f"registered keys or module:attr (default {PEERS})")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu (no timing claims)")
    p.add_argument("--out", default=None, help="write the table as JSON here")
    a = p.parse_args(argv)
    result = run(a.d, [*a.rows, *a.small_rows], a.backends, a.device)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
