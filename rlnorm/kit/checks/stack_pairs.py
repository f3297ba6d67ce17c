"""Stack pairs: the same rows through the trainer and the sampler an RL stack deploys (`PAIRS`), bitwise. Row r of x
is scaled by 2^-(r mod 16), so mean squares reach below eps, where a wrong eps shows. `main` runs one pair per
process: a vLLM import patches torch for the rest of a process, and a crash takes only its own row down.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlnorm.inputs import make_case
from rlnorm.kit.backends import REGISTRY, Backend, describe_error, dist_version, load_backend
from rlnorm.kit.checks.common import bits, check_int
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions

# rlnorm.integrations and the vllm backend are imported where used: they bring in transformers and vLLM

# what Qwen3-Next's and Qwen3.5's gated norm is: whole rows, the norm before a silu gate
QWEN3_NEXT_OPTIONS = {"group_size": None, "norm_before_gate": True, "activation": "silu"}


def row_scales(rows: int) -> Tensor:
    """[rows, 1] fp32: 2^-(r mod 16), exact in every float dtype, so scaling x rounds nothing."""
    return torch.pow(2.0, -(torch.arange(rows) % 16).to(torch.float32))[:, None]


def sampler_plan(rows: int, heads: int, decode_tokens: int) -> list[int]:
    """Row counts of the sampler's calls: a prefill, then up to `decode_tokens` decode steps of `heads` rows."""
    for name, (n, least) in {"rows": (rows, 1), "heads": (heads, 1), "decode_tokens": (decode_tokens, 0)}.items():
        check_int(name, n, least)
    steps = min(decode_tokens, rows // heads)
    prefill = rows - steps * heads
    return ([prefill] if prefill else []) + [heads] * steps


def compare_outputs(trainer_y: Tensor, sampler_y: Tensor) -> dict[str, Any]:
    """How the sampler's output differs from the trainer's, row by row, bitwise."""
    if trainer_y.shape != sampler_y.shape or trainer_y.dtype != sampler_y.dtype:
        raise ValueError(
            f"sampler output {tuple(sampler_y.shape)} {sampler_y.dtype}, expected the trainer's "
            f"{tuple(trainer_y.shape)} {trainer_y.dtype}"
        )
    a, b = trainer_y.detach().cpu(), sampler_y.detach().cpu()
    differ = bits(a) != bits(b)
    rows = differ.any(dim=-1).nonzero().flatten().tolist()
    ulp = int(ulp_distance(a, b).max()) if a.numel() else 0
    out = {"bitwise_equal": not rows, "rows_differ": len(rows), "elements_differ": int(differ.sum()), "max_ulp": ulp}
    return out | {"differing_rows": rows[:10]}  # the first ten by index (the counts are complete)


def vllm_unavailable_reason() -> str | None:
    """Why vLLM's layer cannot be imported in this process, or None once it is."""
    try:
        import vllm.model_executor.layers.layernorm  # noqa: F401
    except Exception as exc:
        return f"importing vLLM fails: {describe_error(exc)}"
    return None


class ModelNorm(Backend):
    """Qwen3-Next's gated norm as the model's own layer holds it (`integrations.qwen3_next`, a tiny config at the
    call's width and eps): transformers' (a trainer) or vLLM's (a sampler), patched with rlnorm or not. Where vLLM
    cannot be imported, the patched sampler is the operator rlnorm's vLLM layer calls, labelled so."""

    requires = "transformers.models.qwen3_next.modeling_qwen3_next"

    def __init__(self, key: str, framework: str, patched: bool) -> None:
        self.key = self.source = key
        self.framework, self.patched, self.has_backward = framework, patched, framework == "transformers"

    def _probe(self, device: str) -> tuple[bool, str]:
        reason = vllm_unavailable_reason() if self.framework == "vllm" else None
        if reason and not self.patched:
            return False, f"vLLM's own layer cannot run here: {reason}"
        return super()._probe(device)

    @functools.cache  # noqa: B019 (one build per width, eps, device and dtype; a pair's process is short)
    def _build(self, d: int, eps: float, device: str, dtype: torch.dtype) -> Callable[..., Tensor]:
        from rlnorm.integrations import qwen3_next as q

        config = q.tiny_config(d=d, eps=eps)
        if self.framework == "transformers":
            norm = q.transformers_norm(config, patched=self.patched, device=device, dtype=dtype)
            self.source = f"transformers {dist_version('transformers')} {type(norm).__qualname__}"
        elif (reason := vllm_unavailable_reason()) is None:
            norm = q.vllm_norm(config, patched=self.patched, device=device, dtype=dtype)
            method = getattr(getattr(norm, "_forward_method", None), "__name__", "forward")
            self.source = f"vLLM {dist_version('vllm')} {type(norm).__qualname__}.{method}"
        else:
            from rlnorm.integrations.ops import rms_norm_gated_op

            self.source = f"torch.ops.rlnorm.rms_norm_gated as rlnorm's vLLM layer calls it (vLLM: {reason})"
            act = q.sampler_activation(config)  # the arguments RlnormRMSNormGated passes from vLLM's constructor
            return lambda x, z, w: rms_norm_gated_op(x, z, w, eps, None, True, act)
        return lambda x, z, w: torch.func.functional_call(norm, {"weight": w}, (x, z))

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return self._build(x.shape[-1], opts.eps, str(x.device), w.dtype)(x, z, w)


# the sides `ModelNorm` builds: key -> (framework, patched)
MODEL_SIDES = {"transformers_rlnorm": ("transformers", True), "vllm_rlnorm": ("vllm", True)}
MODEL_SIDES |= {"transformers_model": ("transformers", False), "vllm_layer": ("vllm", False)}


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
    # the patched/unpatched contrast: Qwen3-Next's own layers, rlnorm in both or in neither
    PairSpec("rlnorm_patched", "rlnorm on both sides (patched)", "Qwen3-Next", "transformers_rlnorm", "vllm_rlnorm",
             "rlnorm integrations/transformers.py apply_rlnorm_to_qwen3_next", "rlnorm integrations/vllm_layer.py "
             "RLNORM_VLLM=1"),
    PairSpec("stock_unpatched", "stock layers, unpatched (contrast)", "Qwen3-Next", "transformers_model",
             "vllm_layer", _TRANSFORMERS_NEXT, f"{_VLLM_QWEN3_NEXT}, the installed vLLM's default dispatch"),
)  # fmt: skip


def pair_by_name(name: str) -> PairSpec:
    for p in PAIRS:
        if p.name == name:
            return p
    raise ValueError(f"pair: expected one of {[p.name for p in PAIRS]}, got {name!r}")


def _side(key: str, device: str, opts: OpOptions) -> Backend | str:
    """The backend a key names, or why it cannot run here (a finding, not an error)."""
    if key in MODEL_SIDES:
        backend: Backend = ModelNorm(key, *MODEL_SIDES[key])
    elif key in REGISTRY:
        backend = load_backend(key)
    else:
        return f"backend {key!r} is not registered in this rlnorm"
    for ok, why in (backend.available(device), backend.supports(opts)):
        if not ok:
            return f"{key}: {why}"
    return backend


def run_pair(
    spec: PairSpec,
    *,
    rows: int = 257,
    d: int = 128,
    seed: int = 3,
    device: str = "cpu",
    weight_dtype: str | None = None,
    heads: int = 2,
    decode_tokens: int = 8,
    opts: OpOptions | None = None,
    backends: dict[str, Backend] | None = None,
) -> dict[str, Any]:
    """One pair's row of the table (StackPair's JSON), on bf16 rows. `backends` stands in for keys (tests plant
    one there)."""
    plan = sampler_plan(rows, heads, decode_tokens)
    opts = opts or OpOptions(**QWEN3_NEXT_OPTIONS)
    row = dataclasses.asdict(spec) | {"trainer_calls": [rows], "sampler_calls": plan, "status": "skipped"}
    if other := [f"{k}={getattr(opts, k)!r}" for k, v in QWEN3_NEXT_OPTIONS.items() if getattr(opts, k) != v]:
        row["reason"] = f"{spec.model}'s norm is {QWEN3_NEXT_OPTIONS}; the run's options differ: {', '.join(other)}"
        return row
    trainer, sampler = ((backends or {}).get(k) or _side(k, device, opts) for k in (spec.trainer, spec.sampler))
    if isinstance(trainer, str) or isinstance(sampler, str):
        return row | {"reason": trainer if isinstance(trainer, str) else sampler}
    case = make_case(rows, d, seed, torch.bfloat16, getattr(torch, weight_dtype or "bfloat16"), device=device)
    x, z, w, dy = (case.x.float() * row_scales(rows).to(device)).to(torch.bfloat16), case.z, case.w, case.dy
    try:  # the trainer: one packed batch, forward and backward (forward only where the backend has no backward)
        y = trainer.forward_backward(x, z, w, dy, opts).y if trainer.has_backward else trainer.forward(x, z, w, opts)
        sampled = []  # the sampler: a prefill, then decode steps, each under inference mode as a model runner calls
        for xs, zs in zip(x.split(plan), z.split(plan), strict=True):
            with torch.inference_mode():
                sampled.append(sampler.forward(xs, zs, w, opts))
        row |= compare_outputs(y, torch.cat([t.clone() for t in sampled])) | {"status": "ran"}  # clone: normal tensors
    except Exception as exc:
        row |= {"status": "error", "reason": describe_error(exc)}
    return row | {"trainer_source": trainer.source, "sampler_source": sampler.source}


def main(argv: Sequence[str] | None = None) -> int:
    """`main([JOB, OUT.json])`: the pair JOB["pair"] with JOB's other keywords; its row goes to OUT."""
    job_text, out = sys.argv[1:] if argv is None else argv
    job = json.loads(job_text)
    spec = pair_by_name(job.pop("pair"))
    job["opts"] = OpOptions(**job["opts"]) if job.get("opts") else None
    try:
        row = run_pair(spec, **job)
    except Exception as exc:
        row = {"name": spec.name, "status": "error", "reason": describe_error(exc)}
    Path(out).write_text(json.dumps(row, allow_nan=False), encoding="utf-8")
    return 0
