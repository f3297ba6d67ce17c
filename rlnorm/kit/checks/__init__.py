"""The reuse checks of docs/spec.md §5: batch invariance per row, dweight repeatability, accuracy and latency.

Every check takes `(backend, opts, device, ...sizes/seeds...)` and returns `CheckResult(summary,
records)`: `summary` holds the seed report's fields for that check (plus the NEW ones), `records`
one dict per differing (row, tensor) in the columns of `rlnorm.kit.records.RECORD_COLUMNS`, each with
the JSON that `rlnorm.kit.records.rebuild_case` needs to rebuild the compared batch. A backend that
raises inside a check ends only that check: its summary carries `error` and the records so far.
"""

from rlnorm.kit.checks.accuracy import accuracy_latency
from rlnorm.kit.checks.agreement import agreement_from_outputs, agreement_matrix, agreement_output
from rlnorm.kit.checks.common import INVARIANCE_CHECKS, CheckResult, batch_invariant, following
from rlnorm.kit.checks.dweight import dweight_repeatable
from rlnorm.kit.checks.rows import COVERAGES, all_rows, full_vs_sub_batches, sub_batch_plan
from rlnorm.kit.checks.sweep import batch_size_sweep, default_probe_rows, default_sweep_sizes, sweep_positions
from rlnorm.kit.checks.trainer_sampler import trainer_vs_sampler

__all__ = [
    "COVERAGES",
    "INVARIANCE_CHECKS",
    "CheckResult",
    "accuracy_latency",
    "agreement_from_outputs",
    "agreement_matrix",
    "agreement_output",
    "all_rows",
    "batch_invariant",
    "batch_size_sweep",
    "default_probe_rows",
    "default_sweep_sizes",
    "dweight_repeatable",
    "following",
    "full_vs_sub_batches",
    "sub_batch_plan",
    "sweep_positions",
    "trainer_vs_sampler",
]
