"""What rlnorm's vLLM plugin does inside vLLM, run in a child process: `python vllm_scenarios.py OUT.json`.

Importing vLLM takes ~20 s and patches torch's compiler for the rest of a process, so the test process never
imports it: `facts()` runs this script once per pytest run, which runs every scenario against the installed
vLLM on the CPU and writes each one's facts (or its error) for `test_vllm.py` and `test_stack_pairs.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import rlnorm
from rlnorm.integrations import vllm as plugin
from rlnorm.integrations.ops import OP_NAME, rms_norm_gated_op
from rlnorm.numerics import ulp_distance

D = 32
SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {}


def scenario(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    SCENARIOS[fn.__name__] = fn
    return fn


def rows(n: int = 37, seed: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 x (rows scaled by 2^-(r mod 16): mean squares from far above eps to far below), z, and a weight."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.pow(2.0, -(torch.arange(n) % 16).float())[:, None]
    x = (2 * torch.randn(n, D, generator=g) * scale).to(torch.bfloat16)
    z = torch.randn(n, D, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)
    return x, z, w


def build(custom_ops: list[str] | None = None, **kwargs: Any) -> torch.nn.Module:
    """`RMSNormGated(D, **kwargs)` as a model's code constructs it, under a vLLM config for the CPU."""
    from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNormGated

    compilation = CompilationConfig(custom_ops=custom_ops) if custom_ops else CompilationConfig()
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"), compilation_config=compilation)):
        return RMSNormGated(D, dtype=torch.bfloat16, **kwargs)


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (0: bitwise equal)."""
    return int((ulp_distance(a, b) != 0).sum()) + int(a.shape != b.shape)


def expected(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, layer: Any) -> torch.Tensor:
    names = ("eps", "group_size", "norm_before_gate", "activation")
    return rlnorm.rms_norm_gated(x, z, w, **{name: getattr(layer, name) for name in names})


@scenario
def off_unless_asked() -> dict[str, Any]:
    os.environ.pop(plugin.ENV, None)
    plugin.register_plugin()
    unset = type(build()).__qualname__
    os.environ[plugin.ENV] = "0"
    plugin.register_plugin()
    zero = type(build()).__qualname__
    os.environ[plugin.ENV] = "yes"
    try:
        plugin.register_plugin()
        typo = None
    except ValueError as exc:
        typo = str(exc)
    os.environ.pop(plugin.ENV)
    return {"unset": unset, "zero": zero, "typo": typo, "registered": plugin.is_registered()}


@scenario
def through_the_entry_point() -> dict[str, Any]:
    """vLLM's own loader finds the declared entry point (a dist-info standing in for `pip install rlnorm`)."""
    from importlib.metadata import entry_points

    import vllm.plugins

    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "rlnorm_plugin_probe-0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlnorm-plugin-probe\nVersion: 0.0\n")
        (dist / "entry_points.txt").write_text(
            f"[{vllm.plugins.DEFAULT_PLUGINS_GROUP}]\nrlnorm = rlnorm.integrations.vllm:register_plugin\n"
        )
        sys.path.insert(0, tmp)
        os.environ[plugin.ENV] = "1"
        os.environ.pop("VLLM_PLUGINS", None)
        try:
            found = sorted({ep.value for ep in entry_points(group=vllm.plugins.DEFAULT_PLUGINS_GROUP)})
            vllm.plugins.plugins_loaded = False
            vllm.plugins.load_general_plugins()
            vllm.plugins.load_general_plugins()  # vLLM loads plugins again in other places: a no-op
            layer = build(eps=1e-6, norm_before_gate=True, activation="silu")
        finally:
            sys.path.remove(tmp)
            os.environ.pop(plugin.ENV)
    out = {"found": found, "class": f"{type(layer).__module__}.{type(layer).__qualname__}"}
    out["registered"] = plugin.is_registered()
    plugin.unregister()
    return out


@scenario
def instantiated_and_dispatched() -> dict[str, Any]:
    """Under each custom_ops setting: the class built, the method dispatched, and its output against rlnorm's."""
    plugin.register()
    x, z, w = rows()
    out: dict[str, Any] = {}
    options = {"eps": 1e-5, "group_size": 16, "norm_before_gate": False, "activation": "sigmoid"}
    for ops in (["all"], ["none"], ["none", "+rms_norm_gated"]):
        layer = build(ops, **options)
        with torch.no_grad():
            layer.weight.copy_(w)
        ref = expected(x, z, w, layer)
        with torch.inference_mode():  # as vLLM's model runner calls the model
            y = layer(x, z)
            every = {
                m: differing(getattr(layer, m)(x, z), ref)
                for m in ("forward_native", "forward_cuda", "forward_cpu", "forward_hip", "forward_xpu", "forward_oot")
            }
        out["+".join(ops)] = {
            "class": type(layer).__qualname__,
            "name": type(layer).name,
            "dispatched": layer._forward_method.__name__,
            "differing": differing(y, ref),
            "every_method_differing": every,
            "options": [layer.eps, layer.group_size, layer.norm_before_gate, layer.activation],
        }
    plugin.unregister()
    return out


@scenario
def compiled() -> dict[str, Any]:
    """forward_native compiled as vLLM compiles it (`maybe_compile`: Inductor, dynamic shapes), and the graph
    Dynamo hands a backend: the norm is one opaque call there, not re-derived PyTorch ops."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    plugin.register()
    x, z, w = rows()
    layer = build(eps=1e-6, norm_before_gate=True, activation="silu")
    with torch.no_grad():
        layer.weight.copy_(w)
    ref = expected(x, z, w, layer)
    graphs: list[str] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(str(gm.graph))
        return gm.forward

    with torch.inference_mode():
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
            compiled_native = layer.maybe_compile(layer.forward_native)
        sizes = {n: differing(compiled_native(x[:n], z[:n]), ref[:n]) for n in (37, 5, 1)}
        traced = torch.compile(layer, backend=capture, fullgraph=True)
        traced_differ = differing(traced(x, z), ref)
    vllm_native = type(layer).__mro__[1].forward_native  # vLLM's own body, for contrast
    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(lambda a, b: vllm_native(layer, a, b), backend=capture, fullgraph=True)(x, z)
    plugin.unregister()
    return {
        "is_compiled": compiled_native is not layer.forward_native,
        "differing_by_rows": sizes,
        "traced_differing": traced_differ,
        "graph_has_op": OP_NAME.replace("::", ".") in graphs[0],
        "graph_has_rsqrt": "rsqrt" in graphs[0],
        "vllm_graph_has_rsqrt": "rsqrt" in graphs[-1],
    }


@scenario
def layer_options_not_defaults() -> dict[str, Any]:
    """The layer's own options reach the kernel (vLLM's defaults: eps 1e-5, gate first, swish)."""
    plugin.register()
    x, z, w = rows()
    out = {}
    for i, options in enumerate(
        [{}, {"eps": 1e-6, "norm_before_gate": True, "activation": "silu"}, {"eps": 1e-3, "group_size": 8}]
    ):
        layer = build(**options)
        with torch.no_grad():
            layer.weight.copy_(w)
            y = layer.forward_native(x, z)
        out[str(i)] = {
            "options": [layer.eps, layer.group_size, layer.norm_before_gate, layer.activation],
            "differing": differing(y, expected(x, z, w, layer)),
            "differing_from_rlnorm_defaults": differing(y, rlnorm.rms_norm_gated(x, z, w)),
        }
    plugin.unregister()
    return out


@scenario
def planted_default_eps() -> dict[str, Any]:
    """A replacement that keeps rlnorm's default eps: the dispatch comparison must see it."""
    from rlnorm.integrations.vllm_layer import RlnormRMSNormGated

    def wrong_eps(self: Any, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return rms_norm_gated_op(x, z, self.weight, 1e-6, self.group_size, self.norm_before_gate, self.activation)

    plugin.register()
    saved = RlnormRMSNormGated._rlnorm
    RlnormRMSNormGated._rlnorm = wrong_eps
    try:
        x, z, w = rows()
        layer = build(eps=1e-5)
        with torch.no_grad():
            layer.weight.copy_(w)
        with torch.inference_mode():
            out = {"differing": differing(layer(x, z), expected(x, z, w, layer))}
    finally:
        RlnormRMSNormGated._rlnorm = saved
        plugin.unregister()
    return out


@scenario
def refused_at_construction() -> dict[str, Any]:
    plugin.register()
    out = {}
    for key, options in {"group_size": {"group_size": 5}, "activation": {"activation": "gelu"}}.items():
        try:
            build(**options)
            out[key] = None
        except ValueError as exc:
            out[key] = str(exc)
    plugin.unregister()
    return out


@scenario
def another_replacement_registered() -> dict[str, Any]:
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.layernorm import RMSNormGated

    class Theirs(RMSNormGated):
        pass

    op_registry_oot[plugin.IN_TREE] = Theirs
    try:
        plugin.register()
        message = None
    except RuntimeError as exc:
        message = str(exc)
    finally:
        del op_registry_oot[plugin.IN_TREE]
    return {"message": message}


@scenario
def stack_pairs_check() -> dict[str, Any]:
    """Qwen3-Next's layers through the stack pairs at width 32, rlnorm in both or in neither, and rlnorm's pair with
    a planted replacement that keeps rlnorm's default eps in a model whose eps is 1e-5."""
    from rlnorm.integrations.vllm_layer import RlnormRMSNormGated
    from rlnorm.kit.checks.stack_pairs import QWEN3_NEXT_OPTIONS, pair_by_name, run_pair
    from rlnorm.options import OpOptions

    def pair(name: str, eps: float) -> dict[str, Any]:
        return run_pair(pair_by_name(name), d=D, rows=40, opts=OpOptions(eps=eps, **QWEN3_NEXT_OPTIONS))

    out = {f"{n}@{e:.0e}": pair(n, e) for n in ("rlnorm_patched", "stock_unpatched") for e in (1e-6, 1e-5)}

    def wrong_eps(self: Any, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return rms_norm_gated_op(x, z, self.weight, 1e-6, self.group_size, self.norm_before_gate, self.activation)

    saved = RlnormRMSNormGated._rlnorm
    RlnormRMSNormGated._rlnorm = wrong_eps
    try:
        out["planted"] = pair("rlnorm_patched", 1e-5)
    finally:
        RlnormRMSNormGated._rlnorm = saved
    return out | {"registered_after": plugin.is_registered()}


# -- the test process's side ----------------------------------------------------------------------------------
_FACTS: dict[str, Any] = {}


def facts(name: str) -> dict[str, Any]:
    """One scenario's facts, from the suite's one child run; skips (fails in CI) where vLLM is not installed."""
    import pytest
    from conftest import needs_installed_vllm  # the test process's: this side runs only under pytest

    from rlnorm.kit.process import child_env

    if not _FACTS:
        needs_installed_vllm("the vLLM plugin")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "facts.json"
            proc = subprocess.run(
                [sys.executable, __file__, str(out)],
                capture_output=True,
                text=True,
                timeout=900,
                env=child_env({"TRITON_INTERPRET": "1"}),
            )
            if not out.is_file():
                tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
                pytest.fail(f"the vLLM scenarios' process exited {proc.returncode} without its facts:\n{tail}")
            _FACTS.update(json.loads(out.read_text()))
    entry = _FACTS[name]
    assert "error" not in entry, entry.get("error")
    return entry["facts"]


def main(argv: list[str]) -> int:
    out: dict[str, Any] = {}
    for name, fn in SCENARIOS.items():
        try:
            out[name] = {"facts": fn()}
        except Exception:
            out[name] = {"error": traceback.format_exc()[-3000:]}
        finally:  # each scenario starts unregistered and with the switch unset, whatever the one before did
            if plugin.is_registered():
                plugin.unregister()
            os.environ.pop(plugin.ENV, None)
    Path(argv[0]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
