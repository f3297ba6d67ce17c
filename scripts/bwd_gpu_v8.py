"""Session 4, call 1: the backward's finalize fused into its last program, the counters zeroed by the
forward, one counter copy per 64 vs 512 programs; the forward's launch shape at decode sizes.

    python3 scripts/bwd_gpu_v8.py   ($OUT/bwd8.json; one line per measurement)

Every time is GPU time per call from CUDA-graph replays (`kernel_gpu_v2.graph_us`) over 20 input
sets, or `do_bench` (CUDA events, L2 flushed) at 262144 rows. Bits are checked before timing: the
fused and zeroed paths must give the separate path's dx, dz and dweight, on every repeat.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

import rlnorm
from rlnorm.bench import make_sets
from rlnorm.kernel import _bwd as B
from rlnorm.kernel import _dweight
from rlnorm.kernel import _fwd as F
from scripts import kernel_gpu_v2 as V
from scripts.bwd_gpu_v7 import kernel_times

OUT = os.environ.get("OUT", "/tmp")
RES: dict = {"decode": [], "profile": [], "bits": [], "fwd": []}
ARGS = (1e-6, None, True, "silu")


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16)))


def paths(sets):
    """name -> fn(set) for one forward+backward by each route."""

    def sep(st):
        x, z, w, dy = st
        F.rms_norm_gated_fwd(x, z, w, *ARGS)
        return B.rms_norm_gated_bwd(dy, x, z, w, *ARGS, config={"FUSED_FINAL": 0})

    def fused(st):
        x, z, w, dy = st
        F.rms_norm_gated_fwd(x, z, w, *ARGS)
        return B.rms_norm_gated_bwd(dy, x, z, w, *ARGS)

    def fused_zero(st):
        x, z, w, dy = st
        ws = torch.empty(B.workspace_numel(x.shape[0], x.shape[1], None), dtype=torch.int64, device=x.device)
        F.rms_norm_gated_fwd(x, z, w, *ARGS, zero=ws)
        return B.rms_norm_gated_bwd(dy, x, z, w, *ARGS, workspace=ws)

    grads = [tuple(t.detach().clone().requires_grad_(True) for t in st[:3]) for st in sets]

    def autograd(st, i=[0]):  # noqa: B006 (cycles through its own leaf copies)
        xr, zr, wr = grads[i[0] % len(grads)]
        i[0] += 1
        torch.autograd.grad(rlnorm.rms_norm_gated(xr, zr, wr), (xr, zr, wr), st[3])

    return {"separate": sep, "fused": fused, "fused+zero": fused_zero, "autograd": autograd}


def over(fn, sets):
    """One call of fn on every set (a graph's body)."""
    return lambda: [fn(st) for st in sets]


def cycling(fn, sets):
    """One call of fn on the next set (for do_bench: a different buffer each call)."""
    i = [0]

    def call():
        i[0] += 1
        return fn(sets[i[0] % len(sets)])

    return call


def decode() -> None:
    for pps in (64, 512):
        _dweight.PROGRAMS_PER_STRIPE = pps
        for d in (128, 256):
            for rows in (32, 512, 4096):
                sets = make_sets(rows, d, torch.bfloat16, "cuda")[:20]
                ps = paths(sets)
                # bits first: every route, 5 repeats, against the separate route
                ok = True
                for st in sets[:3]:
                    want = ps["separate"](st)
                    for name in ("fused", "fused+zero"):
                        for _ in range(5):
                            got = ps[name](st)
                            ok &= all(same(a, b) for a, b in zip(got, want, strict=True))
                RES["bits"].append({"pps": pps, "d": d, "rows": rows, "ok": ok})
                line = [f"pps={pps} d={d} rows={rows:<5} bits {'OK' if ok else 'DIFFER'}"]
                for name, fn in ps.items():
                    t = V.graph_us(over(fn, sets), len(sets), reps=20)
                    RES["decode"].append({"pps": pps, "d": d, "rows": rows, "path": name, "us": t})
                    line.append(f"{name} {t:6.2f}")
                print(" | ".join(line), flush=True)
                if d == 128 and rows in (32, 4096):
                    for name in ("separate", "autograd"):
                        kt = kernel_times(over(ps[name], sets[:1]))
                        RES["profile"].append({"pps": pps, "d": d, "rows": rows, "path": name, "kernels": kt})
                        print(
                            f"   profile {name}: "
                            + "; ".join(f"{k[:34]} {v:.2f}" for k, v in sorted(kt.items(), key=lambda kv: -kv[1])),
                            flush=True,
                        )
    _dweight.PROGRAMS_PER_STRIPE = 64


def large() -> None:
    timer = V.gpu_timer()
    for d in (128, 256):
        sets = make_sets(262144, d, torch.bfloat16, "cuda")
        ps = paths(sets[:1])
        for name in ("separate", "fused+zero", "autograd"):
            t = timer(cycling(ps[name], sets))
            RES["decode"].append({"d": d, "rows": 262144, "path": name, "us": t[0]})
            print(f"d={d} rows=262144 {name:<11} {t[0]:7.1f} us (p20 {t[1]:.1f} p80 {t[2]:.1f})", flush=True)


def fwd_shapes() -> None:
    shapes = {128: [None, (4, 128, 1), (8, 128, 1), (2, 128, 1), (4, 128, 2)], 256: [None, (2, 256, 1), (4, 256, 1)]}
    for d, cfgs in shapes.items():
        for rows in (32, 512, 4096):
            sets = make_sets(rows, d, torch.bfloat16, "cuda")[:20]
            add = V.graph_us(over(lambda s: torch.add(s[0], s[1]), sets), len(sets), reps=20)
            line = [f"fwd d={d} rows={rows:<5} add {add:5.2f}"]
            for cfg in cfgs:
                for exact in (1, 0):
                    kw = {"_config": cfg, "_variant": {"EXACT": exact}}
                    t = V.graph_us(over(lambda s, kw=kw: F.rms_norm_gated_fwd(*s[:3], *ARGS, **kw), sets), len(sets))
                    RES["fwd"].append({"d": d, "rows": rows, "config": cfg, "exact": exact, "us": t, "add": add})
                    line.append(f"{cfg or 'default'}{'' if exact else ' noexact'} {t:5.2f}")
            print(" | ".join(line), flush=True)
        sets = make_sets(262144, d, torch.bfloat16, "cuda")
        timer = V.gpu_timer()
        line = [f"fwd d={d} rows=262144 add {timer(cycling(lambda s: torch.add(s[0], s[1]), sets))[0]:6.1f}"]
        for cfg in cfgs:
            t = timer(cycling(lambda s, cfg=cfg: F.rms_norm_gated_fwd(*s[:3], *ARGS, _config=cfg), sets))[0]
            RES["fwd"].append({"d": d, "rows": 262144, "config": cfg, "exact": 1, "us": t})
            line.append(f"{cfg or 'default'} {t:6.1f}")
        print(" | ".join(line), flush=True)


def main() -> None:
    for name, fn in (("decode", decode), ("large", large), ("fwd_shapes", fwd_shapes)):
        try:
            fn()
        except Exception as exc:  # one section failing never stops the others
            import traceback

            traceback.print_exc()
            RES.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}"[:500])
        with open(os.path.join(OUT, "bwd8.json"), "w") as f:
            json.dump(RES, f, indent=1)


if __name__ == "__main__":
    main()
