"""The one child process that imports the real vllm for tests/kit/test_vllm_files.py and test_vllm_native.py
(importing vLLM takes ~20 s and patches torch's compiler for the rest of a process, so the test process never does):
`facts(archive)` runs every section below once per pytest run and returns what each found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import CHILD_DESCRIBE, child_result

# Imports the real vllm as the backend does on this CPU machine (`describe`: conftest's CHILD_DESCRIBE). vLLM's CPU
# platform answers torch's thread count for the compute units its rows-per-program choice reads (and caches), so
# the child fixes that count at 2 before anything asks: the grids and tile sizes asserted below are then the same
# on every machine. Before the compute units are answered, forward_cuda must fail: that step of the set-up is needed.
_PRELUDE = r"""
import json, sys
import torch
torch.set_num_threads(2)
from rlnorm.inputs import make_case
from rlnorm.kit.backends import stack_files as sf
from rlnorm.kit.backends.vllm import (VllmBackend, answer_compute_units, build_module, load_layernorm_guard,
                                      prepare_import, rmsnorm_call)
from rlnorm.kit.backends.vllm_native import (VllmNativeBackend, VllmNativeBatchInvariantBackend,
                                             VllmNativeCompiledBackend, native_call, vllm_inductor_options)
from rlnorm.options import OpOptions
from rlnorm.reference import rms_norm_gated_reference

prepare_import("cpu")
import vllm.third_party.flash_linear_attention.ops.layernorm_guard as lg
from vllm.model_executor.layers.layernorm import RMSNormGated
found = {}
c = make_case(3, 128, seed=0)
try:
    found["unanswered"] = list(build_module(128, c.w, OpOptions()).forward_cuda(c.x, c.z).shape)
except Exception as exc:
    found["unanswered"] = f"{type(exc).__name__}: {exc}"
answer_compute_units()
assert torch.get_num_threads() == 2
OPTIONS = (OpOptions(), OpOptions(eps=1e-5, group_size=32, norm_before_gate=False, activation="sigmoid"))

def module(w, opts):
    mod = build_module(128, w, opts)
    mod.weight = torch.nn.Parameter(w, requires_grad=False)
    return mod
"""
_PRELUDE += CHILD_DESCRIBE

_BITS_SCRIPT = r"""
from vllm.third_party.flash_linear_attention.ops.layernorm_guard import rmsnorm_fn as installed_fn
real = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
archive = sys.argv[1]
PIN = sf.PINS["vllm"]
from_installed = load_layernorm_guard(sf.find(PIN, sf.installed(PIN))[0])
from_archive = load_layernorm_guard(sf.find(PIN, archive)[0])
restored = {k for k, v in real.items() if sys.modules.get(k) is not v} | {
    k for k in sys.modules if (k == "vllm" or k.startswith("vllm.")) and k not in real
}
backend = VllmBackend(files=archive)
out = {"restored": sorted(restored), "files": [from_installed.__file__, from_archive.__file__],
       "distinct": from_installed is not lg and from_archive is not lg, "cases": []}
for rows in (1, 3, 6, 9, 64):  # with 2 compute units: 1, 2 and 4 rows per program
    for opts in (OpOptions(), OpOptions(eps=1e-5, group_size=32, norm_before_gate=False, activation="sigmoid")):
        for wdt in (torch.bfloat16, torch.float32):
            c = make_case(rows, 128, seed=rows, weight_dtype=wdt)
            ys = [rmsnorm_call(fn, c.x, c.z, c.w, opts) for fn in
                  (installed_fn, from_installed.rmsnorm_fn, from_archive.rmsnorm_fn)]
            ys.append(backend.forward(c.x, c.z, c.w, opts))
            out["cases"].append({"rows": rows, "equal": [bool(torch.equal(ys[0], y)) for y in ys[1:]]})
x3 = make_case(12, 128, seed=5).x.reshape(3, 4, 128)  # rmsnorm_fn flattens leading dimensions
out["3d"] = bool(torch.equal(rmsnorm_call(installed_fn, x3, None, torch.ones(128), OpOptions()),
                             rmsnorm_call(from_archive.rmsnorm_fn, x3, None, torch.ones(128), OpOptions())))
found["bits"] = out
"""


_GDN_SCRIPT = r"""
import types

gdn_file = sf.find(PIN, sf.installed(PIN))[0].path("vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py")
# the GDN module needs packages the CPU install leaves out; its method is read from its own lines instead
fused = sf.read_function(gdn_file, "QwenGatedDeltaNetAttention._rms_norm_gated_cuda", {})
launches = []
real_kernel = lg.LayerNormFwdKernel.kernel

class Recorder:
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            launches.append({"grid": list(grid), "args": args, "kwargs": kwargs})
            return real_kernel[grid](*args, **kwargs)
        return launch

lg.LayerNormFwdKernel.kernel = staticmethod(Recorder())

def shape_only(launch):  # tensors by shape, strides and dtype: where they live is compared apart
    d = describe([launch["grid"], list(launch["args"]), launch["kwargs"]])
    def strip(v):
        if isinstance(v, list) and v[:1] == ["tensor"]:
            return v[2:]
        if isinstance(v, list):
            return [strip(e) for e in v]
        if isinstance(v, dict):
            return {k: strip(e) for k, e in v.items()}
        return v
    return strip(d)

out = []
tokens, heads, d = 5, 4, 128
for act in ("silu", "sigmoid"):
    opts = OpOptions(eps=1e-6, activation=act)
    g = torch.Generator().manual_seed(7)
    core = (2 * torch.randn(tokens, heads, d, generator=g)).to(torch.bfloat16)
    # the gate as _forward_core_fused_norm_packed makes it: the z columns of the projection, split off and viewed
    mixed = torch.randn(tokens, 3 * heads * d, generator=g).to(torch.bfloat16)
    gate = mixed[:, 2 * heads * d :].reshape(tokens, -1, d)
    w = (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16)
    mod = build_module(d, w, opts)
    mod.weight = torch.nn.Parameter(w, requires_grad=False)
    launches.clear()
    y = mod.forward_cuda(core.reshape(-1, d), gate.reshape(-1, d))  # _output_projection's call
    cuda_launch = launches[-1]
    in_place = core.clone()
    launches.clear()
    fused(types.SimpleNamespace(norm=mod), in_place, gate, in_place)  # _forward_core_fused_norm's call
    fused_launch = launches[-1]
    out.append({
        "launches": [len(launches)],
        "same_launch": shape_only(cuda_launch) == shape_only(fused_launch),
        "cuda_launch": shape_only(cuda_launch),
        "fused_y_is_x": fused_launch["args"][1].data_ptr() == fused_launch["args"][0].data_ptr(),
        "cuda_y_is_x": cuda_launch["args"][1].data_ptr() == cuda_launch["args"][0].data_ptr(),
        "same_weight": fused_launch["args"][2].data_ptr() == cuda_launch["args"][2].data_ptr(),
        "bitwise": bool(torch.equal(y.reshape(tokens, heads, d), in_place)),
    })
found["gdn"] = out
"""


_MAPPING_SCRIPT = r"""
out = []  # forward_native reads the attributes forward_cuda hands its kernel
for gs in (None, 32):
    for nbg in (True, False):
        for act in ("silu", "sigmoid"):
            for wdt in (torch.bfloat16, torch.float32):
                opts = OpOptions(eps=1e-5, group_size=gs, norm_before_gate=nbg, activation=act)
                c = make_case(7, 128, seed=3, weight_dtype=wdt)
                mod = build_module(128, c.w, opts)
                mod.weight = torch.nn.Parameter(c.w.detach(), requires_grad=False)
                y, ref = mod.forward_native(c.x, c.z).float(), rms_norm_gated_reference(c.x, c.z, c.w, opts).float()
                out.append({
                    "opts": [gs, nbg, act, str(wdt)],
                    "attrs": [mod.eps, mod.group_size, mod.norm_before_gate, mod.activation, str(mod.weight.dtype),
                              mod.bias],
                    "max_rel": ((y - ref).abs() / ref.abs().clamp_min(1e-3)).max().item(),
                    "bitwise": bool(torch.equal(y, ref)),
                    "same_weight": mod.weight.data_ptr() == c.w.data_ptr(),
                })
found["mapping"] = out
"""


_NATIVE_BITS_SCRIPT = r"""
eager, compiled = VllmNativeBackend(), VllmNativeCompiledBackend()
compiled.compile_rows = 64
out = []
for opts in OPTIONS:
    for wdt in (torch.bfloat16, torch.float32):
        for gated in (True, False):
            c = make_case(9, 128, seed=4, weight_dtype=wdt)
            z = c.z if gated else None
            y = module(c.w, opts).forward_native(c.x, z)
            e = eager.forward(c.x, z, c.w, opts)
            k = compiled.forward(c.x, z, c.w, opts)
            out.append({"eager": bool(torch.equal(y, e)), "compiled_ulps": int((y.view(torch.int16).int()
                        - k.view(torch.int16).int()).abs().max()) if y.dtype == torch.bfloat16 else None})
found["native_bits"] = out
"""


_DISPATCH_SCRIPT = r"""
import inspect
from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.config.compilation import CompilationMode
from vllm.platforms import current_platform

out = {}
for name, mode in (("default", None), ("compiled", CompilationMode.VLLM_COMPILE), ("none", CompilationMode.NONE)):
    cc = CompilationConfig() if mode is None else CompilationConfig(mode=mode)
    cfg = VllmConfig(device_config=DeviceConfig(device="cpu"), compilation_config=cc)
    with set_current_vllm_config(cfg):
        mod = RMSNormGated(128, eps=1e-6, norm_before_gate=True)
    out[name] = {"mode": int(cfg.compilation_config.mode), "custom_ops": list(cfg.compilation_config.custom_ops),
                 "backend": cfg.compilation_config.backend, "forward": mod._forward_method.__name__,
                 "inductor": cfg.compilation_config.inductor_compile_config}
out["ours_gpu"] = vllm_inductor_options("cuda")
is_cpu, current_platform.is_cpu = current_platform.is_cpu, lambda: True  # the options vLLM's CPU platform gets
out["cpu_platform"] = CompilationConfig(mode=CompilationMode.VLLM_COMPILE).inductor_compile_config
current_platform.is_cpu = is_cpu
out["ours_cpu"] = vllm_inductor_options("cpu")
post_init = inspect.getsource(VllmConfig.__post_init__)
out["enforce_eager_sets_none"] = (
    "if self.model_config is not None and self.model_config.enforce_eager:" in post_init
    and "self.compilation_config.mode = CompilationMode.NONE" in post_init
)
found["dispatch"] = out
"""


_BATCH_INVARIANT_SCRIPT = r"""
import inspect, os
os.environ["VLLM_BATCH_INVARIANT"] = "1"
import vllm.model_executor.determinism.batch_invariant as bi
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.third_party.flash_linear_attention.ops import layernorm_guard

c = make_case(9, 128, seed=6)
mod = module(c.w, OpOptions())
before = {"cuda": mod.forward_cuda(c.x, c.z), "native": mod.forward_native(c.x, c.z)}
compiled = VllmNativeCompiledBackend()
compiled.compile_rows = 64
before["compiled"] = compiled.forward(c.x, c.z, c.w, OpOptions())
row = VllmNativeBatchInvariantBackend().forward(c.x, c.z, c.w, OpOptions())  # our override only, then removed
x32 = make_case(9, 128, seed=6, dtype=torch.float32).x
mean_before = x32.pow(2).mean(-1, keepdim=True)

calls = []
real_mean = bi.mean_batch_invariant
def counting(*args, **kwargs):
    calls.append(1)
    return real_mean(*args, **kwargs)
bi.mean_batch_invariant = counting
bi.enable_batch_invariant_mode()  # vLLM's own: registers its overrides on this platform's key (CPU here)

out = {}
n = len(calls); y = mod.forward_native(c.x, c.z); out["native_calls"] = len(calls) - n
out["native_is_the_row"] = bool(torch.equal(y, row))
n = len(calls); y = mod.forward_cuda(c.x, c.z); out["cuda_calls"] = len(calls) - n
out["cuda_unchanged"] = bool(torch.equal(y, before["cuda"]))
fresh = VllmNativeCompiledBackend()
fresh.compile_rows = 64
n = len(calls); y = fresh.forward(c.x, c.z, c.w, OpOptions()); out["compiled_calls"] = len(calls) - n
out["compiled_unchanged"] = bool(torch.equal(y, before["compiled"]))
out["mean_differs_in_fp32"] = not torch.equal(x32.pow(2).mean(-1, keepdim=True), mean_before)
out["reads_flag"] = {
    "RMSNormGated": "VLLM_BATCH_INVARIANT" in inspect.getsource(RMSNormGated),
    "layernorm_guard": "VLLM_BATCH_INVARIANT" in inspect.getsource(layernorm_guard),
    "RMSNorm.forward_cuda": "VLLM_BATCH_INVARIANT" in inspect.getsource(RMSNorm.forward_cuda),
}
found["batch_invariant"] = out
"""


_FOUND: dict[str, Any] = {}


def facts(archive: Path) -> dict[str, Any]:
    """Every section's findings; the call recorders restore what they replace, and batch-invariant mode, which stays
    on, goes last."""
    if not _FOUND:
        sections = [_BITS_SCRIPT, _GDN_SCRIPT, _MAPPING_SCRIPT, _NATIVE_BITS_SCRIPT, _DISPATCH_SCRIPT,
                    _BATCH_INVARIANT_SCRIPT]  # fmt: skip
        script = _PRELUDE + "".join(sections) + 'print("RESULT " + json.dumps(found))'
        _FOUND.update(child_result(script, str(archive)))
    return _FOUND
