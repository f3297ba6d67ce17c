"""Forcing a kernel's launch configuration: inside a `Setting`'s `pin()` every call launches with that value (the
`configurations` check). Ordinary calls use only `pin_first_configs`, where no autotuner can time (a CPU)."""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

Pin = Callable[[], AbstractContextManager[Any]]


@dataclass
class Setting:
    """One value of one launch parameter. `pin` None: the value exists but cannot be forced here (`why`)."""

    kernel: str  # qualified name of the kernel the parameter belongs to
    parameter: str  # "config" for an autotuner's whole config, else the parameter's name ("ROWS_PER_BLOCK")
    value: str  # the value in words ("BT=16, num_warps=4")
    pin: Pin | None = None
    why: str | None = None  # why it cannot be forced here
    # parameters this value fixes at the same time, in this kernel or another one the same launcher starts (rlnorm:
    # TILES fixes HOT_WIDTH; STRIPES is also the finalize kernel's): "kernel.parameter" -> value
    implies: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kernel}.{self.parameter}"


def _unwrap(obj: Any, until: type) -> Any:
    """Down a Triton kernel's `.fn` chain (Autotuner / Heuristics / JITFunction) to the first `until`."""
    for _ in range(8):
        if isinstance(obj, until) or not hasattr(obj, "fn"):
            break
        obj = obj.fn
    return obj


def kernel_name(obj: Any) -> str:
    """`module.name` of the Python function under a Triton kernel."""
    obj = _unwrap(obj, types.FunctionType)
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"


def autotuner(obj: Any) -> Any:
    """The triton Autotuner inside a kernel object (under @triton.heuristics, say)."""
    from triton.runtime.autotuner import Autotuner

    found = _unwrap(obj, Autotuner)
    if not isinstance(found, Autotuner):
        raise ValueError(f"autotuner: {kernel_name(obj)} is not an autotuned Triton kernel")
    return found


def config_words(config: Any) -> str:
    """A triton.Config in words: its constexprs, then num_warps and num_stages."""
    parts = [f"{k}={v}" for k, v in sorted(config.kwargs.items())]
    return ", ".join([*parts, f"num_warps={config.num_warps}", f"num_stages={config.num_stages}"])


@contextlib.contextmanager
def pin_first_configs(autotuners: Iterable[Any]) -> Iterator[None]:
    """Each autotuner not already pinned runs its first config: where none can time (no active driver). An Autotuner
    with a single config launches it untimed; its cache of earlier picks is used again after."""
    with contextlib.ExitStack() as stack:
        for at in autotuners:
            if len(at.configs) > 1:
                stack.enter_context(patched(at, "configs", at.configs[:1]))
        yield


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block."""
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


@contextlib.contextmanager
def _pinned(autotuner: Any, config: Any, autotuners: list[Any]) -> Iterator[None]:
    with patched(autotuner, "configs", [config]), pin_first_configs(autotuners):  # the others run their first
        yield


def autotuner_settings(autotuners: list[Any], distinct_kwargs_only: bool = False) -> list[Setting]:
    """One Setting per config of each autotuner, the others pinned to their first; `distinct_kwargs_only` (the Triton
    interpreter ignores num_warps and num_stages): one per set of constexprs."""
    out: list[Setting] = []
    for at in autotuners:
        seen: set[tuple] = set()
        for cfg in at.configs:
            sig = tuple(sorted(cfg.kwargs.items()))
            if distinct_kwargs_only and sig in seen:
                continue
            seen.add(sig)
            words = ", ".join(f"{k}={v}" for k, v in sig) if distinct_kwargs_only else config_words(cfg)
            out.append(Setting(kernel_name(at), "config", words, functools.partial(_pinned, at, cfg, autotuners)))
    return out
