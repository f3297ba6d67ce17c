"""vLLM's own files, run without importing vllm: the `vllm` row where vllm cannot import measures what vLLM runs.

Proven against the installed vLLM in the suite's one vLLM child (tests/kit/vllm_child.py; vllm never enters
this process):
- `RMSNormGated.forward_cuda` calls `layernorm_guard.rmsnorm_fn` with exactly `rmsnorm_call`'s arguments, and the
  constructor gets our options (compute units answered: a step of the set-up that is needed);
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
from vllm_child import facts

from rlnorm.inputs import make_case
from rlnorm.kit.backends import vllm_files as vf
from rlnorm.kit.backends.vllm import VllmBackend, rmsnorm_call, vllm_version
from rlnorm.options import OpOptions

TOOL = Path(__file__).resolve().parents[2] / "tools" / "vllm_sources.py"


@pytest.fixture(scope="module")
def vllm_child(installed_vllm: vf.VllmFiles, vllm_archive: Path) -> dict:
    """The real vllm's findings, from the suite's one child (tests/kit/vllm_child.py)."""
    return facts(vllm_archive)


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


# -- the loader, here in this process ----------------------------------------------------------------------------


def test_loading_runs_vllms_files_and_leaves_no_vllm_behind(installed_vllm: vf.VllmFiles) -> None:
    import triton

    def vllm_modules() -> set[str]:  # another test in this process may have imported vLLM itself
        return {k for k in sys.modules if k == "vllm" or k.startswith("vllm.")}

    before = vllm_modules()
    lg = vf.load_layernorm_guard(installed_vllm)
    c = make_case(9, 128, seed=2)
    y = rmsnorm_call(lg.rmsnorm_fn, c.x, c.z, c.w, OpOptions())
    assert y.shape == (9, 128)
    assert vllm_modules() == before
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
