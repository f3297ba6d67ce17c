"""`rlnorm.kernel.testing.plant`, the one hook into the launches: what the launches receive (read by a spy around
each kernel), and every block restoring the outer switches on exit, also after an exception."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kernel_helpers import assert_grads_same, grads
from launches import Launches, record

from rlnorm.inputs import make_case
from rlnorm.kernel import RMSNormGated, _bwd, _fwd, rms_norm_gated
from rlnorm.kernel._bound import near_threshold
from rlnorm.kernel._switches import bwd_switches, fwd_fault_keywords, fwd_switches
from rlnorm.kernel.testing import BWD_SWITCHES, FWD_SWITCHES, plant


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> tuple[Launches, Launches]:
    fwd = record(monkeypatch, _fwd, "_rms_norm_gated_fwd_kernel")
    return fwd, record(monkeypatch, _bwd, "_rms_norm_gated_bwd_kernel")


def forward_and_backward(case) -> None:
    """The module's forward and its autograd backward: one launch of each kernel."""
    m = RMSNormGated(128, dtype=torch.bfloat16)
    x = case.x.clone().requires_grad_(True)
    m(x, case.z).backward(case.dy)


def picked(launch: dict[str, Any], *names: str) -> tuple[Any, ...]:
    return tuple(launch["kwargs"].get(name) for name in names)


FWD_KEYS = ("EXACT", "NEAR_T", "SPLIT", "maxnreg", "BLOCK_R", "num_warps")
BWD_KEYS = ("TILES", "STAGES", "maxnreg", "BLOCK_R", "num_warps", "COLD_MODE")


def test_a_variant_reaches_both_launches_through_the_module_and_autograd(spies):
    fwd, bwd = spies
    c = make_case(7, 128, seed=2)
    forward_and_backward(c)
    default_fwd, default_bwd = picked(fwd.calls[-1], *FWD_KEYS), picked(bwd.calls[-1], *BWD_KEYS)
    fwd_sw = {"EXACT": 0, "NEAR_T": 3, "SPLIT": 1, "MAXNREG": 96, "BLOCK_R": 8, "NUM_WARPS": 2}
    bwd_sw = {"TILES": 1, "STAGES": 2, "MAXNREG": 100, "BLOCK_R": 4, "NUM_WARPS": 2, "COLD_MODE": 0}
    with plant(fwd=fwd_sw, bwd=bwd_sw):
        forward_and_backward(c)
        with torch.no_grad():
            rms_norm_gated(c.x, c.z, c.w)  # the no-grad route takes the switches too
    assert [picked(got, *FWD_KEYS) for got in fwd.calls[-2:]] == [(0, 3, 1, 96, 8, 2)] * 2
    assert picked(bwd.calls[-1], *BWD_KEYS) == (1, 2, 100, 4, 2, 0)
    forward_and_backward(c)  # restored after the block
    assert (picked(fwd.calls[-1], *FWD_KEYS), picked(bwd.calls[-1], *BWD_KEYS)) == (default_fwd, default_bwd)
    assert default_fwd[:3] == (1, near_threshold(128), 2)  # T from the bound at 128 columns, silu gate


@pytest.mark.parametrize(
    ("fwd", "bwd", "name"),
    [
        ({"NO_SUCH": 1}, None, "NO_SUCH"), ({"exact": 0}, None, "exact"),  # names are upper-case
        ({"EXACT": 2}, None, "EXACT"), ({"NEAR_T": 1.5}, None, "NEAR_T"), ({"NEAR_T": "10"}, None, "NEAR_T"),
        ({"SPLIT": 4}, None, "SPLIT"), ({"BLOCK_R": 3}, None, "BLOCK_R"), ({"NUM_WARPS": 0}, None, "NUM_WARPS"),
        ({"TILES": 4}, None, "TILES"),  # a backward switch given to the forward
        (None, {"TILES": 65}, "TILES"),  # past the dweight counters' window layout (MAX_TILES)
        (None, {"COLD_MODE": 2}, "COLD_MODE"), (None, {"HOT_MODE": 0}, "HOT_MODE"),  # retired
        (None, {"STRIPES": 3}, "STRIPES"),
        (None, {"EXACT": 0}, "EXACT"),  # a forward switch given to the backward
    ],
)  # fmt: skip
def test_bad_switches_are_refused_naming_them_and_listing_the_valid_ones(fwd, bwd, name):
    before = fwd_switches(), bwd_switches()
    with pytest.raises(ValueError, match=rf"^plant: .*\b{name}\b") as err:
        with plant(fwd=fwd, bwd=bwd):
            pass
    table = FWD_SWITCHES if fwd is not None else BWD_SWITCHES
    assert all(f"\n  {switch}: " in str(err.value) for switch in table)
    assert (fwd_switches(), bwd_switches()) == before
    with pytest.raises(TypeError, match="fwd="):
        with plant(fwd=[("EXACT", 0)]):
            pass


def test_switch_values_that_need_the_launch_are_checked_there():
    c = make_case(3, 128, seed=1)
    with pytest.raises(ValueError, match="TILES 64"), plant(bwd={"TILES": 64, "COLD_MODE": 0}):
        _bwd.rms_norm_gated_bwd(c.dy, c.x, c.z, c.w, 1e-6, None, True, "silu")
    x = torch.ones(2, 1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="SPLIT 2"), plant(fwd={"SPLIT": 2}):
        rms_norm_gated(x, x, torch.ones(1, dtype=torch.bfloat16))


def test_blocks_nest_and_each_restores_its_outer_switches_and_faults_also_after_an_exception():
    defaults = dict(fwd_switches()), dict(bwd_switches())
    assert fwd_fault_keywords() == {} and (defaults[0]["EXACT"], defaults[0]["NEAR_T"]) == (1, None)
    with pytest.raises(RuntimeError), plant(fwd={"EXACT": 0, "NEAR_T": 20}, fast_ulps=6, plain_products=True):
        with plant(fwd={"TIER2": 0}, bwd={"STAGES": 2}, no_midpoint_test=True, plain_products=False):  # over the outer
            assert (fwd_switches()["EXACT"], fwd_switches()["TIER2"], fwd_switches()["NEAR_T"]) == (0, 0, -1)
            assert fwd_fault_keywords() == {"FAULT_ULPS": 6}
            with plant(fwd={"EXACT": None}):  # None: back to the default
                assert (fwd_switches()["EXACT"], fwd_switches()["TIER2"]) == (1, 0)
            assert fwd_switches()["EXACT"] == 0 and bwd_switches()["STAGES"] == 2
        assert (fwd_switches()["EXACT"], fwd_switches()["TIER2"], fwd_switches()["NEAR_T"]) == (0, 1, 20)
        assert bwd_switches()["STAGES"] is None and fwd_fault_keywords() == {"FAULT_ULPS": 6, "FTZ": False}
        raise RuntimeError
    assert fwd_fault_keywords() == {} and (dict(fwd_switches()), dict(bwd_switches())) == defaults
    with pytest.raises(TypeError):
        plant(no_such_fault=True)  # type: ignore[call-arg]


def test_a_backward_under_other_switches_than_its_forward_gets_the_same_bits():
    # the forward sizes the backward's counters under the switches then in force; a backward run under others
    # must not use counters of the wrong size (copies of the counters only spread atomics: the same bits)
    c = make_case(7, 128, seed=17)
    leaves = [t.clone().requires_grad_(True) for t in (c.x, c.z, c.w)]
    want = grads(c.x, c.z, c.w, c.dy)
    with plant(bwd={"STRIPES": 4}):
        y = rms_norm_gated(*leaves)
    got_outside = torch.autograd.grad(y, leaves, c.dy)
    y = rms_norm_gated(*leaves)
    with plant(bwd={"STRIPES": 4}):
        got_inside = torch.autograd.grad(y, leaves, c.dy)
    assert_grads_same(got_outside, want, "a backward outside the forward's switches")
    assert_grads_same(got_inside, want, "a backward under other switches than its forward's")
