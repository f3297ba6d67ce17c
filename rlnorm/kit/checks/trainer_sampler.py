"""Trainer against sampler: the same rows through the norm as transformers calls it and as vLLM calls it, bitwise.

RL trains on what the sampler generated, so the trainer (transformers) and the sampler (vLLM, in a prefill then
decode steps of `heads` rows) must compute the same bits for a token. From one tiny Qwen3-Next config and one weight,
two pairs are built: the patched pair (`apply_rlnorm_to_qwen3_next` in transformers, rlnorm's layer registered in
vLLM as `RLNORM_VLLM=1` does) and the unpatched pair for contrast; `agree` is the patched pair's bitwise equality.
Row r of x is scaled by 2^-(r mod 16), exactly, so mean squares reach far below eps, where a default eps shows.
Where vLLM cannot be imported, the patched sampler is the operator rlnorm's vLLM layer calls, labelled so, and the
unpatched pair is skipped with the reason. `main` runs in a process of its own: importing vLLM patches torch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlnorm.inputs import make_case
from rlnorm.kit.backends import describe_error, dist_version
from rlnorm.kit.checks.common import bits, check_int
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions

# rlnorm.integrations and the vllm backend are imported where used: they bring in transformers and vLLM

__all__ = ["QWEN3_NEXT_OPTIONS", "compare_outputs", "main", "row_scales", "sampler_plan", "trainer_vs_sampler"]
__all__ += ["vllm_unavailable_reason"]

# what Qwen3-Next's gated norm is: whole rows, the norm before a silu gate (eps is the config's)
QWEN3_NEXT_OPTIONS = {"group_size": None, "norm_before_gate": True, "activation": "silu"}
SHOWN_ROWS = 10  # differing rows listed by index in the summary (the counts are complete)
Side = Callable[[Tensor, Tensor], Tensor]


@dataclass
class SamplerCheck:
    """The check's summary (it has no per-row records)."""

    summary: dict[str, Any]


def row_scales(rows: int) -> Tensor:
    """[rows, 1] fp32: 2^-(r mod 16), exact in every float dtype, so scaling x rounds nothing."""
    return torch.pow(2.0, -(torch.arange(rows) % 16).to(torch.float32))[:, None]


def sampler_plan(rows: int, heads: int, decode_tokens: int) -> list[int]:
    """Row counts of the sampler's calls: a prefill, then up to `decode_tokens` decode steps of `heads` rows (the
    one place the sizes both the trainer-vs-sampler check and the stack pairs take are checked)."""
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
    return {
        "bitwise_equal": not rows,
        "rows_differ": len(rows),
        "elements_differ": int(differ.sum()),
        "max_ulp": int(ulp_distance(a, b).max()) if a.numel() else 0,
        "differing_rows": rows[:SHOWN_ROWS],
    }


def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot be used in this process, or None after importing its layer."""
    from rlnorm.kit.backends.vllm import vllm_version

    version = vllm_version()
    if version is None:
        return "vllm is not installed"
    try:
        import vllm.model_executor.layers.layernorm  # noqa: F401
    except Exception as exc:
        return f"importing vLLM {version} fails: {describe_error(exc)}"
    return None


def _trainer(config: Any, weight: Tensor, patched: bool, device: str) -> tuple[str, Side]:
    from rlnorm.integrations.qwen3_next import transformers_norm

    norm = transformers_norm(config, patched=patched, weight=weight, device=device, dtype=weight.dtype)
    label = f"transformers {dist_version('transformers')} {type(norm).__qualname__}"

    def run(x: Tensor, z: Tensor) -> Tensor:  # a training step: inputs that need grad, autograd recording
        with torch.enable_grad():
            return norm(x.detach().requires_grad_(True), z.detach().requires_grad_(True)).detach()

    return label, run


def _sampler(config: Any, weight: Tensor, patched: bool, device: str, vllm_reason: str | None) -> tuple[str, Side]:
    from rlnorm.integrations.qwen3_next import sampler_activation, vllm_norm

    if vllm_reason is None:
        layer = vllm_norm(config, patched=patched, weight=weight, device=device, dtype=weight.dtype)
        method = getattr(getattr(layer, "_forward_method", None), "__name__", "forward")

        def run(x: Tensor, z: Tensor) -> Tensor:
            with torch.inference_mode():  # as vLLM's model runner calls a model
                return layer(x, z).clone()  # a normal tensor again, for comparing outside inference mode

        return f"vLLM {dist_version('vllm')} {type(layer).__qualname__}.{method}", run
    if not patched:
        raise _Skip(f"vLLM's own layer cannot run here: {vllm_reason}")
    from rlnorm.integrations.ops import rms_norm_gated_op

    w = weight.to(device)
    eps, activation = config.rms_norm_eps, sampler_activation(config)

    def op(x: Tensor, z: Tensor) -> Tensor:  # the arguments RlnormRMSNormGated passes from vLLM's constructor
        with torch.inference_mode():
            return rms_norm_gated_op(x, z, w, eps, None, True, activation).clone()

    return f"torch.ops.rlnorm.rms_norm_gated as rlnorm's vLLM layer calls it (vLLM cannot run here: {vllm_reason})", op


class _Skip(Exception):
    """A side that cannot be built here, for a reason that is a finding, not an error."""


def trainer_vs_sampler(
    *,
    d: int = 128,
    eps: float = 1e-6,
    rows: int = 257,
    seed: int = 3,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    weight_dtype: str | torch.dtype | None = None,
    heads: int = 2,
    decode_tokens: int = 8,
    opts: OpOptions | None = None,
) -> SamplerCheck:
    """The same `rows` rows (make_case, x scaled per row) through both pairs; eps is the config's rms_norm_eps.
    Options other than Qwen3-Next's norm (`QWEN3_NEXT_OPTIONS`) are skipped with the reason."""
    check_int("d", d, 1)
    plan = sampler_plan(rows, heads, decode_tokens)
    wdt = getattr(torch, weight_dtype) if isinstance(weight_dtype, str) else weight_dtype or dtype
    summary: dict[str, Any] = {"rows": rows, "d": d, "heads": heads, "seed": seed, "eps": eps, "device": device}
    summary.update(dtype=str(dtype).removeprefix("torch."), weight_dtype=str(wdt).removeprefix("torch."))
    summary.update(trainer_calls=[rows], sampler_calls=plan, vllm=None, vllm_reason=None, agree=None, pairs={})
    if opts is not None:
        other = {k: v for k, v in QWEN3_NEXT_OPTIONS.items() if getattr(opts, k) != v}
        if other:
            summary["skip_reason"] = (
                f"the trainer's norm is Qwen3-Next's ({QWEN3_NEXT_OPTIONS}); the run's options differ: "
                + ", ".join(f"{k}={getattr(opts, k)!r}" for k in other)
            )
            return SamplerCheck(summary)
    try:
        from rlnorm.integrations.qwen3_next import tiny_config

        config = tiny_config(d=d, eps=eps, heads=heads)
    except Exception as exc:
        summary["error"] = f"cannot build a Qwen3-Next config with transformers: {describe_error(exc)}"
        return SamplerCheck(summary)
    case = make_case(rows, d, seed, dtype, wdt)
    x = (case.x.float() * row_scales(rows)).to(dtype).to(device)
    z = case.z.to(device)
    reason = vllm_unavailable_reason()
    summary["vllm_reason"] = reason
    summary["vllm"] = None if reason else dist_version("vllm")
    for name, patched in (("patched", True), ("unpatched", False)):
        pair: dict[str, Any] = {"trainer": None, "sampler": None, "bitwise_equal": None}
        summary["pairs"][name] = pair
        try:
            pair["trainer"], trainer = _trainer(config, case.w, patched, device)
            pair["sampler"], sampler = _sampler(config, case.w, patched, device, reason)
            y_trainer = trainer(x, z)
            y_sampler = torch.cat([sampler(xs, zs) for xs, zs in zip(x.split(plan), z.split(plan), strict=True)])
            pair.update(compare_outputs(y_trainer, y_sampler))
        except _Skip as why:
            pair["skip_reason"] = str(why)
        except Exception as exc:
            pair["error"] = describe_error(exc)
    summary["agree"] = summary["pairs"]["patched"]["bitwise_equal"]
    return SamplerCheck(summary)


def main(argv: Sequence[str] | None = None) -> int:
    """`main([JOB, OUT.json])`: the check with the keywords of JOB (a JSON object); the summary goes to OUT."""
    job, out = sys.argv[1:] if argv is None else argv
    kwargs = json.loads(job)
    if kwargs.get("opts") is not None:
        kwargs["opts"] = OpOptions(**kwargs["opts"])
    try:
        summary = trainer_vs_sampler(**kwargs).summary
    except Exception as exc:
        summary = {"error": describe_error(exc)}
    Path(out).write_text(json.dumps({"summary": summary}, allow_nan=False), encoding="utf-8")
    return 0
