"""rlnorm's vLLM plugin: with `RLNORM_VLLM=1`, vLLM builds rlnorm's layer wherever a model asks for `RMSNormGated`.

`register_plugin` is declared as a `vllm.general_plugins` entry point, which vLLM runs in each of its processes;
`register` puts the layer in vLLM's out-of-tree registry, so model code is unchanged. Imports no vLLM itself.
"""

from __future__ import annotations

import os

ENV = "RLNORM_VLLM"
IN_TREE = "RMSNormGated"  # the key vLLM's registry uses: the in-tree class's __name__


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    """Whether `RLNORM_VLLM` is "1"; a value other than 1, 0 or unset raises (a typo must not leave vLLM unpatched)."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if value in ("", "0", "1"):
        return value == "1"
    raise ValueError(f"{ENV}: expected 1 (use rlnorm's kernel in vLLM) or 0/unset, got {value!r}")


def register_plugin() -> None:
    """vLLM's general-plugin entry point (idempotent)."""
    if enabled_by_env():
        register()


def _registry() -> dict[str, type]:
    from vllm.model_executor.custom_op import op_registry_oot

    return op_registry_oot


def is_registered() -> bool:
    from rlnorm.integrations.vllm_layer import RlnormRMSNormGated

    return _registry().get(IN_TREE) is RlnormRMSNormGated


def register() -> type:
    """vLLM builds `RlnormRMSNormGated` for every `RMSNormGated` from now on in this process (idempotent)."""
    from vllm.model_executor.layers.layernorm import RMSNormGated

    from rlnorm.integrations.vllm_layer import RlnormRMSNormGated

    current = _registry().get(IN_TREE)
    if current is RlnormRMSNormGated:
        return current
    if current is not None:
        raise RuntimeError(
            f"{ENV}: vLLM's {IN_TREE} is already replaced by {current.__module__}.{current.__qualname__}; "
            "vLLM holds one out-of-tree layer per class, so rlnorm's cannot be registered beside it"
        )
    RMSNormGated.register_oot(RlnormRMSNormGated)
    # register_oot names the class after its registry key; the in-tree name keeps vLLM's custom_ops switches
    # ("+rms_norm_gated") and its logs meaning what they meant (both dispatch paths run rlnorm anyway)
    RlnormRMSNormGated.name = RMSNormGated.name
    return RlnormRMSNormGated


def unregister() -> None:
    """Undo `register` (layers already built keep their class)."""
    if is_registered():
        del _registry()[IN_TREE]
