"""The protocol's inputs: seeded, identical across devices, drawn in the documented order."""

from __future__ import annotations

import pytest
import torch

from rlnorm.inputs import DY_SEED_OFFSET, make_case


def test_same_seed_same_bits_and_documented_draw_order() -> None:
    a, b = make_case(7, 128, seed=3), make_case(7, 128, seed=3)
    for t, u in zip((a.x, a.z, a.w, a.dy), (b.x, b.z, b.w, b.dy), strict=True):
        assert torch.equal(t.view(torch.int16), u.view(torch.int16))
    g = torch.Generator().manual_seed(3)
    x = 2 * torch.randn(7, 128, generator=g)
    z = torch.randn(7, 128, generator=g)
    w = 1 + 0.1 * torch.randn(128, generator=g)  # drawn after x and z
    dy = torch.randn(7, 128, generator=torch.Generator().manual_seed(3 + DY_SEED_OFFSET))
    assert torch.equal(a.x, x.bfloat16()) and torch.equal(a.z, z.bfloat16())
    assert torch.equal(a.w, w.bfloat16()) and torch.equal(a.dy, dy.bfloat16())


def test_rows_restriction_and_weight_dtype() -> None:
    c = make_case(63, 96, seed=5, weight_dtype=torch.float32)
    assert c.w.dtype == torch.float32 and c.x.dtype == torch.bfloat16
    sub = c.rows(slice(7, 14))
    assert torch.equal(sub.x, c.x[7:14]) and sub.w is c.w
    assert make_case(0, 128).x.shape == (0, 128)


def test_bad_sizes_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="rows"):
        make_case(-1)
    with pytest.raises(ValueError, match="d: expected"):
        make_case(3, 0)
