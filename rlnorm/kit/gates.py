"""Contract gates (docs/spec.md §5), run in the backend's worker, so a crash is the backend's, with the gate's cell
on the trail. Workload: samples of 11, 16, 13 and 19 tokens of `heads` rows each, arranged in cells. The forward
gate wants every token's output bitwise equal to its `BN/full` output in every cell; the gradient gate the same for
dx and dz, and dweight equal to the exact sum of single-row dweights and to the other one-call cells'.
"""

from __future__ import annotations

import itertools
import traceback

import torch
from torch import Tensor

from rlnorm.kit.backends import Backend
from rlnorm.kit.checks.common import Check, Trail, bits
from rlnorm.kit.results import Gate
from rlnorm.numerics import exact_sum
from rlnorm.options import OpOptions

SAMPLE_TOKENS = (11, 16, 13, 19)
CHUNK_TOKENS = 7
TAIL_LINES = 20
# a gate's returncode: ran to the end (the verdict is in its lines), the backend raised, it has no backward
RAN, RAISED, CANNOT = 0, 1, 3


def _chunks(tokens: list[int], size: int) -> list[list[int]]:
    return [tokens[i : i + size] for i in range(0, len(tokens), size)]


def build_cells(seed: int = 0) -> dict[str, list[list[int]]]:
    """The cells of docs/spec.md §5, each arrangement of the workload as its calls, each a list of token slots (-1: a
    zero padding token); `BN/full` first (everything is compared with it)."""
    starts = [0, *itertools.accumulate(SAMPLE_TOKENS)]
    samples = [list(range(start, start + n)) for start, n in zip(starts, SAMPLE_TOKENS, strict=False)]
    all_tokens = [t for s in samples for t in s]
    longest = max(SAMPLE_TOKENS)
    g = torch.Generator().manual_seed(seed + 7)
    perm = torch.randperm(len(all_tokens), generator=g).tolist()
    return {
        "BN/full": [all_tokens],
        "BN/chunked": _chunks(all_tokens, CHUNK_TOKENS),
        "B1/full": [list(s) for s in samples],
        "B1/chunked": [c for s in samples for c in _chunks(s, CHUNK_TOKENS)],
        "BN/padded-left": [[t for s in samples for t in [-1] * (longest - len(s)) + s]],
        "BN/padded-right": [[t for s in samples for t in s + [-1] * (longest - len(s))]],
        "BN/permuted": [[all_tokens[i] for i in perm]],
        "BN/packed": [[t for s in reversed(samples) for t in s]],
    }


def _rows_of(tokens: list[int], heads: int) -> list[int]:
    return [t * heads + h if t >= 0 else -1 for t in tokens for h in range(heads)]


def _gather(src: Tensor, rows: list[int]) -> Tensor:
    """Rows of src, a zero row where the slot is -1 (padding: -1 indexes the zero row appended last)."""
    padded = torch.cat([src, src.new_zeros(1, *src.shape[1:])])
    return padded[torch.tensor(rows, dtype=torch.long, device=src.device)]


def _scatter(dst: Tensor, rows: list[int], values: Tensor) -> None:
    keep = [i for i, r in enumerate(rows) if r >= 0]
    dst[torch.tensor([rows[i] for i in keep], dtype=torch.long, device=dst.device)] = values[keep].to(dst.device)


def format_line(kind: str, a: str, b: str, tensor: str, x: Tensor, y: Tensor) -> str:
    """A report-format line comparing tensors x (cell a) and y (cell b) bitwise."""
    same = x.shape == y.shape and x.dtype == y.dtype and torch.equal(bits(x), bits(y))
    max_abs = float("inf") if x.shape != y.shape else (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
    return f"{kind} pair=('{a}', '{b}') tensor={tensor} max_abs={max_abs:.8e} passed={same}"


def gate_lines(
    backend: Backend, opts: OpOptions, device: str, grad: bool, heads: int, d: int, trail: Trail | None
) -> list[str]:
    """The forward gate's lines (each cell's y in token order against `BN/full`'s), or the gradient gate's (dx and
    dz so, then dweight against the exact singleton aggregate and the other one-call cells')."""
    check = Check("contract_gates", backend, opts, device, d, torch.float32, trail)
    case, cells = check.case(sum(SAMPLE_TOKENS) * heads, 0, whole=False), build_cells(0)
    inputs = (case.x, case.z, case.dy)  # every call's rows are gathered from these
    names = ("dx", "dz") if grad else ("y",)
    got: dict[str, dict[str, Tensor]] = {}
    dweights: dict[str, Tensor] = {}
    for cell, calls in cells.items():
        mine = got[cell] = {t: torch.full_like(case.x, float("nan")) for t in names}
        for tokens in calls:
            rows = _rows_of(tokens, heads)
            x, z, dy = (_gather(t, rows) for t in inputs)
            check.mark({"kind": "gate", "cell": cell, "size": x.shape[0]})  # a crash names the gate's cell
            if not grad:
                _scatter(mine["y"], rows, backend.forward(x, z, case.w, opts))
                continue
            g = backend.forward_backward(x, z, case.w, dy, opts)
            _scatter(mine["dx"], rows, g.dx)
            if g.dz is not None:
                _scatter(mine["dz"], rows, g.dz)
            if len(calls) == 1:
                if g.dw is None:
                    raise RuntimeError(f"{cell}: forward_backward returned no dweight")
                dweights[cell] = g.dw.detach().to("cpu")
    full = got.pop("BN/full")
    lines = [format_line("bitwise", "BN/full", n, t, full[t], o[t]) for n, o in got.items() for t in names]
    if not grad:
        return lines
    full_dw = dweights["BN/full"]
    # the backend's dweight against the exact sum of single-row dweights: each row a fresh contiguous tensor in
    # canonical order, then each a one-row view into its chunk in B1/chunked order
    fresh = [tuple(t[r : r + 1].clone() for t in inputs) for r in range(case.x.shape[0])]
    chunks = [[_gather(t, _rows_of(tokens, heads)) for t in inputs] for tokens in cells["B1/chunked"]]
    views = [tuple(t[i : i + 1] for t in chunk) for chunk in chunks for i in range(chunk[0].shape[0])]
    for name, cell, singles in (("full", "B1-singleton", fresh), ("chunked", "B1-singleton/chunked", views)):
        dws = []
        for x, z, dy in singles:
            check.mark({"kind": "gate", "cell": cell, "size": 1})
            dws.append(backend.forward_backward(x, z, case.w, dy, opts).dw.detach().to("cpu", torch.float32))
        agg = exact_sum(torch.stack(dws), case.w.dtype).to(full_dw.dtype)
        lines.append(
            format_line("singleton_aggregate", "BN/full", f"B1-singleton_aggregate/{name}", "dweight", full_dw, agg)
        )
    for name in ("BN/permuted", "BN/padded-left", "BN/padded-right", "BN/packed"):
        lines.append(format_line("dweight", "BN/full", name, "dweight", full_dw, dweights[name]))
    return lines


def _gate(lines: list[str], returncode: int, tail: list[str]) -> Gate:
    failed = [ln for ln in lines if ln.endswith(" passed=False")]
    singleton = [ln for ln in lines if ln.startswith("singleton_aggregate ")]
    return Gate(returncode, returncode == RAN and bool(lines) and not failed, failed, singleton, tail, False, lines)


def run_gates(
    backend: Backend, opts: OpOptions, device: str, *, d: int = 128, heads: int = 2, trail: Trail | None = None
) -> dict[str, Gate]:
    """Both gates of `backend`, in its worker: a gate the backend raises in fails with its traceback's tail; the
    gradient gate of a forward-only backend is not taken (returncode 3)."""
    gates: dict[str, Gate] = {}
    for name, grad in (("forward", False), ("gradient", True)):
        if grad and not backend.has_backward:
            gates[name] = _gate([], CANNOT, [f"backend {getattr(backend, 'key', '')!r} has no backward"])
            continue
        try:
            lines = gate_lines(backend, opts, device, grad, heads, d, trail)
        except Exception:
            tail = traceback.format_exc().strip().splitlines()[-TAIL_LINES:]
            gates[name] = _gate([], RAISED, tail)
        else:
            gates[name] = _gate(lines, RAN, [])
    return gates
