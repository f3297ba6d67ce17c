"""The launchers' limits: every argument the kernels cannot take raises, naming it, before any launch."""

from __future__ import annotations

import pytest
import torch

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET=1 on a machine without a GPU)
from rlnorm.inputs import make_case
from rlnorm.kernel._bwd import rms_norm_gated_bwd
from rlnorm.kernel._dweight import MAX_TILES, MAX_TILES_DEFERRED, column_counters, exact_column_sum
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kit.checks.common import bits
from rlnorm.numerics import exact_sum

TOP = 2.0**127  # the top binade of fp32: its shift (253) puts the hot range as high as it goes


@pytest.mark.parametrize("value", [-TOP, TOP, -torch.finfo(torch.float32).max])
def test_most_tiles_keep_a_first_tile_at_fp32s_top_exact(value: float) -> None:
    # at MAX_TILES the hot range's start is at most 223, so a flush's three limbs stay in windows 6..7
    v = torch.tensor([[value], [1.0], [-3.0]])
    want = exact_sum(v)
    assert want.item() == value  # the small values vanish in the rounding: the sum is the top value
    got = exact_column_sum(v, tiles=MAX_TILES, cold_mode=1, block_rows=1)
    assert torch.equal(bits(got), bits(want))
    got = exact_column_sum(v, tiles=MAX_TILES_DEFERRED, cold_mode=0, block_rows=1)
    assert torch.equal(bits(got), bits(want))


def test_more_tiles_than_the_counters_allow_raise() -> None:
    v = torch.tensor([[-TOP]])
    assert MAX_TILES == 64
    with pytest.raises(ValueError, match=r"tiles: expected 1\.\.64 .*NaN / Inf slots"):
        exact_column_sum(v, tiles=MAX_TILES + 1, cold_mode=1, block_rows=1)
    with pytest.raises(ValueError, match=r"tiles: expected 1\.\.63 with COLD_MODE 0"):
        column_counters(v, tiles=MAX_TILES_DEFERRED + 1, cold_mode=0)
    with pytest.raises(ValueError, match="tiles: expected"):
        column_counters(v, tiles=0)
    with pytest.raises(ValueError, match="cold_mode: expected 0 or 1"):
        column_counters(v, tiles=2, cold_mode=2)


def test_forward_launcher_checks_activation_and_group_size() -> None:
    c = make_case(2, 12, seed=1)
    args = (c.x, c.z, c.w, 1e-6)
    with pytest.raises(ValueError, match="activation: expected 'silu' or 'sigmoid', got 'swish'"):
        rms_norm_gated_fwd(*args, None, True, "swish")  # the launcher takes the normalised name only
    with pytest.raises(ValueError, match="group_size: 5 does not divide the last dimension 12"):
        rms_norm_gated_fwd(*args, 5, True, "silu")
    with pytest.raises(ValueError, match="group_size: -4 does not divide"):
        rms_norm_gated_fwd(*args, -4, True, "silu")
    # the backward launcher refuses the same
    with pytest.raises(ValueError, match="activation: expected"):
        rms_norm_gated_bwd(c.dy, c.x, c.z, c.w, 1e-6, None, True, "swish")
    with pytest.raises(ValueError, match="group_size: 5 does not divide"):
        rms_norm_gated_bwd(c.dy, c.x, c.z, c.w, 1e-6, 5, True, "silu")
    big = torch.zeros(1, 16384, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="8192"):
        rms_norm_gated_bwd(big, big, None, torch.ones(16384), 1e-6, None, True, "silu")
    y = rms_norm_gated_fwd(c.x, c.z, c.w, 1e-6, 4, True, "sigmoid")  # a group that divides is taken
    assert y.shape == (2, 12) and bool(torch.isfinite(y.float()).all())
