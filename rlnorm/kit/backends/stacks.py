"""The gated norm as the RL stacks run it, from each stack's own files at a pinned version (docs/stacks.md).

SGLang, Megatron-core and TorchTitan cannot be installed beside the kit's torch, so each row executes the stack's files
with only the helpers named in `source` stood in, and calls them as the model's layer does (tests/kit/test_stacks.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlnorm.kit.backends import BackendUnavailable, describe_error, fresh_function
from rlnorm.kit.backends import stack_files as sf
from rlnorm.kit.backends.vllm import VllmBackend
from rlnorm.options import OpOptions

# -- SGLang 0.5.23 -----------------------------------------------------------------------------------------------
_SGL = "sglang.kernels.ops.attention.fla."


def _capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def _no_server_config() -> Any:
    raise ValueError("no server config is published here")


class _SglangRow(sf.ForwardOnlyRow):  # SGLang's autograd Functions define no backward
    pin = sf.PINS["sglang"]
    batch_invariant = False
    writes_input = False

    def _load(self) -> dict[str, types.ModuleType]:
        """SGLang's norm modules from its files; `batch_invariant`: --enable-deterministic-inference."""
        common = self.files.path("sglang/srt/utils/common.py")
        # device_context's own lines: on a host without a GPU it answers as SGLang's CPU engine (torch.device("cpu"))
        scope = {"torch": torch, "contextmanager": contextlib.contextmanager, "is_cpu": lambda: _capability() is None}
        utils = {name: sf.read_function(common, name, {}) for name in ("cdiv", "next_power_of_2")}
        utils["device_context"] = sf.read_function(common, "device_context", scope)
        arch = {
            "is_arch_support_pdl": lambda: (_capability() or (0, 0))[0] >= 9 and torch.version.hip is None,
            "get_jit_cuda_arch": lambda: types.SimpleNamespace(major=_capability()[0], minor=_capability()[1]),  # type: ignore[index]
        }
        stand_ins = {
            "sglang.srt.utils": {**utils, **dict.fromkeys(("is_cpu", "is_npu", "cpu_has_amx_support"), lambda: False)},
            "sglang.kernels.jit.utils": arch,
            "sglang.srt.batch_invariant_ops": {"is_batch_invariant_mode_enabled": lambda: self.batch_invariant},
            "sglang.srt.runtime_context": {"get_exec": _no_server_config},
        }
        norms = [_SGL.replace(".", "/") + f"{m}.py" for m in ("fused_norm_gate", "layernorm_gated")]
        loaded = sf.load(self.files, ["sglang/srt/model_executor/cuda_graph_config.py", *norms], stand_ins)
        lg = loaded[_SGL + "layernorm_gated"]
        # its torch.cuda query has no answer on a CPU: torch's threads, as vLLM's CPU platform
        if _capability() is None:
            lg._get_sm_count = functools.cache(lambda device: torch.get_num_threads())
        return {"fused_norm_gate": loaded[_SGL + "fused_norm_gate"], "layernorm_gated": lg}

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        mod = self._module(x.shape[-1], w, opts)
        mod.weight = nn.Parameter(w.detach(), requires_grad=False)  # our bits, no copy
        return mod(x.clone() if self.writes_input else x, z)


class SglangFusedNormGateBackend(_SglangRow):
    """Qwen3-Next's gated norm in SGLang: FLA's fused kernel with BT=32, num_warps=4 for D <= 512."""

    key = "sglang_fused_norm_gate"
    qwen_only = "FusedRMSNormGated"
    activations = ("silu", "sigmoid")
    writes_input = True  # y = x: layer_norm_gated_fwd stores the output over its input

    @property
    def what(self) -> str:  # type: ignore[override]
        return (
            "fused_norm_gate.py FusedRMSNormGated(D, eps, activation) as qwen3_next.py builds it, called as its GDN "
            f"layer calls it (self.norm(core_attn_out, z)); it writes over its input, so x goes in copied{sf.interp()}"
        )

    def _module(self, d: int, w: Tensor, opts: OpOptions) -> nn.Module:
        cls = self.loaded()["fused_norm_gate"].FusedRMSNormGated
        return cls(d, eps=opts.eps, activation=opts.activation, device=w.device, dtype=w.dtype)


class SglangLayernormGatedBackend(_SglangRow):
    """Qwen3.5's gated norm in SGLang: rows per program from the row count and the SM count."""

    key = "sglang_layernorm_gated"

    @property
    def what(self) -> str:  # type: ignore[override]
        mode = (
            "under --enable-deterministic-inference (is_batch_invariant_mode_enabled(): 4 rows per program)"
            if self.batch_invariant
            else "rows per program from calc_rows_per_block(M, device)"
            + ("" if torch.cuda.is_available() else ", whose _get_sm_count answers torch's thread count on a CPU")
        )
        built = "layernorm_gated.py RMSNorm(D, eps, group_size, norm_before_gate, activation) as qwen3_5.py builds it"
        return f"{built}, {mode}{sf.interp()}"

    def _module(self, d: int, w: Tensor, opts: OpOptions) -> nn.Module:
        return self.loaded()["layernorm_gated"].RMSNorm(d, **opts.as_dict(), device=w.device, dtype=w.dtype)


class SglangLayernormGatedDeterministicBackend(SglangLayernormGatedBackend):
    key = "sglang_layernorm_gated_deterministic"
    batch_invariant = True


# -- TorchTitan 0.3.0 --------------------------------------------------------------------------------------------
class TorchtitanBackend(sf.StackRow):
    """TorchTitan's trainer's and generator's norm: PyTorch, rounded to x's dtype before the gate (two roundings)."""

    key = "torchtitan"
    pin = sf.PINS["torchtitan"]
    qwen_only = "TorchTitan's RMSNormGated"
    what = "models/qwen3_5/model.py RMSNormGated.forward(x, gate), eager, with its weight and Config.eps"

    def _load(self) -> Callable[..., Tensor]:
        path = self.files.path("torchtitan/models/qwen3_5/model.py")  # type: ignore[union-attr]
        return sf.read_function(path, "RMSNormGated.forward", {"torch": torch, "F": F})

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return self.loaded()(types.SimpleNamespace(eps=opts.eps, weight=w), x, z)


# -- Megatron-core 0.19.2 ----------------------------------------------------------------------------------------
_GDN = "megatron/core/ssm/gated_delta_net/common.py"
_BIK = "megatron/core/transformer/custom_layers/batch_invariant_kernels.py"


def zero_centred(w: Tensor) -> Tensor:
    """The weight Megatron holds with layernorm_zero_centered_gamma: Megatron-Bridge loads it minus one."""
    return (w.float() - 1.0).to(w.dtype)


class _MegatronRow(sf.StackRow):
    """Megatron's GDN `_apply_gated_norm`: out_norm(x) (the zero-centred weight) * silu(gate.float()), jit-fused."""

    pin = sf.PINS["megatron-core"]
    qwen_only = "Megatron's _apply_gated_norm (Qwen3-Next: act_fn = F.silu)"
    jit_fuser: Callable[..., Any] = staticmethod(torch.compile)  # what megatron/core/jit.py sets for torch >= 2.2

    def _load(self) -> Any:
        path = self.files.path(_GDN)  # type: ignore[union-attr]
        return sf.read_function(path, "_GDNBase._apply_gated_norm", {"jit_fuser": self.jit_fuser})

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        layer = types.SimpleNamespace(out_norm=self.out_norm(w, opts), act_fn=F.silu)
        return self.loaded()(layer, x, z).reshape(x.shape)


class MegatronGdnBackend(_MegatronRow):
    key = "megatron_gdn"
    what = (
        "ssm/gated_delta_net/common.py _GDNBase._apply_gated_norm under jit_fuser (torch.compile), "
        "out_norm = Transformer Engine's RMSNorm(zero_centered_gamma=True) holding the weight minus one"
    )

    def _import_reason(self) -> str | None:
        try:
            import transformer_engine.pytorch  # noqa: F401
        except Exception as exc:
            return f"needs Transformer Engine: {describe_error(exc)}"[:160]
        return super()._import_reason()

    def out_norm(self, w: Tensor, opts: OpOptions) -> Callable[[Tensor], Tensor]:
        import transformer_engine.pytorch as te

        norm = te.RMSNorm(w.shape[0], eps=opts.eps, zero_centered_gamma=True, params_dtype=w.dtype, device=w.device)
        # the norm called with the held weight as its parameter, in the graph so that dweight reaches the row's w
        return functools.partial(torch.func.functional_call, norm, {"weight": zero_centred(w)})


class MegatronGdnBatchInvariantBackend(_MegatronRow):
    key = "megatron_gdn_batch_invariant"
    what = (
        "ssm/gated_delta_net/common.py _GDNBase._apply_gated_norm under jit_fuser (torch.compile), with TE's "
        "RMSNorm.forward patched by batch-invariant mode (batch_invariant_kernels.py _te_rmsnorm_forward_patched "
        "-> BatchInvariantRMSNormFn, whose forward uses the stored weight, not weight + 1: zero_centered_gamma "
        "is ignored); needs no TE"
    )

    def _load(self) -> Any:
        self.bik = sf.load_file(self.files, _BIK)  # type: ignore[arg-type]
        return super()._load()

    def out_norm(self, w: Tensor, opts: OpOptions) -> Callable[[Tensor], Tensor]:
        self.loaded()  # TE's RMSNorm as batch-invariant mode leaves it: its forward is _te_rmsnorm_forward_patched
        te_norm = types.SimpleNamespace(weight=zero_centred(w), eps=opts.eps, zero_centered_gamma=True)
        return functools.partial(self.bik._te_rmsnorm_forward_patched, te_norm)


# -- vLLM 0.30.0 forward_native --------------------------------------------------------------------------------------
# Inductor traces forward_native into the model's graph: a default deployment disables custom ops (docs/vllm.md).
# The rows vLLM's profile run traces the graph at: offline max_num_batched_tokens on an H200 (16384) x
# Qwen3-Next-80B's 32 value heads over tensor parallel 2 (the norm sees one row per token and head).
COMPILE_ROWS = 16384 * 16


def native_call(
    forward_static: Callable[..., Tensor], x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions
) -> Tensor:
    """The call `RMSNormGated.forward_native(x, z)` makes, for a module with weight w built with opts."""
    kwargs = opts.as_dict()
    return forward_static(x, z, w, kwargs.pop("eps"), x.dtype, **kwargs)


def vllm_inductor_options(device_type: str) -> dict[str, Any]:
    """The Inductor options a default vLLM 0.30 config gives on `device_type` (CompilationConfig's post-init)."""
    from packaging.version import Version

    opts: dict[str, Any] = {"enable_auto_functionalized_v2": False}
    if Version(torch.__version__) < Version("2.12.0.dev"):
        debug = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG"
        opts.update(size_asserts=debug, alignment_asserts=debug, scalar_asserts=debug)
    if device_type != "cpu":  # from torch 2.9 on (the kit's torch is 2.11 or later)
        opts.update(combo_kernels=True, benchmark_combo_kernel=True)
    return opts


class _FromVllmFiles(sf.ForwardOnlyRow):
    """vLLM's forward_static from its own file."""

    pin = sf.PINS["vllm"]

    def describe(self, where: str) -> str:
        return f"vLLM {self.pin.version} {self.what}; forward_static read from {where}, vllm not imported"

    def _load(self) -> Callable[..., Tensor]:
        path = self.files.path(sf.LAYERNORM)  # type: ignore[union-attr]
        return sf.read_function(path, "RMSNormGated.forward_static", {"torch": torch, "F": F})

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return native_call(self.loaded(), x, z, w, opts)


class VllmNativeBackend(_FromVllmFiles):
    key = "vllm_native"
    what = "RMSNormGated.forward_native, eager (fp32 PyTorch, one rounding)"


class VllmNativeCompiledBackend(_FromVllmFiles):  # vLLM's compilation/wrapper.py, with `vllm_inductor_options`
    key = "vllm_native_compiled"
    compile_rows = COMPILE_ROWS
    what = (
        "RMSNormGated.forward_native compiled by Inductor as a default vLLM deployment runs it: fullgraph, rows "
        f"dynamic, compiled once at {compile_rows} rows, every guard dropped; alone, not fused with neighbours"
    )

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        d = x.shape[-1]
        # every guard is dropped, so nothing but this key may tell two graphs apart
        key = (opts, d, x.dtype, w.dtype, z is None, str(x.device))
        compiled = self._memo(key, lambda: self._compile(x, z, w, opts))
        x2 = x.reshape(-1, d).contiguous()
        z2 = None if z is None else z.reshape(-1, d).contiguous()
        return compiled(x2, z2, w.contiguous()).reshape(x.shape)

    def _compile(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Callable[..., Tensor]:
        forward_static = self.loaded()

        def op(x: Tensor, z: Tensor | None, w: Tensor) -> Tensor:
            return native_call(forward_static, x, z, w, opts)

        # every guard dropped, as vLLM's guard_filter_fn does: hence a fresh code object per closure (options)
        options = {**vllm_inductor_options(x.device.type), "guard_filter_fn": torch.compiler.skip_all_guards_unsafe}
        fn = torch.compile(fresh_function(op), fullgraph=True, dynamic=False, backend="inductor", options=options)
        # the one compile, at the profile run's size, with the row dimension dynamic (backed), as vLLM marks it
        gen = torch.Generator().manual_seed(0)
        shape = (self.compile_rows, x.shape[-1])
        xh, zh = (None if t is None else torch.randn(shape, generator=gen).to(t) for t in (x, z))
        for t in (xh, zh):
            if t is not None:
                torch._dynamo.mark_dynamic(t, 0)
        fn(xh, zh, w.contiguous())
        return fn


class VllmNativeBatchInvariantBackend(_FromVllmFiles):  # forward_cuda's kernel makes no aten call to override
    key = "vllm_native_batch_invariant"

    @property
    def what(self) -> str:  # type: ignore[override]
        key = "CUDA" if torch.cuda.is_available() else "CPU (vLLM registers it on CUDA only)"
        return (  # the refusal: vLLM 0.30.0 vllm/v1/attention/selector.py:235-238, 0.33.0 :245-248 (docs/vllm.md)
            "RMSNormGated.forward_native, eager, under VLLM_BATCH_INVARIANT=1: aten::mean.dim -> vLLM's Triton "
            f"mean_batch_invariant, registered on {key}; unreachable for Qwen3-Next: vLLM refuses "
            "VLLM_BATCH_INVARIANT=1 for its GDN_ATTN layers (v1/attention/selector.py: 'VLLM batch_invariant mode is "
            "not supported for GDN_ATTN')"
        )

    def _load(self) -> Callable[..., Tensor]:
        import triton
        import triton.language as tl

        path = self.files.path(sf.BATCH_INVARIANT)  # type: ignore[union-attr]
        scope: dict[str, Any] = {"torch": torch, "triton": triton, "tl": tl}
        for name in ("mean_kernel", "mean_dim", "mean_batch_invariant"):  # each reads the ones before
            scope[name] = sf.read_function(path, name, scope)
        self.mean = scope["mean_batch_invariant"]
        return super()._load()

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        key = {"cuda": "CUDA", "cpu": "CPU"}.get(x.device.type)
        if key is None:
            raise BackendUnavailable(f"{self.key}: no dispatch key for device {x.device} (expected cuda or cpu)")
        forward_static = self.loaded()
        # aten::mean.dim -> vLLM's mean for this call only, as enable_batch_invariant_mode() registers it
        lib = torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
                lib.impl("aten::mean.dim", self.mean, key)
            return native_call(forward_static, x, z, w, opts)
        finally:
            lib._destroy()


# -- vLLM 0.33.0, beside the installed 0.30.0: the vLLM rows on its pin ------------------------------------------
def _at_033(base: type, key: str, **attrs: Any) -> type:
    """`base`'s row on vLLM 0.33.0's pin."""
    name = base.__name__.replace("Backend", "033Backend")
    pin = sf.PINS["vllm-0.33.0"]
    return type(name, (base,), {"__module__": __name__, "__qualname__": name, "key": key, "pin": pin, **attrs})


# `vllm_033`: forward_cuda -> torch.ops.vllm.fla_rms_norm_gated -> layernorm_guard.rmsnorm_fn (layernorm.py:413-455)
Vllm033Backend = _at_033(VllmBackend, "vllm_033", imports=False)
VllmNative033Backend = _at_033(VllmNativeBackend, "vllm_native_033")
VllmNativeCompiled033Backend = _at_033(VllmNativeCompiledBackend, "vllm_native_compiled_033")
VllmNativeBatchInvariant033Backend = _at_033(VllmNativeBatchInvariantBackend, "vllm_native_batch_invariant_033")
