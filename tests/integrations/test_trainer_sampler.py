"""The trainer-vs-sampler check (`rlnorm.kit.checks.trainer_sampler`), its step and its place in the artifact.

With vLLM: the patched pair agrees bitwise, the unpatched pair (transformers' eager norm against vLLM's default
path) does not, and a planted replacement that keeps rlnorm's default eps makes the patched pair disagree. Those
run in the vLLM scenarios' child process; the rest runs here without vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import require
from vllm_scenarios import facts

import rlnorm.kit.checks.trainer_sampler as ts
from rlnorm.kit import artifact as art
from rlnorm.kit import steps
from rlnorm.kit.params import load_params
from rlnorm.kit.results import run_from_doc, to_json
from rlnorm.options import OpOptions
from rlnorm.report import tables

require("transformers")
slow = pytest.mark.slow


# -- the parts ----------------------------------------------------------------------------------------------------
def test_the_sampler_calls_a_prefill_then_one_token_per_decode_step() -> None:
    assert ts.sampler_plan(40, heads=2, decode_tokens=8) == [24] + [2] * 8
    assert ts.sampler_plan(5, heads=2, decode_tokens=8) == [1, 2, 2]
    assert ts.sampler_plan(4, heads=2, decode_tokens=8) == [2, 2]
    assert ts.sampler_plan(7, heads=2, decode_tokens=0) == [7]


def test_row_scales_are_exact_powers_of_two() -> None:
    s = ts.row_scales(40)
    assert s.shape == (40, 1) and s[0, 0] == 1 and s[15, 0] == 2.0**-15 and s[16, 0] == 1
    x = torch.randn(40, 8).to(torch.bfloat16)
    assert torch.equal(((x.float() * s).to(torch.bfloat16).float() / s).to(torch.bfloat16), x)  # nothing rounded


def test_compare_outputs_counts_every_flipped_bit() -> None:
    a = torch.randn(6, 8).to(torch.bfloat16)
    same = {"bitwise_equal": True, "rows_differ": 0, "elements_differ": 0, "max_ulp": 0, "differing_rows": []}
    assert ts.compare_outputs(a, a.clone()) == same
    b = a.clone()
    b.view(torch.int16)[4, 3] += 3  # planted: three ulps in one element
    b.view(torch.int16)[1, 0] += 1
    got = ts.compare_outputs(a, b)
    assert (got["bitwise_equal"], got["rows_differ"], got["elements_differ"], got["max_ulp"]) == (False, 2, 2, 3)
    assert got["differing_rows"] == [1, 4]
    with pytest.raises(ValueError, match="sampler output"):
        ts.compare_outputs(a, b[:3])


def test_options_that_are_not_qwen3_next_s_are_skipped_with_the_reason() -> None:
    s = ts.trainer_vs_sampler(d=32, rows=3, opts=OpOptions(norm_before_gate=False)).summary
    assert s["skip_reason"].endswith("the run's options differ: norm_before_gate=False")
    assert s["agree"] is None and s["pairs"] == {}


def test_where_vllm_cannot_run_the_sampler_is_rlnorm_s_op_as_its_layer_calls_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ts, "vllm_unavailable_reason", lambda: "vllm is not installed")
    s = ts.trainer_vs_sampler(d=32, rows=12, seed=3, eps=1e-5).summary
    patched, unpatched = s["pairs"]["patched"], s["pairs"]["unpatched"]
    assert s["vllm"] is None and s["vllm_reason"] == "vllm is not installed"
    assert patched["trainer"].endswith("RlnormQwen3NextRMSNormGated")
    assert patched["sampler"].startswith("torch.ops.rlnorm.rms_norm_gated as rlnorm's vLLM layer calls it")
    assert s["agree"] is True and patched["bitwise_equal"] is True
    assert unpatched["bitwise_equal"] is None and "vllm is not installed" in unpatched["skip_reason"]


# -- with vLLM, on the CPU (the scenarios' child process) ----------------------------------------------------------
@slow
def test_patched_trainer_and_sampler_agree_and_the_unpatched_pair_does_not() -> None:
    f = facts("trainer_sampler_check")
    for key in ("shipped", "at_1e5"):
        s = f[key]
        patched, unpatched = s["pairs"]["patched"], s["pairs"]["unpatched"]
        assert s["vllm"] is not None and s["vllm_reason"] is None
        assert patched["trainer"].endswith("RlnormQwen3NextRMSNormGated")
        assert patched["sampler"].endswith("RlnormRMSNormGated.forward_native")  # vLLM's default dispatch
        assert s["agree"] is True and patched["elements_differ"] == 0
        assert unpatched["trainer"].endswith(" Qwen3NextRMSNormGated")
        assert unpatched["sampler"].endswith(" RMSNormGated.forward_native")
        # transformers rounds three times, vLLM's native path once: about a third of the outputs, 1-2 ulp
        assert unpatched["bitwise_equal"] is False and unpatched["rows_differ"] > 20
        assert 0.2 < unpatched["elements_differ"] / (s["rows"] * s["d"]) < 0.5 and unpatched["max_ulp"] <= 2
    assert f["shipped"]["sampler_calls"] == [24] + [2] * 8
    assert not f["registered_after"]  # the check leaves the process's vLLM as it found it


@slow
def test_a_sampler_replacement_that_keeps_rlnorm_s_default_eps_is_caught() -> None:
    s = facts("trainer_sampler_check")["planted"]
    assert s["eps"] == 1e-5 and s["agree"] is False
    patched = s["pairs"]["patched"]
    assert patched["rows_differ"] > 10 and patched["max_ulp"] > 2
    assert 0 not in patched["differing_rows"]  # the unscaled row: eps is negligible beside its mean square


# -- the step, the artifact, the table ------------------------------------------------------------------------
def _run(tmp_path: Path, **overrides: object) -> steps.Run:
    params = {"name": "ts", "device": "cpu", "progress": False, "output_dir": str(tmp_path / "ts"), "backends": []}
    params |= {"checks": ["trainer_sampler"], "d": 32, "agreement_rows": 12, **overrides}
    return steps.start_run(load_params(params))


@slow
def test_the_step_runs_the_check_in_its_own_process_and_the_artifact_keeps_it(tmp_path: Path) -> None:
    run = _run(tmp_path)
    steps.run_trainer_sampler(run)
    s = run.result.trainer_sampler
    assert s is not None and s.error is None, s
    assert s.agree is True and s.rows == 12 and s.d == 32
    back = art.load_artifact(steps.write(run))
    assert back.trainer_sampler is not None and back.trainer_sampler.agree is True
    table = tables.trainer_sampler_table(run.result)
    assert list(table.index) == ["patched", "unpatched"] and bool(table.loc["patched", "bitwise equal"])


def test_the_step_records_a_process_that_outlives_its_time(tmp_path: Path) -> None:
    run = _run(tmp_path, backend_timeout_s=0.2)
    steps.run_trainer_sampler(run)
    assert run.result.trainer_sampler is not None
    assert run.result.trainer_sampler.error == "timed out after 0.2 s"


def test_the_step_does_nothing_unless_chosen(tmp_path: Path) -> None:
    run = _run(tmp_path, checks=["agreement"])
    steps.run_trainer_sampler(run)
    assert run.result.trainer_sampler is None


SUMMARY = {"rows": 4, "d": 32, "heads": 2, "seed": 3, "eps": 1e-6, "dtype": "bfloat16", "weight_dtype": "bfloat16"}
SUMMARY |= {"device": "cpu", "trainer_calls": [4], "sampler_calls": [2, 2], "vllm": "0.30.0", "vllm_reason": None}
PATCHED = {"trainer": "t", "sampler": "s", "bitwise_equal": True, "rows_differ": 0}
SUMMARY |= {"agree": True, "pairs": {"patched": PATCHED}}


def _doc(tmp_path: Path, trainer_sampler: dict | None) -> dict:
    return {**to_json(_run(tmp_path).result), "trainer_sampler": trainer_sampler}


def test_the_schema_takes_the_summary_an_error_or_nothing_and_refuses_a_wrong_type(tmp_path: Path) -> None:
    for ok in (SUMMARY, {"error": "timed out after 1 s"}, None):
        art.validate_artifact(_doc(tmp_path / str(len(str(ok))), ok))
    with pytest.raises(art.ArtifactValidationError, match=r"\$\.trainer_sampler\.agree"):
        art.validate_artifact(_doc(tmp_path / "a", {**SUMMARY, "agree": "yes"}))
    with pytest.raises(art.ArtifactValidationError, match="trainer_sampler"):
        art.validate_artifact(_doc(tmp_path / "b", {"rows": 4}))  # neither a summary nor an error
    typed = run_from_doc(_doc(tmp_path / "c", SUMMARY)).trainer_sampler
    assert typed is not None and typed.agree is True and to_json(typed) == SUMMARY


def test_an_artifact_from_before_the_check_still_reads(tmp_path: Path) -> None:
    doc = _doc(tmp_path, None)
    del doc["trainer_sampler"]
    assert run_from_doc(doc).trainer_sampler is None


@pytest.mark.gpu
def test_on_the_gpu_at_width_128_the_patched_trainer_and_sampler_agree() -> None:
    s = ts.trainer_vs_sampler(d=128, rows=4097, seed=3, eps=1e-6, device="cuda").summary
    print(json.dumps(s))  # the numbers the report quotes
    assert "error" not in s and "error" not in s["pairs"]["patched"], s
    assert s["agree"] is True and s["pairs"]["patched"]["elements_differ"] == 0
    # where vLLM cannot import (the H200 image's torch is not vLLM's pin), the sampler is rlnorm's op as its layer
    # calls it; where it can, vLLM's unpatched layer must differ from transformers' eager norm
    if s["vllm"] is None:
        assert s["pairs"]["patched"]["sampler"].startswith("torch.ops.rlnorm.rms_norm_gated")
    else:
        assert s["pairs"]["unpatched"]["bitwise_equal"] is False
