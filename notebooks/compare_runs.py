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
# # Two reuse-check runs side by side
#
# Lay two artifacts next to each other, typically the reference report measured on a B200 (A) and
# a run of this kit on another GPU (B): the environments, each backend's verdict per check, the
# latency ratios B/A, the accuracy, and a list of what changed. Nothing is recomputed; both files
# are read through the same reader, so the seed report and our artifacts compare field by field.

# %%
_names_before_parameters = set(globals())

# %% tags=["parameters"]
artifact_a: str = ""  # artifact JSON or run folder; empty: the B200 seed report shipped with rlnorm
artifact_b: str = ""  # artifact JSON or run folder; empty: the newest run under outputs/
latency_move: float = 0.10  # report latency changes larger than this fraction
accuracy_move: float = 1e-4  # report changes of fwd_correctly_rounded larger than this

# %%
from rlnorm.report.runs import check_parameters as _check_parameters

_check_parameters(globals(), _names_before_parameters, ["artifact_a", "artifact_b", "latency_move", "accuracy_move"])

# %matplotlib inline
import pandas as pd
from IPython.display import Markdown, display

from rlnorm.report.compare import compare_runs, digest_table
from rlnorm.report.plots.counts import plot_comparison
from rlnorm.report.runs import latest_run

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
path_a = artifact_a or "seed"
path_b = artifact_b or latest_run()
cmp = compare_runs(path_a, path_b, latency_move=latency_move, accuracy_move=accuracy_move)
print("A:", path_a)
print("B:", path_b)

# %% [markdown]
# ## What changed
# First whether the two runs computed the same op at all, then backends present in one run only, verdicts that
# flipped, latency moves beyond `latency_move`, and accuracy moves beyond `accuracy_move`.

# %%
display(Markdown(cmp.changes_markdown()))

# %% [markdown]
# ## Environments

# %%
cmp.environment

# %% [markdown]
# ## Verdicts per backend and check
# `passed`: no row comparison differed (or the gate passed); `failed (N y / M dx,dz of K row comparisons)`: N row
# comparisons whose output differed, M whose dx or dz did (the reference report's sweep counts only their total);
# `raised`: the check raised; `not run`: not measured (for example no backward); `skipped` / `not loaded` /
# `crashed` / `timed out`: the backend did not run or did not finish, see why; `absent`: not in that run.

# %%
cmp.verdicts[[cmp.label_a, cmp.label_b, "changed"]]

# %% [markdown]
# ## The same bits?
# Per backend: whether A and B computed the same bits on the standard case, from the sha256 of each output's bytes
# (y; dx, dz and dweight where it has a backward): two machines, a trainer's GPU and a sampler's, compared without
# moving a tensor. Empty where a run has no digest or the two computed different cases.

# %%
digest_table(*cmp.runs)

# %% [markdown]
# ## Latency (microseconds) and ratios B/A
# A ratio below 1 means B is faster. Different GPUs, library versions and protocols all move these.

# %%
cmp.latency

# %% [markdown]
# ## Accuracy
# `fwd_correctly_rounded`: fraction of outputs equal to the fp64 result rounded once to bf16;
# `grad_rel_err_*`: max |g - g64| / max |g64| per gradient.

# %%
cmp.accuracy

# %% [markdown]
# ## The picture
# Left: latency ratio B/A per backend (log scale; the line at 1 = unchanged).
# Middle: the share of forward outputs NOT correctly rounded, A and B side by side (log scale;
# "0" marks a backend that rounds every output correctly).
# Right: the verdict grid, each cell's left half A's state and right half B's (framed where it changed).

# %%
display(plot_comparison(cmp))
