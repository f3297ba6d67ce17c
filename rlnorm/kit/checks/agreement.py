"""How often two backends compute bitwise the same output on the same inputs: each output computed in its
backend's own process, the matrix formed from the saved outputs (a crash loses only its row and column).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rlnorm.kit.checks.common import NO_TRAIL, Check, Trail, bits, check_int
from rlnorm.kit.results import Agreement

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend
    from rlnorm.options import OpOptions


def agreement_output(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    agreement_rows: int,
    agreement_seed: int,
    d: int,
    weight_dtype: str | torch.dtype,
    trail: Trail = NO_TRAIL,
) -> Tensor:
    """The backend's forward output on the agreement inputs, checked for shape and dtype (raises otherwise)."""
    rows = check_int("agreement_rows", agreement_rows, 1)
    seed = check_int("agreement_seed", agreement_seed)
    c = Check("agreement", backend, opts, device, d, weight_dtype, trail)
    case = c.case(rows, seed)
    y = c.call(case, grad=False)[0]
    if y.shape != case.x.shape or y.dtype != case.x.dtype:
        raise ValueError(f"output {tuple(y.shape)} {y.dtype}, expected {tuple(case.x.shape)} {case.x.dtype}")
    return y.detach()


def agreement_from_outputs(
    outputs: Mapping[str, Tensor | None], rows: int, seed: int, errors: Mapping[str, str] | None = None
) -> Agreement:
    """The matrix from each backend's output (None where it has none; `errors` says why)."""
    keys = list(outputs)
    as_bits = [None if outputs[k] is None else bits(outputs[k].cpu()) for k in keys]
    frac = [
        [None if a is None or b is None or a.shape != b.shape else float((a == b).double().mean()) for b in as_bits]
        for a in as_bits
    ]
    return Agreement("y", rows, seed, keys, frac, dict(errors or {}))
