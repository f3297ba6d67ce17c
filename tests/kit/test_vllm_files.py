"""vLLM's own files, run without importing vllm, and its forward_native rows (eager, compiled,
VLLM_BATCH_INVARIANT=1): each row measures what vLLM runs.

Proven against the installed vLLM in ONE child process (vllm never enters this one):
- `RMSNormGated.forward_cuda` calls `layernorm_guard.rmsnorm_fn` with exactly `rmsnorm_call`'s arguments, and
  `forward_native` calls `forward_static` with exactly `native_call`'s; the constructor gets our options;
- `rmsnorm_fn` loaded from vLLM's files (installed, and packed by tools/vllm_sources.py) gives the installed
  module's bits, and a real `import vllm` in the same process is left as it was;
- the GDN layer's fused path (`_rms_norm_gated_cuda`: `layer_norm_fwd(..., out=...)`, in place) launches the same
  kernel with the same arguments as forward_cuda, and gives the same bits;
- a default (compiled) vLLM config disables the op, so its forward is forward_native; the mode enforce_eager sets
  keeps it enabled, so its forward is forward_cuda; the compiled row's Inductor options are the config's;
- vLLM's own `enable_batch_invariant_mode()` reroutes the eager forward_native's mean (and the row gives those bits),
  and leaves forward_cuda and the compiled forward_native as they were.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CHILD_DESCRIBE, child_result

from rlnorm.inputs import make_case
from rlnorm.kit.backends import BackendUnavailable, load_backend
from rlnorm.kit.backends import vllm_files as vf
from rlnorm.kit.backends.vllm import VllmBackend, rmsnorm_call, vllm_version
from rlnorm.kit.backends.vllm_native import (
    VllmNativeBackend,
    VllmNativeBatchInvariantBackend,
    VllmNativeCompiledBackend,
)
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions

TOOL = Path(__file__).resolve().parents[2] / "tools" / "vllm_sources.py"
ROWS = ("vllm_native", "vllm_native_compiled", "vllm_native_batch_invariant")
OPTIONS = (OpOptions(), OpOptions(eps=1e-5, group_size=32, norm_before_gate=False, activation="sigmoid"))


# Imports the real vllm as the backend does on this CPU machine (`describe`: conftest's CHILD_DESCRIBE). vLLM's CPU
# platform answers torch's thread count for the compute units its rows-per-program choice reads (and caches), so
# the child fixes that count at 2 before anything asks: the grids and tile sizes asserted below are then the same
# on every machine. Before the compute units are answered, forward_cuda must fail: that step of the set-up is needed.
_PRELUDE = r"""
import json, sys
import torch
torch.set_num_threads(2)
from rlnorm.inputs import make_case
from rlnorm.kit.backends import vllm_files as vf
from rlnorm.kit.backends.vllm import VllmBackend, answer_compute_units, build_module, prepare_import, rmsnorm_call
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

_CALL_SCRIPT = r"""
calls = []
real_fn = lg.rmsnorm_fn

def recorder(*args, **kwargs):
    calls.append(describe([list(args), kwargs]))
    return torch.zeros(1)

lg.rmsnorm_fn = recorder  # forward_cuda imports it from layernorm_guard when called
out = {"real": [], "planted": []}
for variant, results in out.items():
    for opts in (OpOptions(), OpOptions(eps=1e-5, group_size=32, norm_before_gate=False, activation="sigmoid")):
        for gated in (True, False):
            c = make_case(5, 128, seed=1)
            z = c.z if gated else None
            mod = build_module(128, c.w, opts)
            mod.weight = torch.nn.Parameter(c.w, requires_grad=False)  # what the backend does: our bits, no copy
            if variant == "planted":
                mod.norm_before_gate = not mod.norm_before_gate
            calls.clear()
            mod.forward_cuda(c.x, z)
            vllm_calls = list(calls)
            calls.clear()
            rmsnorm_call(recorder, c.x, z, c.w, opts)
            results.append({"vllm": vllm_calls, "ours": list(calls)})
found["calls"] = out
lg.rmsnorm_fn = real_fn  # the sections after this one run the real function
"""


@pytest.mark.slow
def test_forward_cuda_calls_rmsnorm_fn_with_exactly_these_arguments(vllm_child: dict) -> None:
    """RMSNormGated.forward_cuda(x, z) is rmsnorm_call(rmsnorm_fn, x, z, w, opts): the same function (the recorder
    put in its place is what forward_cuda calls), the same positional and keyword arguments, the same tensors. The
    planted variant (forward_cuda reading a flipped norm_before_gate) shows the comparison catches a difference."""
    out = vllm_child["calls"]
    for variant, results in out.items():
        assert len(results) == 4
        for r in results:
            assert len(r["vllm"]) == 1 and len(r["ours"]) == 1, r  # forward_cuda called rmsnorm_fn, once
            assert (r["vllm"] == r["ours"]) is (variant == "real"), r


_BITS_SCRIPT = r"""
from vllm.third_party.flash_linear_attention.ops.layernorm_guard import rmsnorm_fn as installed_fn
real = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
archive = sys.argv[1]
from_installed = vf.load_layernorm_guard(vf.find_files(vf.installed_root())[0])
from_archive = vf.load_layernorm_guard(vf.find_files(archive)[0])
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


@pytest.mark.slow
def test_vllms_files_give_the_installed_modules_bits(installed_vllm: vf.VllmFiles, vllm_child: dict) -> None:
    r = vllm_child["bits"]
    assert r["restored"] == []  # the real vllm modules are back, and none of ours is left
    assert r["distinct"]
    assert r["files"][0] == str(installed_vllm.path(vf.LAYERNORM_GUARD))
    assert r["files"][1].endswith(vf.LAYERNORM_GUARD) and "rlnorm-vllm-src-" in r["files"][1]
    assert len(r["cases"]) == 20
    for case in r["cases"]:
        assert case["equal"] == [True, True, True], case
    assert r["3d"]


_GDN_SCRIPT = r"""
import types

gdn_file = vf.find_files(vf.installed_root())[0].path("vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py")
# the GDN module needs packages the CPU install leaves out; its method is read from its own lines instead
fused = vf.read_function(gdn_file, "QwenGatedDeltaNetAttention._rms_norm_gated_cuda", {})
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


@pytest.mark.slow
def test_gdn_fused_path_is_forward_cudas_kernel_with_the_same_arguments(vllm_child: dict) -> None:
    """The GDN layer's fused path (vLLM's own `_rms_norm_gated_cuda`) and forward_cuda launch
    `layer_norm_fwd_kernel` with the same grid, scalars, constexprs and tensor shapes, strides and dtypes; only the
    output differs in where it lives (the fused path writes over its input), and the bits are the same."""
    results = vllm_child["gdn"]
    for r in results:
        assert r["launches"] == [1], r
        assert r["same_launch"], r
        assert r["fused_y_is_x"] and not r["cuda_y_is_x"], r
        assert r["same_weight"] and r["bitwise"], r
    grid, _, kwargs = results[0]["cuda_launch"]
    assert grid == [5, 1]  # 20 rows, 4 per program with 2 compute units
    assert kwargs["ROWS_PER_BLOCK"] == 4 and kwargs["IS_RMS_NORM"] is True and kwargs["NORM_BEFORE_GATE"] is True
    assert results[1]["cuda_launch"][2]["ACTIVATION"] == "sigmoid"


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
                    "attrs": [mod.eps, mod.group_size, mod.norm_before_gate, mod.activation, str(mod.weight.dtype)],
                    "max_rel": ((y - ref).abs() / ref.abs().clamp_min(1e-3)).max().item(),
                    "bitwise": bool(torch.equal(y, ref)),
                    "same_weight": mod.weight.data_ptr() == c.w.data_ptr(),
                })
found["mapping"] = out
"""


@pytest.mark.slow
def test_the_set_up_needs_the_compute_units_and_the_module_gets_our_options(vllm_child: dict) -> None:
    """Without the compute units answered vLLM's platform here raises (without CUDA_VISIBLE_DEVICES="" it swaps
    Triton for its placeholder: tests/kit/test_backends_vllm.py). The constructor mapping is checked on the real
    class: forward_native reads what forward_cuda hands its kernel, so it must match the reference."""
    assert vllm_child["unanswered"].startswith("NotImplementedError: num_compute_units is not implemented")
    assert len(vllm_child["mapping"]) == 16
    for r in vllm_child["mapping"]:
        gs, nbg, act, wdt = r["opts"]
        assert r["attrs"] == [1e-5, gs, nbg, act, wdt] and r["same_weight"], r
        # both are fp32 math rounded once; a wrong mapping (gate order, activation, groups, eps) moves outputs by
        # far more than one bf16 ulp (2^-8 relative)
        assert r["max_rel"] <= 2**-7, r
    assert any(r["bitwise"] for r in vllm_child["mapping"])  # the comparison is not vacuous


_NATIVE_CALL_SCRIPT = r"""
calls = []

def recorder(*args, **kwargs):
    calls.append(describe([list(args), kwargs]))
    return torch.zeros(1)

out = {"real": [], "planted": []}
for variant, results in out.items():
    for opts in OPTIONS:
        for gated in (True, False):
            c = make_case(5, 128, seed=1)
            z = c.z if gated else None
            mod = module(c.w, opts)
            if variant == "planted":
                mod.activation = "swish" if opts.activation == "sigmoid" else "sigmoid"
            real_static = RMSNormGated.__dict__["forward_static"]  # the staticmethod itself
            RMSNormGated.forward_static = staticmethod(recorder)
            calls.clear()
            mod.forward_native(c.x, z)
            vllm_calls = list(calls)
            RMSNormGated.forward_static = real_static
            calls.clear()
            native_call(recorder, c.x, z, c.w, opts)
            results.append({"vllm": vllm_calls, "ours": list(calls)})
found["native_calls"] = out
"""


@pytest.mark.slow
def test_forward_native_calls_forward_static_with_exactly_these_arguments(vllm_child: dict) -> None:
    """forward_native(x, z) is native_call(forward_static, x, z, w, opts); the planted variant (a module whose
    activation differs) shows the comparison catches a difference."""
    for variant, results in vllm_child["native_calls"].items():
        assert len(results) == 4
        for r in results:
            assert len(r["vllm"]) == 1 and len(r["ours"]) == 1, r
            assert (r["vllm"] == r["ours"]) is (variant == "real"), r


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


@pytest.mark.slow
def test_the_rows_give_vllms_forward_native_bits(vllm_child: dict) -> None:
    """The eager row is the installed forward_native bit for bit (options, weight dtypes, with and without a gate);
    the compiled row is Inductor's code for the same function, within a bf16 ulp of it."""
    results = vllm_child["native_bits"]
    assert len(results) == 8
    for r in results:
        assert r["eager"], r
        assert r["compiled_ulps"] <= 1, r


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


@pytest.mark.slow
def test_default_vllm_runs_forward_native_and_enforce_eager_forward_cuda(vllm_child: dict) -> None:
    r = vllm_child["dispatch"]
    # a default config compiles with Inductor: every custom op disabled, RMSNormGated's forward is forward_native
    assert r["default"]["mode"] == 3 and r["default"]["backend"] == "inductor"
    assert r["default"]["custom_ops"] == ["none"] and r["default"]["forward"] == "forward_native"
    assert r["compiled"] == r["default"]
    # enforce_eager=True sets mode NONE: every custom op enabled, forward is forward_cuda (layernorm_guard)
    assert r["enforce_eager_sets_none"]
    assert r["none"]["custom_ops"] == ["all"] and r["none"]["forward"] == "forward_cuda"
    # the compiled row compiles with the options vLLM's config gives, on a GPU platform and on vLLM's CPU platform
    assert r["default"]["inductor"] == r["ours_gpu"]
    assert r["cpu_platform"] == r["ours_cpu"] and "combo_kernels" not in r["ours_cpu"]


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


@pytest.mark.slow
def test_batch_invariant_mode_changes_only_the_eager_native_path(vllm_child: dict) -> None:
    """Under vLLM's own enable_batch_invariant_mode(): the eager forward_native's mean goes to vLLM's Triton kernel
    (its bits are the row's, and fp32 means change), while forward_cuda and the compiled forward_native never call
    it and keep their bits. Neither RMSNormGated nor layernorm_guard reads VLLM_BATCH_INVARIANT (RMSNorm does)."""
    r = vllm_child["batch_invariant"]
    assert r["native_calls"] >= 1 and r["native_is_the_row"], r
    assert r["mean_differs_in_fp32"], r
    assert r["cuda_calls"] == 0 and r["cuda_unchanged"], r
    assert r["compiled_calls"] == 0 and r["compiled_unchanged"], r
    assert r["reads_flag"] == {"RMSNormGated": False, "layernorm_guard": False, "RMSNorm.forward_cuda": True}


@pytest.fixture(scope="module")
def vllm_child(installed_vllm: vf.VllmFiles, vllm_archive: Path) -> dict:
    """One child importing the real vllm for every comparison in this module; the call recorders restore what they
    replace, and batch-invariant mode, which stays on, goes last."""
    sections = [_BITS_SCRIPT, _GDN_SCRIPT, _CALL_SCRIPT, _MAPPING_SCRIPT, _NATIVE_CALL_SCRIPT, _NATIVE_BITS_SCRIPT,
                _DISPATCH_SCRIPT, _BATCH_INVARIANT_SCRIPT]  # fmt: skip
    return child_result(_PRELUDE + "".join(sections) + 'print("RESULT " + json.dumps(found))', str(vllm_archive))


# -- the loader and the rows, here in this process ----------------------------------------------------------------


def test_loading_runs_vllms_files_and_leaves_no_vllm_behind(installed_vllm: vf.VllmFiles) -> None:
    import triton

    assert not any(k == "vllm" or k.startswith("vllm.") for k in sys.modules)
    lg = vf.load_layernorm_guard(installed_vllm)
    c = make_case(9, 128, seed=2)
    y = rmsnorm_call(lg.rmsnorm_fn, c.x, c.z, c.w, OpOptions())
    assert y.shape == (9, 128)
    assert not any(k == "vllm" or k.startswith("vllm.") for k in sys.modules)
    # what ran is vLLM's files: the module, the decorator and the kernel base class it imports ...
    assert lg.__file__ == str(installed_vllm.path(vf.LAYERNORM_GUARD))
    ops = "vllm/third_party/flash_linear_attention/ops/utils.py"
    assert lg.input_guard.__code__.co_filename == str(installed_vllm.path(ops))
    assert lg.VllmJitKernel.__init__.__code__.co_filename == str(
        installed_vllm.path("vllm/model_executor/warmup/jit_warmup.py")
    )
    # ... and only the helpers named in STOOD_IN are ours
    assert lg.triton is triton
    assert lg.num_compute_units.__wrapped__ is vf.compute_units


def test_read_function_names_what_the_namespace_lacks(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "import torch.nn.functional as F\n\nclass A:\n    @staticmethod\n    def g(x):\n        return F.silu(x)\n"
    )
    with pytest.raises(NameError, match=r"m\.py:A\.g reads \['F'\], which the namespace given does not define"):
        vf.read_function(f, "A.g", {})
    assert vf.read_function(f, "A.g", {"F": torch.nn.functional})(torch.zeros(2)).tolist() == [0.0, 0.0]
    with pytest.raises(LookupError, match=r"no function 'A\.h'"):
        vf.read_function(f, "A.h", {})


def test_the_archive_is_reproducible_and_holds_what_is_read(vllm_archive: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.tar.gz"
    proc = subprocess.run([sys.executable, str(TOOL), "--out", str(again)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert again.read_bytes() == vllm_archive.read_bytes()
    with tarfile.open(vllm_archive) as tar:
        names = tar.getnames()
    assert names == [*sorted(vf.NEEDED), f"vllm-{vllm_version()}.dist-info/METADATA"]
    assert vf.unpack(vllm_archive) == vf.unpack(vllm_archive)  # unpacked once per content


@pytest.mark.gpu
def test_the_vllm_row_from_vllms_files_on_the_gpu() -> None:
    """On the GPU machine (vllm not importable there): the row runs vLLM's kernel from the carried files, with the
    GPU's SM count as vLLM's CUDA platform answers it, and one bf16 ulp of the reference at most."""
    from rlnorm.numerics import ulp_distance
    from rlnorm.reference import rms_norm_gated_reference

    files, where = vf.find_files()
    if files is None:
        pytest.skip(f"no vLLM files here ({where}): python tools/vllm_sources.py, and carry .whl")
    b = VllmBackend(files=files.root)
    assert b.available("cuda") == (True, "")
    assert vf.compute_units(0) == torch.cuda.get_device_properties(0).multi_processor_count
    c = make_case(1000, 128, seed=3, device="cuda")
    y = b.forward(c.x, c.z, c.w, OpOptions())
    ref = rms_norm_gated_reference(c.x, c.z, c.w, OpOptions())
    assert int(ulp_distance(y, ref).max()) <= 1


def test_the_rows_are_forward_only_and_read_vllms_files(installed_vllm: vf.VllmFiles) -> None:
    for key in ROWS:
        b = load_backend(key)
        assert f"read from the installed package ({installed_vllm.root / 'vllm'}), vllm not imported" in b.source
        with pytest.raises(BackendUnavailable, match="no backward"):
            b.forward_backward(torch.zeros(2, 128), None, torch.ones(128), torch.zeros(2, 128), OpOptions())


def test_without_vllms_files_the_rows_say_where_to_get_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(vf, "installed_root", lambda: None)
    monkeypatch.setattr(vf, "DEFAULT_ARCHIVE", tmp_path / "absent.tar.gz")
    monkeypatch.delenv(vf.SOURCES_ENV, raising=False)
    for cls in (VllmNativeBackend, VllmNativeCompiledBackend, VllmNativeBatchInvariantBackend):
        ok, why = cls().available("cpu")
        assert not ok
        assert why.startswith("vLLM's Python files were not found (RLNORM_VLLM_SOURCES is unset, vllm is not")
        assert ".ci/install-vllm.sh" in why and "tools/vllm_sources.py" in why


def test_the_compiled_row_compiles_once_per_option_set_and_serves_every_size(installed_vllm: vf.VllmFiles) -> None:
    """One graph serves every row count, 1 included (vLLM drops the guards that would recompile for it); other
    options get a graph of their own (with every guard dropped, sharing one would silently reuse the first)."""
    from torch._dynamo.utils import counters

    b = VllmNativeCompiledBackend()
    b.compile_rows = 64
    eager = VllmNativeBackend()
    start = counters["stats"]["unique_graphs"]
    for opts in OPTIONS:
        for rows in (1, 2, 7, 65):
            c = make_case(rows, 128, seed=rows)
            y = b.forward(c.x, c.z, c.w, opts)
            assert int(ulp_distance(y, eager.forward(c.x, c.z, c.w, opts)).max()) <= 1, (opts, rows)
    assert counters["stats"]["unique_graphs"] - start == 2
    assert len(b._compiled) == 2


def test_the_batch_invariant_override_lasts_one_call(installed_vllm: vf.VllmFiles) -> None:
    b = VllmNativeBatchInvariantBackend()
    real = b._mean_fn()
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    b._mean = counting
    c = make_case(9, 128, seed=2)
    y = b.forward(c.x, c.z, c.w, OpOptions())
    assert len(calls) == 1 and y.shape == (9, 128)
    x = make_case(9, 128, seed=2, dtype=torch.float32).x
    expected = x.sum(-1, keepdim=True) / 128  # torch's own mean, exact here: 128 is a power of two
    assert torch.equal(x.mean(-1, keepdim=True), expected)
    assert len(calls) == 1  # after the call, aten::mean.dim is torch's again


@pytest.mark.gpu
@pytest.mark.parametrize("key", ROWS)
def test_the_native_rows_on_the_gpu(key: str) -> None:
    from rlnorm.reference import rms_norm_gated_reference

    b = load_backend(key)
    ok, why = b.available("cuda")
    if not ok and "files were not found" in why:
        pytest.skip(why)
    assert (ok, why) == (True, "")
    c = make_case(1000, 128, seed=3, device="cuda")
    y = b.forward(c.x, c.z, c.w, OpOptions())
    ref = rms_norm_gated_reference(c.x, c.z, c.w, OpOptions())
    assert int(ulp_distance(y, ref).max()) <= 1
