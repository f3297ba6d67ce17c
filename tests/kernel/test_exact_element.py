"""The forward's per-element second tier (rlnorm/kernel/_exact_element.py): a settled element is the correctly
rounded value, and what it cannot settle goes to the row path (the interpreter runs the tier's math tile-wide)."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest
import torch
from conftest import oracle
from kernel_helpers import DEFAULT, fwd, same

from rlnorm.inputs import make_case
from rlnorm.kernel import _exact_element
from rlnorm.kernel.testing import plant
from rlnorm.options import OpOptions

WIDE = {"NEAR_T": 200}  # the fast path's bound widened: many elements go through the tier
TIER_ON, TIER_OFF = {**WIDE, "TIER2": 1}, {**WIDE, "TIER2": 0}
MOVED = {"tier2_ulps": 1 << 36}  # the planted fault: the tier's value moved 2**36 fp64 ulps
COVERED = {**MOVED, "tier2_margin": 1 << 37}  # a margin above the fault
TIER_CASES = [  # (opts, has_z, w dtype): each gate (silu, sigmoid, none), each weight dtype, groups
    (DEFAULT, True, torch.bfloat16),
    (OpOptions(activation="sigmoid"), True, torch.bfloat16),
    (DEFAULT, False, torch.bfloat16),
    (DEFAULT, True, torch.float32),
    (DEFAULT, True, torch.float16),
    (OpOptions(group_size=32), True, torch.bfloat16),
    # the gate first needs every element's gate for rstd: flagged rows stay with the row path, whatever TIER2 says
    (OpOptions(norm_before_gate=False), True, torch.bfloat16),
]


def fwd_under(switches, faults, *args, **kw):
    with plant(fwd=switches, **faults):
        return fwd(*args, **kw)


@pytest.mark.parametrize(("opts", "has_z", "wdtype"), TIER_CASES)
def test_tier_settles_near_elements_to_the_correctly_rounded_value(opts, has_z, wdtype):
    c = make_case(33, 128, seed=11, weight_dtype=wdtype)
    z = c.z if has_z else None
    ref = oracle(c.x, z, c.w, opts)
    y_tier, _, flags = fwd_under(TIER_ON, {}, c.x, z, c.w, opts, debug=True)
    assert flags.float().mean().item() > 0.003  # the tier had work
    assert same(y_tier, ref)
    assert same(fwd_under(TIER_OFF, {}, c.x, z, c.w, opts), ref)  # the row path it replaces: the same bits


@pytest.mark.parametrize("d", [128, 256])
def test_margin_sends_a_planted_tier_error_to_the_row_path_and_the_default_uses_the_tier(d):
    # the tier's value moved ~128 fp32 ulps: a margin above it sends what the tier cannot place to the row path;
    # under the default margin wrong outputs show with the tier on (the default), not with it off
    c = make_case(32, d, seed=11)
    ref = oracle(c.x, c.z, c.w)
    assert same(fwd_under(TIER_ON, COVERED, c.x, c.z, c.w), ref)
    assert not same(fwd_under(WIDE, MOVED, c.x, c.z, c.w), ref)
    assert same(fwd_under(TIER_OFF, MOVED, c.x, c.z, c.w), ref)


@pytest.mark.parametrize(("d", "group"), [(128, None), (96, None), (200, None), (256, None), (128, 32)])
def test_row_chunk_layouts_and_everything_undecided_are_still_correct(d, group):
    # SPLIT chunks only regroup the columns (widths not a power of two pad the last one); a margin wider than any
    # distance sends every flagged row to the row path (96 and 200 end mid-step), the NaN row to the whole-row path
    c = make_case(32, d, seed=2)
    x = c.x.clone()
    x[5, 3] = float("nan")
    opts = OpOptions(group_size=group)
    ref = oracle(x, c.z, c.w, opts)
    for split, faults in ((1, {}), (2, {}), (2, {"tier2_margin": 1 << 50})):
        assert same(fwd_under({**TIER_ON, "SPLIT": split}, faults, x, c.z, c.w, opts), ref), (split, faults)


_EXP2_COEF = [math.log(2) ** k / math.factorial(k) for k in range(_exact_element._EXP2_DEGREE + 1)]


def run_fp64_ptx(text: str, regs: dict[str, Fraction]) -> dict[str, Fraction]:
    """The fp64 mov / fma lines of the tier's PTX evaluated exactly, without rounding: this checks what the
    text computes (coefficients, their order, operands), not fp64's rounding."""

    def val(op: str) -> Fraction:
        if op.startswith("0d"):
            return Fraction(struct.unpack(">d", bytes.fromhex(op[2:]))[0])
        return regs[op]

    for line in text.strip().splitlines():
        ins, ops = line.split(" ", 1)
        d, *src = [o.strip() for o in ops.split(";")[0].split(",")]
        a = [val(o) for o in src]
        if ins == "mov.f64":
            regs[d] = a[0]
        elif ins == "fma.rn.f64":
            regs[d] = a[0] * a[1] + a[2]
        else:
            raise AssertionError(f"unexpected instruction {ins}")
    return regs


def test_exp2_series_text_computes_two_to_the_f():
    # the tier's exp is 2**n * p(f): p must be the degree-12 series of 2**f, within 2**-50 on |f| <= 1/2
    # (the tier's budget is 2**-43); a coefficient one place off must show
    poly = _exact_element._exp2_poly(_EXP2_COEF)
    for i in range(-16, 17):
        f = Fraction(i, 32)
        got = run_fp64_ptx(poly, {"df": f})["dp"]
        assert abs(float(got) / 2 ** float(f) - 1) < 2**-50, f
    swapped = _EXP2_COEF[:3] + _EXP2_COEF[4:5] + _EXP2_COEF[3:4] + _EXP2_COEF[5:]
    got = run_fp64_ptx(_exact_element._exp2_poly(swapped), {"df": Fraction(1, 2)})["dp"]
    assert abs(float(got) / 2**0.5 - 1) > 2**-20


@pytest.mark.gpu(reason="the inline PTX runs on a GPU only (the interpreter runs the tile-wide form)")
@pytest.mark.parametrize(("opts", "has_z", "wdtype"), TIER_CASES)
def test_ptx_tier_on_the_gpu(opts, has_z, wdtype):
    # the PTX form: tier and row path bitwise equal to fp64 rounded once with many elements in the tier,
    # and the planted tier error caught
    c = make_case(4096, 256, seed=11, weight_dtype=wdtype, device="cuda")
    z = c.z if has_z else None
    ref = oracle(c.x, z, c.w, opts)
    for switches, faults in ((TIER_ON, {}), (TIER_OFF, {}), (TIER_ON, COVERED)):
        assert same(fwd_under(switches, faults, c.x, z, c.w, opts), ref)
    uncovered = {**MOVED, "tier2_margin": _exact_element.MARGIN_ULPS}
    assert opts.norm_before_gate is False or not same(fwd_under(TIER_ON, uncovered, c.x, z, c.w, opts), ref)
