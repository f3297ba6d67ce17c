"""The reuse checks of docs/spec.md §5: batch invariance per row, dweight repeatability, accuracy and latency.

Every check takes `(backend, opts, device, *, <its run parameters by their RunParams names>, trail, progress)` and
returns a `CheckOutcome`: its typed summary, one `Record` per differing (row, tensor), and the error that ended it
early. `rlnorm.kit.params.check_kwargs` is the one place that maps a run's parameters onto a check.
"""

from __future__ import annotations

from collections.abc import Callable

from rlnorm.kit.checks.accuracy import accuracy_latency
from rlnorm.kit.checks.common import CheckOutcome
from rlnorm.kit.checks.launch import configurations, launch
from rlnorm.kit.checks.rows import all_rows, batch_size_sweep, dweight_repeatable, full_vs_sub_batches

# the per-backend checks, in the order a run gives them and reports them
_ORDER = (all_rows, dweight_repeatable, full_vs_sub_batches, batch_size_sweep, launch, accuracy_latency, configurations)
CHECKS: dict[str, Callable[..., CheckOutcome]] = {check.__name__: check for check in _ORDER}
