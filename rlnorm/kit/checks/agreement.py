"""How often two backends compute bitwise the same output on the same inputs.

Each backend's output can be computed on its own (`agreement_output`, in the backend's own process) and the
matrix formed afterwards from the saved outputs (`agreement_from_outputs`): a backend that crashes loses only
its own row and column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm import tqdm

from rlnorm.inputs import make_case
from rlnorm.kit.backends import describe_error
from rlnorm.kit.checks.common import TRAIL, CheckResult, backend_key, bits, case_spec, check_common, check_int
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend


def agreement_output(
    backend: Backend,
    opts: OpOptions | None = None,
    device: str = "cpu",
    rows: int = 4097,
    seed: int = 3,
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
) -> Tensor:
    """The backend's forward output on the agreement inputs, checked for shape and dtype (raises otherwise)."""
    check_int("rows", rows, 1)
    check_int("seed", seed)
    opts = check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    case = make_case(rows, d, seed, dtype, wdt, device)
    TRAIL.at_case("agreement", case_spec(rows, d, seed, dtype, wdt), opts)
    TRAIL.at_batch({"kind": "slice", "start": 0, "size": rows})
    y = backend.forward(case.x, case.z, case.w, opts)
    if y.shape != case.x.shape or y.dtype != case.x.dtype:
        raise ValueError(f"output {tuple(y.shape)} {y.dtype}, expected {tuple(case.x.shape)} {case.x.dtype}")
    return y.detach()


def agreement_from_outputs(
    outputs: Mapping[str, Tensor | None], rows: int, seed: int, errors: Mapping[str, str] | None = None
) -> CheckResult:
    """The matrix from each backend's output (None where it has none; `errors` says why)."""
    keys = list(outputs)
    as_bits = [None if outputs[k] is None else bits(outputs[k].cpu()) for k in keys]
    frac: list[list[float | None]] = []
    for a in as_bits:
        frac.append(
            [None if a is None or b is None or a.shape != b.shape else float((a == b).double().mean()) for b in as_bits]
        )
    summary = {
        "tensor": "y",
        "rows": rows,
        "seed": seed,
        "backends": keys,
        "equal_fraction": frac,
        "errors": dict(errors or {}),
    }
    return CheckResult(summary, [])


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
    """Fraction of forward outputs bitwise equal between each pair of backends on the same inputs, in one process.

    Summary: {tensor: "y", rows, seed, backends, equal_fraction (None where a backend raised), errors}.
    """
    if isinstance(backends, (str, bytes)) or not isinstance(backends, Sequence):
        raise TypeError(f"backends: expected a list of Backends, got {type(backends).__name__}")
    check_int("rows", rows, 1)
    check_int("seed", seed)
    opts = opts if opts is not None else OpOptions()
    for b in backends:
        opts = check_common(b, opts, device, d)
    outputs: dict[str, Tensor | None] = {}
    errors: dict[str, str] = {}
    for b in tqdm(backends, desc="agreement", disable=not progress):
        try:
            outputs[backend_key(b)] = agreement_output(b, opts, device, rows, seed, d, dtype, weight_dtype)
        except Exception as exc:
            outputs[backend_key(b)] = None
            errors[backend_key(b)] = describe_error(exc)
    return agreement_from_outputs(outputs, rows, seed, errors)
