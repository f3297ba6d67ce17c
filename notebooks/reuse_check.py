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
# # Can this gated RMSNorm be reused for RL?
#
# RL post-training needs the trainer and the sampler to compute **bitwise the same** output for a row of
# Qwen3-Next's gated RMSNorm (`y = rmsnorm(x) * w * silu(z)`, rows of 128, bf16), whatever else is in the batch.
# This page checks each implementation for that, and for an exact weight gradient, correct rounding and speed.

# %% Setup
import pandas as pd
from IPython.display import Image, Markdown, display

from rlnorm.kit import steps
from rlnorm.kit.artifact import records_frame
from rlnorm.kit.params import params_from_namespace
from rlnorm.report import plots, tables, verdict

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
pd.set_option("display.max_colwidth", 240)
_before_parameters = set(globals())

# %% Parameters tags=["parameters"]
# params_file: a parameter set (params/*.yaml holds what differs from the full protocol, whose every parameter
# and default is rlnorm.kit.params.RunParams); overrides: parameters changed on top of it, e.g. {"d": 256}
# (`papermill -p d 256` does the same). The rest say where the run goes: `python -m rlnorm run` sets them
# (papermill: -p name NEW, -p overwrite True).
params_file = "params/quick.yaml"
overrides = {}
name = ""  # "": the parameter file's name
output_dir = ""
staging_dir = ""
overwrite = False

# %% Start the run
# Checked before any work: a name the kit does not know, or a value of the wrong type, stops the run here
# with a message naming it (papermill itself would only warn); so does a run folder that exists already.
params = params_from_namespace(globals(), _before_parameters)
run = steps.start_run(params)

# %% [markdown]
# ## Verdict
#
# One line per backend: whether it is **batch invariant** (a count is row comparisons that differ: `y` its
# output, `dx,dz` either gradient, of all those made, summed over sizes and seeds); the **gradient gate**, which
# compares dx and dz across batch arrangements and the backend's *own* fp32 dweight with the exact sum of
# single-row dweights; how often its output is the **correctly rounded** bf16 value; and its forward time over
# the `torch.add` timed beside it in the same run. A backend whose process crashed or timed out says so, with the
# cause and the check and batch it was on; the checks it finished stand. The figure shows each check's state.

# %% Verdict
_header = display(Markdown(tables.placeholder("run's identity")), display_id=True)
_verdict = display(Markdown(tables.placeholder("verdict per backend")), display_id=True)
_headline = display(Markdown(tables.placeholder("headline figure")), display_id=True)

# %% [markdown]
# ## Backends, each in a process of its own
#
# Every backend runs its checks, its contract gates and its agreement output in a fresh process with a time limit
# (`backend_timeout_s`). One that cannot run here (package missing, no GPU, an option it does not have) is
# **skipped with its reason**; one that crashes, hangs or leaves the GPU in an error state is recorded as
# **crashed** or **timed out**, with the check and the batch it was on, and keeps the checks it finished. Neither
# stops the run, and the artifact is written as soon as the backends are done.
#
# * **all_rows**: every row computed alone against the same row inside the whole batch, bitwise.
# * **dweight_repeatable**: the same batch run twice gives bitwise the same dweight.
# * **full_vs_sub_batches**: each row of the full batch against the same row inside a contiguous sub-batch of
#   several sizes, covering every row (`coverage: all`) or the report's sample (`coverage: sampled`).
# * **batch_size_sweep**: probe rows placed first, in the middle and last in batches of many sizes, against the
#   probe row alone.
# * **launch**: each kernel's launch parameters at a ladder of row counts, and those that change with it.
# * **accuracy_latency**: the fraction of outputs equal to the fp64 result rounded once, the gradients' error
#   against fp64, and the median time against a same-run `torch.add` moving as many bytes.
#
# **vLLM's rows.** A default vLLM deployment compiles the model with Inductor and disables vLLM's custom ops, so
# Qwen3-Next's gated norm runs `RMSNormGated.forward_native` compiled by Inductor (row `vllm_native_compiled`);
# with `enforce_eager=True`, common in RL rollouts, it runs `forward_cuda`, `layernorm_guard`'s Triton kernel (row
# `vllm`). Where vLLM cannot be imported, the `vllm` row runs vLLM's own `layernorm_guard` from its Python files,
# with only its Triton and platform helpers stood in; each row's `source` says what ran. vLLM refuses to start a
# Qwen3-Next engine with `VLLM_BATCH_INVARIANT=1` ("VLLM batch_invariant mode is not supported for GDN_ATTN",
# `vllm/v1/attention/selector.py`, vLLM 0.30.0 and 0.33.0): the row `vllm_native_batch_invariant` is what the flag
# would do to `forward_native` where vLLM allows it, unreachable for Qwen3-Next.

# %% Run every backend
steps.run_backends(run)
steps.run_step(
    run,
    "page",
    lambda: display(
        Markdown(tables.device_notice(run.result)),
        tables.backend_table(run.result),
        Markdown(
            "**Batch invariance** (row comparisons that differ, in the artifact's field names; a row is compared "
            "once per size and seed; 0 everywhere is what RL needs)"
        ),
        verdict.verdict_frame(run.result),
        Markdown(
            "**Accuracy and latency** (microseconds; `fwd / its add`: the time over the `torch.add` timed beside "
            "that backend in the same run; `*`: the GPU queue ran dry while timing, so that time includes host "
            "overhead)"
        ),
        tables.accuracy_table(run.result),
    ),
)

# %% Launches: what each kernel launched at each row count
steps.run_step(
    run, "page", lambda: display(Markdown(tables.LAUNCH_EXPLANATION), Markdown(tables.launch_markdown(run.result)))
)

# %% [markdown]
# ## Contract gates
#
# A packed workload of 4 samples (11, 16, 13 and 19 tokens) run as one batch, in chunks of 7 tokens, each sample
# alone, padded left and right, permuted: every token's output and dx, dz must be bitwise equal across these
# cells, and the backend's **own** dweight must equal the exact aggregate of single-row runs. The gates run in the
# backend's own process, so a crash or a hang there is that backend's crash, in check `contract_gates`.

# %% Contract gates
steps.run_step(run, "page", lambda: display(Markdown(tables.GATE_EXPLANATION), tables.gates_table(run.result)))

# %% [markdown]
# ## Cross-backend agreement
#
# Fraction of forward outputs that two backends compute bitwise alike on the same inputs. Two batch-invariant
# kernels can still disagree with each other: swapping one for another between sampler and trainer is only safe
# where this is 1.

# %% Agreement matrix
steps.run_agreement(run)
steps.run_step(run, "page", lambda: display(tables.shown(tables.agreement_table(run.result))))

# %% [markdown]
# ## The pairs RL stacks deploy
# The same rows (the agreement rows and seed, row r scaled by 2^-(r mod 16), so some mean squares lie below eps)
# through the trainer and the sampler of each stack that serves Qwen3-Next or Qwen3.5 (verl FSDP
# with vLLM compiled and eager, Megatron with vLLM, slime and AReaL with SGLang, TorchTitan, rlnorm on both sides),
# each pair in a process of its own: the trainer as a training step runs them (one packed batch, forward and
# backward), the sampler as generation does (a prefill, then decode steps). `trainer chosen at` / `sampler chosen
# at` say where the stack's source makes the choice. A pair whose backend cannot run here says why.
#
# Two pairs are Qwen3-Next's own layers, transformers' as the trainer and vLLM's as the sampler:
#
# * **rlnorm_patched**: rlnorm on both sides (`apply_rlnorm_to_qwen3_next`, and vLLM with `RLNORM_VLLM=1`): must be
#   bitwise equal (where vLLM cannot run here, its sampler is the operator rlnorm's vLLM layer calls, labelled so);
# * **stock_unpatched**, for contrast: transformers' own norm against vLLM's default path.

# %% Stack pairs
steps.run_stack_pairs(run)
steps.run_step(run, "page", lambda: display(tables.shown(tables.stack_pairs_table(run.result))))

# %% [markdown]
# ## The artifact, the records and the plots
#
# The JSON artifact keeps every key of the reference B200 report, so the two compare directly
# (`python -m rlnorm compare seed outputs/NAME`); the CSV has a line per differing row comparison and tensor
# (up to `max_records`), with what is needed to rebuild its batch (`python -m rlnorm investigate outputs/NAME`).

# %% Plots
figures = steps.run_plots(run, plots.make_plots)
steps.run_step(
    run,
    "page",
    lambda: display(
        Markdown(
            f"Artifact: `{steps.ARTIFACT_FILE}` · records: `{steps.RECORDS_FILE}` ({len(run.records)} kept; "
            "`max_records` caps them, the counts above are complete)"
        ),
        tables.shown(tables.record_table(run.result, records_frame(run.records))),
        *[x for _h, _png in tables.plot_sections(figures) for x in (Markdown(f"### {_h}"), Image(filename=str(_png)))],
    ),
)

# %% [markdown]
# ## Parameters, environment and time
#
# The parameters this run used beside the full protocol's, where it ran, and where the time went.

# %% Parameters and environment
steps.run_step(
    run,
    "page",
    lambda: display(
        tables.params_table(run.result),
        tables.environment_table(run.result),
        Markdown(f"Run `{params.name}`; where the time went:"),
        tables.time_table(run.timings),
    ),
)

# %% Fill in the verdict
_ = steps.run_step(  # assigned: the updates' return values are no part of the page
    run,
    "page",
    lambda: (
        _header.update(Markdown(tables.header(run.result))),
        _verdict.update(Markdown(tables.verdict_markdown(run.result))),
        _headline.update(Image(filename=str(figures["verdict"])) if figures.get("verdict") else Markdown("-")),
    ),
)

# %% Finish
# Places the run folder; a step above that failed is in the artifact and on the page, and raises here so the run
# exits non-zero. `result` is the run's typed result, for interactive use (assigned: the page shows no repr of it).
result = steps.finish(run)
