"""Whether backends compute the same bits. Within a run, the agreement matrix: how often two backends give bitwise
the same output on the same inputs, each output computed in its backend's own process (a crash loses only its row
and column). Across runs, digests: sha256 of a backend's outputs on one standard case, so two runs on different
machines (a trainer's GPU and a sampler's) say whether they computed the same bits without moving tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from torch import Tensor

from rlnorm.inputs import make_case
from rlnorm.kit.backends import Backend
from rlnorm.kit.checks.common import Check, Trail, bits, caught, check_int
from rlnorm.kit.results import Agreement, Digests
from rlnorm.options import OpOptions

STANDARD_ROWS = 257  # not a multiple of any block size, so a kernel's tail handling is in the bits
STANDARD_SEED = 0


def digest(t: Tensor) -> str:
    """sha256 of the tensor's bytes (its dtype and shape are the case's: a digest alone says nothing of them)."""
    flat = t.detach().contiguous().cpu().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def output_digests(backend: Backend, opts: OpOptions, device: str, *, d: int = 128) -> Digests:
    """The backend's y (and dx, dz, dweight where it has a backward) on the standard case, digested."""
    case_text = f"make_case({STANDARD_ROWS}, {d}, seed={STANDARD_SEED}, bfloat16) {opts.as_dict()}"
    case = make_case(STANDARD_ROWS, d, STANDARD_SEED, device=device)
    out = Digests(case=case_text, tensors={})
    with caught(out):  # what was digested stands
        out.tensors["y"] = digest(backend.forward(case.x, case.z, case.w, opts))
        if backend.has_backward:
            g = backend.forward_backward(case.x, case.z, case.w, case.dy, opts)
            for name, t in (("dx", g.dx), ("dz", g.dz), ("dweight", g.dw)):
                if t is not None:
                    out.tensors[name] = digest(t)
    return out


def same_bits(a: Digests | None, b: Digests | None) -> tuple[bool | None, str]:
    """Whether two backends' digests show the same bits: (None, why) where they cannot be compared."""
    if a is None or b is None:
        return None, "no digest in " + " and ".join(w for w, d in (("A", a), ("B", b)) if d is None)
    if a.case != b.case:
        return None, f"different cases: {a.case} vs {b.case}"
    shared = [k for k in a.tensors if k in b.tensors]
    if not shared:
        return None, "no tensor digested in both"
    differ = [k for k in shared if a.tensors[k] != b.tensors[k]]
    only = sorted(set(a.tensors) ^ set(b.tensors))
    tail = f" ({', '.join(only)} in one run only)" if only else ""
    if differ:
        return False, f"differ: {', '.join(differ)}" + tail
    return True, f"same bits: {', '.join(shared)}" + tail


def agreement_output(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    agreement_rows: int,
    agreement_seed: int,
    d: int,
    weight_dtype: str | torch.dtype,
    trail: Trail | None = None,
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
