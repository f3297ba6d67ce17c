"""The launch configurations a backend's kernels take: a row check sees only those this process happened to take
(an autotuner that picked the same one for the batch and the row alone hides the other).

`launch` records which launch parameters change with the row count (Triton's launch hook on a GPU, torch.profiler
for other CUDA kernels, a recording `InterpretedFunction.run` under the interpreter, `Autotuner.run` for each pick;
integer specialisations: docs/spec.md §5.9). `configurations` runs each value of every such parameter against each
other: one no pair changes a bit of is cleared; one whose values cannot all be forced here is unexercised.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rlnorm.inputs import Case
from rlnorm.kit.backends.pins import Setting, kernel_name, patched
from rlnorm.kit.checks.common import Check, CheckOutcome, Trail, bits, caught, check_int, check_ints, differ_masks
from rlnorm.kit.checks.rows import sub_batch_plan
from rlnorm.kit.results import ConfigPair, Configurations, KernelLaunches, Launches
from rlnorm.options import OpOptions
from rlnorm.timing import describe_error

if TYPE_CHECKING:
    from rlnorm.kit.backends import Backend

# the backend's process needs this before torch._inductor reads its config: Inductor's static launcher bypasses
# Triton's launch hooks
LAUNCH_ENV = {"TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER": "0"}
CONFIG = "config"  # the pseudo-parameter of an autotuned kernel whose pick changes with the row count
LAUNCHED = "launched"  # the pseudo-parameter of a kernel launched at some row counts only
INDUCTOR_PREFIXES = ("triton_poi_", "triton_red_", "triton_per_", "triton_tem_", "triton_for_")
UNSEEN_CPU = (
    "CPU (Triton's interpreter): no kernel is compiled, so Triton's launch hook does not fire and there is no "
    "binary, num_warps or num_stages unless a config passes them, and no integer specialisation; torch's own "
    "operators (and torch.compile's C++ kernels) launch no kernel the profiler can see. Recorded: each Triton "
    "launch's constexprs and grid, and each autotuner's key and pick."
)


def ladder(sizes: list[int], top: int) -> list[int]:
    """1..9, 2^k-1, 2^k, 2^k+1 and every size in `sizes`, those <= top (and top itself)."""
    powers = {m for k in range(4, top.bit_length() + 1) for m in (2**k - 1, 2**k, 2**k + 1)}
    return sorted(m for m in {*range(1, 10), *powers, *sizes, top} if m <= top)


@dataclass
class _Kernel:
    seen_by: str
    passes: set[str] = field(default_factory=set)
    # rows -> the launch parameters of each launch at that row count
    launches: dict[int, list[dict[str, str]]] = field(default_factory=lambda: defaultdict(list))
    special: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    autotune: dict[int, str] = field(default_factory=dict)  # rows -> "key (...) -> pick"
    tuned: set[str] = field(default_factory=set)  # the launch parameters an autotuner's configs set


class _Recorder:
    """Collects launches while installed, filed under the row count and pass the check sets in `rows`, `pass_`."""

    def __init__(self) -> None:
        self.kernels: dict[str, _Kernel] = {}
        self.rows = 0
        self.pass_ = ""
        self.benchmarking = 0
        self.triton_names: set[str] = set()  # kernel names seen through Triton in this call (the profiler skips)

    def add(self, name: str, seen_by: str, params: dict[str, Any], special: list[str]) -> None:
        if self.benchmarking or not self.rows:
            return
        k = self.kernels.setdefault(name, _Kernel(seen_by))
        if not (self.pass_ == "backward" and "forward" in k.passes):  # forward+backward repeats the forward's
            k.passes.add(self.pass_)
        k.launches[self.rows].append({p: _word(v) for p, v in params.items()})
        for s in special:
            k.special[s].add(self.rows)

    def add_triton(self, fn: Any, arg_names: list[str], args: dict[str, Any], grid: Any, extra: dict[str, Any],
                   seen_by: str, name: str | None = None) -> None:  # fmt: skip
        name = name or kernel_name(fn)
        self.triton_names.add(getattr(fn, "__name__", name))
        constexpr, nospec = _kinds(fn, arg_names)
        params = {n: args[n] for n in arg_names if n in constexpr and n in args}
        params.update({k: v for k, v in extra.items() if v is not None})
        params.update(_grid_rest(grid, args))
        special = []
        for n in arg_names:
            v = args.get(n)
            if n in constexpr or n in nospec or isinstance(v, bool) or not isinstance(v, int):
                continue
            special += [f"{n}==1"] if v == 1 else [f"{n}%16==0"] if v % 16 == 0 else []
        self.add(name, seen_by, params, special)


def _word(v: Any) -> str:
    return v.__name__ if callable(v) and hasattr(v, "__name__") else str(getattr(v, "value", v))


def _kinds(fn: Any, arg_names: list[str]) -> tuple[set[str], set[str]]:
    """(constexpr argument names, names Triton does not specialise on)."""
    params = getattr(fn, "params", None)
    if params is not None:  # a JITFunction
        return ({p.name for p in params if p.is_constexpr}, {p.name for p in params if p.do_not_specialize})
    raw = getattr(fn, "fn", fn)
    sig = inspect.signature(raw).parameters
    constexpr = {n for n, p in sig.items() if "constexpr" in str(p.annotation)}
    dns = (getattr(fn, "kwargs", None) or {}).get("do_not_specialize") or []
    nospec = {arg_names[d] if isinstance(d, int) else d for d in dns}
    return constexpr, nospec


def _grid_rest(grid: Any, args: dict[str, Any]) -> dict[str, Any]:
    """The grid's axes after the first (the row extent)."""
    if callable(grid):
        try:
            grid = grid(args)
        except Exception:
            return {}
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    return {f"grid[{i}]": g for i, g in enumerate(grid) if i > 0 and g != 1}


@contextlib.contextmanager
def _installed(rec: _Recorder, interpreted: bool) -> Iterator[None]:
    """Wrap Triton's launch points for the duration; restored whatever happens."""
    from triton import knobs
    from triton.runtime import autotuner

    undo = contextlib.ExitStack()
    tuner_run, tuner_bench = autotuner.Autotuner.run, autotuner.Autotuner._bench

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = tuner_run(self, *args, **kwargs)
        if rec.rows and not rec.benchmarking:
            names = dict(zip(self.arg_names, args, strict=False)) | kwargs
            key = {k: _word(names[k]) for k in self.keys if k in names}
            k = rec.kernels.get(kernel_name(self.base_fn))
            if k is not None:
                k.autotune[rec.rows] = f"key {key} -> {self.best_config}"
                k.tuned |= set(self.best_config.all_kwargs())
        return out

    def bench(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec.benchmarking += 1
        try:
            return tuner_bench(self, *args, **kwargs)
        finally:
            rec.benchmarking -= 1

    undo.enter_context(patched(autotuner.Autotuner, "run", run))
    undo.enter_context(patched(autotuner.Autotuner, "_bench", bench))
    if interpreted:
        from triton.runtime.interpreter import InterpretedFunction

        def interp_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            if warmup:
                return
            bound = dict(zip(self.arg_names, args, strict=False)) | kwargs
            extra = {k: kwargs.get(k) for k in ("num_warps", "num_stages")}
            rec.add_triton(self, self.arg_names, bound, grid, extra, "jit_hook")
            # recorded, not executed: no output of a launch is read here

        undo.enter_context(patched(InterpretedFunction, "run", interp_run))
    else:
        from triton.compiler.compiler import CompiledKernel

        meta = CompiledKernel.launch_metadata

        def launch_metadata(self: Any, grid: Any, stream: Any, *args: Any) -> Any:
            out = meta(self, grid, stream, *args)
            if out is not None and hasattr(out, "data"):
                out.data["rlnorm_launch"] = (self, grid, args)
            return out

        def hook(lazy: Any) -> None:
            kernel, grid, args = lazy.data.get("rlnorm_launch", (None, None, ()))
            if kernel is None:  # a launcher that fetched the metadata before this check: its name only
                rec.triton_names.add(str(lazy.data.get("name")))
                rec.add(str(lazy.data.get("name")), "launch_hook", {"config": "not seen"}, [])
                return
            md, src = kernel.metadata, kernel.src
            fn = getattr(src, "fn", None)
            extra = {k: getattr(md, k, None) for k in ("num_warps", "num_stages", "shared")}
            if fn is None or not hasattr(fn, "arg_names"):
                rec.add(f"{getattr(md, 'name', '?')}", "launch_hook", {**extra, **_grid_rest(grid, {})}, [])
                return
            names = list(fn.arg_names)
            bound = dict(zip(names, args, strict=False))
            consts = {k if isinstance(k, str) else names[k[0]]: v for k, v in getattr(src, "constants", {}).items()
                      if isinstance(k, str) or len(k) == 1}  # fmt: skip
            md_name = str(getattr(md, "name", fn.__name__))
            # Inductor's generated modules have throwaway names: its kernels go by their own
            fn_name = f"inductor.{md_name}" if md_name.startswith(INDUCTOR_PREFIXES) else kernel_name(fn)
            constexpr, _ = _kinds(fn, names)
            bound.update({n: v for n, v in consts.items() if n in constexpr})
            rec.triton_names.add(getattr(md, "name", ""))
            rec.add_triton(fn, names, bound, grid, extra, "launch_hook", name=fn_name)

        undo.enter_context(patched(CompiledKernel, "launch_metadata", launch_metadata))
        knobs.runtime.launch_enter_hook.add(hook)  # a HookChain (triton >= 3.6): others' hooks keep running
        undo.callback(knobs.runtime.launch_enter_hook.remove, hook)
    with undo:
        yield


def _profiled(rec: _Recorder, fn: Any) -> None:
    """Run fn() under torch.profiler and record the CUDA kernels Triton did not report."""
    from torch.profiler import ProfilerActivity, profile

    rec.triton_names.clear()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh).get("traceEvents", [])
    for e in events:
        if e.get("cat") != "kernel" or e.get("name") in rec.triton_names:
            continue
        a = e.get("args", {})
        grid, block = list(a.get("grid") or [1]), a.get("block")
        shared = a.get("shared memory", a.get("dynamic shared memory"))
        params = {**_grid_rest(grid, {}), "block": tuple(block) if block else None, "shared": shared}
        name = " ".join(str(e.get("name", "?")).split())
        rec.add(name if len(name) <= 160 else name[:159] + "…", "profiler", params, [])


def _spans(rows: list[int], ladder_: list[int]) -> str:
    """Row counts as runs over the ladder: '1..257, 4097'."""
    idx = sorted(ladder_.index(r) for r in rows)
    out, start = [], idx[0]
    for a, b in zip(idx, [*idx[1:], None], strict=True):
        if b != a + 1:
            lo, hi = ladder_[start], ladder_[a]
            out.append(f"{lo}" if lo == hi else f"{lo}..{hi}")
            start = b if b is not None else 0
    return ", ".join(out)


def summarise(name: str, k: _Kernel, ladder_: list[int], done: list[int] | None = None) -> KernelLaunches:
    """One kernel's record: its configurations, the parameters that change with the row count and the evidence.
    A kernel launched at some of the row counts `done` and not at others changes with the row count too: its
    parameter `launched` (another kernel takes its place there, e.g. a compiled graph of another shape)."""
    configs: dict[str, list[int]] = defaultdict(list)
    values: dict[str, dict[int, frozenset[str]]] = defaultdict(dict)
    params = sorted({p for launches in k.launches.values() for one in launches for p in one})
    for rows, launches in sorted(k.launches.items()):
        for one in {", ".join(f"{p}={one[p]}" for p in sorted(one)) for one in launches}:
            configs[one].append(rows)
        for p in params:
            values[p][rows] = frozenset(one.get(p, "-") for one in launches)
    varying = [p for p in params if len(set(values[p].values())) > 1]
    evidence = []
    for p in varying:
        by = values[p]
        at = {v: _spans([r for r, u in by.items() if u == v], ladder_) for v in dict.fromkeys(by.values())}
        evidence.append(f"{p}=" + ", ".join(f"{'|'.join(sorted(v))} at {rows}" for v, rows in at.items()))
    if any(p in k.tuned for p in varying):  # an autotuner's pick is one parameter: its whole config
        varying = [p for p in varying if p not in k.tuned] + [CONFIG]
    if absent := [r for r in (ladder_ if done is None else done) if r not in k.launches]:
        varying.append(LAUNCHED)
        evidence.append(f"launched at {_spans(sorted(k.launches), ladder_)}, not at {_spans(absent, ladder_)}")
    picks = sorted(set(k.autotune.values()))
    if len(picks) > 1 or (picks and varying):
        at = {p: _spans([r for r, q in k.autotune.items() if q == p], ladder_) for p in picks}
        evidence.append("autotuner: " + "; ".join(f"{p} at {at[p]}" for p in picks))
    special = {s: sorted(r) for s, r in k.special.items() if 0 < len(r) < len(k.launches)}
    return KernelLaunches(
        kernel=name,
        passes=sorted(k.passes, key=["forward", "backward"].index),
        seen_by=k.seen_by,
        configs=dict(configs),
        varying=varying,
        evidence="; ".join(evidence) or None,
        specializations=special or None,
    )


def launch(
    backend: Any,
    opts: OpOptions | None,
    device: str,
    *,
    d: int = 128,
    weight_dtype: Any = "bfloat16",
    launch_rows: int | None = None,
    all_rows_sizes: list[int] | tuple[int, ...] = (),
    sub_batch_sizes: list[int] | tuple[int, ...] = (),
    sub_batches_rows: int = 1,
    sweep_sizes: list[int] | tuple[int, ...] = (),
    dweight_rows: int = 1,
    accuracy_rows: int = 1,
    agreement_rows: int = 1,
    seed: int = 3,
    trail: Trail | None = None,
    progress: bool = False,
) -> CheckOutcome:
    """The backend's forward (and forward+backward) at each row count of the ladder, every launch recorded."""
    c = Check("launch", backend, opts, device, d, weight_dtype, trail)
    used = [*all_rows_sizes, *sub_batch_sizes, *sweep_sizes, sub_batches_rows, dweight_rows, accuracy_rows,
            agreement_rows]  # fmt: skip
    used = check_ints("sizes", used, 1)
    top = max(used) if launch_rows is None else launch_rows
    rows_ladder = ladder(used, top)
    cuda = torch.device(device).type == "cuda"
    interpreted = not cuda and os.environ.get("TRITON_INTERPRET") == "1"
    out = Launches(rows=rows_ladder, unseen=None if cuda else UNSEEN_CPU)
    rec = _Recorder()
    done: list[int] = []  # the row counts whose passes all ran
    passes = [("forward", False)] + ([("backward", True)] if c.with_grad else [])
    try:
        with _installed(rec, interpreted):
            for rows in rows_ladder:
                case = c.case(rows, seed)  # one batch, marked once: each pass is given the same
                for name, grad in passes:
                    rec.rows, rec.pass_ = rows, name
                    once = functools.partial(c.call, case, grad)
                    _profiled(rec, once) if cuda else once()
                done.append(rows)
                rec.rows = 0
    except Exception as exc:
        out.error = f"at {rec.rows} rows ({rec.pass_}): {describe_error(exc)}"
    out.kernels = [summarise(n, k, rows_ladder, done) for n, k in sorted(rec.kernels.items())]
    return CheckOutcome(out, [], out.error)


# what one setting gave: the full batch's (y, dx, dz), its dweight, and per sub-batch size the rows' (y, dx, dz)
_Run = tuple[tuple[Tensor | None, ...], Tensor | None, dict[int, tuple[Tensor | None, ...]]]


def _run(setting: Setting, c: Check, case: Case, sizes: list[int]) -> _Run:
    assert setting.pin is not None
    rows = case.x.shape[0]
    with setting.pin():
        c.mark({"kind": "slice", "start": 0, "size": rows})
        g = c.backend.forward_backward(case.x, case.z, case.w, case.dy, c.opts) if c.with_grad else None
        full = c.call(case, grad=False) if g is None else (g.y, g.dx, g.dz)
        parts = {size: c.pieces(case, sub_batch_plan(rows, size)) for size in sizes}
    return tuple(None if t is None else t.detach() for t in full), None if g is None else g.dw, parts


def _pair(a: Setting, b: Setting, ra: _Run, rb: _Run) -> ConfigPair:
    """The full batch under a against the rows alone / sub-batches under b; dweight of the full batch a vs b."""
    (full, dw_a, _), (_, dw_b, parts) = ra, rb
    fwd = grad = 0
    for piece in parts.values():
        masks, grad_mask = differ_masks(full, piece)
        fwd, grad = fwd + int(masks["y"].sum()), grad + int(grad_mask.sum())
    both = a is not b and dw_a is not None and dw_b is not None
    dweight = bool(torch.equal(bits(dw_a), bits(dw_b))) if both else None
    return ConfigPair(a.kernel, a.parameter, a.value, b.value, fwd, None if full[1] is None else grad, dweight)


def configurations(
    backend: Backend,
    opts: OpOptions | None,
    device: str,
    *,
    configurations_rows: int,
    configurations_sizes: Sequence[int],
    configurations_seed: int,
    d: int,
    weight_dtype: str | torch.dtype,
    trail: Trail | None = None,
    progress: bool = True,
) -> CheckOutcome:
    """Each launch parameter the backend's kernels pick by row count or autotuner, at each of its values: the
    full batch of `configurations_rows` under one value against its rows in sub-batches of each of
    `configurations_sizes` (1: alone) under another, for every ordered pair of values."""
    rows = check_int("configurations_rows", configurations_rows, 1)
    sizes = check_ints("configurations_sizes", configurations_sizes, 1)
    seed = check_int("configurations_seed", configurations_seed)
    if any(s > rows for s in sizes):
        raise ValueError(f"configurations_sizes: expected sizes no larger than configurations_rows={rows}, got {sizes}")
    c = Check("configurations", backend, opts, device, d, weight_dtype, trail, progress)
    summary = Configurations()
    with caught(summary):
        groups: dict[str, list[Setting]] = {}
        for s in backend.configurations(c.opts, device, d):
            groups.setdefault(s.key, []).append(s)
            if s.pin is not None:
                summary.values.setdefault(s.key, []).append(s.value)
            for name, value in s.implies.items():
                implied = summary.values.setdefault(name, [])
                if value not in implied:
                    implied.append(value)
        for key, group in groups.items():
            if unrun := [s for s in group if s.pin is None]:
                whys = "; ".join(dict.fromkeys(str(s.why) for s in unrun))
                summary.unexercised[key] = f"{whys} ({len(unrun)} of its {len(group)} values not run)"
        case = c.case(rows, seed, whole=False)
        for key, group in groups.items():
            pinned = [s for s in group if s.pin is not None]
            if not pinned:
                continue
            ran = [(s, _run(s, c, case, sizes)) for s in pinned]
            pairs = [_pair(a, b, ra, rb) for a, ra in ran for b, rb in ran]
            summary.pairs += pairs
            clean = all(p.fwd_differ == 0 and not p.rowgrad_differ and p.dweight_equal is not False for p in pairs)
            if clean and key not in summary.unexercised:
                implied = {n for s in group for n in s.implies}
                summary.cleared += [key, *sorted(implied - set(summary.cleared))]
    return c.outcome(summary)
