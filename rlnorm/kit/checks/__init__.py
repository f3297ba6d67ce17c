"""The reuse checks of docs/spec.md §5: batch invariance per row, dweight repeatability, accuracy and latency.

Every check takes `(backend, opts, device, *, <its run parameters by their RunParams names>, trail, progress)` and
returns a `CheckOutcome`: its typed summary, one `Record` per differing (row, tensor), and the error that ended it
early. `rlnorm.kit.params.run_check` is the one place that maps a run's parameters onto a check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlnorm.kit.checks.accuracy import accuracy_latency
from rlnorm.kit.checks.common import CheckOutcome
from rlnorm.kit.checks.configurations import configurations
from rlnorm.kit.checks.dweight import dweight_repeatable
from rlnorm.kit.checks.rows import all_rows, full_vs_sub_batches
from rlnorm.kit.checks.sweep import batch_size_sweep
from rlnorm.kit.results import BatchInvariance

# the per-backend checks, in the order a run gives them and reports them
CHECKS: dict[str, Callable[..., CheckOutcome]] = {
    "all_rows": all_rows,
    "dweight_repeatable": dweight_repeatable,
    "full_vs_sub_batches": full_vs_sub_batches,
    "batch_size_sweep": batch_size_sweep,
    "accuracy_latency": accuracy_latency,
    "configurations": configurations,
}
CHECK_ORDER: tuple[str, ...] = tuple(CHECKS)
# the checks whose verdicts make `batch_invariant`, in the report's order
INVARIANCE_CHECKS = CHECK_ORDER[:4]


def batch_invariant(inv: BatchInvariance, errors: Mapping[str, str] | None = None) -> bool | None:
    """False on any difference (or a non-repeatable dweight); None if a row check is missing or raised (its
    summary's error, or `errors[check]`); else True. A dweight_repeatable of None (no backward) is no verdict."""
    counts: list[int] = []
    if inv.all_rows is not None:
        # rowgrad_differ is None where gradients were not compared (a forward-only backend)
        counts += [(s.fwd_differ or 0) + (s.rowgrad_differ or 0) for s in inv.all_rows.sizes.values()]
    for s in (inv.full_vs_sub_batches, inv.batch_size_sweep):
        if s is not None:
            counts += [s.fwd_differ or 0, s.rowgrad_differ or 0, getattr(s, "differ", 0) or 0]
    if any(c > 0 for c in counts) or inv.dweight_repeatable is False:
        return False
    parts = (inv.all_rows, inv.full_vs_sub_batches, inv.batch_size_sweep)
    if any(p is None or p.error for p in parts) or any(c in (errors or {}) for c in INVARIANCE_CHECKS):
        return None
    return True
