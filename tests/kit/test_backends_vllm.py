"""The `vllm` backend: exact reasons where vLLM cannot run, checked against the real vllm package.

The real-package tests never import vllm into this process (vLLM's import patches torch._inductor
for everything after it); they go through the adapter's child-process probe, or a child script.
Where vllm is installed but not importable they skip with the reason, except in CI (CI=true),
where .ci/install-vllm.sh must have made it importable, so they fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import rlnorm.kit.backends.vllm as vb
from rlnorm.kit.backends import BackendUnavailable, load_backend
from rlnorm.kit.backends.vllm import VllmBackend, reason_from_probe, run_probe, torch_pin_reason, torch_requirement
from rlnorm.options import OpOptions

IN_CI = os.environ.get("CI", "").lower() == "true"
ON_GPU = torch.cuda.is_available()


def _no_probe(*args: Any, **kwargs: Any) -> dict[str, Any]:
    raise AssertionError("the probe child must not be started when package metadata already says why")


# -- planted conditions: the reason logic ---------------------------------------------------------


def test_vllm_missing_is_reported_without_a_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vb, "vllm_version", lambda: None)
    monkeypatch.setattr(vb, "run_probe", _no_probe)
    b = VllmBackend()
    ok, why = b.available("cpu")
    assert not ok
    assert why.startswith("vllm is not installed") and ".ci/install-vllm.sh" in why
    assert b.source == "vLLM (not installed) RMSNormGated.forward_cuda"
    with pytest.raises(BackendUnavailable, match="vllm is not installed"):
        b.forward(torch.zeros(2, 128), torch.zeros(2, 128), torch.ones(128), OpOptions())


def test_torch_pin_mismatch_is_reported_without_a_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vb, "vllm_version", lambda: "0.30.0")
    monkeypatch.setattr(vb, "torch_requirement", lambda: "torch==2.13.0")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")  # the GPU image's torch
    monkeypatch.setattr(vb, "run_probe", _no_probe)
    monkeypatch.delenv(vb.ALLOW_TORCH_MISMATCH_ENV, raising=False)
    ok, why = VllmBackend().available("cuda")
    assert not ok
    assert why.startswith("vLLM 0.30.0 pins torch==2.13.0 but torch 2.11.0+cu130 is installed")
    assert vb.ALLOW_TORCH_MISMATCH_ENV in why


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_torch_pin_mismatch_can_be_overridden(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setattr(vb, "vllm_version", lambda: "0.30.0")
    monkeypatch.setattr(vb, "torch_requirement", lambda: "torch==2.13.0")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    calls: list[str] = []

    def fake_probe(device: str, timeout_s: float, env: dict[str, str] | None) -> dict[str, Any]:
        calls.append(device)
        return {"device": device, "stage": "ok", "error": None}

    monkeypatch.setattr(vb, "run_probe", fake_probe)
    if how == "environment":
        monkeypatch.setenv(vb.ALLOW_TORCH_MISMATCH_ENV, "1")
        b = VllmBackend()
    else:
        monkeypatch.delenv(vb.ALLOW_TORCH_MISMATCH_ENV, raising=False)
        b = VllmBackend(allow_torch_mismatch=True)
    assert b.available("cuda") == (True, "")
    assert b.available("cuda") == (True, "")  # cached: one probe per device
    assert calls == ["cuda"]
    # tensors on cuda:0 use the "cuda" probe; another GPU gets its own
    assert b._probed_name(torch.device("cuda", 0)) == "cuda"
    assert b._probed_name(torch.device("cuda", 1)) == "cuda:1"
    assert b._probed_name(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize(
    ("torch_version", "requirement", "meets"),
    [
        ("2.13.0+cpu", "torch==2.13.0", True),  # a local build label meets an exact pin (PEP 440)
        ("2.13.0", "torch==2.13.0", True),
        ("2.11.0+cu130", "torch==2.13.0", False),
        ("2.13.1", "torch==2.13.0", False),
        ("2.12.0", "torch>=2.11,<2.14", True),
        ("2.14.0", "torch>=2.11,<2.14", False),
        ("2.11.0", None, True),  # vllm states no torch requirement: nothing to say
        ("2.11.0", "torch", True),
    ],
)
def test_torch_pin_reason(torch_version: str, requirement: str | None, meets: bool) -> None:
    reason = torch_pin_reason(torch_version, requirement, "0.30.0")
    assert (reason is None) is meets
    if not meets:
        assert requirement in reason and torch_version in reason


def test_torch_requirement_reads_torch_not_its_siblings(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM 0.30.0's metadata lists torchaudio/torchvision/torchcodec pins too; the zentorch extra
    # names torch in a marker. Only the requirement on `torch` itself counts, wherever it stands.
    reqs = [
        "torchaudio==2.11.0",
        "torchvision==0.28.0",
        'zentorch==2.13.0.0; extra == "zen"',
        "torchcodec>=0.14",
        "torch==2.13.0",
    ]
    monkeypatch.setattr(vb.importlib.metadata, "requires", lambda dist: reqs)
    assert torch_requirement() == "torch==2.13.0"
    monkeypatch.setattr(vb.importlib.metadata, "requires", lambda dist: reqs[:4])
    assert torch_requirement() is None
    monkeypatch.setattr(vb.importlib.metadata, "requires", lambda dist: ["torch (>=2.1, <3)"])
    assert torch_requirement() == "torch>=2.1,<3"


_TRITON_OFF = {
    "device": "cpu",
    "stage": "forward_cuda",
    "error": "AttributeError: module 'triton' has no attribute 'next_power_of_2'",
    "cuda_visible_devices": None,
    "torch_cuda_available": False,
    "has_triton": False,
    "triton_installed": True,
    "active_drivers": [],
}


@pytest.mark.parametrize(
    ("probe", "expected", "absent"),
    [
        ({"device": "cuda", "stage": "ok", "error": None}, None, []),
        (
            {"device": "cpu", "stage": "import", "error": "ModuleNotFoundError: No module named 'psutil'"},
            "vllm 0.30.0 is installed but importing its RMSNormGated fails: "
            "ModuleNotFoundError: No module named 'psutil'",
            [],
        ),
        (
            {"device": "cpu", "stage": "child", "error": "the probe child was killed by signal 11 before answering"},
            "probing vllm in a child process failed: the probe child was killed by signal 11",
            [],
        ),
        (
            {"device": "cpu", "stage": "construct", "error": "RuntimeError: Failed to infer device type"},
            "VllmConfig(device_config=DeviceConfig('cpu')) fails: RuntimeError: Failed to infer device type",
            [],
        ),
        (
            _TRITON_OFF,
            "no GPU driver: vLLM disabled Triton (vllm/triton_utils/importing.py found 0 active Triton GPU driver(s)",
            ["CUDA_VISIBLE_DEVICES"],
        ),
        (
            {**_TRITON_OFF, "triton_installed": False, "active_drivers": None},
            "vLLM found no Triton (find_spec('triton') is None)",
            ["no GPU driver"],
        ),
        (
            {
                **_TRITON_OFF,
                "has_triton": True,
                "cuda_visible_devices": "",
                "error": "NotImplementedError: num_compute_units is not implemented for the current platform.",
            },
            "CUDA_VISIBLE_DEVICES is empty, so vLLM kept Triton with no active driver",
            ["no GPU driver"],
        ),
        (
            {**_TRITON_OFF, "device": "cuda", "stage": "inputs", "error": "AssertionError: Torch not compiled"},
            "the probe's tensors cannot be placed on cuda: AssertionError: Torch not compiled",
            ["forward_cuda launches"],
        ),
        (
            {
                "device": "cpu",
                "stage": "forward_cuda",
                "error": "ValueError: Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)",
                "has_triton": True,
                "triton_installed": True,
                "active_drivers": ["cuda"],
                "torch_cuda_available": True,
            },
            "forward_cuda launches a CUDA Triton kernel and device 'cpu' is not CUDA",
            ["no GPU driver"],
        ),
        (
            {
                "device": "cuda:0",
                "stage": "forward_cuda",
                "error": "RuntimeError: Triton Error [CUDA]: out of memory",
                "has_triton": True,
                "triton_installed": True,
                "active_drivers": ["cuda"],
            },
            "RMSNormGated.forward_cuda(x, z) on cuda:0 raises RuntimeError: Triton Error [CUDA]: out of memory",
            ["not CUDA", "no GPU driver"],
        ),
    ],
)
def test_reason_from_probe(probe: dict[str, Any], expected: str | None, absent: list[str]) -> None:
    reason = reason_from_probe(probe, "0.30.0")
    if expected is None:
        assert reason is None
        return
    assert expected in reason
    assert probe["error"] in reason  # vLLM's own error is always quoted
    for text in absent:
        assert text not in reason


def _plant_vllm(root: Path, body: str) -> dict[str, str]:
    """A fake `vllm` package ahead of the real one on the child's path."""
    (root / "vllm").mkdir()
    (root / "vllm" / "__init__.py").write_text(textwrap.dedent(body))
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


def test_probe_reports_the_real_import_error(tmp_path: Path) -> None:
    env = _plant_vllm(tmp_path, "raise ImportError('planted: libcudart.so.13: cannot open shared object file')\n")
    p = run_probe("cpu", timeout_s=120, env=env)
    assert p["stage"] == "import"
    assert p["error"] == "ImportError: planted: libcudart.so.13: cannot open shared object file"
    assert reason_from_probe(p, "0.30.0").endswith(p["error"])


def test_probe_reports_a_crash(tmp_path: Path) -> None:
    env = _plant_vllm(tmp_path, "import os, sys\nsys.stderr.write('planted crash\\n')\nos.abort()\n")
    p = run_probe("cpu", timeout_s=120, env=env)
    assert p["stage"] == "child"
    assert "killed by signal 6" in p["error"] and "planted crash" in p["error"]


def test_probe_reports_a_hang(tmp_path: Path) -> None:
    env = _plant_vllm(tmp_path, "import time\ntime.sleep(3600)\n")
    p = run_probe("cpu", timeout_s=10, env=env)
    assert p == {"device": "cpu", "stage": "child", "error": "the probe child did not finish in 10 s"}


def test_no_backward() -> None:
    b = VllmBackend()
    assert b.has_backward is False
    with pytest.raises(BackendUnavailable, match="no backward"):
        b.forward_backward(torch.zeros(2, 128), torch.zeros(2, 128), torch.ones(128), torch.zeros(2, 128), OpOptions())


def test_every_option_is_supported() -> None:
    b = VllmBackend()
    for gs in (None, 64):
        for nbg in (True, False):
            for act in ("silu", "swish", "sigmoid"):
                assert b.supports(OpOptions(group_size=gs, norm_before_gate=nbg, activation=act)) == (True, "")


def test_registry_loads_it_and_a_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, tiny_params: dict, tmp_path: Path
) -> None:
    from rlnorm.kit.params import load_params
    from rlnorm.kit.steps import run_backends, start_run
    from rlnorm.report.tables import backend_table

    monkeypatch.setattr(vb, "vllm_version", lambda: None)
    assert isinstance(load_backend("vllm"), VllmBackend)
    params = load_params({**tiny_params, "backends": ["reference", "vllm"], "output_dir": str(tmp_path / "run")})
    run = start_run(params)
    run_backends(run)
    table = backend_table(run)
    assert table.loc["reference", "status"] == "ran"
    assert table.loc["vllm", "status"] == "skipped"
    assert table.loc["vllm", "why"].startswith("vllm is not installed")
    assert table.loc["vllm", "backward"] == "none"


# -- the real vllm package ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real() -> VllmBackend:
    """One real probe on the CPU (importing vllm takes ~25 s), shared by the tests below."""
    b = VllmBackend(allow_torch_mismatch=False)
    _, why = b.available("cpu")
    probe = b.last_probe
    if probe is None or probe.get("stage") in ("import", "child"):
        msg = f"vllm cannot be imported here: {why}"
        if IN_CI:
            pytest.fail(f"{msg} (CI must run the adapter against the real package: .ci/install-vllm.sh)")
        pytest.skip(msg)
    return b


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="checks the CPU machine's reason; on a GPU the probe runs the kernel")
def test_real_vllm_on_this_cpu_machine(real: VllmBackend) -> None:
    ok, why = real.available("cpu")
    p = real.last_probe
    assert real.source == f"vLLM {real.version} RMSNormGated.forward_cuda"
    assert not ok
    # the adapter really imported vLLM's class and constructed it under a vLLM config ...
    assert p["module"] == "vllm.model_executor.layers.layernorm.RMSNormGated"
    assert p["vllm_version"] == real.version
    # ... and forward_cuda really ran into vLLM's Triton placeholder
    assert p["stage"] == "forward_cuda"
    assert p["has_triton"] is False and p["triton_placeholder"] is True
    assert p["error"] == "AttributeError: module 'triton' has no attribute 'next_power_of_2'"
    if p["triton_installed"]:
        assert p["active_drivers"] == []
        assert why.startswith(
            "no GPU driver: vLLM disabled Triton (vllm/triton_utils/importing.py found 0 active Triton GPU driver(s)"
        )
    assert "TritonPlaceholder" in why
    assert "forward_cuda launches a CUDA Triton kernel and device 'cpu' is not CUDA" in why
    assert why.endswith("raises AttributeError: module 'triton' has no attribute 'next_power_of_2'")
    with pytest.raises(BackendUnavailable, match=r"no GPU driver|found no Triton"):
        real.forward(torch.zeros(2, 128, dtype=torch.bfloat16), None, torch.ones(128), OpOptions())
    assert "vllm" not in sys.modules  # the kit's process never imported vllm


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="a CPU-machine mechanism")
def test_real_vllm_keeps_triton_when_cuda_visible_devices_is_empty(real: VllmBackend) -> None:
    # vllm/triton_utils/importing.py tolerates 0 drivers where CUDA_VISIBLE_DEVICES is "" (Ray's
    # actor init): then the real Triton stays, and the kernel launch fails further on instead.
    p = run_probe("cpu", env={"CUDA_VISIBLE_DEVICES": ""})
    if not p.get("triton_installed"):
        pytest.skip("triton is not installed: vLLM has no Triton to keep")
    assert p["has_triton"] is True and p["triton_placeholder"] is False
    assert p["stage"] == "forward_cuda" and p["error"].startswith("NotImplementedError: num_compute_units")
    why = reason_from_probe(p, real.version)
    assert why.startswith("CUDA_VISIBLE_DEVICES is empty, so vLLM kept Triton with no active driver")


_MAPPING_SCRIPT = r"""
import json, sys
import torch
from rlnorm.kit.backends.vllm import VllmBackend
from rlnorm.inputs import make_case
from rlnorm.options import OpOptions
from rlnorm.reference import rms_norm_gated_reference

b = VllmBackend(allow_torch_mismatch=True)
out = []
for gs in (None, 32):
    for nbg in (True, False):
        for act in ("silu", "sigmoid"):
            for wdt in (torch.bfloat16, torch.float32):
                opts = OpOptions(eps=1e-5, group_size=gs, norm_before_gate=nbg, activation=act)
                c = make_case(7, 128, seed=3, weight_dtype=wdt)
                mod = b._module(128, c.w, opts)
                mod.weight = torch.nn.Parameter(c.w.detach(), requires_grad=False)
                y = mod.forward_native(c.x, c.z)  # the same attributes forward_cuda passes to its kernel
                ref = rms_norm_gated_reference(c.x, c.z, c.w, opts)
                attrs = [mod.eps, mod.group_size, mod.norm_before_gate, mod.activation, str(mod.weight.dtype)]
                out.append({"opts": [gs, nbg, act, str(wdt)], "attrs": attrs,
                            "max_rel": ((y.float() - ref.float()).abs()
                                        / ref.float().abs().clamp_min(1e-3)).max().item(),
                            "bitwise": bool(torch.equal(y, ref)),
                            "same_weight": mod.weight.data_ptr() == c.w.data_ptr()})
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_real_vllm_module_gets_our_options_and_weight(real: VllmBackend) -> None:
    """The adapter's constructor mapping, checked on the real class: vLLM's forward_native reads the
    same attributes forward_cuda hands its kernel, and runs on the CPU, so it must match the reference."""
    proc = subprocess.run(
        [sys.executable, "-c", _MAPPING_SCRIPT], capture_output=True, text=True, timeout=600, check=False
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    results = json.loads(lines[-1][len("RESULT ") :])
    assert len(results) == 16
    for r in results:
        gs, nbg, act, wdt = r["opts"]
        assert r["attrs"] == [1e-5, gs, nbg, act, wdt], r
        assert r["same_weight"], r
        # both are fp32 math rounded once; a wrong mapping (gate before/after, silu vs sigmoid,
        # groups, eps) moves outputs by far more than one bf16 ulp (2^-8 relative)
        assert r["max_rel"] <= 2**-7, r
    assert sum(r["bitwise"] for r in results) >= 1  # the comparison is not vacuous
