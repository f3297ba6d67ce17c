"""Second GPU call: fast-path variants x launch shapes (timing), then accuracy/invariance of the candidates.

    python scripts/kernel_gpu_v2.py      (writes $OUT/v2.json, prints a summary table last)

Variants (rlnorm/kernel/_fwd.py constexprs): A = fp64 sum of squares; B = fp32 sum of squares;
both with the FMA-corrected exp argument and div.approx. C = B with the exact path disabled (its
cost); D = B with div.full; E = the first version (fp64 sums, rounded exp argument, div.full).
"""

from __future__ import annotations

import json
import os
import time
import traceback

import torch

from rlnorm.bench import _rotating, make_sets
from rlnorm.inputs import make_case
from rlnorm.kernel import _fwd as F
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math

QUEUE_PRIME_CYCLES = 200_000_000  # ~0.1 s of GPU clock: longer than enqueueing every rep


def gpu_timer(warmup_ms: float = 25, rep_ms: float = 100):
    """(median, p20, p80) microseconds: CUDA events around each call, L2 flushed before it, the GPU queue
    primed first. triton.testing.do_bench (these probes' timer until session 11) enqueues flush and call
    one rep at a time: a launch whose host path outlasts flush + kernel (this kernel's launcher: 50-85 us
    per call, 150-230 us at 6b4559e with its PTX as a constexpr argument) lets the queue run dry, and the
    host's time enters the result. That made D=128, 262144 rows read 1.3-2x slow in some processes and
    6b4559e look 2-5x slow (docs/kernel-notes.md, session 11)."""

    def timer(fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        est_us = max((time.perf_counter() - t0) / 3 * 1e6, 1.0)
        for _ in range(max(1, int(warmup_ms * 1e3 / est_us))):
            fn()
        reps = max(10, min(100, int(rep_ms * 1e3 / est_us)))  # 4 queue entries per rep: under ~1000
        cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        torch.cuda.synchronize()
        torch.cuda._sleep(QUEUE_PRIME_CYCLES)  # the kit's prime (~0.1 s): longer than enqueueing every rep
        for a, b in ev:
            cache.zero_()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) * 1e3 for a, b in ev)
        return tuple(t[min(len(t) - 1, int(q * len(t)))] for q in (0.5, 0.2, 0.8))

    return timer


OUT = os.environ.get("OUT", "/tmp/kernel_gpu_v2")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROWS = int(os.environ.get("ROWS", "262144"))
A = {"MS_FP64": True, "ACCURATE_ARG": True, "FAST_DIV": True}
B = {"MS_FP64": False, "ACCURATE_ARG": True, "FAST_DIV": True}
D = {"MS_FP64": False, "ACCURATE_ARG": True, "FAST_DIV": False}
E = {"MS_FP64": True, "ACCURATE_ARG": False, "FAST_DIV": False}
RES: dict = {"timing": [], "accuracy": [], "invariance": [], "errors": []}
SUMMARY: list[str] = []


def save() -> None:
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "v2.json"), "w") as f:
        json.dump(RES, f, indent=1)


def guarded(name, fn):
    t0 = time.time()
    try:
        fn()
    except Exception:
        tb = traceback.format_exc()
        print(tb, flush=True)
        RES["errors"].append({"section": name, "traceback": tb[-3000:]})
    print(f"[{name}: {time.time() - t0:.1f}s]", flush=True)
    save()


def same_bits(a, b):
    return (a.view(torch.int16) == b.view(torch.int16)) | (torch.isnan(a) & torch.isnan(b))


def fwd(x, z, w, opts=OpOptions(), **kw):  # noqa: B008
    return F.rms_norm_gated_fwd(x, z, w, opts.eps, opts.group_size, opts.norm_before_gate, opts.activation, **kw)


def timing(d: int, rows: int, variants: list[tuple[str, dict]], timer) -> None:
    sets = make_sets(rows, d, torch.bfloat16, DEV)
    nxt = _rotating([(st, torch.empty_like(st[0])) for st in sets])

    def add():
        (x, z, _, _), o = nxt()
        torch.add(x, z, out=o)

    add_t = timer(add)
    RES["timing"].append({"d": d, "rows": rows, "name": "torch.add", "us": add_t})
    for name, kw in variants:

        def f(kw=kw):
            (x, z, w, _), _ = nxt()
            fwd(x, z, w, **kw)

        try:
            t = timer(f)
        except Exception as exc:
            SUMMARY.append(f"time d={d} rows={rows} {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        RES["timing"].append({"d": d, "rows": rows, "name": name, "us": t, "ratio": t[0] / add_t[0]})
        SUMMARY.append(
            f"time d={d} rows={rows:<7} {name:<16} {t[0]:7.1f} us (p20 {t[1]:6.1f} p80 {t[2]:6.1f})"
            f" add {add_t[0]:6.1f} ratio {t[0] / add_t[0]:.3f}"
        )


def last_regs(jit_fn) -> tuple:
    """(registers, spills) of jit_fn's most recently compiled kernel, if Triton says: a variant's own only right
    after its first compile; a later call that reuses the cache reports the last compile's."""
    try:
        kc = next(iter(jit_fn.device_caches.values()))[0]
        k = list(kc.values())[-1]
        return k.n_regs, k.n_spills
    except Exception as exc:
        return str(exc)[:60], None


def graph_us(fn, calls: int, reps: int = 20) -> float:
    """GPU time per call: median over `reps` replays of a CUDA graph of `fn` (which makes `calls` calls)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    times.sort()
    return times[len(times) // 2]


def graph_time(d: int, rows: int, variants: list[tuple[str, dict]], calls: int = 20, reps: int = 20) -> None:
    """GPU time per call from CUDA-graph replays of `calls` launches over distinct buffers."""
    sets = make_sets(rows, d, torch.bfloat16, DEV)[:calls]

    def timed(fn) -> float:
        return graph_us(fn, len(sets), reps)

    outs = [torch.empty_like(st[0]) for st in sets]

    def add():
        for (x, z, _, _), o in zip(sets, outs, strict=True):
            torch.add(x, z, out=o)

    add_t = timed(add)
    RES["timing"].append({"d": d, "rows": rows, "name": "torch.add(graph)", "us": add_t})
    for name, kw in variants:

        def f(kw=kw):
            for x, z, w, _ in sets:
                fwd(x, z, w, **kw)

        try:
            t = timed(f)
        except Exception as exc:
            SUMMARY.append(f"graph d={d} rows={rows} {name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        RES["timing"].append({"d": d, "rows": rows, "name": name + "(graph)", "us": t, "ratio": t / add_t})
        SUMMARY.append(f"graph d={d} rows={rows:<5} {name:<16} {t:6.2f} us  add {add_t:5.2f}  ratio {t / add_t:.2f}")


def accuracy(name: str, d: int, kw: dict, opts=OpOptions(), has_z=True, zscale=1.0) -> None:  # noqa: B008
    c = make_case(ROWS, d, seed=11, device=DEV)
    z = (c.z.float() * zscale).to(c.z.dtype) if has_z else None
    y = fwd(c.x, z, c.w, opts, **kw)
    _, fast, flags = fwd(c.x, z, c.w, opts, _debug=True, **kw)
    ref64 = gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64)
    ref = round_once(ref64, torch.bfloat16)
    frac = same_bits(y, ref).double().mean().item()
    _, e = torch.frexp(ref64)
    ulp32 = torch.ldexp(torch.ones_like(ref64), e - 24)
    ok = torch.isfinite(ref64) & (ref64.abs() > 1e-30)
    err = torch.where(ok, (fast.double() - ref64).abs() / ulp32, torch.zeros_like(ref64))
    row_flag = flags.bool().any(dim=1)
    rec = {
        "case": name,
        "d": d,
        "kw": {k: v for k, v in kw.items()},
        "correct": frac,
        "wrong": int((~same_bits(y, ref)).sum()),
        "err_max": err.max().item(),
        "err_gt": {str(t): int((err > t).sum()) for t in (3, 4, 5, 6, 7, 8)},
        "flag_rows": row_flag.float().mean().item(),
        "flag_elems": flags.float().mean().item(),
    }
    RES["accuracy"].append(rec)
    SUMMARY.append(
        f"acc {name:<22} d={d} correct={frac:.9f} wrong={rec['wrong']} err_max={rec['err_max']:.2f} "
        f"n(err>5,6,7)={rec['err_gt']['5']},{rec['err_gt']['6']},{rec['err_gt']['7']} rows_exact={rec['flag_rows']:.4f}"
    )


def invariance(name: str, d: int, kw: dict) -> None:
    c = make_case(ROWS, d, seed=3, device=DEV)
    full = fwd(c.x, c.z, c.w, **kw)
    for m in (7, 4097):
        got = torch.cat([fwd(c.x[s : s + m], c.z[s : s + m], c.w, **kw) for s in range(0, ROWS, m)])
        diff = int((~same_bits(got, full).all(dim=1)).sum())
        RES["invariance"].append({"case": name, "d": d, "sub": m, "rows_differ": diff})
        SUMMARY.append(f"inv {name:<10} d={d} sub={m:<5} differ={diff}")
    perm = torch.randperm(ROWS, device=DEV)
    diff = int((~same_bits(fwd(c.x[perm], c.z[perm], c.w, **kw), full[perm]).all(dim=1)).sum())
    SUMMARY.append(f"inv {name:<10} d={d} permuted differ={diff}")


def accuracy_and_invariance(name: str = "default", kw: dict | None = None, dims: tuple[int, ...] = (128, 256)) -> None:
    """Correct rounding and batch invariance of one variant at each width."""
    for d in dims:
        guarded(f"acc{d}", lambda d=d: accuracy(name, d, kw or {}))
        guarded(f"inv{d}", lambda d=d: invariance(name, d, kw or {}))


def timing_passes(d: int, variants: list[tuple[str, dict]], timer, passes: int = 2) -> None:
    """Every variant at ROWS rows, `passes` times interleaved (suffixes _b, _c, ...: the noise shows), then
    once each at decode sizes (32 / 512 / 4096 rows) in CUDA graphs."""
    var = [(n + ("" if p == 0 else "_" + "abcdefgh"[p]), kw) for p in range(passes) for n, kw in variants]
    guarded(f"timing{d}", lambda: timing(d, ROWS, var, timer))
    for rows in (32, 512, 4096):
        guarded(f"graph{d}_{rows}", lambda rows=rows: graph_time(d, rows, variants))


def run_sections(env: str, sections: dict) -> None:
    """Run the named sections the environment variable `env` lists (comma-separated; all when unset), in
    the dict's order, then print the summary."""
    RES["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    chosen = os.environ.get(env, ",".join(sections)).split(",")
    for name, fn in sections.items():
        if name in chosen:
            fn()
    print_summary()


def print_summary() -> None:
    """The summary lines last in the log (what the notes quote), then any section that failed."""
    print("\n==== summary ====")
    print("\n".join(SUMMARY))
    if RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in RES["errors"]])


def main() -> None:
    timer = gpu_timer(warmup_ms=20, rep_ms=80)
    RES["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    off = (-1.0, 0.0)
    v128 = [
        ("E_R16w4(v1)", {"_variant": E, "_config": (16, 128, 4)}),
        ("B_R16w4", {"_variant": B, "_config": (16, 128, 4)}),
        ("B_R8w4", {"_variant": B, "_config": (8, 128, 4)}),
        ("B_R4w2", {"_variant": B, "_config": (4, 128, 2)}),
        ("B_R4w1", {"_variant": B, "_config": (4, 128, 1)}),
        ("B_R2w1", {"_variant": B, "_config": (2, 128, 1)}),
        ("B_R1w1", {"_variant": B, "_config": (1, 128, 1)}),
        ("A_R2w1", {"_variant": A, "_config": (2, 128, 1)}),
        ("A_R8w4", {"_variant": A, "_config": (8, 128, 4)}),
        ("C_R2w1(noexact)", {"_variant": B, "_config": (2, 128, 1), "_near": off}),
        ("C_R8w4(noexact)", {"_variant": B, "_config": (8, 128, 4), "_near": off}),
        ("D_R2w1(divfull)", {"_variant": D, "_config": (2, 128, 1)}),
        ("B_R2w1_T6", {"_variant": B, "_config": (2, 128, 1), "_near": (6.0, 0.0)}),
        ("B_R2w1_T14", {"_variant": B, "_config": (2, 128, 1), "_near": (14.0, 0.0)}),
    ]
    v256 = [
        ("E_R8w4(v1)", {"_variant": E, "_config": (8, 256, 4)}),
        ("B_R8w4", {"_variant": B, "_config": (8, 256, 4)}),
        ("B_R4w4", {"_variant": B, "_config": (4, 256, 4)}),
        ("B_R2w2", {"_variant": B, "_config": (2, 256, 2)}),
        ("B_R2w1", {"_variant": B, "_config": (2, 256, 1)}),
        ("B_R1w1", {"_variant": B, "_config": (1, 256, 1)}),
        ("A_R1w1", {"_variant": A, "_config": (1, 256, 1)}),
        ("C_R1w1(noexact)", {"_variant": B, "_config": (1, 256, 1), "_near": off}),
        ("C_R2w2(noexact)", {"_variant": B, "_config": (2, 256, 2), "_near": off}),
    ]
    guarded("timing128", lambda: timing(128, ROWS, v128, timer))
    guarded("timing256", lambda: timing(256, ROWS, v256, timer))
    for rows in (32, 512, 4096):
        small = [
            ("B_R2w1", {"_variant": B, "_config": (2, 128, 1)}),
            ("B_R8w4", {"_variant": B, "_config": (8, 128, 4)}),
        ]
        guarded(f"timing128_{rows}", lambda rows=rows, small=small: timing(128, rows, small, timer))
        small = [
            ("B_R1w1", {"_variant": B, "_config": (1, 256, 1)}),
            ("B_R2w2", {"_variant": B, "_config": (2, 256, 2)}),
        ]
        guarded(f"timing256_{rows}", lambda rows=rows, small=small: timing(256, rows, small, timer))
    cands = [
        ("B_R2w1", 128, {"_variant": B, "_config": (2, 128, 1)}),
        ("B_R8w4", 128, {"_variant": B, "_config": (8, 128, 4)}),
        ("A_R2w1", 128, {"_variant": A, "_config": (2, 128, 1)}),
        ("B_R1w1", 256, {"_variant": B, "_config": (1, 256, 1)}),
        ("B_R2w2", 256, {"_variant": B, "_config": (2, 256, 2)}),
    ]
    for name, d, kw in cands:
        guarded(f"acc_{name}_{d}", lambda name=name, d=d, kw=kw: accuracy(name, d, kw))
    kw = {"_variant": B, "_config": (2, 128, 1)}
    guarded("acc_wide", lambda: accuracy("B_R2w1_wide_z8", 128, kw, zscale=8.0))
    guarded("acc_nbgF", lambda: accuracy("B_R2w1_nbg_false", 128, kw, OpOptions(norm_before_gate=False)))
    guarded("acc_sigmoid", lambda: accuracy("B_R2w1_sigmoid", 128, kw, OpOptions(activation="sigmoid")))
    guarded("acc_noz", lambda: accuracy("B_R2w1_no_z", 128, kw, has_z=False))
    for name, d, kw in cands[:2] + cands[3:]:
        guarded(f"inv_{name}_{d}", lambda name=name, d=d, kw=kw: invariance(name, d, kw))
    print_summary()


if __name__ == "__main__":
    main()
