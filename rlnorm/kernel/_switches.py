"""Switches of the kernels' launches, for benchmarks, and the faults tests plant.

`variant` sets switches for the forward and backward launches within a block (the benchmark hook);
`rlnorm.kernel.testing.planted` plants faults (tests only). Both only ever change the launch through
values that are the same for every row, so every variant is still batch invariant; the forward's outputs
are claimed correctly rounded under every variant except EXACT=0 and a NEAR_T below the op's default bound
(docs/kernel.md §3 says what that claim rests on).
This module imports neither torch nor Triton: `from rlnorm.kernel import variant` stays cheap.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

FWD_SWITCHES: dict[str, str] = {
    "EXACT": "1 (default): rows the midpoint and range tests flag are settled in fp64; "
    "0: never (timing only, outputs NOT correctly rounded)",
    "TIER2": "1 (default): near-midpoint elements of bf16 rows settled one by one first; "
    "0: flagged rows go whole to fp64",
    "NEAR_T": "int 0..4096: the midpoint test's bound T in fp32 ulps (default: the op's bound, 10 gated, 24 with "
    "the gate first, 8 without a gate; below it outputs are NOT claimed correctly rounded)",
    "SPLIT": "1 or 2: column chunks per thread (default: 2 where the group width rounded up to a power of two, "
    "BLOCK_G, is 32 or more, else 1)",
    "MAXNREG": "int 0..255: register cap per thread, 0 = the compiler's choice (default: 64 at 128 and 256 "
    "columns where the tier runs, else 0)",
    "BLOCK_R": "power of two 1..64: rows per program (default: from the width, 512 or 1024 elements per program)",
    "NUM_WARPS": "power of two 1..32: warps per program (default: from the width, 16 elements per thread)",
}
BWD_SWITCHES: dict[str, str] = {
    "BLOCK_R": "power of two 1..256: rows per tile (default: from the width)",
    "NUM_WARPS": "power of two 1..32: warps per program (default: 1 up to 256 columns, else width / 128, 2..16)",
    "TILES": "int 1..64 (1..63 with COLD_MODE 0): tiles per program, capped by the dweight counters' window "
    "layout (_dweight.MAX_TILES) (default: from the row count; it only partitions the rows and changes no bit)",
    "STAGES": "int 1..8: cp.async pipeline depth of the tile loop's loads (default: 4, or 6 above 128 columns, "
    "up to 256 columns; else 1)",
    "PREFETCH": "0 or 1: load tile t + 1 before tile t's math (default: 1 for 257..2048 columns)",
    "MAXNREG": "int 0..255: register cap per thread, 0 = the compiler's choice (default: 168, or 200 for groups "
    "in a 256-column row, up to 256 columns; else 0)",
    "COLD_MODE": "0 or 1: rare dweight values kept aside and added after the tile loop (0) or added inline (1) "
    "(default: 1 up to 256 columns, else 0)",
    "RSTD_FAST": "0 or 1: rstd as 1 / sqrt_rn (0) or rsqrt.approx and a Newton step (1, GPU only) "
    "(default: 1 above 128 columns)",
    "DWEIGHT": "1 (default); 0: no dweight accumulation (timing dx, dz alone: dweight comes back zero)",
}


def _one_of(*allowed: int) -> Callable[[int], bool]:
    return lambda v: v in allowed


def _int_range(lo: int, hi: int) -> Callable[[int], bool]:
    return lambda v: lo <= v <= hi


def _pow2(hi: int) -> Callable[[int], bool]:
    return lambda v: 1 <= v <= hi and v & (v - 1) == 0


_FWD_VALID = {
    "EXACT": _one_of(0, 1),
    "TIER2": _one_of(0, 1),
    "NEAR_T": _int_range(0, 4096),
    "SPLIT": _one_of(1, 2),
    "MAXNREG": _int_range(0, 255),
    "BLOCK_R": _pow2(64),
    "NUM_WARPS": _pow2(32),
}
_BWD_VALID = {
    "BLOCK_R": _pow2(256),
    "NUM_WARPS": _pow2(32),
    "TILES": _int_range(1, 64),  # _dweight.MAX_TILES (not imported: no Triton here)
    "STAGES": _int_range(1, 8),
    "PREFETCH": _one_of(0, 1),
    "MAXNREG": _int_range(0, 255),
    "COLD_MODE": _one_of(0, 1),
    "RSTD_FAST": _one_of(0, 1),
    "DWEIGHT": _one_of(0, 1),
}
# None: chosen by the launcher from the width (and the row count, for TILES)
FWD_DEFAULTS: dict[str, int | None] = {name: None for name in FWD_SWITCHES} | {"EXACT": 1, "TIER2": 1}
BWD_DEFAULTS: dict[str, int | None] = {name: None for name in BWD_SWITCHES} | {"DWEIGHT": 1}

_fwd: dict[str, int | None] = dict(FWD_DEFAULTS)
_bwd: dict[str, int | None] = dict(BWD_DEFAULTS)


def _listing(switches: dict[str, str]) -> str:
    return "".join(f"\n  {name}: {desc}" for name, desc in switches.items())


def _merged(
    current: dict[str, int | None],
    given: Mapping[str, Any] | None,
    which: str,
    switches: dict[str, str],
    valid: dict[str, Callable[[int], bool]],
) -> dict[str, int | None]:
    if given is None:
        return current
    if not isinstance(given, Mapping):
        raise TypeError(f"variant: {which}= expects a mapping of switch names to values, got {type(given).__name__}")
    defaults = FWD_DEFAULTS if which == "fwd" else BWD_DEFAULTS
    kind = "forward" if which == "fwd" else "backward"
    valid_ones = f"the {kind} switches ({which.upper()}_SWITCHES) are:{_listing(switches)}"
    out = dict(current)
    for name, value in given.items():
        if name not in switches:
            raise ValueError(f"variant: unknown {kind} switch {name!r}; {valid_ones}")
        if value is None:
            out[name] = defaults[name]
            continue
        try:
            number = operator.index(value)  # ints (bools as 0 / 1), not floats
        except TypeError:
            number = None
        if number is None or not valid[name](number):
            raise ValueError(f"variant: {kind} switch {name}={value!r} is not allowed ({switches[name]}); {valid_ones}")
        out[name] = int(number)
    return out


@contextlib.contextmanager
def variant(fwd: Mapping[str, Any] | None = None, bwd: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Within the block, every forward / backward launch (including through rms_norm_gated and
    RMSNormGated, autograd included) uses these switches over the defaults.

    Names are those of FWD_SWITCHES / BWD_SWITCHES (name -> one-line description with the allowed
    values); a value of None restores that switch's default. Blocks nest: an inner block applies its
    switches over the outer one's, and every block restores on exit, also on an exception. An unknown
    switch or a bad value raises ValueError, naming it and listing the valid switches. Not thread-safe.
    """
    global _fwd, _bwd
    new_fwd = _merged(_fwd, fwd, "fwd", FWD_SWITCHES, _FWD_VALID)
    new_bwd = _merged(_bwd, bwd, "bwd", BWD_SWITCHES, _BWD_VALID)
    saved = _fwd, _bwd
    _fwd, _bwd = new_fwd, new_bwd
    try:
        yield
    finally:
        _fwd, _bwd = saved


def fwd_switches() -> Mapping[str, int | None]:
    """The forward's switches now in force: every FWD_SWITCHES name, None where the launcher chooses."""
    return _fwd


def bwd_switches() -> Mapping[str, int | None]:
    """The backward's switches now in force (as fwd_switches). The same object until a variant block
    starts or ends, so a caller can tell whether the switches changed by identity."""
    return _bwd


@dataclass(frozen=True)
class Faults:
    """Faults and test levers planted by `rlnorm.kernel.testing.planted`; the defaults plant none."""

    fast_ulps: int = 0
    plain_products: bool = False
    no_midpoint_test: bool = False
    tier2_ulps: int = 0
    tier2_margin: int | None = None


NO_FAULTS = Faults()
_faults = NO_FAULTS


def planted_faults() -> Faults:
    """The faults planted now (NO_FAULTS outside `rlnorm.kernel.testing.planted`)."""
    return _faults


@contextlib.contextmanager
def faults_planted(faults: Faults) -> Iterator[None]:
    """`faults` in force within the block, restored on exit (`rlnorm.kernel.testing.planted`'s mechanism)."""
    global _faults
    saved = _faults
    _faults = faults
    try:
        yield
    finally:
        _faults = saved
