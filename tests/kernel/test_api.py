"""Public API: validation naming the argument, shapes, zero rows, the module, autograd wiring (CPU interpreter)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import same

from rlnorm.inputs import make_case
from rlnorm.kernel import RMSNormGated, rms_norm_gated
from rlnorm.kernel._bwd import rms_norm_gated_bwd
from rlnorm.kernel._fwd import rms_norm_gated_fwd
from rlnorm.kernel.api import _validate
from rlnorm.options import OpOptions


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
    x, z = case.x[:0].clone().requires_grad_(True), case.z[:0].clone().requires_grad_(True)
    w = case.w.clone().float().requires_grad_(True)
    y = rms_norm_gated(x, z, w)
    assert y.shape == (0, 128)
    y.sum().backward()
    assert same(w.grad, torch.zeros(128)) and x.grad.shape == (0, 128)


def test_module_defaults_and_forward(case):
    m = RMSNormGated(128, dtype=torch.bfloat16)
    assert m.weight.shape == (128,) and m.weight.dtype == torch.bfloat16
    assert torch.equal(m.weight.detach(), torch.ones(128, dtype=torch.bfloat16))  # ones, not zero-centred
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
        (lambda c: {"group_size": 48}, ValueError, "group_size"),
        (lambda c: {"activation": "gelu"}, ValueError, "activation"),
        (lambda c: {"eps": -1.0}, ValueError, "eps"),
        (lambda c: {"norm_before_gate": 1}, TypeError, "norm_before_gate"),
    ],
)
def test_bad_input_raises_naming_the_argument(case, make_bad, exc, name):
    args = {"x": case.x, "z": case.z, "weight": case.w}
    bad = make_bad(case)
    kwargs = {k: bad.pop(k) for k in list(bad) if k not in args}
    args.update(bad)
    with pytest.raises(exc, match=rf"^{name}:"):
        rms_norm_gated(args["x"], args["z"], args["weight"], **kwargs)


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
    for launch, groups in ((rms_norm_gated_fwd, (5, -4)), (lambda *a: rms_norm_gated_bwd(c.dy, *a), (5, -4))):
        with pytest.raises(ValueError, match="activation: expected 'silu' or 'sigmoid', got 'swish'"):
            launch(c.x, c.z, c.w, 1e-6, None, True, "swish")  # the launchers take the normalised name only
        for group in groups:
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
        _validate(case.x, case.z, case.w, OpOptions())


def test_autograd_gives_the_backward_kernels_bits_on_every_backward(case, monkeypatch):
    # the forward zeroes the backward's dweight counters in its own launch: each backward of the same graph
    # (retain_graph) must get fresh zeroed counters and the plain backward's bits
    from rlnorm.kernel import api

    want = rms_norm_gated_bwd(case.dy, case.x, case.z, case.w, 1e-6, None, True, "silu")
    y_plain = rms_norm_gated(case.x, case.z, case.w)  # nothing requires grad: the kernel directly
    leaves = [case.x.view(3, 4, 128).clone(), case.z.view(3, 4, 128).clone(), case.w.clone()]
    leaves = [t.requires_grad_(True) for t in leaves]
    with torch.no_grad():
        assert rms_norm_gated(*leaves).grad_fn is None
    y = rms_norm_gated(*leaves)
    assert y_plain.grad_fn is None and y.grad_fn is not None and same(y.detach().view(12, 128), y_plain)
    dy = case.dy.view(3, 4, 128)
    for _ in range(2):
        got = torch.autograd.grad(y, leaves, dy, retain_graph=True)
        for a, b, name in zip(got, want, ("dx", "dz", "dweight"), strict=True):
            assert same(a.reshape(b.shape), b), name
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
