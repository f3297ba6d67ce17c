"""What the launches read of `rlnorm.kernel.testing.plant`: its switches and planted faults, or the defaults.

Outside a `plant` block the launchers see the defaults below and no fault keywords, so the shipped op
launches as it always does. Only `plant` changes this state. Imports neither torch nor Triton.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# None: chosen by the launcher from the width (and the row count: the forward's BLOCK_R, the backward's TILES, STRIPES)
FWD_DEFAULTS: dict[str, int | None] = dict.fromkeys(
    ("EXACT", "TIER2", "NEAR_T", "SPLIT", "MAXNREG", "BLOCK_R", "NUM_WARPS")
) | {"EXACT": 1, "TIER2": 1}
BWD_DEFAULTS: dict[str, int | None] = dict.fromkeys(
    ("BLOCK_R", "NUM_WARPS", "TILES", "STRIPES", "STAGES", "PREFETCH", "MAXNREG", "COLD_MODE", "RSTD_FAST", "DWEIGHT")
) | {"DWEIGHT": 1}


@dataclass(frozen=True)
class Planted:
    """One `plant` block's state: the switches in force and the faults planted."""

    fwd: Mapping[str, int | None] = field(default_factory=lambda: dict(FWD_DEFAULTS))  # what the launch reads
    fwd_set: Mapping[str, int | None] = field(default_factory=lambda: dict(FWD_DEFAULTS))  # as plant set them
    bwd: Mapping[str, int | None] = field(default_factory=lambda: dict(BWD_DEFAULTS))
    faults: Mapping[str, Any] = field(default_factory=dict)  # plant's fault keywords, as given
    fwd_kernel: Mapping[str, Any] = field(default_factory=dict)  # the forward kernel's fault constexprs


_now = Planted()


def fwd_switches() -> Mapping[str, int | None]:
    """The forward's switches in force: every FWD_SWITCHES name, None where the launcher chooses (NEAR_T is -1
    where the midpoint test is planted away)."""
    return _now.fwd


def bwd_switches() -> Mapping[str, int | None]:
    """The backward's switches in force. The same object until a block that sets backward switches starts or
    ends, so a caller can tell whether they changed by identity."""
    return _now.bwd


def fwd_fault_keywords() -> Mapping[str, Any]:
    """The forward kernel's fault constexprs that a `plant` block overrides (empty outside one): the kernel's
    defaults plant nothing."""
    return _now.fwd_kernel


def planted() -> Planted:
    """The state now in force (what an inner `plant` block builds on)."""
    return _now


@contextlib.contextmanager
def holding(state: Planted) -> Iterator[None]:
    """`state` in force within the block, the outer one restored on exit (`plant`'s mechanism)."""
    global _now
    saved, _now = _now, state
    try:
        yield
    finally:
        _now = saved
