"""GPU calls 19-20: the forward's cheaper gate (ACCURATE_ARG 2: log2(e) cut to 16 bits, an exact product
for bf16 z) and bf16 pairs widened by a shift and a mask; the backward's rstd by rsqrt.approx + a Newton
step (RSTD_FAST; call 19 also timed the loop's loads pipelined through shared memory, STAGES, removed
after it: 80ddd21). Timing against the variants they replace, the forward's worst fast-path error
(standard data, z x 32, sigmoid), the checks of scripts/kernel_gpu_v15.py on the new default, and the
backward's dx / dz against fp64 rounded once.
    V18_SECTIONS=fwd,acc,checks,bwd python3 scripts/kernel_gpu_v18.py
Writes $OUT/v18/v2.json and $OUT/v18/bwd18.json; the summary is printed last.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.bench import make_sets
from rlnorm.inputs import make_case
from rlnorm.kernel import _bwd as B
from rlnorm.numerics import round_once, ulp_distance
from rlnorm.reference import gated_rmsnorm_math
from scripts import kernel_gpu_v2 as V
from scripts import kernel_gpu_v15 as V15

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v18")
AA1 = {"ACCURATE_ARG": 1}
ARGS = (1e-6, None, True, "silu")


def over(cfg: dict, sets: list) -> object:
    return lambda: [B.rms_norm_gated_bwd(s[3], s[0], s[1], s[2], *ARGS, config=cfg) for s in sets]


def fwd_timing() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    for d in (128, 256):
        var = [("default", {}), ("aa1", {"_variant": AA1}), ("noexact", {"_variant": {"EXACT": 0}})]
        if d == 128:
            var.append(("m56", {"_variant": {"MAXNREG": 56}}))
        V.timing_passes(d, var, timer, passes=3)


def fwd_accuracy() -> None:
    for d in (128, 256):
        for name, kw in (("aa2", {}), ("aa1", {"_variant": AA1})):
            V.guarded(f"acc_{name}{d}", lambda n=name, d=d, kw=kw: V.accuracy(n, d, kw))
            V.guarded(f"acc_{name}{d}_z32", lambda n=name, d=d, kw=kw: V.accuracy(n + "_z32", d, kw, zscale=32.0))
    sig = V.OpOptions(activation="sigmoid")
    V.guarded("acc_sigmoid", lambda: V.accuracy("aa2_sigmoid", 128, {}, opts=sig))
    V.guarded("acc_sigmoid_z32", lambda: V.accuracy("aa2_sigmoid_z32", 128, {}, opts=sig, zscale=32.0))


BWD = {  # (call 19 also timed STAGES, a `tl.range(num_stages=)` pipeline of the loop's loads: 80ddd21)
    128: [("rstd_ieee", {"RSTD_FAST": 0}), ("rstd_fast", {"RSTD_FAST": 1})],
    256: [("rstd_ieee", {"RSTD_FAST": 0}), ("rstd_fast", {"RSTD_FAST": 1})],
}
BRES: list[dict] = []


def grad_check(d: int, name: str, cfg: dict) -> None:
    """dx, dz against fp64 autograd rounded once: the fraction equal and the worst bf16 ulp distance."""
    c = make_case(65536, d, seed=11, device=V.DEV)
    dx, dz, _ = B.rms_norm_gated_bwd(c.dy, c.x, c.z, c.w, *ARGS, config=cfg)
    x64, z64 = c.x.double().requires_grad_(), c.z.double().requires_grad_()
    r = gated_rmsnorm_math(x64, z64, c.w.double(), V.OpOptions(), torch.float64)
    r.backward(c.dy.double())
    for g, ref in (("dx", x64.grad), ("dz", z64.grad)):
        got = dx if g == "dx" else dz
        u = ulp_distance(got, round_once(ref, torch.bfloat16)).double()
        rec = {"d": d, "name": name, "grad": g, "equal": float((u == 0).double().mean()), "max_ulp": float(u.max())}
        BRES.append(rec)
        V.SUMMARY.append(f"grad d={d} {name:<14} {g} equal={rec['equal']:.6f} max_ulp={rec['max_ulp']:.0f}")


def bwd() -> None:
    for d in (128, 256):
        for name, cfg in BWD[d]:
            V.guarded(f"grad{d}_{name}", lambda d=d, n=name, c=cfg: grad_check(d, n, c))
        for rows in (262144, 4096, 512, 32):
            sets = make_sets(rows, d, torch.bfloat16, "cuda")[: (4 if rows > 4096 else 20)]
            outs = [torch.empty_like(s[0]) for s in sets]

            def add(sets=sets, outs=outs):
                for s, o in zip(sets, outs, strict=True):
                    torch.add(s[0], s[1], out=o)

            add_us = V.graph_us(add, len(sets), reps=10)
            for rep in ("", "_b"):
                for name, cfg in BWD[d]:
                    t = V.graph_us(over(cfg, sets), len(sets), reps=10)
                    BRES.append({"d": d, "rows": rows, "name": name + rep, "us": t, "add_us": add_us})
                    V.SUMMARY.append(
                        f"bwd d={d} rows={rows:<6} {name + rep:<16} {t:7.2f} us  add {add_us:6.2f}"
                        f"  x floor(5) {t / (add_us * 5 / 3):.3f}"
                    )
        os.makedirs(V.OUT, exist_ok=True)
        with open(os.path.join(V.OUT, "bwd18.json"), "w") as fh:
            json.dump(BRES, fh, indent=1)


def main() -> None:
    sections = {"fwd": fwd_timing, "acc": fwd_accuracy, "checks": V15.checks, "bwd": lambda: V.guarded("bwd", bwd)}
    V.run_sections("V18_SECTIONS", sections)


if __name__ == "__main__":
    main()
