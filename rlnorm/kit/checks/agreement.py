"""How often two backends compute bitwise the same output on the same inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm.auto import tqdm

from rlnorm.inputs import make_case
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend
from rlnorm.kit.checks.common import CheckResult, backend_key, bits, check_common, check_int, describe


def agreement_matrix(
    backends: Sequence[Backend],
    opts: OpOptions | None = None,
    device: str = "cpu",
    rows: int = 4097,
    seed: int = 3,
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    progress: bool = True,
) -> CheckResult:
    """Fraction of forward outputs bitwise equal between each pair of backends on the same inputs.

    Summary: {tensor: "y", rows, seed, backends, equal_fraction (None where a backend raised), errors}.
    """
    if isinstance(backends, (str, bytes)) or not isinstance(backends, Sequence):
        raise TypeError(f"backends: expected a list of Backends, got {type(backends).__name__}")
    check_int("rows", rows, 1)
    check_int("seed", seed)
    opts = opts if opts is not None else OpOptions()
    for b in backends:
        opts = check_common(b, opts, device, d)
    case = make_case(rows, d, seed, dtype, weight_dtype or dtype, device)
    outs: list[Tensor | None] = []
    errors: dict[str, str] = {}
    for b in tqdm(backends, desc="agreement", disable=not progress):
        try:
            y = b.forward(case.x, case.z, case.w, opts)
            if y.shape != case.x.shape or y.dtype != case.x.dtype:
                raise ValueError(f"output {tuple(y.shape)} {y.dtype}, expected {tuple(case.x.shape)} {case.x.dtype}")
            outs.append(bits(y))
        except Exception as exc:
            outs.append(None)
            errors[backend_key(b)] = describe(exc)
    frac: list[list[float | None]] = []
    for a in outs:
        row_f: list[float | None] = []
        for b_ in outs:
            row_f.append(None if a is None or b_ is None else float((a == b_).double().mean()))
        frac.append(row_f)
    summary = {
        "tensor": "y",
        "rows": rows,
        "seed": seed,
        "backends": [backend_key(b) for b in backends],
        "equal_fraction": frac,
        "errors": errors,
    }
    return CheckResult(summary, [])
