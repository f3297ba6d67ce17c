# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Which rows differ, and why
#
# A reuse-check run says, for example, `fwd_differ: 95`: 95 rows whose output was not bitwise the
# same when computed inside a batch and alone. This notebook opens that run, lists the differing
# rows, and takes one of them apart:
#
# 1. the row recomputed **inside the exact batch** the check used and **in what it was compared
#    with** (the row alone; for `full_vs_sub_batches` the full batch), rebuilt from the record,
#    so no check is rerun; plus the row alone in every case,
# 2. which of its columns differ and by how many ulps (units in the last place of bf16),
# 3. the row's normalisation statistic `rstd = 1/sqrt(mean(x^2) + eps)` in fp32 and fp64,
# 4. the **correctly rounded** value (the fp64 result rounded once to bf16),
# 5. how every other available backend computes the same row.
#
# Run it cell by cell in JupyterLab, or end to end with papermill (`-p run outputs/NAME`).

# %%
_names_before_parameters = set(globals())

# %% tags=["parameters"]
run: str = ""  # run folder (outputs/NAME) or its artifact JSON; empty: the newest run under outputs/
backend = None  # backend to look at; None: the first one with differing rows
check = None  # check to look at; None: the first check of that backend with differing rows
row_index: int = 0  # which line of the differing-rows table to explain
row = None  # or: the case row to explain (its first differing record); overrides row_index
reproduce: bool = False  # give a crashed backend the batch it died on again, in a process of its own
others = None  # backends to compare on the same row; None: every backend that ran in this run
device: str = "auto"  # where to recompute: auto (the GPU if there is one), cpu or cuda
others_in_batch = None  # run the others on the whole batch too; None: on a GPU, or for small batches

# %%
from rlnorm.report.runs import check_parameters as _check_parameters

_check_parameters(
    globals(),
    _names_before_parameters,
    ["run", "backend", "check", "row_index", "row", "reproduce", "others", "device", "others_in_batch"],
)

# %matplotlib inline
import pandas as pd
from IPython.display import Markdown, display

from rlnorm.report.investigate import (
    crash_batch,
    crash_table,
    crashed_backends,
    explain_record,
    pick_row,
    plot_row,
    reproduce_crash,
    rows_or_reason,
)
from rlnorm.report.runs import latest_run, open_run, records_of
from rlnorm.report.tables import backend_table
from rlnorm.report.verdict import differing_table, verdict_frame

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
the_run = open_run(run or latest_run())
records = records_of(the_run)
print("artifact:", the_run.path)
print("records: ", the_run.resolve(the_run.records) if records is not None else "none")

# %% [markdown]
# ## The run's backends and verdicts
# `status` says whether each backend ran here; a skipped one carries the reason, and has no rows below.
# The verdicts are the run's own: `failed (736 y / 3,128 dx,dz of ...)` counts the row comparisons whose output
# (y) or gradients (dx or dz) differed; a row is compared once per size and seed.

# %%
display(backend_table(the_run))
display(verdict_frame(the_run))

# %% [markdown]
# ## Backends whose process died
# A backend runs its checks in a process of its own; one that crashed or outlived the run's time limit left a
# trail: the check and the batch it was given last. That batch is rebuilt here from the trail, and with
# `reproduce=True` (`-p reproduce true`) given to the backend again in a fresh process, so the crash can be
# reproduced, and then debugged, in one call without rerunning the check.

# %%
crashed = crashed_backends(the_run)
if not crashed:
    display(Markdown("No backend crashed or timed out in this run."))
else:
    display(crash_table(the_run))
    for _key in crashed:
        try:
            _batch = crash_batch(the_run, _key)
        except ValueError as _exc:
            display(Markdown(f"**{_key}**: {_exc}"))
            continue
        display(
            Markdown(
                f"**{_key}** died on a batch of {_batch.batch.x.shape[0]} rows of `{_batch.check}` "
                f"(case {_batch.spec['case']}, batch {_batch.spec['batch']}). To give it that batch again: "
                f"`reproduce_crash(the_run, {_key!r})`, or `crash_batch(the_run, {_key!r})` "
                "for the tensors themselves."
            )
        )
        if reproduce:
            _replayed = reproduce_crash(the_run, _key, None if device == "auto" else device)
            display(pd.Series(_replayed, name=_key).to_frame())

# %% [markdown]
# ## What differs, per backend and check
# One line per backend and check that differs: the row comparisons made, those whose `y` differs and those
# whose `dx` or `dz` differs (the artifact's counts, always complete), then the **records**: one per differing
# (row comparison, tensor), kept up to `max_records`, so `records kept` + `records not kept` is every differing
# pair. `max_ulp` is the largest recorded difference in bf16 ulps.

# %%
summary_table = differing_table(the_run, records)
summary_table

# %% [markdown]
# ## The differing rows of the chosen backend and check
# `case` names the comparison, `batch_start` / `batch_size` / `position` where the row sat in the
# batch, `row` its index in the seeded case, `cols_differ` / `max_ulp` how much it moved.
# Change `row_index` to pick another line.

# %%
table, _sentence = rows_or_reason(records, the_run, backend, check)
display(Markdown(_sentence))
if table is not None:
    display(table.drop(columns=["rebuild"]).head(50))

# %% [markdown]
# ## One row, taken apart
# The row's batch is rebuilt from its record and the backend computes the row inside that batch,
# inside what the check compared it with (`compared_with`: alone, or the full batch), and alone.
# The paragraph says what differs, by how much, and what follows; the table below it has the numbers.
# To say *why*, the larger of the two compared batches is probed three times: computed again
# (repeatable?), with every row moved one place (does position matter?), and with the other rows
# redrawn at the same size (row count or the other rows' values?). `diagnosis` names the answer.
# (A `dweight` record has no row: the same batch's weight gradient is computed twice instead.)

# %%
explanation = None
if table is not None:
    record = table.iloc[pick_row(table, row, row_index)]
    explanation = explain_record(
        record,
        others=[k for k, r in the_run.results.items() if r.status == "ran"] if others is None else others,
        device=None if device == "auto" else device,
        others_in_batch=others_in_batch,
    )
    display(Markdown(explanation.text))
    for note in explanation.notes:
        display(Markdown(f"*Note:* {note}"))
    display(pd.Series(explanation.summary, name="value").to_frame())

# %% [markdown]
# ## The columns that differ
# `in_batch` and `compared` are the backend's two results that the check compared, for the same
# inputs `x`, `z`; `alone` is the row computed by itself; `correctly_rounded` is the exact result
# rounded once to bf16. The ulp columns count bf16 values in between: 0 means bitwise equal.
# `explanation.columns` holds all 128 columns.

# %%
if explanation is not None:
    display(explanation.differing_columns)

# %% [markdown]
# ## The row's rstd, both ways
# rstd recomputed from `x` in fp32 and in fp64 (and the relative error of the fp32 one). When the
# backend exposes its own rstd, its value alone and in the batch is shown too: if those are equal,
# the difference arises after the row statistic.

# %%
if explanation is not None and not explanation.rstd.empty:
    display(explanation.rstd)

# %% [markdown]
# ## How every other backend computes this row
# For each backend: how many of the row's columns it gets correctly rounded alone, its largest ulp
# distance to the correctly rounded value, whether it equals this backend's alone / in-batch result,
# and (when run on the batches too) whether it computes the row bitwise the same on both sides
# of the comparison (`batch_equal_compared`): a backend that does is batch invariant on this row.

# %%
if explanation is not None and not explanation.others.empty:
    display(explanation.others)

# %% [markdown]
# ## Per column: the two compared sides, and each side vs correctly rounded
# Top: ulp distance between the row in its batch and in what it was compared with (red = differs).
# Bottom: each side's ulp distance to the correctly rounded value.

# %%
if explanation is not None:
    display(plot_row(explanation, table, the_run))
