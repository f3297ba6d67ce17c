"""Contract gates (docs/spec.md §5): a forward and a gradient gate per backend, each in its own child process.

A child process, because the thing being gated may take the process down (a device assert, a
segfault in a compiled extension) or never return; the parent records returncode, the lines
printed so far, the stderr tail and whether it timed out, and goes on.

Workload: 4 samples of 11, 16, 13 and 19 tokens (59 tokens), each token `heads` rows of width D
(rows are token-major: row = token * heads + head), drawn by `rlnorm.inputs.make_case` with an
fp32 weight. Each *cell* processes the same rows in another arrangement, as one or more calls:

| cell | calls |
|---|---|
| `BN/full` | the 4 samples concatenated, one call |
| `BN/chunked` | the concatenation in chunks of 7 tokens (chunks cross sample boundaries) |
| `B1/full` | each sample alone |
| `B1/chunked` | each sample alone, in chunks of 7 tokens |
| `BN/padded-left`, `BN/padded-right` | a [4, 19]-token batch, samples zero-padded on that side (dy = 0 there) |
| `BN/permuted` | the tokens in a seeded random order (a token's heads stay together), one call |
| `BN/packed` | the samples packed in the reverse order, one call |

Forward gate: every token's output in every cell is bitwise equal to its `BN/full` output.
Gradient gate: the same for dx and dz; and dweight, the backend's OWN autograd dweight, in lines of
the reference report's format:

    singleton_aggregate pair=('BN/full', 'B1-singleton_aggregate/full') tensor=dweight max_abs=... passed=...

where the aggregate is `rlnorm.numerics.exact_sum` of the dweights of single-ROW runs (exact, so a
kernel with an order-independent dweight can pass bitwise; a single row, because summing per-token
partials that were already rounded would not be exact). `/chunked` repeats the single-row runs in
the order of `B1/chunked`, each row a one-row view into its chunk: the same multiset, so it differs
from `/full` only if a row's dweight depends on the call (nondeterminism) or on the storage.
NEW lines compare `BN/full`'s dweight with the one-call cells `BN/permuted`, `BN/padded-left`,
`BN/padded-right` and `BN/packed`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import torch
from torch import Tensor

from rlnorm.inputs import Case, make_case
from rlnorm.kit.backends import Backend, load_backend
from rlnorm.kit.isolation import child_env, kill_group
from rlnorm.numerics import exact_sum
from rlnorm.options import OpOptions

SAMPLE_TOKENS = (11, 16, 13, 19)
CHUNK_TOKENS = 7
GATES = ("forward", "gradient")
STDERR_TAIL_LINES = 20
# exit codes of the child: 0 ran to the end (verdict in the lines), 3 backend cannot run here
EXIT_UNAVAILABLE = 3
# "1" in the gates' child process (the planted crash and hang faults of the tests act only there)
GATE_CHILD_ENV = "RLNORM_GATE_CHILD"

LINE_RE = re.compile(
    r"^(?P<kind>\w+) pair=\('(?P<a>[^']*)', '(?P<b>[^']*)'\) tensor=(?P<tensor>\w+) "
    r"max_abs=(?P<max_abs>\S+) passed=(?P<passed>True|False)$"
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------- workload
@dataclass
class Cell:
    """One arrangement of the workload: calls, each a list of token slots (-1 = a zero padding token)."""

    name: str
    calls: list[list[int]]


def _sample_token_ranges() -> list[list[int]]:
    out, start = [], 0
    for n in SAMPLE_TOKENS:
        out.append(list(range(start, start + n)))
        start += n
    return out


def _chunks(tokens: list[int], size: int) -> list[list[int]]:
    return [tokens[i : i + size] for i in range(0, len(tokens), size)]


def build_cells(seed: int = 0) -> list[Cell]:
    """The cells of docs/spec.md §5, in token slots; `BN/full` first (everything is compared with it)."""
    samples = _sample_token_ranges()
    all_tokens = [t for s in samples for t in s]
    longest = max(SAMPLE_TOKENS)
    g = torch.Generator().manual_seed(seed + 7)
    perm = torch.randperm(len(all_tokens), generator=g).tolist()
    return [
        Cell("BN/full", [all_tokens]),
        Cell("BN/chunked", _chunks(all_tokens, CHUNK_TOKENS)),
        Cell("B1/full", [list(s) for s in samples]),
        Cell("B1/chunked", [c for s in samples for c in _chunks(s, CHUNK_TOKENS)]),
        Cell("BN/padded-left", [[t for s in samples for t in [-1] * (longest - len(s)) + s]]),
        Cell("BN/padded-right", [[t for s in samples for t in s + [-1] * (longest - len(s))]]),
        Cell("BN/permuted", [[all_tokens[i] for i in perm]]),
        Cell("BN/packed", [[t for s in reversed(samples) for t in s]]),
    ]


def _rows_of(tokens: list[int], heads: int) -> list[int]:
    return [t * heads + h if t >= 0 else -1 for t in tokens for h in range(heads)]


def _gather(src: Tensor, rows: list[int]) -> Tensor:
    """Rows of src, zero rows where the slot is -1 (padding)."""
    idx = torch.tensor([max(r, 0) for r in rows], dtype=torch.long, device=src.device)
    out = src.index_select(0, idx)
    pad = torch.tensor([r < 0 for r in rows], dtype=torch.bool, device=src.device)
    return torch.where(pad[:, None], torch.zeros((), dtype=src.dtype, device=src.device), out).contiguous()


def _scatter(dst: Tensor, rows: list[int], values: Tensor) -> None:
    keep = [i for i, r in enumerate(rows) if r >= 0]
    dst[torch.tensor([rows[i] for i in keep], dtype=torch.long, device=dst.device)] = values[keep].to(dst.device)


# ----------------------------------------------------------------------------- lines
def _same_bits(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def _max_abs(a: Tensor, b: Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max().item())


def format_line(kind: str, a: str, b: str, tensor: str, x: Tensor, y: Tensor) -> str:
    """A report-format line comparing tensors x (cell a) and y (cell b) bitwise."""
    return f"{kind} pair=('{a}', '{b}') tensor={tensor} max_abs={_max_abs(x, y):.8e} passed={_same_bits(x, y)}"


def parse_line(line: str) -> dict | None:
    """The fields of a gate line, or None if the line is not one."""
    m = LINE_RE.match(line.strip())
    if not m:
        return None
    d = m.groupdict()
    d["passed"] = d["passed"] == "True"
    d["max_abs"] = float(d["max_abs"])
    return d


# ----------------------------------------------------------------------------- gate bodies (child side)
def _workload(heads: int, d: int, seed: int, weight_dtype: torch.dtype, device: str) -> Case:
    return make_case(sum(SAMPLE_TOKENS) * heads, d, seed=seed, weight_dtype=weight_dtype, device=device)


def forward_gate(
    backend: Backend,
    opts: OpOptions,
    device: str,
    heads: int = 2,
    d: int = 128,
    seed: int = 0,
    weight_dtype: torch.dtype = torch.float32,
    emit: Callable[[str], Any] = print,
) -> list[str]:
    """Every token's forward output bitwise equal across cells. Emits lines as they are made."""
    case = _workload(heads, d, seed, weight_dtype, device)
    lines: list[str] = []
    outs: dict[str, Tensor] = {}
    for cell in build_cells(seed):
        y = torch.full_like(case.x, float("nan"))
        for tokens in cell.calls:
            rows = _rows_of(tokens, heads)
            yc = backend.forward(_gather(case.x, rows), _gather(case.z, rows), case.w, opts)
            _scatter(y, rows, yc)
        outs[cell.name] = y
        if cell.name != "BN/full":
            line = format_line("bitwise", "BN/full", cell.name, "y", outs["BN/full"], y)
            lines.append(line)
            emit(line)
    return lines


def gradient_gate(
    backend: Backend,
    opts: OpOptions,
    device: str,
    heads: int = 2,
    d: int = 128,
    seed: int = 0,
    weight_dtype: torch.dtype = torch.float32,
    emit: Callable[[str], Any] = print,
) -> list[str]:
    """dx, dz bitwise equal across cells; dweight against the exact singleton aggregate and one-call cells."""
    case = _workload(heads, d, seed, weight_dtype, device)
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        emit(line)

    grads: dict[str, dict[str, Tensor]] = {}
    dweights: dict[str, Tensor] = {}
    for cell in build_cells(seed):
        dx = torch.full_like(case.x, float("nan"))
        dz = torch.full_like(case.z, float("nan"))
        for tokens in cell.calls:
            rows = _rows_of(tokens, heads)
            g = backend.forward_backward(
                _gather(case.x, rows), _gather(case.z, rows), case.w, _gather(case.dy, rows), opts
            )
            _scatter(dx, rows, g.dx)
            if g.dz is not None:
                _scatter(dz, rows, g.dz)
            if len(cell.calls) == 1:
                if g.dw is None:
                    raise RuntimeError(f"{cell.name}: forward_backward returned no dweight")
                dweights[cell.name] = g.dw.detach().to("cpu")
        grads[cell.name] = {"dx": dx, "dz": dz}
        if cell.name != "BN/full":
            out(format_line("bitwise", "BN/full", cell.name, "dx", grads["BN/full"]["dx"], dx))
            out(format_line("bitwise", "BN/full", cell.name, "dz", grads["BN/full"]["dz"], dz))

    full_dw = dweights["BN/full"]
    n_rows = case.x.shape[0]
    # single-row runs, canonical order, each row a fresh contiguous tensor
    singles = []
    for r in range(n_rows):
        g = backend.forward_backward(
            case.x[r : r + 1].clone(), case.z[r : r + 1].clone(), case.w, case.dy[r : r + 1].clone(), opts
        )
        singles.append(g.dw.detach().to("cpu", torch.float32))
    agg = exact_sum(torch.stack(singles), case.w.dtype) if singles else torch.zeros_like(full_dw)
    pair_b = "B1-singleton_aggregate/full"
    out(format_line("singleton_aggregate", "BN/full", pair_b, "dweight", full_dw, agg.to(full_dw.dtype)))
    # the same single rows again, in B1/chunked order, each a one-row view into its chunk
    singles_chunked = []
    b1_chunked = next(c for c in build_cells(seed) if c.name == "B1/chunked")
    for tokens in b1_chunked.calls:
        rows = _rows_of(tokens, heads)
        xc, zc, dyc = _gather(case.x, rows), _gather(case.z, rows), _gather(case.dy, rows)
        for i in range(len(rows)):
            g = backend.forward_backward(xc[i : i + 1], zc[i : i + 1], case.w, dyc[i : i + 1], opts)
            singles_chunked.append(g.dw.detach().to("cpu", torch.float32))
    agg_c = exact_sum(torch.stack(singles_chunked), case.w.dtype)
    pair_b = "B1-singleton_aggregate/chunked"
    out(format_line("singleton_aggregate", "BN/full", pair_b, "dweight", full_dw, agg_c.to(full_dw.dtype)))
    for name in ("BN/permuted", "BN/padded-left", "BN/padded-right", "BN/packed"):
        out(format_line("dweight", "BN/full", name, "dweight", full_dw, dweights[name]))
    return lines


# ----------------------------------------------------------------------------- parent side
def _gate_result(returncode: int | None, stdout: str, stderr: str, timed_out: bool) -> dict[str, Any]:
    lines = [ln.strip() for ln in stdout.splitlines() if parse_line(ln)]
    failed = [ln for ln in lines if not parse_line(ln)["passed"]]
    singleton = [ln for ln in lines if ln.startswith("singleton_aggregate ")]
    passed = (returncode == 0) and not timed_out and bool(lines) and not failed
    return {
        "returncode": returncode,
        "passed": passed,
        "failed_lines": failed,
        "singleton_aggregate": singleton,
        "stderr_tail": stderr.splitlines()[-STDERR_TAIL_LINES:],
        "timed_out": timed_out,
        "lines": lines,
    }


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def run_gates(
    backend_spec: str | Backend,
    opts: OpOptions | dict[str, Any] | None = None,
    device: str = "cpu",
    timeout_s: float = 600.0,
    *,
    gates: tuple[str, ...] = GATES,
    heads: int = 2,
    d: int = 128,
    seed: int = 0,
    weight_dtype: str = "float32",
) -> dict[str, dict[str, Any]]:
    """Run each gate in its own child process (concurrently, one deadline of `timeout_s` for all); never raises for
    what the child does.

    `backend_spec` is a registered key, an import path, or a Backend whose `key` is one of those.
    Returns {gate: {returncode, passed, failed_lines, singleton_aggregate, stderr_tail, timed_out, lines}}.
    """
    spec = getattr(backend_spec, "key", backend_spec)
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"backend_spec: expected a registered key or 'package.module:attr', got {backend_spec!r}")
    if opts is None:
        opts = OpOptions()
    elif isinstance(opts, dict):
        opts = OpOptions(**opts)
    elif not isinstance(opts, OpOptions):
        raise TypeError(f"opts: expected OpOptions, dict or None, got {type(opts).__name__}")
    for g in gates:
        if g not in GATES:
            raise ValueError(f"gates: expected a subset of {GATES}, got {g!r}")
    if weight_dtype not in _DTYPES:
        raise ValueError(f"weight_dtype: expected one of {sorted(_DTYPES)}, got {weight_dtype!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: expected > 0, got {timeout_s!r}")
    procs: dict[str, subprocess.Popen] = {}
    # each child writes to files, never pipes: a child waited on second must not block on a full pipe meanwhile
    files: dict[str, tuple[IO[bytes], IO[bytes]]] = {}
    results: dict[str, dict[str, Any]] = {}
    try:
        for g in gates:
            cmd = [
                sys.executable, "-m", "rlnorm.kit.gates", "--backend", spec, "--gate", g, "--device", str(device),
                "--opts", json.dumps(opts.as_dict()), "--heads", str(heads), "--d", str(d), "--seed", str(seed),
                "--weight-dtype", weight_dtype,
            ]  # fmt: skip
            files[g] = (tempfile.TemporaryFile(), tempfile.TemporaryFile())
            procs[g] = subprocess.Popen(
                cmd,
                stdout=files[g][0],
                stderr=files[g][1],
                stdin=subprocess.DEVNULL,
                env=child_env({GATE_CHILD_ENV: "1"}),
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        for g, proc in procs.items():
            timed_out = False
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc)
                proc.wait()
            stderr = _read(files[g][1])
            if timed_out:
                stderr += f"\n[rlnorm.kit.gates] killed after the {timeout_s:g} s timeout"
            results[g] = _gate_result(proc.returncode, _read(files[g][0]), stderr, timed_out)
    finally:
        # children run in their own sessions (so a crash cannot take the parent's group down); if the
        # parent is interrupted, end them here rather than leave them orphaned
        for proc in procs.values():
            if proc.poll() is None:
                kill_group(proc)
                proc.wait()
        for out, err in files.values():
            out.close()
            err.close()
    return results


# ----------------------------------------------------------------------------- child entry point
def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlnorm.kit.gates", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", required=True, help="registered key or package.module:attr")
    ap.add_argument("--gate", required=True, choices=GATES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--opts", default="{}", help="JSON of OpOptions fields")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weight-dtype", default="float32", choices=sorted(_DTYPES))
    args = ap.parse_args(argv)
    os.environ[GATE_CHILD_ENV] = "1"

    opts = OpOptions(**json.loads(args.opts))
    backend = load_backend(args.backend)
    ok, why = backend.available(args.device)
    if not ok:
        print(f"backend {args.backend!r} unavailable on {args.device}: {why}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    ok, why = backend.supports(opts)
    if not ok:
        print(f"backend {args.backend!r} does not support {opts}: {why}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.gate == "gradient" and not backend.has_backward:
        print(f"backend {args.backend!r} has no backward", file=sys.stderr)
        return EXIT_UNAVAILABLE
    body = forward_gate if args.gate == "forward" else gradient_gate
    body(
        backend, opts, args.device, heads=args.heads, d=args.d, seed=args.seed,
        weight_dtype=_DTYPES[args.weight_dtype], emit=lambda s: print(s, flush=True),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(_main())
