"""What the differ counts count, defined once, and the words every table, plot and notebook uses for them.

A **row comparison** is one row of a seeded case computed two ways and compared bitwise:

- `all_rows`: the row inside its batch of n vs the row alone (once per n and seed);
- `full_vs_sub_batches`: the row inside a sub-batch vs the same row in the full batch (once per sub-batch
  size and seed, so every row of the case is compared once per size);
- `batch_size_sweep`: a probe row at one position in a batch of m vs the probe alone (once per m, position,
  probe and seed).

The artifact's counts are row comparisons, summed over sizes and seeds, and always complete:
`fwd_differ` = row comparisons whose y differs ("y"), `rowgrad_differ` = those whose dx or dz differs
("dx,dz"; a row comparison where both differ counts once), the sweep's `differ` = those where any of y, dx,
dz differs. Their denominators are `rows` (all_rows, per n), `rows_compared` (full_vs_sub_batches) and
`comparisons` (batch_size_sweep). `dweight_repeatable` compares one batch's dweight run vs run: no rows.

A **record** (a line of `records.csv`) is one differing (row comparison, tensor): a row comparison where y and
dx both differ is two records. Records are capped at `max_records` per backend and check; `records_dropped`
says how many differing pairs the cap left out, so kept + not kept is every differing pair. A distinct row
index is none of these (one case row is compared once per size and seed), so nothing here counts one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

ROW_CHECKS = ("all_rows", "full_vs_sub_batches", "batch_size_sweep")
# what each check compares, in the words of titles, lanes and tables
COMPARES = {
    "all_rows": "row in its batch vs the row alone",
    "full_vs_sub_batches": "row in a sub-batch vs the full batch",
    "batch_size_sweep": "probe row in a batch of m vs alone",
    "dweight_repeatable": "dweight of one batch, run vs run",
}
Y_WORDS = "y differs"  # fwd_differ
GRAD_WORDS = "dx or dz differs"  # rowgrad_differ
ANY_WORDS = "y, dx or dz differs"  # the sweep's differ
COMPARED_WORDS = "row comparisons"
KEPT_WORDS = "records kept"
NOT_KEPT_WORDS = "records not kept (max_records)"
COUNT_COLUMNS = [
    "backend",
    "check",
    "compares",
    COMPARED_WORDS,
    Y_WORDS,
    GRAD_WORDS,
    ANY_WORDS,
    KEPT_WORDS,
    NOT_KEPT_WORDS,
]


def count(n: int | None) -> str:
    """An integer as every report prints it: thousands separated ('3,128'); '?' where unknown."""
    return "?" if n is None else f"{n:,}"


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class CheckCounts:
    """One row check's counts for one backend, straight from its artifact summary."""

    check: str
    compared: int | None  # row comparisons made (None: the summary predates the field)
    y: int | None  # fwd_differ
    grad: int | None  # rowgrad_differ (None: forward only, or not in the summary)
    any: int | None  # the sweep's differ (None for the other checks: they do not count it)
    not_kept: int  # records_dropped
    error: str | None  # the check raised: its counts are partial

    @property
    def differs(self) -> bool:
        return any((c or 0) > 0 for c in (self.y, self.grad, self.any))

    def short(self) -> str:
        """'736 y / 3,128 dx,dz' (a figure cell, a lane label); '12 y, dx or dz' where only the total is known."""
        if self.y is None and self.any is not None:
            return f"{count(self.any)} y, dx or dz"
        parts = [f"{count(self.y)} y"]
        if self.grad is not None:
            parts.append(f"{count(self.grad)} dx,dz")
        return " / ".join(parts)

    def of(self) -> str:
        """'of 2,621,440 row comparisons' ('' when the summary does not say)."""
        return "" if self.compared is None else f"of {count(self.compared)} {COMPARED_WORDS}"

    def sentence(self) -> str:
        """'y differs in 736 and dx or dz in 3,128 of 2,621,440 row comparisons' (verdict lines, notebooks)."""
        if self.y is None and self.any is not None:
            text = f"{ANY_WORDS} in {count(self.any)}"
        else:
            text = f"y differs in {count(self.y)}"
            if self.grad is not None:
                text += f" and dx or dz in {count(self.grad)}"
        return f"{text} {self.of()}".strip()


def check_counts(entry: Mapping[str, Any] | None, check: str) -> CheckCounts | None:
    """The counts of one row check of a `results.<backend>` entry (None when that check left no summary)."""
    if check not in ROW_CHECKS:
        raise ValueError(f"check: expected one of {ROW_CHECKS}, got {check!r}")
    node = ((entry or {}).get("batch_invariance") or {}).get(check)
    if not isinstance(node, Mapping) or not node:
        return None
    errors = (entry or {}).get("errors") or {}
    error = errors.get(check) or node.get("error")
    with_grad = (entry or {}).get("backward") != "none"
    if check == "all_rows":
        sizes = [v for v in node.values() if isinstance(v, Mapping)]
        if not sizes:
            return CheckCounts(check, None, None, None, None, 0, error or "no size finished")

        def total(name: str) -> int | None:
            vals = [_int(v.get(name)) for v in sizes]
            return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)

        dropped = sum(_int(v.get("records_dropped")) or 0 for v in sizes) + (_int(node.get("records_dropped")) or 0)
        grad = total("rowgrad_differ") if with_grad else None
        return CheckCounts(check, total("rows"), total("fwd_differ"), grad, None, dropped, error)
    compared = _int(node.get("rows_compared" if check == "full_vs_sub_batches" else "comparisons"))
    grad = _int(node.get("rowgrad_differ")) if with_grad else None
    total_any = _int(node.get("differ")) if check == "batch_size_sweep" else None
    y = _int(node.get("fwd_differ"))
    return CheckCounts(check, compared, y, grad, total_any, _int(node.get("records_dropped")) or 0, error)


def backend_counts(entry: Mapping[str, Any] | None) -> dict[str, CheckCounts]:
    """check -> counts, for the row checks this backend has a summary of (in ROW_CHECKS order)."""
    out = {}
    for check in ROW_CHECKS:
        c = check_counts(entry, check)
        if c is not None:
            out[check] = c
    return out


def records_of(records: pd.DataFrame | None, backend: str, check: str | None = None) -> pd.DataFrame:
    """The kept records of one backend (and check); an empty frame when there are none or no table."""
    if records is None or len(records) == 0:
        return pd.DataFrame(columns=["backend", "check", "tensor"])
    sel = records[records["backend"].astype(str) == backend]
    return sel if check is None else sel[sel["check"].astype(str) == check]


def kept_by_tensor(records: pd.DataFrame | None, backend: str, check: str) -> dict[str, int]:
    """tensor -> records kept, in y, dx, dz, dweight order."""
    sel = records_of(records, backend, check)
    got = sel["tensor"].astype(str).value_counts().to_dict() if len(sel) else {}
    order = ["y", "dx", "dz", "dweight"]
    return {t: int(got[t]) for t in sorted(got, key=lambda t: (order.index(t) if t in order else 9, t))}


def records_line(kept: int, not_kept: int | None) -> str:
    """'2,000 of 3,888 records kept (1,888 not kept: max_records)' / 'all 15 records kept'."""
    if not_kept is None:
        return f"{count(kept)} {KEPT_WORDS}"
    if not_kept == 0:
        return f"all {count(kept)} records kept" if kept else "0 records kept"
    return f"{count(kept)} of {count(kept + not_kept)} records kept ({count(not_kept)} not kept: max_records)"


def count_table(
    results: Mapping[str, Mapping[str, Any]] | None,
    records: pd.DataFrame | None,
) -> pd.DataFrame:
    """One line per (backend, check) that differs or has records: the complete counts, records kept and not.

    With `results` None (no artifact at hand) only the records kept are known: the records cannot give the
    counts (`max_records` may have left some out), so those columns stay empty rather than undercount.
    """
    rows: list[dict[str, Any]] = []
    pairs: list[tuple[str, str]] = []
    if results is not None:
        for key, entry in results.items():
            for check, c in backend_counts(entry).items():
                if c.differs or len(records_of(records, key, check)):
                    pairs.append((key, check))
            if (entry.get("batch_invariance") or {}).get("dweight_repeatable") is False:
                pairs.append((key, "dweight_repeatable"))
    if records is not None and len(records):
        for key, check in records[["backend", "check"]].astype(str).drop_duplicates().itertuples(index=False):
            if (key, check) not in pairs:
                pairs.append((key, check))
    for key, check in pairs:
        entry = (results or {}).get(key)
        kept = len(records_of(records, key, check))
        line: dict[str, Any] = dict.fromkeys(COUNT_COLUMNS)
        line.update(backend=key, check=check, compares=COMPARES.get(check, ""), **{KEPT_WORDS: kept})
        c = check_counts(entry, check) if (entry is not None and check in ROW_CHECKS) else None
        if c is not None:
            line.update(
                {
                    COMPARED_WORDS: c.compared,
                    Y_WORDS: c.y,
                    GRAD_WORDS: c.grad,
                    ANY_WORDS: c.any,
                    NOT_KEPT_WORDS: c.not_kept,
                }
            )
        elif entry is not None:
            line[NOT_KEPT_WORDS] = 0  # dweight_repeatable: at most one record per repeat, none left out
        rows.append(line)
    out = pd.DataFrame(rows, columns=COUNT_COLUMNS)
    for col in (COMPARED_WORDS, Y_WORDS, GRAD_WORDS, ANY_WORDS, KEPT_WORDS, NOT_KEPT_WORDS):
        out[col] = out[col].astype("Int64")
    return out
