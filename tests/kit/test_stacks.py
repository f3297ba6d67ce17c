"""The stacks' rows run the stacks' own files and call them as the stacks do (docs/stacks.md).

Against each pinned package's real files (carried in .whl/ by tools/stack_sources.py): the kernel launch or call each
row makes is recorded and compared with the arguments the stack's layer passes (SGLang's BT and num_warps, the
inputs of calc_rows_per_block, Megatron's zero-centred weight, the calls of vLLM 0.30.0's and 0.33.0's forward_cuda
and forward_native), and a planted change to those arguments (in the stack's file or in how the row calls it) makes
the comparison fail.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from conftest import IN_CI
from launches import record

from rlnorm.inputs import make_case
from rlnorm.kit.backends import load_backend, stacks
from rlnorm.kit.backends import stack_files as sf
from rlnorm.kit.backends.vllm import compute_units, rmsnorm_call
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions
from rlnorm.reference import rms_norm_gated_reference


def pinned(key: str) -> sf.StackFiles:
    files, where = sf.find(sf.PINS[key])
    if files is None:
        if IN_CI:
            pytest.fail(f"CI must check the rows against the real files: {where}")
        pytest.skip(where)
    return files


def planted_copy(files: sf.StackFiles, rel: str, old: str, new: str, tmp: Path) -> Path:
    """A copy of the pin's files with `old` replaced by `new` once in file `rel`."""
    root = tmp / "planted"
    for f in files.pin.files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(files.path(f), root / f)
    text = (root / rel).read_text()
    assert text.count(old) == 1, old
    (root / rel).write_text(text.replace(old, new))
    return root


# -- SGLang --------------------------------------------------------------------------------------------------------
_FNG = "sglang/kernels/ops/attention/fla/fused_norm_gate.py"


def fused_mismatches(call: dict, x: torch.Tensor, w: torch.Tensor, opts: OpOptions) -> list[str]:
    """How a launch of layer_norm_gated_fwd_kernel differs from the one SGLang's Qwen3-Next layer makes for rows x
    (fused_norm_gate.py:243-276 for D <= 512: BT=32, num_warps=4, one program per 32 rows; no PDL without a GPU)."""
    t = x.reshape(-1, x.shape[-1]).shape[0]
    k = call["kwargs"]
    want = {"grid": ((t + 31) // 32,), "BT": 32, "num_warps": 4, "T": t, "D": x.shape[-1], "eps": opts.eps}
    want |= {"ACTIVATION": opts.activation, "IS_RMS_NORM": True, "HAS_WEIGHT": True, "HAS_BIAS": False}
    got = {"grid": call["grid"], **{n: k.get(n) for n in want if n != "grid"}}
    bad = [f"{n}: {got[n]!r} != {want[n]!r}" for n in want if got[n] != want[n]]
    if k["w"].data_ptr() != w.data_ptr():
        bad.append("the weight is not the row's")
    if k["x"].data_ptr() == x.data_ptr() or k["y"].data_ptr() != k["x"].data_ptr():
        bad.append("the kernel must write over a copy of x (y = x), never the caller's x")
    return bad


@pytest.mark.parametrize("planted", [False, True])
def test_sglang_fused_norm_gate_launches_as_qwen3_nexts_layer(
    planted: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = pinned("sglang")
    if planted:  # SGLang's file with BT = 16 in place of 32: the row runs it, and the comparison names the difference
        monkeypatch.setenv(files.pin.env, str(planted_copy(files, _FNG, "BT = 32", "BT = 16", tmp_path)))
    row = stacks.SglangFusedNormGateBackend()
    rec = record(monkeypatch, row.loaded()["fused_norm_gate"], "layer_norm_gated_fwd_kernel")
    for rows, opts in itertools.product((5, 40), (OpOptions(), OpOptions(eps=1e-5, activation="sigmoid"))):
        c = make_case(rows, 128, seed=rows)
        x0 = c.x.clone()
        rec.calls.clear()
        y = row.forward(c.x, c.z, c.w, opts)
        assert len(rec.calls) == 1 and torch.equal(c.x, x0) and y.shape == c.x.shape
        want = {5: ["BT: 16 != 32"], 40: ["grid: (3,) != (2,)", "BT: 16 != 32"]}[rows] if planted else []
        assert fused_mismatches(rec.calls[0], c.x, c.w, opts) == want


def layernorm_gated_mismatches(row: Any, monkeypatch: pytest.MonkeyPatch, rows: int) -> list:
    """How the row's layernorm_gated launch for `rows` rows differs from SGLang's: calc_rows_per_block(M, x.device)
    asked once with M the rows, ROWS_PER_BLOCK = min(next_power_of_2(cdiv(M, 2 * SMs)), 4), or 4 in deterministic
    inference (layernorm_gated.py:222-231), one program per ROWS_PER_BLOCK rows."""
    lg = row.loaded()["layernorm_gated"]
    asked: list = []
    real = lg.calc_rows_per_block
    monkeypatch.setattr(lg, "calc_rows_per_block", lambda m, device: asked.append((m, device)) or real(m, device))
    rec = record(monkeypatch, lg, "_layer_norm_fwd_1pass_kernel")
    c = make_case(rows, 128, seed=rows)
    row.forward(c.x, c.z, c.w, OpOptions())
    assert len(rec.calls) == 1
    sms = torch.get_num_threads()  # what the CPU stand-in answers for the SM count
    rpb = 4 if row.batch_invariant else min(1 << (-(-rows // (2 * sms)) - 1).bit_length(), 4)
    bad = [] if asked == [(rows, c.x.device)] else [f"calc_rows_per_block asked {asked}, not [({rows}, {c.x.device})]"]
    got = rec.calls[0]["kwargs"]["ROWS_PER_BLOCK"], rec.calls[0]["grid"]
    if got != (rpb, (-(-rows // rpb), 1)):
        bad.append(f"ROWS_PER_BLOCK, grid {got} != {(rpb, (-(-rows // rpb), 1))}")
    return bad


@pytest.mark.parametrize(
    ("key", "planted"),
    [
        ("sglang_layernorm_gated", False),
        ("sglang_layernorm_gated_deterministic", False),
        ("sglang_layernorm_gated", True),
    ],
)
def test_sglang_layernorm_gated_picks_rows_per_program_as_sglang(
    key: str, planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned("sglang")
    row = load_backend(key)
    if planted:  # the non-deterministic row's file answering deterministic mode: 4 rows per program for 3 rows
        monkeypatch.setattr(row.loaded()["layernorm_gated"], "is_batch_invariant_mode_enabled", lambda: True)
    # 2 threads: 1, 1, 4 rows a program
    found = [layernorm_gated_mismatches(row, monkeypatch, rows) for rows in (1, 3, 9)]
    assert found[1] != [] if planted else found == [[], [], []]


# -- TorchTitan ----------------------------------------------------------------------------------------------------
def test_torchtitan_row_runs_the_files_forward_with_the_layers_eps_and_weight() -> None:
    files = pinned("torchtitan")
    row = stacks.TorchtitanBackend()
    assert row.loaded().__code__.co_filename == str(files.path("torchtitan/models/qwen3_5/model.py"))
    c = make_case(6, 128, seed=2)
    x = (c.x.float() * 1e-3).to(c.x.dtype)  # small rows: eps moves the bits

    def layer(eps: float) -> torch.Tensor:  # the file's forward for a layer holding w and Config(eps=eps)
        xf = x.float()
        y = (c.w.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)
        return (y * F.silu(c.z.float())).to(x.dtype)

    for eps in (1e-6, 1e-5):
        got = row.forward_backward(x, c.z, c.w, c.dy, OpOptions(eps=eps))
        assert torch.equal(got.y, layer(eps))
        assert got.dw is not None and got.dz is not None
    assert not torch.equal(row.forward(x, c.z, c.w, OpOptions(eps=1e-5)), layer(1e-6))  # a planted eps is caught


# -- Megatron ------------------------------------------------------------------------------------------------------
class Eager(stacks.MegatronGdnBatchInvariantBackend):
    """The batch-invariant row with jit_fuser left out, so a recorder can stand where the CUDA-only kernel runs."""

    jit_fuser = staticmethod(lambda f: f)


def megatron_mismatches(row: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How the row's call differs from Megatron's: out_norm(x) = BatchInvariantRMSNormFn.apply(x, weight, eps, True)
    with the weight held zero-centred (w - 1), then y * silu(gate.float()) rounded to x's dtype (common.py:370-379)."""
    norm_fn = mock.Mock()  # BatchInvariantRMSNormFn.apply(x, weight, eps, zero_centered) gives x * 2 here
    norm_fn.apply.side_effect = lambda x, *rest: x * 2
    row.loaded()
    monkeypatch.setattr(row.bik, "BatchInvariantRMSNormFn", norm_fn)
    c = make_case(4, 128, seed=3)
    y = row.forward(c.x, c.z, c.w, OpOptions(eps=1e-6))
    if norm_fn.apply.call_count != 1:
        return [f"{norm_fn.apply.call_count} calls"]
    x, weight, eps, zc = norm_fn.apply.call_args.args
    bad = [] if torch.equal(x, c.x) else ["x"]
    bad += [] if torch.equal(weight, (c.w.float() - 1).to(c.w.dtype)) else ["the weight is not w - 1"]
    bad += [] if (eps, zc) == (1e-6, True) else [f"eps, zero_centered_gamma = {eps}, {zc}"]
    bad += [] if torch.equal(y, ((c.x * 2) * F.silu(c.z.float())).to(c.x.dtype)) else ["y"]
    return bad


@pytest.mark.parametrize("planted", [False, True])
def test_megatron_batch_invariant_row_calls_megatrons_norm_with_the_zero_centred_weight(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned("megatron-core")
    if planted:  # a weight not zero-centred is caught
        monkeypatch.setattr(stacks, "zero_centred", lambda w: w)
    found = megatron_mismatches(Eager(), monkeypatch)
    assert found == (["the weight is not w - 1"] if planted else [])


# -- vLLM 0.30.0 and 0.33.0 ---------------------------------------------------------------------------------------
def vllm_calls(files: sf.StackFiles, monkeypatch: pytest.MonkeyPatch, flip: bool) -> list[bool]:
    """forward_cuda (0.33.0's through torch.ops.vllm.fla_rms_norm_gated -> _fla_rms_norm_gated) and forward_native,
    read from the release's layernorm.py, against rmsnorm_call and native_call: equal calls, one per case."""
    layernorm = files.path(sf.LAYERNORM)
    guard = types.ModuleType(sf.VLLM_GUARD[-1].removesuffix(".py").replace("/", "."))
    guard.rmsnorm_fn = mock.Mock()
    monkeypatch.setitem(sys.modules, guard.__name__, guard)
    op = (
        sf.read_function(layernorm, "_fla_rms_norm_gated", {})
        if "def _fla_rms_norm_gated" in layernorm.read_text()
        else None
    )
    fake_torch = types.SimpleNamespace(ops=types.SimpleNamespace(vllm=types.SimpleNamespace(fla_rms_norm_gated=op)))
    cuda = sf.read_function(layernorm, "RMSNormGated.forward_cuda", {"torch": fake_torch})
    native = sf.read_function(layernorm, "RMSNormGated.forward_native", {})
    same = []
    c = make_case(3, 128, seed=1)
    options = (OpOptions(), OpOptions(eps=1e-5, group_size=32, norm_before_gate=False, activation="sigmoid"))
    for opts, z in itertools.product(options, (c.z, None)):
        # vLLM's module has no bias; its tensors are the case's own, so comparing calls compares them by identity
        mod = types.SimpleNamespace(weight=c.w, bias=None, forward_static=mock.Mock(), **opts.as_dict())
        if flip:
            mod.norm_before_gate = not mod.norm_before_gate
        for theirs, ours, seen in (
            (cuda, rmsnorm_call, guard.rmsnorm_fn),
            (native, stacks.native_call, mod.forward_static),
        ):
            seen.reset_mock()
            theirs(mod, c.x, z)
            ours(recorder := mock.Mock(), c.x, z, c.w, opts)
            assert seen.call_count == recorder.call_count == 1
            same.append(seen.call_args == recorder.call_args)
    return same


@pytest.mark.parametrize("key", ["vllm", "vllm-0.33.0"])
def test_vllm_forward_cuda_and_native_make_the_rows_calls(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What RMSNormGated.forward_cuda and forward_native call, from each release's own lines (the constructor's
    attributes: tests/kit/test_vllm_files.py); a module with another option is caught."""
    files = pinned(key)
    assert vllm_calls(files, monkeypatch, flip=False) == [True] * 8
    assert vllm_calls(files, monkeypatch, flip=True) == [False] * 8


def test_vllm_033_rows_run_its_files() -> None:
    pinned("vllm-0.33.0")
    c = make_case(5, 128, seed=4)
    for key in ("vllm_033", "vllm_native_033", "vllm_native_batch_invariant_033"):
        row = load_backend(key)
        assert row.available("cpu") == (True, ""), key
        assert "vLLM 0.33.0" in row.source and row.forward(c.x, c.z, c.w, OpOptions()).shape == c.x.shape


VLLM_ROWS = ["vllm", "vllm_native", "vllm_native_compiled", "vllm_native_batch_invariant"]
STACK_ROWS = ["sglang_fused_norm_gate", "sglang_layernorm_gated", "sglang_layernorm_gated_deterministic", "torchtitan"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "key", [*STACK_ROWS, "megatron_gdn_batch_invariant", *VLLM_ROWS, *(f"{k}_033" for k in VLLM_ROWS)]
)
def test_the_rows_on_the_gpu(key: str) -> None:
    """On the GPU machine (the stacks not installed, vllm not importable): each row runs from the carried files; vLLM's
    (the kernel with the SM count vLLM's CUDA platform answers) one bf16 ulp of the reference at most."""
    b = load_backend(key)
    ok, why = b.available("cuda")
    if not ok and key.startswith("vllm") and "files were not found" in why:
        pytest.skip(why)
    assert (ok, why) == (True, "")
    c = make_case(1000, 128, seed=3, device="cuda")
    y = b.forward(c.x, c.z, c.w, OpOptions())
    assert torch.isfinite(y.float()).all()
    if key.startswith("vllm"):
        assert compute_units(0) == torch.cuda.get_device_properties(0).multi_processor_count
        assert int(ulp_distance(y, rms_norm_gated_reference(c.x, c.z, c.w, OpOptions())).max()) <= 1
