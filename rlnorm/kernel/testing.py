"""TEST ONLY: `plant`, the one hook into the kernels' launches: experiment switches and planted faults.

The switches change only how the launches are shaped, through values that are the same for every row, so
every setting is still batch invariant; the forward's outputs are claimed correctly rounded under every
setting except EXACT=0 and a NEAR_T below the op's default bound (docs/kernel.md §3). The benchmark times
rlnorm under switches (`python -m benchmarks.run --variant`). The faults make outputs wrong on purpose:
each is one the kernel's design guards against, and a test in tests/kernel/ plants it and sees it caught.
Imports neither torch nor Triton.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rlnorm.kernel import _switches

__all__ = ["BWD_SWITCHES", "FWD_SWITCHES", "plant"]

FWD_SWITCHES: dict[str, str] = {
    "EXACT": "1 (default): rows the midpoint and range tests flag are settled in fp64; "
    "0: never (timing only, outputs NOT correctly rounded)",
    "TIER2": "1 (default): near-midpoint elements of bf16 rows settled one by one first; "
    "0: flagged rows go whole to fp64",
    "NEAR_T": "int 0..4096: the midpoint test's threshold T in fp32 ulps (default: from the proven error bound, "
    "per group width and options, e.g. 21 at 128 columns with a silu gate; below it outputs are NOT claimed "
    "correctly rounded)",
    "SPLIT": "1 or 2: column chunks per thread (default: 2 where the group width rounded up to a power of two, "
    "BLOCK_G, is 32 or more, else 1)",
    "MAXNREG": "int 0..255: register cap per thread, 0 = the compiler's choice (default: 64 at 128 and 256 "
    "columns where the tier runs, else 0)",
    "BLOCK_R": "power of two 1..64: rows per program (default on a GPU: 1 in launches of at most "
    "_fwd.DECODE_ROWS[BLOCK_G] rows, 64 to 256 columns; else 512 or 1024 elements per program)",
    "NUM_WARPS": "power of two 1..32: warps per program (default: from the width, 16 elements per thread)",
}
BWD_SWITCHES: dict[str, str] = {
    "BLOCK_R": "power of two 1..256: rows per tile (default: from the width)",
    "NUM_WARPS": "power of two 1..32: warps per program (default: 1 up to 256 columns, else width / 128, 2..16)",
    "TILES": "int 1..64 (1..63 with COLD_MODE 0): tiles per program, capped by the dweight counters' window "
    "layout (_dweight.MAX_TILES) (default: from the row count; it only partitions the rows and changes no bit)",
    "STRIPES": "1, 2, 4 or 8: copies of the dweight counters the programs add into, by pid (default: from the "
    "number of programs, `_dweight.stripes_for`; it only spreads atomics and changes no bit)",
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


_VALID = {
    "fwd": {
        "EXACT": _one_of(0, 1),
        "TIER2": _one_of(0, 1),
        "NEAR_T": _int_range(0, 4096),
        "SPLIT": _one_of(1, 2),
        "MAXNREG": _int_range(0, 255),
        "BLOCK_R": _pow2(64),
        "NUM_WARPS": _pow2(32),
    },
    "bwd": {
        "BLOCK_R": _pow2(256),
        "NUM_WARPS": _pow2(32),
        "TILES": _int_range(1, 64),  # _dweight.MAX_TILES (not imported: no Triton here)
        "STRIPES": _one_of(1, 2, 4, 8),  # _dweight.STRIPES at most
        "STAGES": _int_range(1, 8),
        "PREFETCH": _one_of(0, 1),
        "MAXNREG": _int_range(0, 255),
        "COLD_MODE": _one_of(0, 1),
        "RSTD_FAST": _one_of(0, 1),
        "DWEIGHT": _one_of(0, 1),
    },
}
_TABLES = {"fwd": FWD_SWITCHES, "bwd": BWD_SWITCHES}
_DEFAULTS = {"fwd": _switches.FWD_DEFAULTS, "bwd": _switches.BWD_DEFAULTS}


def _merged(current: Mapping[str, int | None], given: Mapping[str, Any] | None, which: str) -> Mapping[str, int | None]:
    if given is None:
        return current
    if not isinstance(given, Mapping):
        raise TypeError(f"plant: {which}= expects a mapping of switch names to values, got {type(given).__name__}")
    table = _TABLES[which]
    kind = "forward" if which == "fwd" else "backward"
    listing = "".join(f"\n  {name}: {desc}" for name, desc in table.items())
    valid_ones = f"the {kind} switches ({which.upper()}_SWITCHES) are:{listing}"
    out = dict(current)
    for name, value in given.items():
        if name not in table:
            raise ValueError(f"plant: unknown {kind} switch {name!r}; {valid_ones}")
        if value is None:
            out[name] = _DEFAULTS[which][name]
            continue
        try:
            number = operator.index(value)  # ints (bools as 0 / 1), not floats
        except TypeError:
            number = None
        if number is None or not _VALID[which][name](number):
            raise ValueError(f"plant: {kind} switch {name}={value!r} is not allowed ({table[name]}); {valid_ones}")
        out[name] = int(number)
    return out


@contextlib.contextmanager
def plant(
    fwd: Mapping[str, Any] | None = None,
    bwd: Mapping[str, Any] | None = None,
    *,
    fast_ulps: int | None = None,
    plain_products: bool | None = None,
    no_midpoint_test: bool | None = None,
    tier2_ulps: int | None = None,
    tier2_margin: int | None = None,
) -> Iterator[None]:
    """Within the block, every forward / backward launch (through rms_norm_gated and RMSNormGated too, autograd
    included) runs under these switches and faults.

    fwd, bwd: switches, names of FWD_SWITCHES / BWD_SWITCHES (name -> one-line description with the allowed
        values); a value of None restores that switch's default. An unknown switch or a bad value raises
        ValueError naming it and listing the valid ones.
    fast_ulps: the fast path's fp32 result moved by this many fp32 ulps before the midpoint test (a bound T
        that covers it keeps the outputs correctly rounded; EXACT=0 shows the fault).
    plain_products: fast-path products keep subnormals instead of flushing them, so an intermediate that
        underflows goes unseen by the range test.
    no_midpoint_test: no element is sent to an exact path for lying near a rounding midpoint.
    tier2_ulps: the per-element tier's fp64 value moved by this many fp64 ulps.
    tier2_margin: the tier's "undecided" margin in fp64 ulps instead of its default (a lever: wider than
        tier2_ulps covers that fault; wider than any distance leaves every element undecided).

    Blocks nest: an inner block applies what it gives over the outer block's (a fault left None keeps the
    outer's), and every block restores on exit, also on an exception. Not thread-safe.
    """
    outer = _switches.planted()
    new_fwd = _merged(outer.fwd_set, fwd, "fwd")
    new_bwd = _merged(outer.bwd, bwd, "bwd")
    given = {
        "fast_ulps": fast_ulps,
        "plain_products": plain_products,
        "no_midpoint_test": no_midpoint_test,
        "tier2_ulps": tier2_ulps,
        "tier2_margin": tier2_margin,
    }
    faults = {**outer.faults, **{k: v for k, v in given.items() if v is not None}}
    # a negative bound: the kernel runs no midpoint test
    launch_fwd = {**new_fwd, "NEAR_T": -1} if faults.get("no_midpoint_test") else new_fwd
    # the forward kernel's fault constexprs, where they differ from its defaults (no fault)
    kernel: dict[str, Any] = {}
    if faults.get("fast_ulps"):
        kernel["FAULT_ULPS"] = int(faults["fast_ulps"])
    if faults.get("plain_products"):
        kernel["FTZ"] = False
    if faults.get("tier2_ulps"):
        kernel["TIER2_FAULT"] = int(faults["tier2_ulps"])
    if faults.get("tier2_margin") is not None:
        kernel["TIER2_MARGIN"] = int(faults["tier2_margin"])
    with _switches.holding(_switches.Planted(launch_fwd, new_fwd, new_bwd, faults, kernel)):
        yield
