"""The gated norm of a Qwen3-Next linear-attention layer as each side of RL builds it from one config: the trainer's
(`transformers_norm`) and the sampler's (`vllm_norm`), patched with rlnorm or not (callers pass the weight).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch import nn

from rlnorm.integrations.transformers import apply_rlnorm_to_qwen3_next


def tiny_config(*, d: int = 32, eps: float = 1e-6) -> Any:
    """A two-layer Qwen3-Next (linear, then full attention) small enough for a CPU. Its MLPs are dense: the MoE's
    expert matmuls change shape with the batch, which no norm makes batch invariant."""
    from transformers import Qwen3NextConfig

    sizes = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 64, "max_position_embeddings": 64}
    full = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
    linear = {"linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 16}
    layers = {"layer_types": ["linear_attention", "full_attention"], "mlp_only_layers": [0, 1]}
    return Qwen3NextConfig(**sizes, **full, **linear, **layers, linear_value_head_dim=d, rms_norm_eps=eps)


@contextlib.contextmanager
def torch_delta_rule() -> Iterator[None]:
    """Within: transformers runs its PyTorch delta rule, even where FLA's kernels (which autotune) are bound."""
    from transformers.models.qwen3_next import modeling_qwen3_next as mq

    names = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")  # bound through functools.wraps
    bound = {name: getattr(mq, name) for name in names}
    with mock.patch.multiple(mq, **{name: getattr(fn, "__wrapped__", fn) for name, fn in bound.items()}):
        yield


def transformers_norm(
    config: Any, *, patched: bool, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16
) -> nn.Module:
    """The trainer's norm: `norm` of the config's first Gated DeltaNet layer."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    layer = Qwen3NextGatedDeltaNet(config, list(config.layer_types).index("linear_attention"))
    layer = layer.to(device=device, dtype=dtype)
    if patched:
        apply_rlnorm_to_qwen3_next(layer)
    return layer.norm


def sampler_activation(config: Any) -> str:
    """The gate vLLM's Qwen3-Next layer passes its norm (`output_gate_type`, silu when absent)."""
    gate = getattr(config, "output_gate_type", None) or "silu"
    return "silu" if gate == "swish" else gate


def vllm_norm(
    config: Any, *, patched: bool, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16
) -> nn.Module:
    """The sampler's norm: vLLM's `RMSNormGated` as its Qwen3-Next layer constructs it; patched: rlnorm's layer
    registered only while it is built."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNormGated

    from rlnorm.integrations import vllm as plugin

    was = plugin.is_registered()
    device = torch.device(device)
    try:
        plugin.register() if patched else plugin.unregister()
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device=device.type))):
            gate = {"group_size": None, "norm_before_gate": True, "activation": sampler_activation(config)}
            return RMSNormGated(
                config.linear_value_head_dim, eps=config.rms_norm_eps, **gate, device=device, dtype=dtype
            )
    finally:
        plugin.register() if was else plugin.unregister()
