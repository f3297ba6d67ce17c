"""What a user meets when the kernel replaces FLA's, vLLM's or transformers' gated norm (CPU interpreter): eps = 0
(FLA's tests use it), no weight, a last dimension that is not contiguous (copied once, as FLA and vLLM do)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from conftest import oracle
from kernel_helpers import BF16, grads, same

from rlnorm.inputs import make_case
from rlnorm.kernel import RMSNormGated, rms_norm_gated
from rlnorm.kernel._bwd import rms_norm_gated_bwd
from rlnorm.numerics import exact_sum
from rlnorm.options import OpOptions

# the interpreter's numpy reports the zero rows' 1 / 0 and 0 * inf (eps = 0)
pytestmark = pytest.mark.filterwarnings(
    "ignore:divide by zero encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)


@pytest.mark.parametrize(
    ("rows", "opts", "dtype", "has_z"),
    [
        (1, OpOptions(eps=0.0), BF16, True),
        (7, OpOptions(eps=0.0, group_size=32), BF16, True),
        (63, OpOptions(eps=0.0, norm_before_gate=False), BF16, True),  # the whole-row path without the tier
        (257, OpOptions(eps=0.0), BF16, True),
        (9, OpOptions(eps=0.0), BF16, False),
        (9, OpOptions(eps=0.0, activation="sigmoid"), torch.float16, True),  # fp16's flag test
        (9, OpOptions(eps=0.0, group_size=32), torch.float32, True),  # fp32's all-fp64 path
    ],
)
def test_eps_zero_rounds_every_finite_row_correctly_and_gives_nan_for_a_zero_row(rows, opts, dtype, has_z):
    c = make_case(rows, 128, seed=rows, dtype=dtype)
    x, z = c.x.clone(), (c.z if has_z else None)
    x[rows // 2] = 0.0  # a zero (padding) row: rstd = inf, its outputs 0 * inf = NaN
    if rows > 2 and dtype == BF16:
        x[1] *= 2.0**-66  # a tiny row: the mean square leaves fp32's normal range, the row goes exact
    y = rms_norm_gated(x, z, c.w, **asdict(opts))
    keep = torch.arange(rows) != rows // 2
    assert torch.isnan(y[rows // 2]).all() and not torch.isnan(y[keep]).any()
    assert same(y, oracle(x, z, c.w, opts))  # the NaN row included: the fp64 oracle gives NaN there too
    if rows > 1:  # each finite row's bits are its bits alone: batch invariance holds at eps = 0
        alone = [rms_norm_gated(x[i : i + 1], None if z is None else z[i : i + 1], c.w, **asdict(opts)) for i in (0, 1)]
        assert same(y[:2], torch.cat(alone))


def test_eps_zero_backward_keeps_finite_rows_and_a_zero_row_makes_dweight_nan():
    c = make_case(7, 128, seed=5, weight_dtype=torch.float32)
    dx, dz, dw = rms_norm_gated_bwd(c.dy, c.x, c.z, c.w, 0.0, None, True, "silu")
    singles = [
        rms_norm_gated_bwd(c.dy[i : i + 1], c.x[i : i + 1], c.z[i : i + 1], c.w, 0.0, None, True, "silu")
        for i in range(7)
    ]
    assert same(dx, torch.cat([s[0] for s in singles])) and same(dz, torch.cat([s[1] for s in singles]))
    assert same(dw, exact_sum(torch.stack([s[2] for s in singles]), torch.float32))  # exact, order independent
    x = c.x.clone()
    x[2] = 0.0
    dx0, dz0, dw0 = grads(x, c.z, c.w, c.dy, eps=0.0)
    keep = torch.arange(7) != 2
    assert same(dx0[keep], dx[keep]) and same(dz0[keep], dz[keep])
    assert torch.isnan(dx0[2]).all() and torch.isnan(dz0[2]).all()
    assert torch.isnan(dw0).all()  # NaN contributions reach every column (IEEE, as a float sum would)


@pytest.mark.parametrize(
    ("rows", "opts"),
    [(1, OpOptions()), (7, OpOptions(group_size=32)), (63, OpOptions(norm_before_gate=False, activation="sigmoid"))],
)
def test_no_weight_is_bitwise_a_weight_of_ones(rows, opts):
    c = make_case(rows, 128, seed=rows + 1)
    y = rms_norm_gated(c.x, c.z, None, **asdict(opts))
    assert same(y, oracle(c.x, c.z, None, opts))
    for ones in (torch.ones(128, dtype=BF16), torch.ones(128)):
        assert same(y, rms_norm_gated(c.x, c.z, ones, **asdict(opts)))
    assert same(
        rms_norm_gated(c.x, None, None, **asdict(opts)), rms_norm_gated(c.x, None, torch.ones(128), **asdict(opts))
    )


@pytest.mark.parametrize("rows", [1, 63])
def test_no_weight_backward_and_a_module_without_weight_give_the_ones_bits_and_no_dweight(rows):
    c = make_case(rows, 128, seed=rows + 2)
    ones = torch.ones(128, dtype=BF16)
    dx, dz, dw = grads(c.x, c.z, None, c.dy, group_size=64)
    want = grads(c.x, c.z, ones, c.dy, group_size=64)
    assert dw is None and same(dx, want[0]) and same(dz, want[1])
    m = RMSNormGated(128, elementwise_affine=False, group_size=64)
    assert m.weight is None and list(m.parameters()) == []
    x = c.x.clone().requires_grad_(True)
    y = m(x, c.z)
    y.backward(c.dy)
    assert same(y.detach(), rms_norm_gated(c.x, c.z, ones, group_size=64)) and same(x.grad, want[0])
    with pytest.raises(ValueError, match=r"^w: None"):
        rms_norm_gated_bwd(c.dy, c.x, c.z, None, 1e-6, None, True, "silu", contributions=torch.empty(rows, 128))
    with pytest.raises(TypeError, match=r"^elementwise_affine:"):
        RMSNormGated(128, elementwise_affine=1)


def transposed(t: torch.Tensor) -> torch.Tensor:
    """t's values with a last-dimension stride of rows (a transposed copy seen back in t's shape)."""
    out = t.t().contiguous().t()
    assert torch.equal(out, t) and (out.stride(-1) != 1 or t.shape[0] == 1)
    return out


@pytest.mark.parametrize(("rows", "group_size"), [(1, None), (7, 32), (63, None)])
def test_a_strided_last_dimension_gives_the_contiguous_bits(rows, group_size):
    c = make_case(rows, 128, seed=rows + 3)
    want = rms_norm_gated(c.x, c.z, c.w, group_size=group_size)
    assert same(rms_norm_gated(transposed(c.x), transposed(c.z), c.w, group_size=group_size), want)
    assert same(rms_norm_gated(transposed(c.x), c.z, c.w, group_size=group_size), want)
    # every other element of a wider buffer, in a 3-D batch; and a weight that is a strided view
    wide = torch.zeros(rows, 256, dtype=BF16)
    wide[:, ::2] = c.x
    w_wide = torch.zeros(256, dtype=BF16)
    w_wide[1::2] = c.w
    got = rms_norm_gated(wide[:, ::2].unsqueeze(0), c.z.unsqueeze(0), w_wide[1::2], group_size=group_size)
    assert same(got, want.unsqueeze(0))


def test_a_strided_last_dimension_backward_gives_the_contiguous_bits():
    c = make_case(7, 128, seed=11)
    want = grads(c.x, c.z, c.w, c.dy)
    got = grads(transposed(c.x), transposed(c.z), c.w, transposed(c.dy))
    for a, b in zip(got, want, strict=True):
        assert same(a, b)
    # a weight that is a strided view of a leaf: dweight lands in the leaf's column, bit for bit
    leaf = torch.zeros(128, 3, dtype=torch.bfloat16)
    leaf[:, 1] = c.w
    leaf.requires_grad_(True)
    rms_norm_gated(c.x, c.z, leaf[:, 1]).backward(c.dy)
    assert same(leaf.grad[:, 1], want[2]) and not leaf.grad[:, [0, 2]].any()
