"""The reference: fp32 math rounded once, and the fp64 oracle the accuracy checks use."""

from __future__ import annotations

import torch

from rlnorm.inputs import make_case
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math, rms_norm_gated_reference


def test_reference_matches_the_written_formula_in_fp64() -> None:
    c = make_case(7, 128, seed=3)
    x, z, w = c.x.double(), c.z.double(), c.w.double()
    rstd = 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    want = x * rstd * w * (z * torch.sigmoid(z))
    assert torch.allclose(gated_rmsnorm_math(c.x, c.z, c.w, OpOptions(), torch.float64), want, rtol=1e-14, atol=0)
    plain = gated_rmsnorm_math(c.x, None, c.w, OpOptions(), torch.float64)  # no gate
    assert torch.allclose(plain, x * rstd * w, rtol=1e-14, atol=0)


def test_fp32_reference_is_almost_always_correctly_rounded() -> None:
    c = make_case(257, 128, seed=11)
    got = rms_norm_gated_reference(c.x, c.z, c.w)
    want = round_once(gated_rmsnorm_math(c.x, c.z, c.w, OpOptions(), torch.float64), torch.bfloat16)
    frac = (got.view(torch.int16) == want.view(torch.int16)).float().mean().item()
    assert got.dtype == torch.bfloat16 and 0.999 < frac <= 1.0
