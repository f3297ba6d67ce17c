"""Public API (CPU interpreter): validation naming the argument, shapes, zero rows, the module, autograd wiring; and
what a user meets replacing FLA's, vLLM's or transformers' gated norm: eps = 0 (FLA's tests use it), no weight, a
last dimension that is not contiguous (copied once, as FLA and vLLM do)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from conftest import oracle
from kernel_helpers import BF16, assert_grads_same, bwd, grads, same

from rlnorm.inputs import make_case
from rlnorm.kernel import RMSNormGated, api, rms_norm_gated
from rlnorm.kernel._bwd import rms_norm_gated_bwd
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.numerics import exact_sum
from rlnorm.options import OpOptions

# the interpreter's numpy reports eps = 0's zero rows' 1 / 0 and 0 * inf
pytestmark = pytest.mark.filterwarnings(
    "ignore:divide by zero encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)


@pytest.fixture(scope="module")
def case():
    return make_case(12, 128, seed=2)


def test_leading_shapes_row_strides_and_zero_rows(case):
    y2 = rms_norm_gated(case.x, case.z, case.w)
    assert same(rms_norm_gated(case.x.view(2, 3, 2, 128), case.z.view(2, 3, 2, 128), case.w), y2.view(2, 3, 2, 128))
    wide = torch.zeros(12, 300, dtype=case.x.dtype)
    wide[:, 5:133] = case.x
    assert same(rms_norm_gated(wide[:, 5:133], case.z, case.w), y2)
    # leading dims that cannot be viewed as rows (a transposed batch) still give the same rows
    xt, zt = case.x.view(3, 4, 128).transpose(0, 1), case.z.view(3, 4, 128).transpose(0, 1)
    assert same(rms_norm_gated(xt, zt, case.w).transpose(0, 1).reshape(12, 128), y2)
    # zero rows: an empty output and a zero dweight
    assert rms_norm_gated(case.x[:0], case.z[:0], case.w).shape == (0, 128)
    dx, _, dw = grads(case.x[:0], case.z[:0], case.w.float(), case.dy[:0])
    assert same(dw, torch.zeros(128)) and dx.shape == (0, 128)


def test_module_defaults_and_forward(case):
    m = RMSNormGated(128, dtype=torch.bfloat16)
    assert same(m.weight.detach(), torch.ones(128, dtype=BF16))  # bf16 ones, not zero-centred
    y = m(case.x, case.z)
    assert same(y, rms_norm_gated(case.x, case.z, m.weight.detach()))
    assert m(case.x).shape == case.x.shape  # z=None
    m_swish = RMSNormGated(128, activation="swish", group_size=64, norm_before_gate=False)
    assert m_swish.opts.activation == "silu"


@pytest.mark.parametrize(
    ("make_bad", "exc", "name"),
    [
        (lambda c: {"x": c.x.to(torch.int32)}, TypeError, "x"),
        (lambda c: {"weight": c.w.to(torch.int16)}, TypeError, "weight"),
        (lambda c: {"z": c.z.float()}, TypeError, "z"),
        (lambda c: {"z": c.z[:5]}, ValueError, "z"),
        (lambda c: {"z": c.z.reshape(-1, 64)}, ValueError, "z"),  # the right number of elements, the wrong shape
        (lambda c: {"weight": c.w[:64]}, ValueError, "weight"),
        (lambda c: {"weight": c.w.to("meta")}, ValueError, "weight"),
        (lambda c: {"x": c.x[0, 0]}, ValueError, "x"),  # 0-d
    ],
)
def test_bad_input_raises_naming_the_argument(case, make_bad, exc, name):
    args = {"x": case.x, "z": case.z, "weight": case.w} | make_bad(case)
    with pytest.raises(exc, match=rf"^{name}:"):
        rms_norm_gated(**args)


def test_width_limit_and_the_launchers_limits_are_named():
    c = make_case(1, 8193, seed=0)
    with pytest.raises(ValueError, match=r"^x: .*8192"):
        rms_norm_gated(c.x, c.z, c.w)
    with pytest.raises(ValueError, match=r"^hidden_size: .*8192"):
        RMSNormGated(8193)
    with pytest.raises(ValueError, match=r"^group_size:"):
        RMSNormGated(128, group_size=100)
    # the launchers refuse what their kernels cannot take, before any launch
    c = make_case(2, 12, seed=1)
    for launch in (rms_norm_gated_fwd, lambda *a: rms_norm_gated_bwd(c.dy, *a)):
        with pytest.raises(ValueError, match="activation: expected 'silu' or 'sigmoid', got 'swish'"):
            launch(c.x, c.z, c.w, 1e-6, None, True, "swish")  # the launchers take the normalised name only
        for group in (5, -4):
            with pytest.raises(ValueError, match=f"group_size: {group} does not divide the last dimension 12"):
                launch(c.x, c.z, c.w, 1e-6, group, True, "silu")
    big = torch.zeros(1, 16384, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="8192"):
        rms_norm_gated_bwd(big, big, None, torch.ones(16384), 1e-6, None, True, "silu")
    y = rms_norm_gated_fwd(c.x, c.z, c.w, 1e-6, 4, True, "sigmoid")  # a group that divides is taken
    assert y.shape == (2, 12) and bool(torch.isfinite(y.float()).all())


def test_cpu_tensor_without_interpreter_is_refused_not_run_elsewhere(case, monkeypatch):
    # nothing falls back silently: with the interpreter off, a CPU tensor is an error naming x
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: CPU tensors are refused there too, but this test plants no GPU")
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        api._validate(case.x, case.z, case.w, OpOptions())


def test_autograd_gives_the_backward_kernels_bits_on_every_backward(case, monkeypatch):
    # the forward zeroes the backward's dweight counters in its own launch: each backward of the same graph
    # (retain_graph) must get fresh zeroed counters and the plain backward's bits
    want = rms_norm_gated_bwd(case.dy, case.x, case.z, case.w, 1e-6, None, True, "silu")
    y_plain = rms_norm_gated(case.x, case.z, case.w)  # nothing requires grad: the kernel directly
    leaves = [t.clone().requires_grad_(True) for t in (case.x.view(3, 4, 128), case.z.view(3, 4, 128), case.w)]
    with torch.no_grad():
        assert rms_norm_gated(*leaves).grad_fn is None
    y = rms_norm_gated(*leaves)
    assert y_plain.grad_fn is None and y.grad_fn is not None and same(y.detach().view(12, 128), y_plain)
    dy = case.dy.view(3, 4, 128)
    for _ in range(2):
        got = torch.autograd.grad(y, leaves, dy, retain_graph=True)
        assert_grads_same([g.reshape(b.shape) for g, b in zip(got, want, strict=True)], want, "through autograd")
    # planted fault: the second backward reuses the first one's (now summed-into) counters
    y = rms_norm_gated(*leaves)
    keep = []

    def reused(*args, workspace=None, **kw):
        keep.append(workspace if workspace is not None else keep[0])
        return rms_norm_gated_bwd(*args, workspace=keep[-1], **kw)

    monkeypatch.setattr(api, "rms_norm_gated_bwd", reused)
    first = torch.autograd.grad(y, leaves, dy, retain_graph=True)[2]
    second = torch.autograd.grad(y, leaves, dy, retain_graph=True)[2]
    assert same(first, want[2])
    assert not same(second, want[2]), "reused counters went unnoticed"


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
    eps0 = OpOptions(eps=0.0)
    dx, dz, dw = bwd(c.x, c.z, c.w, c.dy, eps0)
    singles = [bwd(c.x[i : i + 1], c.z[i : i + 1], c.w, c.dy[i : i + 1], eps0) for i in range(7)]
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
    [(1, OpOptions()), (63, OpOptions(group_size=32, norm_before_gate=False, activation="sigmoid"))],
)
def test_no_weight_is_bitwise_a_weight_of_ones_and_gives_no_dweight(rows, opts):
    c = make_case(rows, 128, seed=rows + 1)
    kw = asdict(opts)
    y = rms_norm_gated(c.x, c.z, None, **kw)
    assert same(y, oracle(c.x, c.z, None, opts))
    for ones in (torch.ones(128, dtype=BF16), torch.ones(128)):
        assert same(y, rms_norm_gated(c.x, c.z, ones, **kw))
    assert same(rms_norm_gated(c.x, None, None, **kw), rms_norm_gated(c.x, None, torch.ones(128), **kw))
    dx, dz, dw = grads(c.x, c.z, None, c.dy, **kw)
    want = grads(c.x, c.z, torch.ones(128, dtype=BF16), c.dy, **kw)
    assert dw is None and same(dx, want[0]) and same(dz, want[1])
    m = RMSNormGated(128, elementwise_affine=False, **kw)
    assert m.weight is None and list(m.parameters()) == []
    x = c.x.clone().requires_grad_(True)
    y_module = m(x, c.z)
    y_module.backward(c.dy)
    assert same(y_module.detach(), y) and same(x.grad, want[0])
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
    assert_grads_same(grads(transposed(c.x), transposed(c.z), c.w, transposed(c.dy)), want, "strided last dimension")
    # a weight that is a strided view of a leaf: dweight lands in the leaf's column, bit for bit
    leaf = torch.zeros(128, 3, dtype=torch.bfloat16)
    leaf[:, 1] = c.w
    leaf.requires_grad_(True)
    rms_norm_gated(c.x, c.z, leaf[:, 1]).backward(c.dy)
    assert same(leaf.grad[:, 1], want[2]) and not leaf.grad[:, [0, 2]].any()
