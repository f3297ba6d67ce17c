"""Planted faults: each is the exact reference except for the ONE guarantee it breaks, exactly as documented."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlnorm.inputs import make_case
from rlnorm.kit.backends import ExactReferenceBackend
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions
from tests import faults
from tests.faults import (
    BatchSizeDependentOutput,
    NondeterministicDweight,
    OrderDependentDweight,
    PositionDependentOutput,
    batch_size_fault_mask,
    bump_one_ulp,
    position_fault_mask,
)

OPTS = OpOptions()
FAULTS = [obj for obj in map(faults.__dict__.get, faults.__all__) if isinstance(obj, type)]
# the faults that end their process past `limit` rows: below it, the exact reference (safe to call here)
PAST_ROWS = [cls for cls in FAULTS if issubclass(cls, faults._PastRows)]
KIT_TESTS = Path(__file__).resolve().parent


def _fb(backend, case):
    return backend.forward_backward(case.x, case.z, case.w, case.dy, OPTS)


def _rows_alone(backend, case):
    return [_fb(backend, case.rows(slice(i, i + 1))) for i in range(case.x.shape[0])]


@pytest.mark.parametrize("cls", PAST_ROWS, ids=lambda c: c.__name__)
def test_past_rows_faults_are_the_reference_up_to_their_limit(cls: type) -> None:
    fault = cls()
    case = make_case(fault.limit, 128, seed=3)
    g, r = _fb(fault, case), _fb(ExactReferenceBackend(), case)
    for name in ("y", "dx", "dz", "dw"):
        assert torch.equal(getattr(g, name), getattr(r, name)), name
    assert torch.equal(fault.forward(case.x, case.z, case.w, OPTS), r.y)


def test_bump_one_ulp_moves_exactly_one_ulp():
    t = torch.tensor([1.0, -2.5, 0.0, 3.0], dtype=torch.bfloat16)
    out = bump_one_ulp(t, torch.tensor([True, True, True, False]))
    assert ulp_distance(out, t).tolist() == [1, 1, 1, 0]


@pytest.mark.parametrize(
    ("fault", "n"),
    [(BatchSizeDependentOutput(), n) for n in (1, 7, 63, 257)] + [(PositionDependentOutput(), 63)],
    ids=lambda v: v if isinstance(v, int) else type(v).__name__,
)
def test_an_output_fault_moves_only_y_by_one_ulp_on_its_masked_rows(fault, n):
    case = make_case(n, 128, seed=3, weight_dtype=torch.float32)
    g, r = _fb(fault, case), _fb(ExactReferenceBackend(), case)
    for name in ("dx", "dz", "dw"):
        assert torch.equal(getattr(g, name), getattr(r, name)), name
    dist = ulp_distance(g.y, r.y)
    mask = batch_size_fault_mask(case.x) if isinstance(fault, BatchSizeDependentOutput) else position_fault_mask(n)
    assert torch.equal(dist[:, 0] == 1, mask) and int(dist[:, 1:].max()) == 0 and int(dist.max()) <= 1
    assert torch.equal(fault.forward(case.x, case.z, case.w, OPTS), g.y)
    if isinstance(fault, PositionDependentOutput):  # a row alone sits at position 0: never perturbed
        assert torch.equal(torch.cat([gg.y for gg in _rows_alone(fault, case)]), r.y)


def test_nondeterministic_dweight_differs_call_to_call_by_one_ulp():
    case = make_case(64, 128, seed=3, weight_dtype=torch.float32)
    f, ex = NondeterministicDweight(), ExactReferenceBackend()
    r = ex.forward_backward(case.x, case.z, case.w, case.dy, OPTS)
    a = f.forward_backward(case.x, case.z, case.w, case.dy, OPTS)
    b = f.forward_backward(case.x, case.z, case.w, case.dy, OPTS)
    assert not torch.equal(a.dw, b.dw)
    for g in (a, b):
        for name in ("y", "dx", "dz"):
            assert torch.equal(getattr(g, name), getattr(r, name)), name
        assert int(ulp_distance(g.dw, r.dw).sum()) == 1
    assert torch.equal(f.forward(case.x, case.z, case.w, OPTS), r.y)


def test_order_dependent_dweight_is_a_left_fold_repeatable_but_not_permutation_free():
    case = make_case(257, 128, seed=3, weight_dtype=torch.float32)
    f, ex = OrderDependentDweight(), ExactReferenceBackend()
    r = ex.forward_backward(case.x, case.z, case.w, case.dy, OPTS)
    a = f.forward_backward(case.x, case.z, case.w, case.dy, OPTS)
    b = f.forward_backward(case.x, case.z, case.w, case.dy, OPTS)
    assert torch.equal(a.dw, b.dw)  # repeatable
    for name in ("y", "dx", "dz"):
        assert torch.equal(getattr(a, name), getattr(r, name)), name
    singles = np.stack([g.dw.numpy() for g in _rows_alone(ex, case)]).astype(np.float32)
    fold = singles[0].copy()
    for row in singles[1:]:
        fold = (fold + row).astype(np.float32)
    assert np.array_equal(a.dw.numpy(), fold)
    assert not torch.equal(a.dw, r.dw)  # differs from the exact sum somewhere
    torch.testing.assert_close(a.dw, r.dw, rtol=1e-5, atol=1e-5)  # but the value is right
    perm = torch.randperm(257, generator=torch.Generator().manual_seed(0))
    p = f.forward_backward(case.x[perm], case.z[perm], case.w, case.dy[perm], OPTS)
    assert not torch.equal(p.dw, a.dw)
    pad = torch.zeros(5, 128, dtype=case.x.dtype)
    padded = f.forward_backward(
        torch.cat([pad, case.x]), torch.cat([pad, case.z]), case.w, torch.cat([pad, case.dy]), OPTS
    )
    assert torch.equal(padded.dw, a.dw)  # zero-gradient padding adds exact zeros
