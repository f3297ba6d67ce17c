# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Can this gated RMSNorm be reused for RL? A batch-invariance reuse check
#
# Qwen3-Next's Gated DeltaNet normalises its output with a gated RMSNorm,
# `y = rmsnorm(x) * w * silu(z)`, on rows of width 128 in bf16. RL post-training needs the
# trainer and the sampler to compute **bitwise the same** result for a row, whatever else is in
# the batch: otherwise the policy that generated a sample is not the policy that is trained on it.
#
# This notebook checks existing implementations (and any candidate you name) against that
# requirement, and measures what each costs in accuracy and time:
#
# 1. **Batch invariance**: is a row's output (and dx, dz) the same alone, inside a batch, in
#    sub-batches of any size, at any position? Is dweight repeatable?
# 2. **Contract gates**: a realistic packed/padded/chunked workload, in a child process each.
# 3. **Accuracy and latency**: how often the output is the correctly rounded bf16 value, and the
#    time against a same-shape `torch.add` (the memory roofline).
# 4. **Agreement**: how often two backends give bitwise the same output.
#
# Every computation lives in the `rlnorm` package; this notebook only calls it and shows what it found.

# %% Setup
import pandas as pd
from IPython.display import Image, Markdown, display

import rlnorm
from rlnorm.kit import steps
from rlnorm.report import tables

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
pd.set_option("display.max_colwidth", 240)
_before_parameters = set(globals())

# %% Parameters tags=["parameters"]
# These literals are params/quick.yaml (a CPU finishes in minutes). `python -m rlnorm run FILE`
# or `papermill -f FILE` overrides them; every name must be one the kit knows.
name = "quick"
output_dir = ""
staging_dir = ""
params_file = "params/quick.yaml"
device = "auto"
progress = True
rfc = "RL-Align/RL-Kernel#428"
d = 128
eps = 1e-06
group_size = None
norm_before_gate = True
activation = "silu"
weight_dtype = "bfloat16"
backends = [
    "rlnorm",
    "reference",
    "transformers",
    "fla_layernorm_gated",
    "fla_fused_norm_gate",
    "vllm",
    "torch_compile",
]
custom_backends = []
checks = [
    "all_rows",
    "dweight_repeatable",
    "full_vs_sub_batches",
    "batch_size_sweep",
    "accuracy_latency",
    "contract_gates",
    "agreement",
]
all_rows_sizes = [7, 64]
all_rows_seeds = [3]
dweight_rows = 257
dweight_seed = 3
sub_batches_rows = 65
sub_batch_sizes = [1, 7, 32]
sub_batches_seeds = [3]
coverage = "all"
sweep_n = 65
sweep_sizes = [1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65]
sweep_probe_rows = [0, 32, 64]
sweep_seeds = [3]
accuracy_rows = 257
accuracy_seed = 11
timing = True
timing_warmup = 1
timing_iters = 3
agreement_rows = 257
agreement_seed = 3
gate_timeout_s = 600.0
backend_timeout_s = 900.0
max_records = 2000

# %% [markdown]
# ## The run's parameters
#
# Checked before any work: a name the kit does not know, or a value of the wrong type, stops the
# run here with a message naming it (papermill itself would only warn).

# %% Validate parameters
params = steps.params_from_namespace(globals(), _before_parameters)
run = steps.start_run(params)
display(Markdown(f"**Run** `{params.name}` on **{run.device}** · rlnorm {rlnorm.__version__}"))
display(Markdown(tables.device_notice(run)))
tables.params_table(run)

# %% [markdown]
# ## Where it ran
#
# GPU, CUDA, the library versions and the commit: what someone needs to reproduce these numbers.

# %% Environment
tables.environment_table(run)

# %% [markdown]
# ## Backends, each in a process of its own
#
# Every backend runs its checks in a fresh process with a time limit (`backend_timeout_s`). One that cannot run
# here (package missing, no GPU, an option it does not have) is **skipped with its reason**; one that crashes,
# hangs or leaves the GPU in an error state is recorded as **crashed** or **timed out**, with the check and the
# batch it was on, and keeps the checks it finished. Neither stops the run.
#
# * **all_rows**: every row computed alone vs inside the whole batch, bitwise (`fwd_differ` rows
#   whose output differs, `rowgrad_differ` rows whose dx or dz differs).
# * **dweight_repeatable**: the same batch twice gives bitwise the same dweight.
# * **full_vs_sub_batches**: the full batch vs contiguous sub-batches of several sizes, covering
#   every row (`coverage: all`) or the report's sample (`coverage: sampled`).
# * **batch_size_sweep**: probe rows placed first, middle and last in batches of many sizes.
# * **accuracy_latency**: fraction of outputs equal to the fp64 result rounded once to bf16, the
#   gradients' relative error against fp64 autograd, and the median time (p20/p80 too).
#
# `batch_invariant` is true only when every one of these checks ran and found no difference. A
# check that raised is listed under `errors` and the others still ran.

# %% Run every backend
steps.run_backends(run)
display(tables.backend_table(run))
display(Markdown("**Batch invariance** (counts of rows that differ; 0 everywhere is what RL needs)"))
display(tables.invariance_table(run))
display(
    Markdown(
        "**Accuracy and latency** (latency in microseconds; roofline = same-run `torch.add` moving as many bytes; "
        "`*`: the GPU queue ran dry while timing, so that time includes host overhead)"
    )
)
tables.accuracy_table(run)

# %% [markdown]
# ## Contract gates
#
# A packed workload of 4 samples (11, 16, 13 and 19 tokens) run as one batch, in chunks of 7
# tokens, each sample alone, padded left and right, permuted: every token's output and dx, dz
# must be bitwise equal across these cells, and the backend's **own** dweight must equal the exact
# aggregate of single-token runs. Each gate runs in a child process, so a crash or a hang is
# recorded as a failed gate.

# %% Contract gates
steps.run_gates(run)
tables.gates_table(run)

# %% [markdown]
# ## Cross-backend agreement
#
# Fraction of forward outputs that two backends compute bitwise alike on the same inputs. Two
# batch-invariant kernels can still disagree with each other: swapping one for another between
# sampler and trainer is only safe where this is 1.

# %% Agreement matrix
steps.run_agreement(run)
tables.agreement_table(run)

# %% [markdown]
# ## The artifact and the per-row records
#
# The JSON artifact keeps every key of the reference B200 report, so the two can be compared
# directly (`notebooks/compare_runs.py`); the CSV lists every row that differed, with what is
# needed to rebuild its batch (`notebooks/investigate_rows.py`).

# %% Write artifact and records
figures = tables.make_plots(run)
display(Markdown(f"Artifact: `{run.artifact_path.name}` · records: `{steps.RECORDS_FILE}` ({len(run.records)} rows)"))
_records = tables.record_table(run)
display(Markdown(_records) if isinstance(_records, str) else _records)

# %% [markdown]
# ## Plots
#
# Rows that differ per backend and check; the error distributions (ulp distance to the correctly
# rounded value, absolute error); forward and forward+backward latency with the roofline marked;
# the agreement matrix; and the reference report's B200 results beside this run's where they
# share a measure.

# %% Plots
for _name, _png in figures.items():
    display(Markdown(f"### {_name.replace('_', ' ')}"))
    display(Image(filename=str(_png)))

# %% [markdown]
# ## Verdict

# %% Verdict
display(Markdown(tables.verdict_markdown(run)))
_done = steps.finish(run)
display(Markdown(f"Run `{params.name}`: {_done['seconds']:.0f} s in all; where the time went:"))
tables.time_table(run)
