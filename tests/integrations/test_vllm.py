"""rlnorm's vLLM plugin against the installed vLLM on the CPU, the vLLM side in the suite's vLLM child."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from rlnorm.integrations import vllm as plugin
from rlnorm.kit.process import child_env

slow = pytest.mark.slow
ENTRY = "rlnorm.integrations.vllm:register_plugin"


@pytest.mark.parametrize(
    ("value", "on"), [(None, False), ("", False), ("0", False), (" 1 ", True), ("1", True), ("yes", None), ("2", None)]
)
def test_the_variable_switches_it_and_any_other_value_is_refused_by_name(value: str | None, on: bool | None) -> None:
    env = {} if value is None else {plugin.ENV: value}
    if on is None:
        with pytest.raises(ValueError, match=f"^RLNORM_VLLM: expected 1 .* got '{value}'"):
            plugin.enabled_by_env(env)
    else:
        assert plugin.enabled_by_env(env) is on


def test_importing_the_plugin_imports_no_vllm() -> None:
    code = "import sys, rlnorm.integrations.vllm; print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), check=True)
    assert proc.stdout.strip() == "[]"


@slow
def test_installing_is_not_switching_on_and_vllms_plugin_loader_switches_it_on(vllm_facts: Any) -> None:
    f = vllm_facts("switched")
    assert f["unset"] == "RMSNormGated" and not f["registered_before"]
    # the entry point pyproject declares, as vLLM's loader finds it
    assert ENTRY in f["found"]
    assert f["class"] == "rlnorm.integrations.vllm_layer.RlnormRMSNormGated" and f["registered"]


@slow
@pytest.mark.parametrize(
    ("custom_ops", "dispatched", "options"),
    [
        ("all", "forward_cuda", [1e-5, None, False, "swish"]),  # vLLM's defaults, as vLLM's constructor sets them
        ("none", "forward_native", [1e-6, None, True, "silu"]),
        ("none++rms_norm_gated", "forward_cuda", [1e-3, 8, False, "sigmoid"]),
    ],
)
def test_vllm_instantiates_it_with_the_layer_s_options_and_every_dispatch_path_equals_rlnorm_bitwise(
    custom_ops: str, dispatched: str, options: list, vllm_facts: Any
) -> None:
    f = vllm_facts("instantiated_and_dispatched")[custom_ops]
    assert f["class"] == "RlnormRMSNormGated"
    assert f["name"] == "rms_norm_gated"  # vLLM's custom_ops switches keep their in-tree meaning
    assert f["dispatched"] == dispatched  # this machine's vLLM platform is not the CPU one: enabled means forward_cuda
    assert f["options"] == options
    assert f["differing"] == 0 and set(f["every_method_differing"].values()) == {0}
    assert (f["differing_from_rlnorm_defaults"] > 0) == (custom_ops != "none")  # the options reach the kernel


@slow
def test_a_layer_that_keeps_rlnorm_s_default_eps_is_caught(vllm_facts: Any) -> None:
    assert vllm_facts("instantiated_and_dispatched")["planted_differing"] > 0


@slow
def test_compiled_forward_native_keeps_rlnorm_opaque_and_equal(vllm_facts: Any) -> None:
    f = vllm_facts("compiled")
    assert f["is_compiled"]
    assert f["differing_by_rows"] == {"37": 0, "5": 0, "1": 0}  # dynamic shapes, one compiled graph
    assert f["traced_differing"] == 0
    assert f["graph_has_op"] and not f["graph_has_rsqrt"]
    assert f["vllm_graph_has_rsqrt"]  # the inspection sees a re-derivable body when there is one


@slow
def test_what_cannot_be_honoured_is_refused_when_the_model_is_built(vllm_facts: Any) -> None:
    f = vllm_facts("refused")
    assert f["group_size"].startswith("vLLM RMSNormGated with rlnorm's kernel (RLNORM_VLLM=1): group_size: 5")
    assert "activation: expected one of" in f["activation"]
    assert "already replaced by" in f["another"] and "Theirs" in f["another"]  # another out-of-tree one is named
