"""TEST ONLY: faults planted in the kernels, so the tests can show that they catch each one.

Never use this outside tests: inside `planted(...)` the kernels' outputs are wrong on purpose. Every
fault is one the kernel's design guards against, and each has a test that plants it and sees it caught
(tests/kernel/).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rlnorm.kernel._switches import Faults, faults_planted

__all__ = ["planted"]


@contextlib.contextmanager
def planted(
    *,
    fast_ulps: int = 0,
    plain_products: bool = False,
    no_midpoint_test: bool = False,
    tier2_ulps: int = 0,
    tier2_margin: int | None = None,
) -> Iterator[None]:
    """Within the block, every forward launch carries these faults (test levers, for the last one).

    fast_ulps: the fast path's fp32 result moved by this many fp32 ulps before the midpoint test (a
        bound T that covers it keeps the outputs correctly rounded; EXACT=0 shows the fault).
    plain_products: fast-path products keep subnormals instead of flushing them, so an intermediate
        that underflows goes unseen by the range test.
    no_midpoint_test: no element is sent to an exact path for lying near a rounding midpoint.
    tier2_ulps: the per-element tier's fp64 value moved by this many fp64 ulps.
    tier2_margin: the tier's "undecided" margin in fp64 ulps instead of its default (a lever: wider than
        tier2_ulps covers that fault; wider than any distance leaves every element undecided).

    Blocks do not merge: the innermost block's faults are the ones in force. Not thread-safe.
    """
    faults = Faults(
        fast_ulps=fast_ulps,
        plain_products=plain_products,
        no_midpoint_test=no_midpoint_test,
        tier2_ulps=tier2_ulps,
        tier2_margin=tier2_margin,
    )
    with faults_planted(faults):
        yield
