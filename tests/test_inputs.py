"""The protocol's inputs: seeded, identical across devices, drawn in the documented order."""

from __future__ import annotations

import pytest
import torch

from rlnorm.inputs import DY_SEED_OFFSET, UNDERFLOW_KINDS, make_case, make_underflow_case
from rlnorm.reference import gated_rmsnorm_math


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


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="rows"):
        make_case(-1)
    with pytest.raises(ValueError, match="d: expected"):
        make_case(3, 0)
    with pytest.raises(ValueError, match="kind"):
        make_underflow_case("x*z")
    with pytest.raises(ValueError, match="rows, d"):
        make_underflow_case("x*w", rows=0)


@pytest.mark.parametrize("kind", UNDERFLOW_KINDS)
def test_underflow_cases_put_a_product_below_the_fp32_normal_range_and_y_above_it(kind: str) -> None:
    # what the forward's flushed products exist for (tests/test_kernel_fwd.py plants the plain products)
    x, z, w, opts = make_underflow_case(kind, rows=4, d=16)
    xd, wd = x.double(), w.double()
    rstd = 1 / ((xd * xd).mean(dim=1, keepdim=True) + opts.eps).sqrt()  # rstd of x: the gate-after cases
    products = {"x*w": xd * wd, "x*w*rstd": xd * wd * rstd, "no gate": xd * wd}
    product = products.get(kind, xd * torch.nn.functional.silu(z.double()) if z is not None else xd)
    y = gated_rmsnorm_math(x, z, w, opts, torch.float64)
    assert (product[:, 1:].abs() < 2.0**-126).all() and (y[:, 1:].abs() > 2.0**-96).all()
    assert x.dtype == w.dtype == torch.bfloat16 and (z is None) == (kind == "no gate")
