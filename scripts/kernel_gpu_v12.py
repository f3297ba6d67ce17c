"""Twelfth GPU call (forward): the per-element second tier (rlnorm/kernel/_exact_element.py) against
the whole-row exact path it replaces, register caps, and the fast path alone; torch.add in the same
run; decode sizes by CUDA-graph replay; accuracy (the tier stressed with a 20x wider bound too) and
bitwise invariance; tier on and off must agree bit for bit (both are the correctly rounded value).
    python3 scripts/kernel_gpu_v12.py   ($OUT/v12/v2.json; summary printed last)
    V12_SECTIONS=shapes python3 scripts/kernel_gpu_v12.py   (D=128 launch shapes, tier on / off)
    V12_SECTIONS=regs python3 scripts/kernel_gpu_v12.py     (the default shapes under register caps)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from rlnorm.inputs import make_case
from rlnorm.numerics import round_once
from rlnorm.reference import gated_rmsnorm_math
from scripts import kernel_gpu_v2 as V

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v12")
T1, T0, NOEX = {"TIER2": 1}, {"TIER2": 0}, {"EXACT": 0}  # tier forced on / off


def agree(name: str, d: int, opts=V.OpOptions(), has_z=True, zscale=1.0, wdtype=torch.bfloat16, near=None) -> None:  # noqa: B008
    """Tier on vs off vs fp64 rounded once, bitwise."""
    c = make_case(V.ROWS, d, seed=11, device=V.DEV, weight_dtype=wdtype)
    z = (c.z.float() * zscale).to(c.z.dtype) if has_z else None
    kw = {"_near": near} if near else {}
    y1 = V.fwd(c.x, z, c.w, opts, _variant=T1, **kw)
    y0 = V.fwd(c.x, z, c.w, opts, _variant=T0, **kw)
    ref = round_once(gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64), torch.bfloat16)
    w1, w0 = int((~V.same_bits(y1, ref)).sum()), int((~V.same_bits(y0, ref)).sum())
    diff = int((~V.same_bits(y1, y0)).sum())
    V.RES.setdefault("agree", []).append({"case": name, "d": d, "wrong_tier": w1, "wrong_rows": w0, "differ": diff})
    V.SUMMARY.append(f"agree {name:<18} d={d} wrong(tier)={w1} wrong(rows)={w0} tier!=rows {diff} of {y1.numel()}")


def planted(d: int) -> None:
    """The tier's margin catches a planted tier error; with the margin under it, wrong outputs show."""
    c = make_case(V.ROWS // 8, d, seed=11, device=V.DEV)
    ref = round_once(gated_rmsnorm_math(c.x, c.z, c.w, V.OpOptions(), torch.float64), torch.bfloat16)
    for name, t2 in (("covered", (1 << 37, 1 << 36)), ("uncovered", (1 << 14, 1 << 36))):
        y = V.fwd(c.x, c.z, c.w, _near=(200, 0), _tier2=t2)
        wrong = int((~V.same_bits(y, ref)).sum())
        V.RES.setdefault("planted", []).append({"d": d, "case": name, "wrong": wrong})
        V.SUMMARY.append(f"planted tier fault 2**36 ulps, margin {name:<9} d={d}: wrong {wrong}")


def shapes() -> None:
    """D=128 launch shapes with the tier forced on and off (8 x 2 with whole rows: sessions 2-5's default)."""
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    var = []
    for r, w in ((8, 2), (4, 1), (4, 2), (16, 2), (16, 4)):
        for name, v in (("tier", T1), ("rows", T0)):
            var.append((f"{name}_R{r}w{w}", {"_variant": v, "_config": (r, 128, w)}))
    V.guarded("shapes128", lambda: V.timing(128, V.ROWS, var, timer))
    for rows in (32, 4096):
        V.guarded(f"shapes128_{rows}", lambda rows=rows: V.graph_time(128, rows, var))


def regs() -> None:
    """The default shapes (D=128 4 x 1, D=256 4 x 2) under register caps, against the old default."""
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    for d in (128, 256):
        var = [(f"tier_m{m}", {"_variant": T1 | {"MAXNREG": m}}) for m in (0, 64, 72, 80)]
        old = {"_variant": T0} | ({"_config": (8, 128, 2)} if d == 128 else {})  # sessions 2-5's forward
        var.append(("rows(old)", old))
        if d == 128:
            var += [(f"tier_R4w2_m{m}", {"_variant": T1 | {"MAXNREG": m}, "_config": (4, 128, 2)}) for m in (0, 64)]
        V.guarded(f"regs{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
        for rows in (32, 512, 4096):
            V.guarded(f"regs{d}_{rows}", lambda d=d, rows=rows, var=var: V.graph_time(d, rows, var))


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    if os.environ.get("V12_SECTIONS") in ("shapes", "regs"):
        shapes() if os.environ["V12_SECTIONS"] == "shapes" else regs()
        print("\n".join(V.SUMMARY))
        return
    cands = [
        ("tier", T1),
        ("tier_m56", T1 | {"MAXNREG": 56}),
        ("tier_m64", T1 | {"MAXNREG": 64}),
        ("rows(old)", T0),
        ("noexact", NOEX),
        ("tier_b", T1),
        ("rows(old)_b", T0),
    ]
    for d in (128, 256):
        var = [(n, {"_variant": v}) for n, v in cands]
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
        for rows in (32, 512, 4096):
            V.guarded(f"graph{d}_{rows}", lambda d=d, rows=rows, var=var: V.graph_time(d, rows, var[:5]))
    for d in (128, 256):
        V.guarded(f"agree{d}", lambda d=d: agree("standard", d))
        V.guarded(f"agree{d}_stress", lambda d=d: agree("stress_T200", d, near=(200, 0)))
        V.guarded(f"planted{d}", lambda d=d: planted(d))
    V.guarded("agree_z32", lambda: agree("z_x32", 128, zscale=32.0))
    V.guarded("agree_z32s", lambda: agree("z_x32_T200", 128, zscale=32.0, near=(200, 0)))
    V.guarded("agree_sig", lambda: agree("sigmoid_T200", 128, V.OpOptions(activation="sigmoid"), near=(200, 0)))
    V.guarded("agree_noz", lambda: agree("no_z_T200", 128, has_z=False, near=(200, 0)))
    V.guarded("agree_w32", lambda: agree("w_fp32_T200", 128, wdtype=torch.float32, near=(200, 0)))
    V.guarded("agree_w16", lambda: agree("w_fp16_T200", 128, wdtype=torch.float16, near=(200, 0)))
    V.guarded("agree_g32", lambda: agree("group32_T200", 128, V.OpOptions(group_size=32), near=(200, 0)))
    V.accuracy_and_invariance()
    V.print_summary()


if __name__ == "__main__":
    main()
