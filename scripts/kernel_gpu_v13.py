"""Thirteenth and fourteenth GPU calls (forward): where the per-element tier's cost lies, and the fp64 sum of squares in
the fast path (SUM64: the tier then needs no second pass over x) under register caps; torch.add in the
same run; decode sizes by CUDA-graph replay; SUM64 against the whole-row path and fp64 rounded once,
bitwise (standard data, and the bound widened to T = 200 for every tier option), a planted tier error,
accuracy and batch invariance.
    python3 scripts/kernel_gpu_v13.py   ($OUT/v13/v2.json; summary printed last)
    V13_SECTIONS=v14 python3 scripts/kernel_gpu_v13.py   (call 14: the one-column row path, caps, shapes)
    V13_SECTIONS=v15 python3 scripts/kernel_gpu_v13.py   (call 15: one-warp shapes under caps, two passes)
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


def agree(
    name: str,
    d: int,
    opts=V.OpOptions(),  # noqa: B008
    has_z=True,
    zscale=1.0,
    wdtype=torch.bfloat16,
    near=None,
    variant=S64,
) -> None:
    """`variant` (SUM64 unless said) vs the whole-row path vs fp64 rounded once, bitwise."""
    c = make_case(V.ROWS, d, seed=11, device=V.DEV, weight_dtype=wdtype)
    z = (c.z.float() * zscale).to(c.z.dtype) if has_z else None
    kw = {"_near": near} if near else {}
    y1 = V.fwd(c.x, z, c.w, opts, _variant=variant, **kw)
    y0 = V.fwd(c.x, z, c.w, opts, _variant=T0, **kw)
    ref = round_once(gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64), torch.bfloat16)
    w1, w0 = int((~V.same_bits(y1, ref)).sum()), int((~V.same_bits(y0, ref)).sum())
    diff = int((~V.same_bits(y1, y0)).sum())
    V.RES.setdefault("agree", []).append({"case": name, "d": d, "wrong_variant": w1, "wrong_rows": w0, "differ": diff})
    V.SUMMARY.append(f"agree {name:<18} d={d} wrong(variant)={w1} wrong(rows)={w0} differ {diff} of {y1.numel()}")


def planted(d: int) -> None:
    """SUM64's tier: a planted error inside the margin is caught, one outside it shows."""
    c = make_case(V.ROWS // 8, d, seed=11, device=V.DEV)
    ref = round_once(gated_rmsnorm_math(c.x, c.z, c.w, V.OpOptions(), torch.float64), torch.bfloat16)
    for name, t2 in (("covered", (1 << 37, 1 << 36)), ("uncovered", (1 << 14, 1 << 36))):
        y = V.fwd(c.x, c.z, c.w, _near=(200, 0), _tier2=t2, _variant=S64)
        wrong = int((~V.same_bits(y, ref)).sum())
        V.RES.setdefault("planted", []).append({"d": d, "case": name, "wrong": wrong})
        V.SUMMARY.append(f"planted sum64 tier fault 2**36 ulps, margin {name:<9} d={d}: wrong {wrong}")


def agree_undecided(name: str, d: int, opts=V.OpOptions(), has_z=True, wdtype=torch.bfloat16) -> None:  # noqa: B008
    """Every flagged row through the whole-row path (a margin nothing passes): the one-column-per-thread form."""
    c = make_case(V.ROWS // 4, d, seed=11, device=V.DEV, weight_dtype=wdtype)
    z = c.z if has_z else None
    y = V.fwd(c.x, z, c.w, opts, _near=(200, 0), _tier2=(1 << 50, 0), _variant=T1)
    ref = round_once(gated_rmsnorm_math(c.x, z, c.w, opts, torch.float64), torch.bfloat16)
    wrong = int((~V.same_bits(y, ref)).sum())
    V.RES.setdefault("undecided", []).append({"case": name, "d": d, "wrong": wrong})
    V.SUMMARY.append(f"all-undecided {name:<14} d={d} wrong={wrong} of {y.numel()}")


def v14() -> None:
    """Call 14: the whole-row path one column per thread (registers 96 -> 72 at D=128, 72 -> 64 at D=256)."""
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    for d in (128, 256):
        var = [
            ("tier", {"_variant": T1}),
            ("noexact", {"_variant": {"EXACT": 0}}),
            ("tier_m64", {"_variant": T1 | {"MAXNREG": 64}}),
            ("tier_m56", {"_variant": T1 | {"MAXNREG": 56}}),
            ("sum64_m64", {"_variant": S64 | {"MAXNREG": 64}}),
            ("abl1_nosums_m64", {"_variant": T1 | {"TIER2_ABLATE": 1, "MAXNREG": 64}}),
            ("abl3_neither_m64", {"_variant": T1 | {"TIER2_ABLATE": 3, "MAXNREG": 64}}),
            ("rows(old)", {"_variant": T0}),
        ]
        if d == 128:
            var += [
                (f"tier_R{r}w{w}_m64", {"_variant": T1 | {"MAXNREG": 64}, "_config": (r, 128, w)})
                for r, w in ((8, 2), (4, 2))
            ]
        else:
            var += [
                (f"tier_R{r}w{w}_m64", {"_variant": T1 | {"MAXNREG": 64}, "_config": (r, 256, w)})
                for r, w in ((2, 1), (8, 4))
            ]
            var += [("tier_R2w1_m56", {"_variant": T1 | {"MAXNREG": 56}, "_config": (2, 256, 1)})]
        var += [
            ("tier_b", {"_variant": T1}),
            ("tier_m64_b", {"_variant": T1 | {"MAXNREG": 64}}),
            ("noexact_b", {"_variant": {"EXACT": 0}}),
        ]
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
        small = [v for v in var if not v[0].endswith("_b") and not v[0].startswith("abl1")]
        for rows in (32, 512, 4096):
            V.guarded(f"graph{d}_{rows}", lambda d=d, rows=rows, small=small: V.graph_time(d, rows, small))
    for d in (128, 256):
        V.guarded(f"agree{d}", lambda d=d: agree("standard", d, variant=T1))
        V.guarded(f"agree{d}_stress", lambda d=d: agree("stress_T200", d, near=(200, 0), variant=T1))
    cases = [
        ("silu", V.OpOptions(), True, torch.bfloat16),
        ("sigmoid", V.OpOptions(activation="sigmoid"), True, torch.bfloat16),
        ("no_z", V.OpOptions(), False, torch.bfloat16),
        ("w_fp32", V.OpOptions(), True, torch.float32),
        ("w_fp16", V.OpOptions(), True, torch.float16),
        ("group32", V.OpOptions(group_size=32), True, torch.bfloat16),
        ("gate_first", V.OpOptions(norm_before_gate=False), True, torch.bfloat16),
    ]
    for name, opts, has_z, wd in cases:
        V.guarded(f"undecided_{name}", lambda n=name, o=opts, h=has_z, wd=wd: agree_undecided(n, 128, o, h, wd))
        V.guarded(
            f"agree_{name}",
            lambda n=name, o=opts, h=has_z, wd=wd: agree(n + "_T200", 128, o, h, wdtype=wd, near=(200, 0), variant=T1),
        )
    V.guarded("undecided_256", lambda: agree_undecided("silu", 256))
    for d in (128, 256):
        V.guarded(f"acc{d}", lambda d=d: V.accuracy("tier", d, {"_variant": T1}))
        V.guarded(f"inv{d}", lambda d=d: V.invariance("tier", d, {"_variant": T1}))


def v15() -> None:
    """Call 15: one-warp shapes under register caps at both widths (two passes, to see the noise)."""
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
    shapes = {
        128: [((4, 1), 64), ((4, 1), 56), ((2, 1), 64), ((2, 1), 56), ((8, 2), 56), ((8, 2), 48)],
        256: [((2, 1), 56), ((2, 1), 64), ((1, 1), 48), ((1, 1), 0), ((4, 2), 64), ((4, 2), 48)],
    }
    for d in (128, 256):
        var = [
            ("noexact", {"_variant": {"EXACT": 0}}),
            ("noexact_R2w1", {"_variant": {"EXACT": 0}, "_config": (2, d, 1)}),
        ]
        for (r, w), m in shapes[d]:
            var.append((f"tier_R{r}w{w}_m{m}", {"_variant": T1 | {"MAXNREG": m}, "_config": (r, d, w)}))
        var += [(n + "_b", kw) for n, kw in var]
        V.guarded(f"timing{d}", lambda d=d, var=var: V.timing(d, V.ROWS, var, timer))
        small = [v for v in var if not v[0].endswith("_b")]
        for rows in (32, 512, 4096):
            V.guarded(f"graph{d}_{rows}", lambda d=d, rows=rows, small=small: V.graph_time(d, rows, small))


def main() -> None:
    V.RES["device"] = torch.cuda.get_device_name() if V.DEV == "cuda" else "cpu"
    if os.environ.get("V13_SECTIONS") in ("v14", "v15"):
        v14() if os.environ["V13_SECTIONS"] == "v14" else v15()
        print("\n==== summary ====")
        print("\n".join(V.SUMMARY))
        return
    timer = V.gpu_timer(warmup_ms=20, rep_ms=80)
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
