"""The `vllm` backend: what runs where (vLLM imported, vLLM's files, nothing), and reasons true for the machine.

vllm is never imported into this process (its import patches torch._inductor): the real-package tests go through the
adapter's probe child or a child script, and skip where vllm does not import (fail on CI).
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import IN_CI, TINY_SIZES, child_result, needs_installed_vllm

import rlnorm.kit.backends.vllm as vb
from rlnorm.kit.backends import BackendUnavailable, load_backend
from rlnorm.kit.backends import stack_files as sf
from rlnorm.kit.backends.vllm import VllmBackend, reason_from_probe, run_probe
from rlnorm.options import OpOptions

ENV = sf.PINS["vllm"].env  # RLNORM_VLLM_SOURCES


def _plant_vllm(root: Path, body: str) -> dict[str, str]:  # a fake `vllm` ahead of the real one on the child's path
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(textwrap.dedent(body))
    return {"PYTHONPATH": str(root)}


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # no vllm installed, no copy of its files
    monkeypatch.setattr(vb, "vllm_version", lambda: None)
    monkeypatch.setattr(vb, "run_probe", mock.Mock(side_effect=AssertionError("a probe without vllm")))
    monkeypatch.setattr(sf, "installed", lambda pin: None)
    monkeypatch.setattr(sf, "WHL", tmp_path)
    monkeypatch.delenv(ENV, raising=False)


def test_not_installed_and_no_files_says_where_it_looked(nowhere: None) -> None:
    b = VllmBackend()
    ok, why = b.available("cpu")
    assert not ok and why.startswith("vllm is not installed here, and vllm 0.30.0's files were not found")
    for key in ("vllm_native", "vllm_native_compiled", "vllm_native_batch_invariant"):
        assert load_backend(key).available("cpu") == (False, why.removeprefix("vllm is not installed here, and "))
    with pytest.raises(BackendUnavailable, match="vllm is not installed here"):
        b.forward(torch.zeros(2, 128), torch.zeros(2, 128), torch.ones(128), OpOptions())


def test_not_installed_with_vllms_files_runs_them(
    monkeypatch: pytest.MonkeyPatch, nowhere: None, vllm_archive: Path
) -> None:
    # the GPU image's case: no vllm, its files carried as tools/stack_sources.py packs them
    monkeypatch.setenv(ENV, str(vllm_archive))
    b = VllmBackend()
    assert b.available("cpu") == (True, "")
    assert b.plan == "files"
    assert f"{vllm_archive} ({ENV})" in b.source and "vllm is not installed here" in b.source  # what ran, from where
    case_x = torch.randn(5, 128).to(torch.bfloat16)
    y = b.forward(case_x, case_x.flip(0), torch.ones(128, dtype=torch.bfloat16), OpOptions())
    assert y.shape == (5, 128) and y.dtype == torch.bfloat16
    assert "vllm" not in sys.modules


def test_installed_but_not_importable_runs_its_files_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `import vllm` failing (vLLM's torch pin unmet): the row runs vLLM's installed files and says why
    needs_installed_vllm("the adapter")
    monkeypatch.delenv(ENV, raising=False)
    b = VllmBackend()
    b.probe_env = _plant_vllm(tmp_path, "raise ImportError('planted: libcudart.so.13: cannot open')\n")
    assert b.plan == "files"
    assert b.last_probe is not None and b.last_probe["stage"] == "import"
    assert "vllm 0.30.0 is installed but `import vllm` fails here: ImportError: planted: libcudart" in b.source
    assert "the installed package" in b.source and "not installed here" not in b.source
    assert b.available("cpu") == (True, "")


def test_reason_from_probe_quotes_vllms_error() -> None:
    assert reason_from_probe({"device": "cuda", "stage": "ok", "error": None}, "0.30.0") is None
    for stage in ("import", "child", "construct", "forward_cuda"):
        probe = {"device": "cpu", "stage": stage, "error": "RuntimeError: planted", "has_triton": True}
        reason = reason_from_probe(probe, "0.30.0")
        assert reason.endswith("RuntimeError: planted") and "disabled Triton" not in reason, stage
    # vllm imported before CUDA_VISIBLE_DEVICES could be emptied: its placeholder stands in for Triton
    off = reason_from_probe({"device": "cpu", "stage": "forward_cuda", "error": "E", "has_triton": False}, "0.30.0")
    assert "vLLM disabled Triton" in off


@pytest.mark.parametrize(
    ("body", "timeout_s", "errors"),
    [
        ("import os, sys\nsys.stderr.write('planted crash\\n')\nos.abort()\n", 120,
         ("killed by SIGABRT (signal 6)", "planted crash")),
        ("import time\ntime.sleep(3600)\n", 3, ("the probe child did not finish in 3 s",)),
    ],
    ids=["crash", "hang"],
)  # fmt: skip
def test_the_probe_reports_how_vllm_failed(tmp_path: Path, body: str, timeout_s: int, errors: tuple) -> None:
    p = run_probe("cpu", timeout_s=timeout_s, env=_plant_vllm(tmp_path, body))
    assert p["stage"] == "child" and all(e in p["error"] for e in errors), p


# where the test plants the unimportable vllm package; the kit's worker process, which builds the backend, inherits it
PLANTED_VLLM_ENV = "RLNORM_TEST_PLANTED_VLLM"


class UnimportableVllm(VllmBackend):
    """Planted: vLLM installed, `import vllm` failing, and none of its files to fall back on."""

    def __init__(self) -> None:
        super().__init__()
        self.version = "0.30.0"
        self.probe_env = {"PYTHONPATH": os.environ[PLANTED_VLLM_ENV]}


def test_a_run_records_the_reason_true_for_the_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through the kit's worker process: skipped, the reason saying installed-but-unimportable, with the error."""
    from rlnorm.kit.params import load_params
    from rlnorm.kit.steps import run_backends, start_run
    from rlnorm.report.tables import backend_table

    monkeypatch.setenv(ENV, str(tmp_path / "no-such-archive.tar.gz"))  # the worker inherits it; it is named
    planted = _plant_vllm(tmp_path / "planted", "raise ImportError('planted: no vllm._C')\n")
    monkeypatch.setenv(PLANTED_VLLM_ENV, planted["PYTHONPATH"])
    spec = f"{__name__}:UnimportableVllm"
    params = {"name": "tiny", "device": "cpu", "progress": False, **TINY_SIZES, "backends": ["reference"]}
    run = start_run(load_params({**params, "custom_backends": [spec], "output_dir": str(tmp_path / "run")}))
    run_backends(run)
    table = backend_table(run.result)
    assert table.loc["reference", "status"] == "ran"
    assert table.loc[spec, "status"] == "skipped"
    why = table.loc[spec, "why"]
    assert why.startswith("vllm 0.30.0 is installed but `import vllm` fails here: ImportError: planted: no vllm._C")
    assert f"{ENV}={tmp_path / 'no-such-archive.tar.gz'} does not exist" in why
    assert table.loc[spec, "backward"] == "none"


@pytest.fixture(scope="module")
def real() -> VllmBackend:
    """One real probe on the CPU (importing vllm takes ~10-25 s)."""
    needs_installed_vllm("the adapter")
    b = VllmBackend()
    if b.plan != "imported":
        msg = f"vllm cannot be imported here: {b.source}"
        if IN_CI:
            pytest.fail(f"{msg} (CI must run the adapter against the real package: .ci/install-vllm.sh)")
        pytest.skip(msg)
    return b


# what prepare_import("cpu") leaves out: CUDA_VISIBLE_DEVICES emptied before vllm is imported
_WITHOUT_SET_UP = r"""
import json, os
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
import torch
from rlnorm.inputs import make_case
from rlnorm.kit.backends.vllm import build_module
from rlnorm.options import OpOptions

c = make_case(3, 128, seed=0)
try:
    out = {"ran": list(build_module(c.w, OpOptions()).forward_cuda(c.x, c.z).shape)}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU machine's set-up; on a GPU vLLM runs as it is")
def test_real_vllm_runs_forward_cuda_under_the_interpreter_here_and_not_without_the_set_up(real: VllmBackend) -> None:
    ok, why = real.available("cpu")
    assert (ok, why) == (True, "")
    ok, why = real.available("bogus:0")  # the device is what is wrong, not vLLM's import
    assert not ok and why.startswith("device 'bogus:0' is not a torch device")
    p = real.last_probe
    assert p is not None and p["stage"] == "ok" and p["output_shape"] == [3, 128]
    # the adapter really imported vLLM's class and constructed it under a vLLM config ...
    assert p["module"] == "vllm.model_executor.layers.layernorm.RMSNormGated"
    assert p["vllm_version"] == real.version
    # ... with CUDA_VISIBLE_DEVICES emptied before the import, so vLLM kept the real Triton, interpreted ...
    assert p["cuda_visible_devices"] == "" and p["triton_interpret"] == "1"
    assert p["has_triton"] is True
    # ... and the compute units vLLM's platform here cannot give answered as its CPU platform does
    assert p["platform"] == "UnspecifiedPlatform"
    assert p["compute_units_answered"] == torch.get_num_threads()
    assert "under the Triton interpreter (CUDA_VISIBLE_DEVICES='')" in real.source
    assert "vllm" not in sys.modules  # the kit's process never imported vllm
    error = "AttributeError: module 'triton' has no attribute 'next_power_of_2'"
    assert child_result(_WITHOUT_SET_UP) == {"error": error}  # without it vLLM swaps Triton for its placeholder
