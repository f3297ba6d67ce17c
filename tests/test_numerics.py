"""The yardsticks must be right before anything is measured with them."""

from __future__ import annotations

import pytest
import torch

from rlnorm.numerics import exact_sum, ordered_int, round_once, round_to_odd_fp32, ulp_distance


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_once_is_nearest_even(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    y = torch.randn(50_000, dtype=torch.float64, generator=g) * 3
    r = round_once(y, dtype)
    up, dn = (r.view(torch.int16) + 1).view(dtype), (r.view(torch.int16) - 1).view(dtype)
    err = (r.double() - y).abs()
    assert bool((err <= (up.double() - y).abs()).all())
    assert bool((err <= (dn.double() - y).abs()).all())


def test_round_once_catches_the_double_rounding_that_a_cast_makes() -> None:
    # 1 + 2^-8 + 2^-30: float32 rounds the 2^-30 away, leaving a tie that bf16 breaks to even (down);
    # the exact value is above the midpoint, so the correct bf16 answer is 1 + 2^-7.
    y = torch.tensor([1 + 2**-8 + 2**-30], dtype=torch.float64)
    assert y.to(torch.bfloat16).item() == 1.0  # the cast through float32 double-rounds
    assert round_once(y, torch.bfloat16).item() == 1 + 2**-7


def test_round_to_odd_keeps_sticky_bit_and_specials() -> None:
    y = torch.tensor([1 + 2**-30, -(1 + 2**-30), 1.0, float("inf"), float("nan"), 2.0**-160], dtype=torch.float64)
    r = round_to_odd_fp32(y)
    bits = r.view(torch.int32)
    assert bits[0] & 1 == 1 and bits[1] & 1 == 1
    assert r[2].item() == 1.0 and r[3].item() == float("inf") and torch.isnan(r[4])
    assert r[5].item() > 0  # below half the smallest subnormal: the odd neighbour, not zero


def test_ulp_distance_counts_representable_values() -> None:
    a = torch.tensor([1.0, 1.0, -0.0, 1.0, float("nan")], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 1.0078125, 0.0, -1.0, 1.0], dtype=torch.bfloat16)
    d = ulp_distance(a, b)
    assert d[:3].tolist() == [0, 1, 0]
    assert d[3].item() == 2 * ordered_int(torch.tensor([1.0], dtype=torch.bfloat16)).item()
    assert d[4].item() == torch.iinfo(torch.int64).max
    with pytest.raises(TypeError, match="b: expected dtype"):
        ulp_distance(a, b.float())


def test_exact_sum_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="values: expected float32"):
        exact_sum(torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="values: expected a 2-D"):
        exact_sum(torch.zeros(2))


def test_exact_sum_keeps_finite_columns_exact_beside_non_finite_ones() -> None:
    inf, nan = float("inf"), float("nan")
    # column 0 is finite and needs the exact sum: 1 + 2**-8 + 2**-60 rounds up to bf16's 1.0078125, while
    # an fp64 sum drops the 2**-60 and leaves the tie 1 + 2**-8, which rounds to even: 1.0
    v = torch.tensor(
        [
            [1 + 2**-8, inf, inf, nan, -inf, 1.0],
            [2**-60, 0.0, -inf, 1.0, -inf, 2.0**-149],
            [0.0, -3e38, 0.0, 0.0, 3e38, 0.0],
        ],
        dtype=torch.float32,
    )
    got = exact_sum(v, torch.bfloat16)
    assert got[0].item() == 1.0078125
    assert got[1].item() == inf  # an infinity decides, whatever the finite values add up to
    assert torch.isnan(got[2]) and torch.isnan(got[3])  # both infinities, or a NaN
    assert got[4].item() == -inf
    assert got[5].item() == 1.0  # the finite columns beside them stay exact
    # a finite column is unaffected by non-finite values in other columns
    assert torch.equal(got[[0, 5]], exact_sum(v[:, [0, 5]].contiguous(), torch.bfloat16))
