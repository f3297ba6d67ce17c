"""vLLM's `RMSNormGated.forward_native` as vLLM runs it: eager, compiled by Inductor, and under VLLM_BATCH_INVARIANT=1.

forward_native is one call, `forward_static(x, z, weight, eps, x.dtype, **options)` (fp32 PyTorch), run here from
vLLM's own file without importing vllm. With Inductor (a default deployment) vLLM disables custom ops, so
forward_native is traced into the model's graph; VLLM_BATCH_INVARIANT=1 changes only its aten::mean.dim.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rlnorm.kit.backends import BackendUnavailable, fresh_function
from rlnorm.kit.backends import stack_files as sf
from rlnorm.options import OpOptions

__all__ = ["COMPILE_ROWS", "VllmNativeBackend", "VllmNativeBatchInvariantBackend", "VllmNativeCompiledBackend"]
__all__ += ["native_call", "vllm_inductor_options"]

# The rows vLLM's profile run traces the graph at: offline max_num_batched_tokens on an H200 (16384) x
# Qwen3-Next-80B's 32 value heads over tensor parallel 2 (the norm sees one row per token and head).
COMPILE_ROWS = 16384 * 16


def native_call(
    forward_static: Callable[..., Tensor], x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions
) -> Tensor:
    """The call `RMSNormGated.forward_native(x, z)` makes, for a module with weight w built with opts."""
    kwargs = opts.as_dict()
    return forward_static(x, z, w, kwargs.pop("eps"), x.dtype, **kwargs)


def _torch_at_least(target: str) -> bool:
    from packaging.version import Version

    return Version(torch.__version__) >= Version(target)


def vllm_inductor_options(device_type: str) -> dict[str, Any]:
    """The Inductor options a default vLLM 0.30 config gives on `device_type` (CompilationConfig's post-init)."""
    opts: dict[str, Any] = {"enable_auto_functionalized_v2": False}
    if not _torch_at_least("2.12.0.dev"):
        debug = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG"
        opts.update(size_asserts=debug, alignment_asserts=debug, scalar_asserts=debug)
    if _torch_at_least("2.9.0.dev") and device_type != "cpu":
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


class VllmNativeCompiledBackend(_FromVllmFiles):
    """Compiled as vLLM compiles it: fullgraph, dynamic=False, once at the profile run's size with the rows dynamic,
    every guard dropped (compilation/wrapper.py), Inductor options `vllm_inductor_options`."""

    key = "vllm_native_compiled"
    compile_rows = COMPILE_ROWS
    what = (
        "RMSNormGated.forward_native compiled by Inductor as a default vLLM deployment runs it: fullgraph, rows "
        f"dynamic, compiled once at {compile_rows} rows, every guard dropped; alone, not fused with neighbours"
    )

    def __init__(self, files: str | Path | None = None) -> None:
        super().__init__(files)
        self._compiled: dict[tuple, Callable[..., Tensor]] = {}

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        d = x.shape[-1]
        # every guard is dropped, so nothing but this key may tell two graphs apart
        key = (opts, d, x.dtype, w.dtype, z is None, str(x.device))
        if key not in self._compiled:
            self._compiled[key] = self._compile(x, z, w, opts)
        x2 = x.reshape(-1, d).contiguous()
        z2 = None if z is None else z.reshape(-1, d).contiguous()
        return self._compiled[key](x2, z2, w.contiguous()).reshape(x.shape)

    def _compile(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Callable[..., Tensor]:
        forward_static = self.loaded()

        def op(x: Tensor, z: Tensor | None, w: Tensor) -> Tensor:
            return native_call(forward_static, x, z, w, opts)

        # every guard dropped, as vLLM's guard_filter_fn does: hence a fresh code object per closure (options)
        skip = getattr(torch.compiler, "skip_all_guards_unsafe", None) or (lambda entries: [False] * len(entries))
        options = {**vllm_inductor_options(x.device.type), "guard_filter_fn": skip}
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


@contextmanager
def _mean_override(mean: Callable[..., Tensor], dispatch_key: str) -> Iterator[None]:
    """aten::mean.dim -> `mean` on `dispatch_key` inside the block, as enable_batch_invariant_mode() registers it."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
            lib.impl("aten::mean.dim", mean, dispatch_key)
        yield
    finally:
        lib._destroy()


class VllmNativeBatchInvariantBackend(_FromVllmFiles):
    """Eager, with VLLM_BATCH_INVARIANT=1's aten::mean.dim override (forward_cuda's kernel makes no aten call)."""

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
        with _mean_override(self.mean, key):
            return native_call(forward_static, x, z, w, opts)
