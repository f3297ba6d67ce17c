"""Whether the same batch gives bitwise the same dweight when run again."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from rlnorm.inputs import make_case
from rlnorm.kit.backends import describe_error
from rlnorm.options import OpOptions

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend
from rlnorm.kit.checks.common import (
    TRAIL,
    CheckResult,
    Recorder,
    backend_key,
    case_spec,
    check_common,
    check_int,
    differ_rows,
    has_backward,
)


def dweight_repeatable(
    backend: Backend,
    opts: OpOptions | None = None,
    device: str = "cpu",
    rows: int = 262144,
    seed: int = 3,
    d: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype | None = None,
    *,
    repeats: int = 2,
    max_records: int | None = None,
    progress: bool = True,
) -> CheckResult:
    """The same full batch `repeats` times gives bitwise the same dweight; None without a backward.

    Summary: {dweight_repeatable: bool | None, rows, seed, repeats}; a differing run is one
    `dweight` record (row and position empty).
    """
    check_int("rows", rows, 1)
    check_int("seed", seed)
    check_int("repeats", repeats, 2)
    opts = check_common(backend, opts, device, d)
    wdt = weight_dtype or dtype
    summary: dict[str, Any] = {"dweight_repeatable": None, "rows": rows, "seed": seed, "repeats": repeats}
    rec = Recorder(backend, "dweight_repeatable", opts, max_records)
    if not has_backward(backend):
        summary["reason"] = "no backward"
        return CheckResult(summary, [])
    try:
        case = make_case(rows, d, seed, dtype, wdt, device)
        TRAIL.at_case("dweight_repeatable", case_spec(rows, d, seed, dtype, wdt), opts)
        TRAIL.at_batch({"kind": "slice", "start": 0, "size": rows})
        dws = []
        for _ in tqdm(range(repeats), desc=f"{backend_key(backend)} dweight_repeatable", disable=not progress):
            g = backend.forward_backward(case.x, case.z, case.w, case.dy, opts)
            if g.dw is None:
                summary["reason"] = "backend gave no dweight"
                return CheckResult(summary, [])
            dws.append(g.dw.detach().clone())
        same = True
        for i, dw in enumerate(dws[1:], start=1):
            if bool(differ_rows(dw.reshape(1, -1), dws[0].reshape(1, -1)).any()):
                same = False
                rec.add_rows(
                    seed=seed,
                    tensor="dweight",
                    in_batch=dw.reshape(1, -1),
                    alone=dws[0].reshape(1, -1),
                    rows=[None],  # type: ignore[list-item]
                    cases=[f"repeat={i}"],
                    batch_starts=[0],
                    batch_sizes=[rows],
                    positions=[None],  # type: ignore[list-item]
                    case_spec=case_spec(rows, d, seed, dtype, wdt),
                    batches=[{"kind": "slice", "start": 0, "size": rows}],
                )
        for r in rec.records:  # rebuild: the whole batch against itself
            spec = json.loads(r["rebuild"])
            spec["row"], spec["position"] = -1, -1
            r["rebuild"] = json.dumps(spec, separators=(",", ":"))
        summary["dweight_repeatable"] = same
    except Exception as exc:
        summary["error"] = describe_error(exc)
    rec.note(summary)
    return CheckResult(summary, rec.records)
