"""Backends: one small interface in front of every implementation the kit checks (docs/spec.md §6).

Built-in keys resolve lazily, so a missing or broken peer makes only its own backend unavailable.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import itertools
import types
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from rlnorm import __version__
from rlnorm.inputs import make_case
from rlnorm.kit.backends.pins import (
    Setting,
    autotuner,
    autotuner_settings,
    config_words,
    kernel_name,
    patched,
    pin_first_configs,
)
from rlnorm.numerics import exact_sum
from rlnorm.options import OpOptions
from rlnorm.reference import rms_norm_gated_reference
from rlnorm.timing import describe_error

_CODE_IDS = itertools.count()


class BackendUnavailable(RuntimeError):
    """A backend cannot do what was asked here (no backward, no device, unsupported option)."""


@dataclass
class Grads:
    """Forward output and the gradients the backend's OWN autograd gives for one upstream dy (dw in w's dtype)."""

    y: Tensor
    dx: Tensor
    dz: Tensor | None
    dw: Tensor | None


def dist_version(dist: str) -> str:
    """The installed version of `dist`, read without importing it; "?" when not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def fresh_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with a code object of its own: dynamo keeps compiled graphs per code object, so graphs compiled for one
    closure (options, mode) never serve another's calls, even where every guard is dropped."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_CODE_IDS)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def device_reason(device: str) -> str | None:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        return f"device {device!r} is not a torch device ({describe_error(exc)})"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False)"
    return None


class Backend:
    """The interface every check talks to (docs/design.md): override `_fn` (both calls derive from it, dweight from
    the backend's own autograd) or `forward` / `forward_backward`."""

    key: str = ""
    source: str = ""
    has_backward: bool = True
    requires: str = ""  # the module the backend's code lives in: a failed import makes it unavailable, with why
    # set (to its name, for refusals) where the implementation has Qwen3-Next's options only: whole rows, the norm
    # first, `activations`, and always a gate z (no ungated path); `_check` refuses the rest before every call
    qwen_only = ""
    activations: tuple[str, ...] = ("silu",)

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} defines neither _fn nor forward")

    def _import_reason(self) -> str | None:
        if self.requires:
            try:
                importlib.import_module(self.requires)
            except Exception as exc:
                return f"cannot import {self.requires}: {describe_error(exc)}"
        return None

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        if not (who := self.qwen_only):
            return True, ""
        if opts.group_size is not None:
            return False, f"{who} has no group_size (it normalises the whole row)"
        if not opts.norm_before_gate:
            return False, f"{who} only norms before the gate (norm_before_gate=True)"
        if opts.activation not in self.activations:
            return False, f"{who} has no activation {opts.activation} (only {', '.join(self.activations)})"
        return True, ""

    def _check(self, z: Tensor | None, opts: OpOptions) -> None:
        ok, why = self.supports(opts)
        if not ok:
            raise BackendUnavailable(f"{self.key}: {why}")
        if self.qwen_only and z is None:
            raise BackendUnavailable(f"{self.key}: needs a gate z (the implementation has no ungated path)")

    def available(self, device: str) -> tuple[bool, str]:
        """(True, "") if a tiny run works on `device`, else (False, reason). Never raises; cached."""
        device = str(device)
        cache: dict[str, tuple[bool, str]] = self.__dict__.setdefault("_available_cache", {})
        if device not in cache:
            try:
                cache[device] = self._probe(device)
            except (Exception, SystemExit) as exc:  # a probe must never take the run down
                cache[device] = (False, f"probe failed: {describe_error(exc)}")
        return cache[device]

    def _probe(self, device: str) -> tuple[bool, str]:
        reason = device_reason(device) or self._import_reason()
        if reason:
            return False, reason
        ok, why = self.supports(OpOptions())
        if not ok:  # which options it does support is not knowable generically
            return False, f"does not support the default options: {why}"
        case = make_case(3, 128, seed=0, device=device)  # small: an interpreted Triton kernel answers fast
        try:
            if self.has_backward:
                y = self.forward_backward(case.x, case.z, case.w, case.dy, OpOptions()).y
            else:
                y = self.forward(case.x, case.z, case.w, OpOptions())
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as exc:
            return False, f"probe run on {device} failed: {describe_error(exc)}"
        if tuple(y.shape) != tuple(case.x.shape):
            return False, f"probe output has shape {tuple(y.shape)}, expected {tuple(case.x.shape)}"
        return True, ""

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        """Each value of every launch parameter its kernels pick by row count or autotuner, with a pin forcing it
        (the `configurations` check); none by default: one launch configuration at every size."""
        return []

    def device_lost(self, device: str) -> str | None:
        """The device's error when this process's device context no longer works, else None. Asked of the device,
        never read off an error's text: an out-of-memory mentions CUDA and leaves the context usable."""
        if torch.device(device).type != "cuda":
            return None
        try:
            torch.cuda.synchronize(device)
            torch.ones(1, device=device).add_(1)  # a tiny allocation and launch: a lost context refuses both
            torch.cuda.synchronize(device)
        except Exception as exc:  # a sticky error: every later launch in this process fails with it
            return describe_error(exc)
        return None

    def _untimed(self, x: Tensor) -> contextlib.AbstractContextManager[Any]:
        """Entered around each call and its backward: where autotuners cannot time, a backend pins them here."""
        return contextlib.nullcontext()

    def _memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """`make()` once per key for this backend: its compiled graphs, built modules and probes."""
        made: dict[Hashable, Any] = self.__dict__.setdefault("_made", {})
        if key not in made:
            made[key] = make()
        return made[key]

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        self._check(z, opts)
        with torch.no_grad(), self._untimed(x):
            return self._fn(x, z, w, opts)

    def forward_backward(self, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
        if not self.has_backward:
            raise BackendUnavailable(f"{self.key}: no backward")
        self._check(z, opts)
        # detach(): fresh leaves sharing storage (no copy inside a timed run), the caller's tensors untouched
        xl = x.detach().requires_grad_(True)
        zl = None if z is None else z.detach().requires_grad_(True)
        wl = w.detach().requires_grad_(True)
        with torch.enable_grad(), self._untimed(x):
            y = self._fn(xl, zl, wl, opts)
            if not y.requires_grad:
                raise BackendUnavailable(f"{self.key}: output has no autograd graph (no backward)")
            leaves = [t for t in (xl, zl, wl) if t is not None]
            grads = torch.autograd.grad(y, leaves, grad_outputs=dy, allow_unused=True)
        if grads[0] is None:
            raise BackendUnavailable(f"{self.key}: autograd gave no dx")
        dw = None if grads[-1] is None else grads[-1].to(w.dtype)
        return Grads(y=y.detach(), dx=grads[0], dz=grads[1] if zl is not None else None, dw=dw)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} key={self.key!r} source={self.source!r}>"


class UnavailableBackend(Backend):
    """A built-in backend whose module failed to import: reports why, runs nothing."""

    has_backward = False

    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason, self.source = key, reason, key

    def available(self, device: str) -> tuple[bool, str]:
        return False, self.reason

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        raise BackendUnavailable(f"{self.key}: {self.reason}")


class FunctionBackend(Backend):
    """A user's plain differentiable function f(x, z, w, *, eps, group_size, norm_before_gate, activation)."""

    def __init__(self, fn: Callable[..., Tensor], key: str) -> None:
        self.fn, self.key = fn, key
        self.source = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return self.fn(x, z, w, **opts.as_dict())


# key -> "module:attr", resolved on first use. The stacks' rows run each stack's own files at a pin (docs/stacks.md)
_K, _S = "rlnorm.kit.backends", "rlnorm.kit.backends.stacks:"
REGISTRY: dict[str, str] = {
    "rlnorm": f"{_K}:RlnormBackend",
    "reference": f"{_K}:ReferenceBackend",
    "transformers": f"{_K}:TransformersBackend",
    "fla_layernorm_gated": f"{_K}:FlaLayernormGatedBackend",
    "fla_fused_norm_gate": f"{_K}:FlaFusedNormGateBackend",
    "vllm": f"{_K}.vllm:VllmBackend",
    "vllm_native": _S + "VllmNativeBackend",
    "vllm_native_compiled": _S + "VllmNativeCompiledBackend",
    "vllm_native_batch_invariant": _S + "VllmNativeBatchInvariantBackend",
    "torch_compile": f"{_K}:TorchCompileBackend",
    "sglang_fused_norm_gate": _S + "SglangFusedNormGateBackend",
    "sglang_layernorm_gated": _S + "SglangLayernormGatedBackend",
    "sglang_layernorm_gated_deterministic": _S + "SglangLayernormGatedDeterministicBackend",
    "torchtitan": _S + "TorchtitanBackend",
    "megatron_gdn": _S + "MegatronGdnBackend",
    "megatron_gdn_batch_invariant": _S + "MegatronGdnBatchInvariantBackend",
    "vllm_033": _S + "Vllm033Backend",
    "vllm_native_033": _S + "VllmNative033Backend",
    "vllm_native_compiled_033": _S + "VllmNativeCompiled033Backend",
    "vllm_native_batch_invariant_033": _S + "VllmNativeBatchInvariant033Backend",
}


def _adapt(obj: object, spec: str) -> Backend:
    if isinstance(obj, type):
        if not issubclass(obj, Backend):
            raise ValueError(f"backend {spec!r}: {obj.__qualname__} is a class but not a rlnorm Backend subclass")
        try:
            inst = obj()
        except Exception as exc:
            raise ValueError(f"backend {spec!r}: {obj.__qualname__}() failed: {describe_error(exc)}") from exc
    elif isinstance(obj, Backend):
        inst = obj
    elif callable(obj):
        try:  # the call `_fn` makes; a builtin without a signature (ValueError) is trusted: the probe will tell
            inspect.signature(obj).bind(None, None, None, **OpOptions().as_dict())
        except ValueError:
            pass
        except TypeError as exc:
            raise ValueError(
                f"backend {spec!r}: a function backend must accept f(x, z, w, *, eps, group_size, "
                f"norm_before_gate, activation); {obj!r} does not ({exc})"
            ) from None
        return FunctionBackend(obj, key=spec)
    else:
        raise ValueError(
            f"backend {spec!r}: expected a Backend subclass, a Backend instance or a function "
            f"f(x, z, w, *, eps, group_size, norm_before_gate, activation), got {type(obj).__name__}"
        )
    if type(inst)._fn is Backend._fn and type(inst).forward is Backend.forward:
        raise ValueError(f"backend {spec!r}: {type(inst).__qualname__} defines neither _fn nor forward")
    if not inst.key:
        inst.key = spec
    # a property source (vLLM's) is decided when first read, not here
    if not isinstance(getattr(type(inst), "source", None), property) and not inst.source:
        inst.source = spec
    return inst


def _resolve_path(spec: str) -> object:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"backend {spec!r}: not a registered key {sorted(REGISTRY)} and not 'package.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"backend {spec!r}: cannot import module {module_name!r}: {describe_error(exc)}") from exc
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise ValueError(f"backend {spec!r}: module {module_name!r} has no attribute {attr!r}") from None


def load_backend(spec: str | Backend) -> Backend:
    """A registered key (docs/spec.md §6) or `package.module:attr` -> Backend; ValueError naming spec if unfit."""
    if isinstance(spec, Backend):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"backend: expected a registered key {sorted(REGISTRY)} or 'package.module:attr', got {spec!r}"
        )
    spec = spec.strip()
    if spec in REGISTRY:  # a built-in that fails to import or construct is unavailable, with the reason
        try:  # each built-in's class names its own key
            return _adapt(_resolve_path(REGISTRY[spec]), spec)
        except ValueError as exc:
            return UnavailableBackend(spec, str(exc))
    return _adapt(_resolve_path(spec), spec)


def load_backends(keys: Iterable[str], custom: Iterable[str] = ()) -> list[Backend]:
    """Registered keys then custom import paths, each once, in order."""
    return [load_backend(spec) for spec in dict.fromkeys([*keys, *custom])]


# -- the backends of this repository and of torch itself ---------------------------------------------------------
class ReferenceBackend(Backend):
    """Eager PyTorch, fp32 math, one rounding at the end; dweight from torch autograd."""

    key = "reference"
    source = f"rlnorm.reference.rms_norm_gated_reference (eager torch {torch.__version__}, fp32 math)"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        return rms_norm_gated_reference(x, z, w, opts)


class ExactReferenceBackend(ReferenceBackend):
    """The reference with the docs/spec.md §2 dweight: exact sum of per-row fp32 contributions, rounded once. Not a
    registered key: the positive control that shows the order-free gate lines can pass (eager autograd's fp32 sum,
    `reference`, fails them), and the base the planted faults build on to break one guarantee each."""

    key = "rlnorm.kit.backends:ExactReferenceBackend"
    source = "rlnorm.reference (fp32 math, one rounding) + exact dweight (rlnorm.numerics.exact_sum)"

    def forward_backward(self, x: Tensor, z: Tensor | None, w: Tensor, dy: Tensor, opts: OpOptions) -> Grads:
        # the weight expanded to one fp32 row per row of x: autograd gives each row's contribution [rows, D], unsummed
        g = super().forward_backward(x, z, w.detach().to(torch.float32).expand(x.shape[0], -1).clone(), dy, opts)
        g.dw = self._reduce_dweight(g.dw, w.dtype).to(w.device)  # type: ignore[arg-type]
        return g

    def _reduce_dweight(self, contributions: Tensor, dtype: torch.dtype) -> Tensor:
        """Per-row contributions [rows, D] fp32 -> dweight [D]: exact here; the planted faults override it."""
        return exact_sum(contributions.detach().cpu(), dtype)


class RlnormBackend(Backend):
    """This project's Triton kernel, `rlnorm.rms_norm_gated`."""

    key = "rlnorm"
    requires = "rlnorm.kernel"
    source = f"rlnorm {__version__} rms_norm_gated (Triton {dist_version('triton')})"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from rlnorm import rms_norm_gated

        return rms_norm_gated(x, z, w, **opts.as_dict())

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        """The launchers' row-count choices, each forced through `plant` at every value they can pick at this width:
        the forward's BLOCK_R (one row per program in decode-sized launches), the backward's TILES (which fixes
        HOT_WIDTH) and STRIPES."""
        from rlnorm.kernel import _bwd, _dweight, _fwd
        from rlnorm.kernel.testing import plant

        cfg = _bwd.bwd_config(d, opts.group_size or d)
        cap = min(cfg["TILES"], _dweight.MAX_TILES_DEFERRED if cfg["COLD_MODE"] == 0 else _dweight.MAX_TILES)
        tiles = sorted({min(cap, 1 << k) for k in range(cap.bit_length() + 1)})
        stripes = [1 << k for k in range(_dweight.STRIPES.bit_length()) if 1 << k <= _dweight.STRIPES]
        kernel = kernel_name(_bwd._rms_norm_gated_bwd_kernel)
        finalize = kernel_name(_dweight._dweight_finalize_kernel)  # sums the backward's stripes: the same STRIPES
        out = [
            Setting(kernel, "TILES", str(t), lambda t=t: plant(bwd={"TILES": t}),
                    implies={f"{kernel}.HOT_WIDTH": str(_dweight.hot_width(t))})
            for t in tiles
        ]  # fmt: skip
        out += [
            Setting(kernel, "STRIPES", str(n), lambda n=n: plant(bwd={"STRIPES": n}),
                    implies={f"{finalize}.STRIPES": str(n)})
            for n in stripes
        ]  # fmt: skip
        forward = kernel_name(_fwd._rms_norm_gated_fwd_kernel)
        # a GPU's choices, on any device (the interpreter keeps the wide tile: the same bits, fewer programs)
        sizes = (1, _fwd.decode_rows(opts.group_size or d) + 1)
        block_rs = {_fwd.fwd_config(opts.group_size or d, torch.bfloat16, n, serial=False)[0] for n in sizes}
        if len(block_rs) > 1:  # widths past 256 columns keep one shape
            out += [Setting(forward, "BLOCK_R", str(b), lambda b=b: plant(fwd={"BLOCK_R": b})) for b in block_rs]
        return out


class TorchCompileBackend(Backend):
    """`torch.compile` of the reference: the first thing a user would try. Backward is AOT-autograd's."""

    key = "torch_compile"
    source = f"torch {torch.__version__} torch.compile(rlnorm.reference.rms_norm_gated_reference)"
    GRAPH = "torch.compile(rlnorm.reference.rms_norm_gated_reference)"  # the `configurations` check's kernel

    # torch.compile's `dynamic`: None as a user calls it (static shapes, then a dynamic graph once the row count
    # changes); True / False forced by the `configurations` check
    _dynamic: bool | None = None

    @contextlib.contextmanager
    def _forced(self, dynamic: bool) -> Iterator[None]:
        # one static graph per row count: past the default recompile limit it would fall back to eager
        with patched(self, "_dynamic", dynamic), torch._dynamo.config.patch(recompile_limit=64):
            yield

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        # the graph a trainer gets (dynamic rows) against a CUDA-graph sampler's (one static row count each)
        static = "dynamic=False (one static graph per row count)"
        return [
            Setting(self.GRAPH, "graph", "dynamic=True", lambda: self._forced(True)),
            Setting(self.GRAPH, "graph", static, lambda: self._forced(False)),
        ]

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        # options are closed over, so each option set is its own graph (no guard on a dataclass)
        def op(x: Tensor, z: Tensor | None, w: Tensor) -> Tensor:
            return rms_norm_gated_reference(x, z, w, opts)

        compiled = self._memo((opts, self._dynamic), lambda: torch.compile(fresh_function(op), dynamic=self._dynamic))
        return compiled(x, z, w)


# -- the peers' own code, grads from their own autograd; options as their sources say (transformers 5.17, FLA 0.5.2)
class TransformersBackend(Backend):
    """`Qwen3NextRMSNormGated(D, eps)` holding w through `functional_call`. It rounds the normalised x before the
    weight multiply (correctly rounded on only ~65% of elements) and hard-codes silu."""

    key = "transformers"
    requires = "transformers.models.qwen3_next.modeling_qwen3_next"
    qwen_only = "Qwen3NextRMSNormGated"
    source = f"transformers {dist_version('transformers')} Qwen3NextRMSNormGated"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

        d, device = x.shape[-1], x.device
        mod = self._memo((d, opts.eps, str(device)), lambda: Qwen3NextRMSNormGated(d, eps=opts.eps).to(device))
        return torch.func.functional_call(mod, {"weight": w}, (x, z))


class FlaLayernormGatedBackend(Backend):
    """FLA `layernorm_gated.rmsnorm_fn`: one program per (row, group); silu only."""

    key = "fla_layernorm_gated"
    requires = "fla.modules.layernorm_gated"
    source = f"FLA {dist_version('fla-core')} layernorm_gated.rmsnorm_fn"

    def supports(self, opts: OpOptions) -> tuple[bool, str]:
        if opts.activation != "silu":
            return False, f"layernorm_gated hard-codes silu (z * sigmoid(z)), not {opts.activation}"
        return True, ""

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from fla.modules.layernorm_gated import rmsnorm_fn

        return rmsnorm_fn(
            x, w, None, z=z, eps=opts.eps, group_size=opts.group_size, norm_before_gate=opts.norm_before_gate
        )


class FlaFusedNormGateBackend(Backend):
    """FLA `fused_norm_gate.rms_norm_gated`: autotuned rows-per-program; norm before gate, no groups. Its autotuners
    need an active driver to time: on a CPU each runs its first config (the `configurations` check runs the others)."""

    key = "fla_fused_norm_gate"
    requires = "fla.modules.fused_norm_gate"
    source = f"FLA {dist_version('fla-core')} fused_norm_gate.rms_norm_gated"
    qwen_only = "fused_norm_gate"
    _ACTIVATION: ClassVar[dict[str, str]] = {"silu": "swish", "sigmoid": "sigmoid"}
    activations = tuple(_ACTIVATION)

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        from fla.modules.fused_norm_gate import rms_norm_gated

        return rms_norm_gated(x, z, w, None, activation=self._ACTIVATION[opts.activation], eps=opts.eps)

    @staticmethod
    def _autotuners(d: int | None = None) -> list[Any]:
        """The autotuned kernels a call of width d launches (all four without d)."""
        from fla.modules import fused_norm_gate as fng

        narrow = [fng.layer_norm_gated_fwd_kernel, fng.layer_norm_gated_bwd_kernel]
        wide = [fng.layer_norm_gated_fwd_kernel1, fng.layer_norm_gated_bwd_kernel1]
        # the launchers' split: one row per program past 512 columns (layer_norm_gated_fwd / _bwd)
        kernels = narrow + wide if d is None else narrow if d <= 512 else wide
        return [autotuner(k) for k in kernels]

    def _untimed(self, x: Tensor) -> contextlib.AbstractContextManager[Any]:
        return pin_first_configs(self._autotuners()) if x.device.type == "cpu" else contextlib.nullcontext()

    def configurations(self, opts: OpOptions, device: str, d: int) -> list[Setting]:
        """Every config of the forward's and the backward's autotuner (any may win the timing at a row count)."""
        tuners = self._autotuners(d)
        interp = torch.device(device).type == "cpu"
        out = autotuner_settings(tuners, distinct_kwargs_only=interp)
        if interp:
            why = "the Triton interpreter ignores num_warps and num_stages: only a GPU runs them"
            out += [Setting(kernel_name(at), "config", config_words(c), why=why)
                    for at in tuners for c in at.configs if c.num_warps != at.configs[0].num_warps]  # fmt: skip
        return out
