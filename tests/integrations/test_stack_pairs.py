"""Trainer against sampler (`rlnorm.kit.checks.stack_pairs`), with vLLM's side in the suite's vLLM child."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO_ROOT, require
from faults import PositionDependentOutput, position_fault_mask

import rlnorm.kit.checks.stack_pairs as sp
from rlnorm.kit import artifact as art
from rlnorm.kit import steps
from rlnorm.kit.backends import ExactReferenceBackend
from rlnorm.kit.params import load_params
from rlnorm.kit.results import StackPair, from_json, load_run, run_from_doc, to_json
from rlnorm.options import OpOptions

require("transformers")
SPEC = sp.PairSpec("planted", "a test stack", "Qwen3-Next", "trainer_key", "sampler_key", "here:1", "there:2")
SIZES = {"rows": 23, "d": 128, "heads": 2, "decode_tokens": 4}
QWEN3_NEXT = OpOptions(eps=1e-5, **sp.QWEN3_NEXT_OPTIONS)  # an eps other than rlnorm's default, so a lost one shows


# -- the parts, a pair ---------------------------------------------------------------------------------------------
def test_the_sampler_calls_a_prefill_then_one_token_per_decode_step_on_rows_scaled_exactly() -> None:
    assert sp.sampler_plan(40, heads=2, decode_tokens=8) == [24] + [2] * 8
    assert sp.sampler_plan(5, heads=2, decode_tokens=8) == [1, 2, 2] and sp.sampler_plan(4, 2, 8) == [2, 2]
    assert sp.sampler_plan(7, heads=2, decode_tokens=0) == [7]
    s = sp.row_scales(40)
    assert s.shape == (40, 1) and s[0, 0] == 1 and s[15, 0] == 2.0**-15 and s[16, 0] == 1
    x = torch.randn(40, 8).to(torch.bfloat16)
    assert torch.equal(((x.float() * s).to(torch.bfloat16).float() / s).to(torch.bfloat16), x)  # nothing rounded


def test_compare_outputs_counts_every_flipped_bit() -> None:
    a = torch.randn(6, 8).to(torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[4, 3] += 3  # planted: three ulps in one element, one in another row
    b.view(torch.int16)[1, 0] += 1
    counts = {"bitwise_equal": False, "rows_differ": 2, "elements_differ": 2, "max_ulp": 3, "differing_rows": [1, 4]}
    assert sp.compare_outputs(a, b) == counts
    with pytest.raises(ValueError, match="sampler output"):
        sp.compare_outputs(a, b[:3])


def test_a_sampler_that_differs_by_position_is_reported_with_exactly_its_count() -> None:
    planted = {"trainer_key": ExactReferenceBackend(), "sampler_key": PositionDependentOutput()}
    row = sp.run_pair(SPEC, backends=planted, **SIZES)
    plan = sp.sampler_plan(SIZES["rows"], SIZES["heads"], SIZES["decode_tokens"])
    bumped = torch.cat([position_fault_mask(n) for n in plan]).nonzero().flatten().tolist()  # column 0 of each
    assert row["status"] == "ran" and row["sampler_calls"] == plan and row["trainer_calls"] == [SIZES["rows"]]
    assert row["elements_differ"] == row["rows_differ"] == len(bumped) > 0 and row["max_ulp"] == 1
    assert from_json(StackPair, row).differing_rows == bumped[:10]  # the row reads back as the typed result
    same = {"trainer_key": ExactReferenceBackend(), "sampler_key": ExactReferenceBackend()}
    assert sp.run_pair(SPEC, backends=same, **SIZES)["bitwise_equal"] is True


def test_a_pair_that_cannot_run_here_is_skipped_with_the_reason_and_rlnorm_s_falls_back_to_its_op(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    row = sp.run_pair(dataclasses.replace(SPEC, trainer="no_such_backend", sampler="rlnorm"), **SIZES)
    assert row["status"] == "skipped" and "no_such_backend" in row["reason"]
    row = sp.run_pair(sp.pair_by_name("rlnorm_patched"), opts=OpOptions(activation="sigmoid"), **SIZES)
    assert row["status"] == "skipped" and "activation" in row["reason"]
    monkeypatch.setattr(sp, "vllm_unavailable_reason", lambda: "vllm is not installed")
    row = sp.run_pair(sp.pair_by_name("stock_unpatched"), d=32, rows=12, opts=QWEN3_NEXT)
    assert row["status"] == "skipped" and "vllm is not installed" in row["reason"]
    row = sp.run_pair(sp.pair_by_name("rlnorm_patched"), d=32, rows=12, opts=QWEN3_NEXT)  # vLLM's layer's own op
    assert row["status"] == "ran" and row["bitwise_equal"] is True, row.get("reason")
    assert row["trainer_source"].endswith("RlnormQwen3NextRMSNormGated")
    assert row["sampler_source"].startswith("torch.ops.rlnorm.rms_norm_gated as rlnorm's vLLM layer calls it")


# -- with vLLM, on the CPU (the suite's vLLM child) ----------------------------------------------------------
@pytest.mark.slow
def test_rlnorm_s_layers_agree_and_the_stock_layers_do_not(vllm_facts: Any) -> None:
    f = vllm_facts("stack_pairs_check")
    for eps in ("1e-06", "1e-05"):
        patched, stock = f[f"rlnorm_patched@{eps}"], f[f"stock_unpatched@{eps}"]
        assert patched["trainer_source"].endswith("RlnormQwen3NextRMSNormGated")
        assert patched["sampler_source"].endswith("RlnormRMSNormGated.forward_native")  # vLLM's default dispatch
        assert patched["bitwise_equal"] is True and patched["elements_differ"] == 0
        assert stock["trainer_source"].endswith(" Qwen3NextRMSNormGated")
        assert stock["sampler_source"].endswith(" RMSNormGated.forward_native")
        # transformers rounds three times, vLLM's native path once: about a third of the outputs, 1-2 ulp
        assert stock["bitwise_equal"] is False and stock["rows_differ"] > 20
        assert 0.2 < stock["elements_differ"] / (40 * 32) < 0.5 and stock["max_ulp"] <= 2
    assert patched["sampler_calls"] == [24] + [2] * 8
    assert not f["registered_after"]  # the pairs leave the process's vLLM as they found it


@pytest.mark.slow
def test_a_sampler_replacement_that_keeps_rlnorm_s_default_eps_is_caught(vllm_facts: Any) -> None:
    row = vllm_facts("stack_pairs_check")["planted"]
    assert row["bitwise_equal"] is False and row["rows_differ"] > 10 and row["max_ulp"] > 2
    assert 0 not in row["differing_rows"]  # the unscaled row: eps is negligible beside its mean square


# -- the step, the artifact ---------------------------------------------------------------------------------------
def _run(tmp_path: Path, **overrides: object) -> steps.Run:
    params = {"name": "sp", "device": "cpu", "progress": False, "output_dir": str(tmp_path / "sp"), "backends": []}
    params |= {"checks": ["stack_pairs"], "d": 32, "agreement_rows": 12, "eps": 1e-5, **overrides}
    return steps.start_run(load_params(params))


@pytest.mark.slow
def test_the_step_writes_each_pair_from_its_own_process_into_a_valid_artifact(tmp_path: Path) -> None:
    run = _run(tmp_path)
    steps.run_stack_pairs(run, pairs=["rlnorm_patched"])
    (pair,) = art.load_artifact(steps.write(run)).stack_pairs.pairs  # validated against the schema as it is read
    assert (pair.name, pair.status, pair.bitwise_equal) == ("rlnorm_patched", "ran", True), pair.reason


def test_a_pair_s_process_that_hangs_or_leaves_half_a_result_is_its_error(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(steps, "STACK_PAIR_CHILD", "import time; time.sleep(600)")  # hangs, whatever the machine
    run = _run(tmp_path / "a", backend_timeout_s=0.2)
    steps.run_stack_pairs(run, pairs=["rlnorm_patched"])
    assert run.result.stack_pairs.pairs[0].reason.startswith("its process: timed out after 0.2 s")  # its error
    monkeypatch.setattr(steps, "STACK_PAIR_CHILD", "import sys; open(sys.argv[2], 'w').write('{\"na')")
    run = _run(tmp_path / "b")
    steps.run_stack_pairs(run, pairs=["rlnorm_patched"])
    (pair,) = run.result.stack_pairs.pairs
    assert pair.reason == "its process: it left no readable result; last line: (no stderr)"
    assert not run.result.failed_steps  # a pair's error, not the step's
    run = _run(tmp_path / "c", checks=["agreement"])
    steps.run_stack_pairs(run)  # not chosen: nothing
    assert run.result.stack_pairs is None


OLD = {"rows": 4, "d": 32, "seed": 3, "eps": 1e-6, "device": "cpu", "trainer_calls": [4], "sampler_calls": [2, 2]}
PATCHED = {"trainer": "t", "sampler": "s", "bitwise_equal": True, "rows_differ": 0, "elements_differ": 0, "max_ulp": 0}
OLD |= {"vllm": "0.30.0", "agree": True, "pairs": {"patched": PATCHED, "unpatched": {"skip_reason": "no vLLM"}}}


def test_an_older_trainer_sampler_summary_reads_as_its_two_pairs(tmp_path: Path) -> None:
    doc = to_json(_run(tmp_path).result)
    for old in (OLD, {"error": "timed out after 1 s"}, None):
        art.validate_artifact({**doc, "trainer_sampler": old})
    patched, stock = run_from_doc({**doc, "trainer_sampler": OLD}).stack_pairs.pairs
    assert (patched.name, patched.status, patched.bitwise_equal) == ("rlnorm_patched", "ran", True)
    assert (stock.name, stock.status, stock.reason) == ("stock_unpatched", "skipped", "no vLLM")
    upgraded = run_from_doc({**doc, "trainer_sampler": {"error": "timed out after 1 s"}})
    art.validate_artifact(upgraded)  # and it writes as this schema's artifact
    assert [(p.status, p.reason) for p in upgraded.stack_pairs.pairs] == [("error", "timed out after 1 s")] * 2
    assert run_from_doc({**doc, "trainer_sampler": None}).stack_pairs is None  # the check did not run
    published = art.load_artifact(REPO_ROOT / "outputs/h200-full/rms_norm_gated_reuse_check.json")
    assert [p.status for p in published.stack_pairs.pairs] == ["error", "error"]  # its check raised
    both = load_run(REPO_ROOT / "outputs/h100-full/stacks").stack_pairs.pairs  # pairs and the old
    names = [p.name for p in both]
    assert len(names) == len(set(names)) == 11 and {"rlnorm_patched", "stock_unpatched"} <= set(names)


@pytest.mark.gpu
def test_on_the_gpu_at_width_128_rlnorm_s_layers_agree() -> None:
    row = sp.run_pair(sp.pair_by_name("rlnorm_patched"), rows=4097, device="cuda")
    print(json.dumps(row))  # the numbers the report quotes
    assert row["status"] == "ran" and row["elements_differ"] == 0, row
