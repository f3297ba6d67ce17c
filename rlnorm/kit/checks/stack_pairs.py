"""Stack pairs: the same rows through the trainer and the sampler that an RL stack deploys, bitwise.

An RL engineer's question is whether their trainer and their sampler compute the same bits for a token. Each pair
in `PAIRS` names the trainer's and the sampler's backend by key and where in the stack's source (file:line at a
pinned version) that choice is made. The trainer runs the rows as a training step does: one packed batch, forward
and backward (the forward output is compared); the sampler as generation does, under inference mode: a prefill, then
decode steps of `heads` rows (`trainer_sampler.sampler_plan`). Row r of x is scaled by 2^-(r mod 16), exactly, so
mean squares reach below eps. A pair whose backend is not registered or cannot run here is skipped with the reason.
`main` runs one pair in a process of its own (`steps.run_stack_pairs`): a vLLM import patches torch for the rest
of a process, and a pair that crashes takes only its own row down.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlnorm.inputs import make_case
from rlnorm.kit.backends import REGISTRY, Backend, describe_error, load_backend
from rlnorm.kit.checks.common import check_int
from rlnorm.kit.checks.trainer_sampler import QWEN3_NEXT_OPTIONS, compare_outputs, row_scales, sampler_plan
from rlnorm.options import OpOptions

__all__ = ["PAIRS", "PairSpec", "main", "pair_by_name", "run_pair"]


@dataclass(frozen=True)
class PairSpec:
    """One trainer/sampler pair a stack deploys, and where its source makes each choice."""

    name: str
    stack: str
    model: str
    trainer: str  # backend key
    sampler: str  # backend key
    trainer_where: str  # file:line at the pinned version where the trainer's norm is chosen
    sampler_where: str


_VERL = "verl 0.9.1"
_VLLM_QWEN3_NEXT = "vllm 0.33.0 model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:666 RMSNormGated"
_MEGATRON = "megatron-core 0.19.2 megatron/core/ssm/gated_delta_net/common.py:256 out_norm, :370 _apply_gated_norm"
_SGLANG_NEXT = "sglang 0.5.23 srt/models/qwen3_next.py:244 FusedRMSNormGated (no piecewise prefill graph)"
_SGLANG_35 = "sglang 0.5.23 srt/models/qwen3_5.py:507 RMSNormGated = fla/layernorm_gated.py RMSNorm"
_TITAN = "torchtitan 0.3.0 models/qwen3_5/model.py:141 RMSNormGated (built at :304)"
_TRANSFORMERS_NEXT = "transformers models/qwen3_next/modeling_qwen3_next.py:621 Qwen3NextRMSNormGated"

# the pairs, Qwen3-Next's and Qwen3.5's gated norm (whole rows of 128, silu, the norm before the gate)
PAIRS: tuple[PairSpec, ...] = (
    PairSpec("verl_fsdp_vllm", "verl FSDP + vLLM (default: compiled)", "Qwen3-Next", "transformers",
             "vllm_native_compiled", f"{_VERL} FSDP trains transformers' module: {_TRANSFORMERS_NEXT}",
             f"{_VERL} workers/config/rollout.py:188 enforce_eager=False -> Inductor traces forward_native; "
             f"{_VLLM_QWEN3_NEXT}"),
    PairSpec("verl_fsdp_vllm_eager", "verl FSDP + vLLM enforce_eager (verl's Qwen3-Next example)", "Qwen3-Next",
             "transformers", "vllm", f"{_VERL} FSDP trains transformers' module: {_TRANSFORMERS_NEXT}",
             f"{_VERL} examples/grpo_trainer/run_qwen3_next_80b_a3b_fsdp.sh enforce_eager=True, passed at "
             f"workers/rollout/vllm_rollout/vllm_async_server.py:339 -> forward_cuda; {_VLLM_QWEN3_NEXT}"),
    PairSpec("megatron_vllm", "Megatron + vLLM (verl / NeMo-RL Megatron path)", "Qwen3-Next", "megatron_gdn",
             "vllm_native_compiled", _MEGATRON, f"{_VERL} workers/config/rollout.py:188; {_VLLM_QWEN3_NEXT}"),
    PairSpec("slime_qwen3_next", "slime: Megatron with FLA's fused norm + SGLang", "Qwen3-Next",
             "fla_fused_norm_gate", "sglang_fused_norm_gate",
             "slime 624b824 slime_plugins/models/qwen3_next.py:71 fla.modules.FusedRMSNormGated", _SGLANG_NEXT),
    PairSpec("slime_qwen3_5", "slime: Megatron with FLA's fused norm + SGLang", "Qwen3.5", "fla_fused_norm_gate",
             "sglang_layernorm_gated",
             "slime 624b824 slime_plugins/models/qwen3_5.py:78 fla.modules.FusedRMSNormGated", _SGLANG_35),
    PairSpec("slime_qwen3_5_deterministic", "slime + SGLang --enable-deterministic-inference", "Qwen3.5",
             "fla_fused_norm_gate", "sglang_layernorm_gated_deterministic",
             "slime 624b824 slime_plugins/models/qwen3_5.py:78 fla.modules.FusedRMSNormGated",
             "sglang 0.5.23 kernels/ops/attention/fla/layernorm_gated.py:222 calc_rows_per_block (fixed rows)"),
    PairSpec("areal_fsdp_sglang", "AReaL FSDP + SGLang", "Qwen3-Next", "transformers", "sglang_fused_norm_gate",
             f"AReaL 4aef98d areal/engine/fsdp_engine.py:992 AutoModelForCausalLM.from_config: {_TRANSFORMERS_NEXT}",
             _SGLANG_NEXT),
    PairSpec("areal_archon_sglang", "AReaL Archon + SGLang", "Qwen3.5", "fla_fused_norm_gate",
             "sglang_layernorm_gated",
             "AReaL 4aef98d areal/experimental/models/archon/qwen3_5/model/model.py:191 fla FusedRMSNormGated",
             _SGLANG_35),
    PairSpec("torchtitan", "TorchTitan trainer + generator (its model registered in vLLM)", "Qwen3.5", "torchtitan",
             "torchtitan", _TITAN, f"torchtitan 0.3.0 experiments/rl/models/vllm_registry.py:197 register_to_vllm; "
             f"{_TITAN}"),
    PairSpec("rlnorm_patched", "rlnorm on both sides (patched)", "Qwen3-Next / Qwen3.5", "rlnorm", "rlnorm",
             "rlnorm integrations/qwen3_next.py apply_rlnorm_to_qwen3_next",
             "rlnorm integrations/vllm_layer.py RLNORM_VLLM=1"),
)  # fmt: skip


def pair_by_name(name: str) -> PairSpec:
    for p in PAIRS:
        if p.name == name:
            return p
    raise ValueError(f"pair: expected one of {[p.name for p in PAIRS]}, got {name!r}")


class _Skip(Exception):
    """A side that cannot run here, for a reason that is a finding, not an error."""


def _backend(key: str, device: str, opts: OpOptions) -> Backend:
    if key not in REGISTRY:
        raise _Skip(f"backend {key!r} is not registered in this rlnorm")
    backend = load_backend(key)
    ok, why = backend.available(device)
    if not ok:
        raise _Skip(f"{key}: {why}")
    ok, why = backend.supports(opts)
    if not ok:
        raise _Skip(f"{key}: {why}")
    return backend


def _train(backend: Backend, x: Tensor, z: Tensor, w: Tensor, dy: Tensor, opts: OpOptions) -> Tensor:
    """A training step: one packed batch, forward and backward (forward only where the backend has no backward)."""
    if backend.has_backward:
        return backend.forward_backward(x, z, w, dy, opts).y
    return backend.forward(x, z, w, opts)


def _sample(backend: Backend, x: Tensor, z: Tensor, w: Tensor, plan: list[int], opts: OpOptions) -> Tensor:
    """Generation: a prefill, then decode steps, each call under inference mode as a model runner makes it."""
    outs = []
    for xs, zs in zip(x.split(plan), z.split(plan), strict=True):
        with torch.inference_mode():
            y = backend.forward(xs, zs, w, opts)
        outs.append(y.clone())  # a normal tensor again, for comparing outside inference mode
    return torch.cat(outs)


def run_pair(
    spec: PairSpec,
    *,
    rows: int = 257,
    d: int = 128,
    seed: int = 3,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: str | torch.dtype | None = None,
    heads: int = 2,
    decode_tokens: int = 8,
    opts: OpOptions | None = None,
    backends: dict[str, Backend] | None = None,
) -> dict[str, Any]:
    """One pair's row of the table (StackPair's JSON). `backends` stands in for keys (tests plant one there)."""
    check_int("d", d, 1)
    plan = sampler_plan(rows, heads, decode_tokens)
    opts = opts or OpOptions(**QWEN3_NEXT_OPTIONS)
    row: dict[str, Any] = {"name": spec.name, "stack": spec.stack, "model": spec.model, "trainer": spec.trainer}
    row |= {"sampler": spec.sampler, "trainer_where": spec.trainer_where, "sampler_where": spec.sampler_where}
    row |= {"trainer_calls": [rows], "sampler_calls": plan, "status": "skipped"}
    other = {k: v for k, v in QWEN3_NEXT_OPTIONS.items() if getattr(opts, k) != v}
    if other:
        row["reason"] = f"{spec.model}'s norm is {QWEN3_NEXT_OPTIONS}; the run's options differ: " + ", ".join(
            f"{k}={getattr(opts, k)!r}" for k in other
        )
        return row
    planted = backends or {}
    try:
        trainer = planted.get(spec.trainer) or _backend(spec.trainer, device, opts)
        sampler = planted.get(spec.sampler) or _backend(spec.sampler, device, opts)
    except _Skip as why:
        row["reason"] = str(why)
        return row
    row |= {"trainer_source": trainer.source, "sampler_source": sampler.source}
    wdt = getattr(torch, weight_dtype) if isinstance(weight_dtype, str) else weight_dtype or dtype
    case = make_case(rows, d, seed, dtype, wdt, device=device)
    x = (case.x.float() * row_scales(rows).to(device)).to(dtype)
    try:
        y_trainer = _train(trainer, x, case.z, case.w, case.dy, opts)
        y_sampler = _sample(sampler, x, case.z, case.w, plan, opts)
        row |= compare_outputs(y_trainer, y_sampler)
    except Exception as exc:
        row |= {"status": "error", "reason": describe_error(exc)}
        return row
    row["status"] = "ran"
    return row


def main(argv: Sequence[str] | None = None) -> int:
    """`main([JOB, OUT.json])`: the pair JOB["pair"] with JOB's other keywords; its row goes to OUT."""
    job_text, out = sys.argv[1:] if argv is None else argv
    job = json.loads(job_text)
    spec = pair_by_name(job.pop("pair"))
    if job.get("opts") is not None:
        job["opts"] = OpOptions(**job["opts"])
    try:
        row = run_pair(spec, **job)
    except Exception as exc:
        row = {"name": spec.name, "status": "error", "reason": describe_error(exc)}
    Path(out).write_text(json.dumps(row, allow_nan=False), encoding="utf-8")
    return 0
