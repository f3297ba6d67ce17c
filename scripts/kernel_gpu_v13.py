"""Thirteenth GPU call (forward): where the per-element tier's cost lies, and the fp64 sum of squares in
the fast path (SUM64: the tier then needs no second pass over x) under register caps; torch.add in the
same run; decode sizes by CUDA-graph replay; SUM64 against the whole-row path and fp64 rounded once,
bitwise (standard data, and the bound widened to T = 200 for every tier option), a planted tier error,
accuracy and batch invariance.
    python3 scripts/kernel_gpu_v13.py   ($OUT/v13/v2.json; summary printed last)
Ablations (TIER2_ABLATE, timing only, NOT correctly rounded): 1 no fp64 row sums (rstd64 = fp32 rstd),
2 no per-element PTX, 3 neither (the branch and the reductions alone).
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

V.OUT = os.path.join(os.environ.get("OUT", "/tmp"), "v13")
T1, T0, S64 = {"TIER2": 1}, {"TIER2": 0}, {"TIER2": 1, "SUM64": 1}


def agree(name: str, d: int, opts=V.OpOptions(), has_z=True, zscale=1.0, wdtype=torch.bfloat16, near=None) -> None:  # noqa: B008
    """SUM64 vs the whole-row path vs fp64 rounded once, bitwise."""
    c = make_case(V.ROWS, d, seed=11, device=V.DEV, weight_dtype=wdtype)
    z = (c.z.float() * zscale).to(c.z.dtype) if has_z else None
    kw = {"_near": near} if near else {}
    y1 = V.fwd(c.x, z, c.w, opts, _variant=S64, **kw)
    y0 = V.fwd(c.x, z, c.w, opts, _variant=T0, **kw)
    ref = round_once(gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64), torch.bfloat16)
    w1, w0 = int((~V.same_bits(y1, ref)).sum()), int((~V.same_bits(y0, ref)).sum())
    diff = int((~V.same_bits(y1, y0)).sum())
    V.RES.setdefault("agree", []).append({"case": name, "d": d, "wrong_sum64": w1, "wrong_rows": w0, "differ": diff})
    V.SUMMARY.append(f"agree {name:<18} d={d} wrong(sum64)={w1} wrong(rows)={w0} differ {diff} of {y1.numel()}")


def planted(d: int) -> None:
    """SUM64's tier: a planted error inside the margin is caught, one outside it shows."""
    c = make_case(V.ROWS // 8, d, seed=11, device=V.DEV)
    ref = round_once(gated_rmsnorm_math(c.x, c.z, c.w, V.OpOptions(), torch.float64), torch.bfloat16)
    for name, t2 in (("covered", (1 << 37, 1 << 36)), ("uncovered", (1 << 14, 1 << 36))):
        y = V.fwd(c.x, c.z, c.w, _near=(200, 0), _tier2=t2, _variant=S64)
        wrong = int((~V.same_bits(y, ref)).sum())
        V.RES.setdefault("planted", []).append({"d": d, "case": name, "wrong": wrong})
        V.SUMMARY.append(f"planted sum64 tier fault 2**36 ulps, margin {name:<9} d={d}: wrong {wrong}")


def main() -> None:
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    V.RES["device"] = torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    for d in (128, 256):
        var = [
            ("tier", {"_variant": T1}),
            ("sum64", {"_variant": S64}),
            ("noexact", {"_variant": {"EXACT": 0}}),
            ("abl1_nosums", {"_variant": T1 | {"TIER2_ABLATE": 1}}),
            ("abl2_noptx", {"_variant": T1 | {"TIER2_ABLATE": 2}}),
            ("abl3_neither", {"_variant": T1 | {"TIER2_ABLATE": 3}}),
            ("rows(old)", {"_variant": T0}),
        ]
        for m in (64, 72, 80):
            var += [(f"tier_m{m}", {"_variant": T1 | {"MAXNREG": m}})]
            var += [(f"sum64_m{m}", {"_variant": S64 | {"MAXNREG": m}})]
        if d == 128:
            var += [(f"sum64_R{r}w{w}", {"_variant": S64, "_config": (r, 128, w)}) for r, w in ((4, 2), (8, 2), (8, 1))]
        var += [("tier_b", {"_variant": T1}), ("sum64_b", {"_variant": S64})]
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
        small = [v for v in var if v[0] in ("tier", "sum64", "noexact", "abl3_neither", "sum64_m64", "sum64_m72")]
        small += [v for v in var if v[0].startswith("sum64_R")]
        for rows in (32, 512, 4096):
            V.guarded(f"graph{d}_{rows}", lambda d=d, rows=rows, small=small: V.graph_time(d, rows, small))
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
    for d in (128, 256):
        V.guarded(f"acc{d}", lambda d=d: V.accuracy("sum64", d, {"_variant": S64}))
        V.guarded(f"inv{d}", lambda d=d: V.invariance("sum64", d, {"_variant": S64}))
    print("\n==== summary ====")
    print("\n".join(V.SUMMARY))
    if V.RES["errors"]:
        print("ERRORS in sections:", [e["section"] for e in V.RES["errors"]])


if __name__ == "__main__":
    main()
