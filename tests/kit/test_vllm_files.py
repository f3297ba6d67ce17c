"""vLLM's own files, run without importing vllm: the `vllm` row where vllm cannot import measures what vLLM runs.

Proven against the installed vLLM, each in a child process (vllm never enters this one):
- `RMSNormGated.forward_cuda` calls `layernorm_guard.rmsnorm_fn` with exactly `rmsnorm_call`'s arguments;
- `rmsnorm_fn` loaded from vLLM's files (installed, and packed by tools/vllm_sources.py) gives the installed
  module's bits, and a real `import vllm` in the same process is left as it was;
- the GDN layer's fused path (`_rms_norm_gated_cuda`: `layer_norm_fwd(..., out=...)`, in place) launches the same
  kernel with the same arguments as forward_cuda, and gives the same bits.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import CHILD_DESCRIBE, child_result

from rlnorm.inputs import make_case
from rlnorm.kit.backends import vllm_files as vf
from rlnorm.kit.backends.vllm import VllmBackend, rmsnorm_call, vllm_version
from rlnorm.options import OpOptions

TOOL = Path(__file__).resolve().parents[2] / "tools" / "vllm_sources.py"


# Imports the real vllm as the backend does on this CPU machine (`describe`: conftest's CHILD_DESCRIBE). vLLM's CPU
# platform answers torch's thread count for the compute units its rows-per-program choice reads (and caches), so
# the child fixes that count at 2 before anything asks: the grids and tile sizes asserted below are then the same
# on every machine.
_PRELUDE = r"""
import json, sys
import torch
torch.set_num_threads(2)
from rlnorm.inputs import make_case
from rlnorm.kit.backends import vllm_files as vf
from rlnorm.kit.backends.vllm import VllmBackend, answer_compute_units, build_module, prepare_import, rmsnorm_call
from rlnorm.options import OpOptions

prepare_import("cpu")
import vllm.third_party.flash_linear_attention.ops.layernorm_guard as lg
answer_compute_units()
assert torch.get_num_threads() == 2
"""
_PRELUDE += CHILD_DESCRIBE

_CALL_SCRIPT = r"""
calls = []

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


@pytest.fixture(scope="module")
def vllm_child(installed_vllm: vf.VllmFiles, vllm_archive: Path) -> dict:
    """One child importing the real vllm for the three comparisons below (the call recorder goes in last)."""
    script = (
        _PRELUDE + "found = {}\n" + _BITS_SCRIPT + _GDN_SCRIPT + _CALL_SCRIPT + 'print("RESULT " + json.dumps(found))'
    )
    return child_result(script, str(vllm_archive))


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


# -- the loader, here in this process --------------------------------------------------------------------------------


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
