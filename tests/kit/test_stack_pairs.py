"""Stack pairs: a planted difference between trainer and sampler is reported, equal sides are equal, a pair whose
backend is missing is skipped with the reason, and the step writes the table into a valid artifact."""

from __future__ import annotations

import dataclasses

from faults import PositionDependentOutput, position_fault_mask

from rlnorm.kit import steps
from rlnorm.kit.artifact import load_artifact
from rlnorm.kit.backends import ExactReferenceBackend
from rlnorm.kit.checks.stack_pairs import PAIRS, PairSpec, pair_by_name, run_pair
from rlnorm.kit.checks.trainer_sampler import sampler_plan
from rlnorm.kit.params import load_params
from rlnorm.kit.results import StackPair, from_json
from rlnorm.options import OpOptions

SPEC = PairSpec("planted", "a test stack", "Qwen3-Next", "trainer_key", "sampler_key", "here:1", "there:2")
SIZES = {"rows": 23, "d": 128, "heads": 2, "decode_tokens": 4}


def test_a_sampler_that_differs_by_position_is_reported_as_differing() -> None:
    planted = {"trainer_key": ExactReferenceBackend(), "sampler_key": PositionDependentOutput()}
    row = run_pair(SPEC, backends=planted, **SIZES)
    plan = sampler_plan(SIZES["rows"], SIZES["heads"], SIZES["decode_tokens"])
    expected = sum(int(position_fault_mask(n).sum()) for n in plan)  # one element (column 0) per bumped row
    assert row["status"] == "ran" and row["sampler_calls"] == plan and row["trainer_calls"] == [SIZES["rows"]]
    assert row["bitwise_equal"] is False
    assert row["elements_differ"] == row["rows_differ"] == expected > 0
    assert row["max_ulp"] == 1
    assert from_json(StackPair, row).bitwise_equal is False  # the row reads back as the typed result


def test_the_same_row_wise_backend_on_both_sides_is_bitwise_equal() -> None:
    same = {"trainer_key": ExactReferenceBackend(), "sampler_key": ExactReferenceBackend()}
    row = run_pair(SPEC, backends=same, **SIZES)
    assert row["status"] == "ran" and row["bitwise_equal"] is True and row["elements_differ"] == 0


def test_rlnorm_on_both_sides_is_bitwise_equal() -> None:
    row = run_pair(pair_by_name("rlnorm_patched"), **SIZES)
    assert row["status"] == "ran", row.get("reason")
    assert row["bitwise_equal"] is True


def test_an_unregistered_backend_or_other_options_skip_the_pair_with_the_reason() -> None:
    missing = dataclasses.replace(SPEC, trainer="no_such_backend", sampler="rlnorm")
    row = run_pair(missing, **SIZES)
    assert row["status"] == "skipped" and "no_such_backend" in row["reason"]
    row = run_pair(pair_by_name("rlnorm_patched"), opts=OpOptions(activation="sigmoid"), **SIZES)
    assert row["status"] == "skipped" and "activation" in row["reason"]


def test_every_pair_names_registered_keys_or_is_skipped_and_where_its_stack_chooses() -> None:
    names = [p.name for p in PAIRS]
    assert len(set(names)) == len(names)
    assert all(":" in p.trainer_where + p.sampler_where for p in PAIRS if not p.trainer.startswith("rlnorm"))


def test_the_step_writes_each_pair_from_its_own_process_into_a_valid_artifact(tmp_path) -> None:
    params = load_params({"backends": ["reference"], "checks": ["stack_pairs"], "agreement_rows": 7,
                          "output_dir": str(tmp_path / "r")})  # fmt: skip
    run = steps.start_run(params)
    steps.run_stack_pairs(run, pairs=["rlnorm_patched", "verl_fsdp_vllm"])
    assert not run.result.failed_steps
    table = run.result.stack_pairs
    assert table is not None and [p.name for p in table.pairs] == ["rlnorm_patched", "verl_fsdp_vllm"]
    assert table.pairs[0].status == "ran" and table.pairs[0].bitwise_equal is True
    assert table.pairs[1].status in ("ran", "skipped")
    back = load_artifact(run.result.path)  # validated against the schema as it is read
    assert back.stack_pairs is not None and back.stack_pairs.pairs[1].name == "verl_fsdp_vllm"
