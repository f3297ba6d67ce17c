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
from rlnorm.kit.checks.launch import launch
from rlnorm.kit.checks.rows import all_rows, full_vs_sub_batches
from rlnorm.kit.checks.sweep import batch_size_sweep
from rlnorm.kit.results import BackendResult, BatchInvariance

# the per-backend checks, in the order a run gives them and reports them
CHECKS: dict[str, Callable[..., CheckOutcome]] = {
    "all_rows": all_rows,
    "dweight_repeatable": dweight_repeatable,
    "full_vs_sub_batches": full_vs_sub_batches,
    "batch_size_sweep": batch_size_sweep,
    "launch": launch,
    "accuracy_latency": accuracy_latency,
    "configurations": configurations,
}
CHECK_ORDER: tuple[str, ...] = tuple(CHECKS)
# the checks whose verdicts make `batch_invariant`, in the report's order
INVARIANCE_CHECKS = CHECK_ORDER[:4]
# the three verdicts (docs/spec.md §5): rows differ; no row differs but a launch parameter that changes with the
# row count was not run at each of its values; neither
INVARIANT, NOT_INVARIANT, BY_CONSTRUCTION = "invariant", "not_invariant", "not_invariant_by_construction"


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


def differing_pairs(result: BackendResult) -> list[str]:
    """The configuration pairs (the `configurations` check) under which rows or dweight differ, in words."""
    c = result.configurations
    return [f"{p.kernel}.{p.parameter}: {p.full} (full batch) vs {p.alone} (alone)" for p in (c.pairs if c else [])
            if p.fwd_differ or p.rowgrad_differ or p.dweight_equal is False]  # fmt: skip


def uncleared(result: BackendResult) -> dict[str, str]:
    """ "kernel.param" -> the launch evidence, for each launch parameter that changes with the row count and that
    the `configurations` check did not run at each of its values without a bit changing."""
    cleared = set(result.configurations.cleared) if result.configurations else set()
    kernels = result.launches.kernels if result.launches else []
    return {f"{k.kernel}.{p}": k.evidence or "" for k in kernels for p in k.varying if f"{k.kernel}.{p}" not in cleared}


def verdict(result: BackendResult, errors: Mapping[str, str] | None = None) -> str | None:
    """INVARIANT, NOT_INVARIANT, BY_CONSTRUCTION, or None (a check that decides it is missing or raised)."""
    inv = result.batch_invariance
    rows = None if inv is None else batch_invariant(inv, errors)
    if rows is False or differing_pairs(result):
        return NOT_INVARIANT
    launches = result.launches
    if rows is None or launches is None or launches.error or "launch" in (errors or {}):
        return None
    return BY_CONSTRUCTION if uncleared(result) else INVARIANT
