"""vLLM's own files, run without importing vllm, give what vLLM runs: proven against the installed vLLM in the
suite's one vLLM child (tests/vllm_child.py).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO_ROOT

from rlnorm.inputs import make_case
from rlnorm.kit.backends import stack_files as sf
from rlnorm.kit.backends import vllm as vb
from rlnorm.kit.backends.vllm import rmsnorm_call
from rlnorm.options import OpOptions

GUARD = sf.VLLM_GUARD[-1]
TOOL = REPO_ROOT / "tools" / "stack_sources.py"


@pytest.mark.slow
def test_vllms_files_give_the_installed_modules_bits(installed_vllm: sf.StackFiles, vllm_facts: Any) -> None:
    r = vllm_facts("bits")
    assert r["restored"] == []  # the real vllm modules are back, and none of ours is left
    assert r["distinct"]
    assert r["files"][0] == str(installed_vllm.path(GUARD))
    assert r["files"][1].endswith(GUARD) and "rlnorm-src-" in r["files"][1]
    assert len(r["cases"]) == 20
    for case in r["cases"]:
        assert case["equal"] == [True, True, True], case
    assert r["3d"]


@pytest.mark.slow
def test_gdn_fused_path_is_forward_cudas_kernel_with_the_same_arguments(vllm_facts: Any) -> None:
    """The GDN layer's fused path (`_rms_norm_gated_cuda`) launches forward_cuda's kernel with the same grid and
    arguments; only the output lives elsewhere (it writes over its input), with the same bits."""
    results = vllm_facts("gdn")
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
def test_the_set_up_needs_the_compute_units_and_the_module_gets_our_options(vllm_facts: Any) -> None:
    """Without the compute units answered vLLM's platform here raises. The constructor's mapping is checked on the
    real class: forward_native reads what forward_cuda hands its kernel, so it must match the reference."""
    assert vllm_facts("unanswered").startswith("NotImplementedError: num_compute_units is not implemented")
    mapping = vllm_facts("mapping")
    assert len(mapping) == 16
    for r in mapping:
        gs, nbg, act, wdt = r["opts"]
        assert r["attrs"] == [1e-5, gs, nbg, act, wdt, None] and r["same_weight"], r  # no bias: rmsnorm_call's None
        # both are fp32 math rounded once; a wrong mapping (gate order, activation, groups, eps) moves outputs by
        # far more than one bf16 ulp (2^-8 relative)
        assert r["max_rel"] <= 2**-7, r
    assert any(r["bitwise"] for r in mapping)  # the comparison is not vacuous


def test_loading_runs_vllms_files_and_leaves_no_vllm_behind(installed_vllm: sf.StackFiles) -> None:
    import triton

    def vllm_modules() -> set[str]:  # another test in this process may have imported vLLM itself
        return {k for k in sys.modules if k == "vllm" or k.startswith("vllm.")}

    before = vllm_modules()
    lg = vb.load_layernorm_guard(installed_vllm)
    c = make_case(9, 128, seed=2)
    y = rmsnorm_call(lg.rmsnorm_fn, c.x, c.z, c.w, OpOptions())
    assert y.shape == (9, 128)
    assert vllm_modules() == before
    # what ran is vLLM's files: the module, the decorator and the kernel base class it imports ...
    assert lg.__file__ == str(installed_vllm.path(GUARD))
    assert lg.input_guard.__code__.co_filename == str(installed_vllm.path(sf.VLLM_GUARD[3]))
    assert lg.VllmJitKernel.__init__.__code__.co_filename == str(installed_vllm.path(sf.VLLM_GUARD[1]))
    # ... and only the helpers the pin names as stood in are ours
    assert lg.triton is triton
    assert lg.num_compute_units.__wrapped__ is vb.compute_units


def test_read_function_names_what_the_namespace_lacks(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "import torch.nn.functional as F\n\nclass A:\n    @staticmethod\n    def g(x):\n        return F.silu(x)\n"
    )
    with pytest.raises(NameError, match=r"m\.py:A\.g reads \['F'\], which the namespace given does not define"):
        sf.read_function(f, "A.g", {})
    assert sf.read_function(f, "A.g", {"F": torch.nn.functional})(torch.zeros(2)).tolist() == [0.0, 0.0]
    with pytest.raises(LookupError, match=r"no function 'A\.h'"):
        sf.read_function(f, "A.h", {})


def test_the_archive_is_reproducible_and_holds_what_is_read(vllm_archive: Path, tmp_path: Path) -> None:
    """tools/stack_sources.py packs the same bytes again, only the pin's files and METADATA; an unknown key is
    refused with nothing written."""
    run = [sys.executable, str(TOOL), "--out", str(tmp_path)]
    proc = subprocess.run([*run, "vllm"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "vllm-src.tar.gz").read_bytes() == vllm_archive.read_bytes()
    with tarfile.open(vllm_archive) as tar:
        assert tar.getnames() == [*sorted(sf.PINS["vllm"].files), "vllm-0.30.0.dist-info/METADATA"]
    assert sf.unpack(vllm_archive) == sf.unpack(vllm_archive)
    proc = subprocess.run([*run, "sglang-9"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["vllm-src.tar.gz"]
