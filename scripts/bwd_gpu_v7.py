"""Where the backward's time goes at decode sizes: per-kernel GPU time (torch.profiler, CUPTI) of the
backward and of forward+backward through autograd, and graph time per call of each launcher alone.

    python scripts/bwd_gpu_v7.py   ($OUT/bwd7.json; table printed)
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.profiler import ProfilerActivity, profile

import rlnorm
from rlnorm.bench import make_sets
from rlnorm.kernel import _bwd as B
from rlnorm.kernel import _dweight
from scripts import kernel_gpu_v2 as V

OUT = os.environ.get("OUT", "/tmp")
RES: dict = {"profile": [], "graph": []}


def kernel_times(fn, n: int = 20) -> dict[str, float]:
    """Mean GPU microseconds per call of every kernel `fn` launches (n calls profiled after warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    tot: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            tot[ev.name[:70]] += ev.device_time / n  # us
    return dict(tot)


def shape_cases(d: int, rows: int) -> dict:
    x, z, w, dy = make_sets(rows, d, torch.bfloat16, "cuda")[0]

    def bwd(tiles: int):
        return lambda: B.rms_norm_gated_bwd(dy, x, z, w, 1e-6, None, True, "silu", {"TILES": tiles})

    xr, zr, wr = (t.detach().clone().requires_grad_(True) for t in (x, z, w))

    def fwd_bwd():
        rlnorm.rms_norm_gated(xr, zr, wr).backward(dy)

    cnt = _dweight.new_counters(d, "cuda")
    cnt1 = _dweight.new_counters(d, "cuda", 1)
    return {
        "bwd TILES=1": bwd(1),
        "bwd TILES=31": bwd(31),
        "fwd+bwd (autograd)": fwd_bwd,
        "fwd": lambda: rlnorm.rms_norm_gated(x, z, w),
        "finalize": lambda: _dweight.finalize(cnt, torch.bfloat16),
        "finalize (1 copy)": lambda: _dweight.finalize(cnt1, torch.bfloat16),
        "new_counters": lambda: _dweight.new_counters(d, "cuda"),
    }


def main() -> None:
    for d in (128, 256):
        for rows in (32, 4096):
            for name, fn in shape_cases(d, rows).items():
                try:
                    kt = kernel_times(fn)
                    g = V.graph_us(fn, 1, reps=50)
                except Exception as exc:  # one case failing never stops the table
                    print(f"d={d} rows={rows} {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    continue
                RES["profile"].append({"d": d, "rows": rows, "case": name, "kernels": kt, "graph_us": g})
                top = sorted(kt.items(), key=lambda kv: -kv[1])
                print(
                    f"d={d} rows={rows:<5} {name:<20} graph {g:6.2f} us | sum {sum(kt.values()):6.2f} us | "
                    + "; ".join(f"{k[:40]} {v:.2f}" for k, v in top),
                    flush=True,
                )
    with open(os.path.join(OUT, "bwd7.json"), "w") as f:
        json.dump(RES, f, indent=1)


if __name__ == "__main__":
    main()
