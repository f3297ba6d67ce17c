"""rlnorm.report.compare: the seed B200 report against synthetic artifacts whose differences are planted."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from rlnorm.checkout import seed_report_path
from rlnorm.kit.artifact import read_artifact, write_artifact
from rlnorm.report.compare import (
    VERDICT_CHECKS,
    backend_verdicts,
    compare_runs,
    plot_comparison,
    run_verdicts,
)
from rlnorm.report.plots.common import gates_passed
from rlnorm.report.runs import load_artifact

SEED = seed_report_path()


@pytest.fixture(scope="module")
def seed() -> dict:
    return read_artifact(SEED)


def synthetic_h200(seed: dict) -> dict:
    """The seed report with planted changes: one FAIL -> pass flip, one pass -> FAIL flip, a faster
    vLLM, a backend gone and a new one, and transformers correctly rounded everywhere."""
    b = copy.deepcopy(seed)
    b["environment"]["gpu"] = "NVIDIA H200"
    res = b["results"]
    fused = res["fla_fused_norm_gate"]["batch_invariance"]
    fused["full_vs_sub_batches"].update(fwd_differ=0, rowgrad_differ=0)
    fused["batch_invariant"] = True
    res["fla_layernorm_gated"]["batch_invariance"]["batch_size_sweep"]["differ"] = 4
    res["fla_layernorm_gated"]["batch_invariance"]["batch_invariant"] = False
    res["vllm"]["accuracy_latency"]["fwd_us"] = 58.6
    res["transformers"]["accuracy_latency"]["fwd_correctly_rounded"] = 1.0
    del res["rl_kernel"]
    res["rlnorm"] = copy.deepcopy(res["reference"])
    res["rlnorm"]["source"] = "rlnorm rms_norm_gated (Triton)"
    return b


def test_seed_report_verdicts_match_what_it_says(seed: dict) -> None:
    v = backend_verdicts(seed["results"]["fla_fused_norm_gate"])
    assert v["full_vs_sub_batches"] == ("FAIL", "95 y / 152 dx,dz")
    assert v["batch_invariant"] == ("FAIL", "")
    assert v["all_rows"] == ("pass", "")
    vllm = backend_verdicts(seed["results"]["vllm"])
    assert vllm["all_rows"] == ("FAIL", "3 y")
    assert vllm["dweight_repeatable"][0] == "n/a"  # forward only: null in the report
    assert vllm["gate_forward"][0] == "n/a"  # the report ran no gates for vLLM
    assert backend_verdicts(seed["results"]["rl_kernel"])["gate_gradient"] == ("pass", "")


def test_run_verdicts_table_of_the_seed_report(seed: dict) -> None:
    table = run_verdicts(seed)
    assert list(table.columns) == list(VERDICT_CHECKS)
    assert table.loc["fla_fused_norm_gate", "full_vs_sub_batches"] == "FAIL (95 y / 152 dx,dz)"
    assert table.loc["vllm", "all_rows"] == "FAIL (3 y)" and table.loc["reference", "all_rows"] == "pass"


def test_seed_against_itself_changes_nothing(seed: dict) -> None:
    cmp = compare_runs(seed, seed)
    assert cmp.changes == []
    assert not cmp.verdicts["changed"].any()
    assert (cmp.latency["fwd_us_ratio"].dropna() == 1.0).all()
    assert cmp.label_a != cmp.label_b


def test_compare_finds_every_planted_change(seed: dict) -> None:
    cmp = compare_runs(seed, synthetic_h200(seed))
    changes = "\n".join(cmp.changes)
    assert (
        cmp.changes[0]
        == "devices differ (NVIDIA B200 vs NVIDIA H200): latency ratios compare the hardware as much as the code"
    )
    assert "rl_kernel: only in A: NVIDIA B200" in changes
    assert "rlnorm: only in B: NVIDIA H200" in changes
    assert "fla_fused_norm_gate full_vs_sub_batches: FAIL (95 y / 152 dx,dz) -> pass" in changes
    assert "fla_fused_norm_gate batch_invariant: FAIL -> pass" in changes
    assert "fla_layernorm_gated batch_size_sweep: pass -> FAIL (4 y, dx or dz)" in changes
    assert "fla_layernorm_gated batch_invariant: pass -> FAIL" in changes
    assert "vllm fwd_us: 87.1 -> 58.6 us (0.67x, faster)" in changes
    assert "transformers fwd_correctly_rounded: 0.654748 -> 1.000000" in changes
    # nothing unplanted is reported
    assert len(cmp.changes) == 9
    lat = cmp.latency
    assert lat.loc["vllm", "fwd_us_ratio"] == pytest.approx(58.6 / 87.07199990749359)
    assert lat.loc["reference", "fwd_bwd_us_ratio"] == pytest.approx(1.0)
    assert set(cmp.verdicts.index.get_level_values("check")) == set(VERDICT_CHECKS)
    assert cmp.accuracy.loc["transformers", "fwd_correctly_rounded_b"] == 1.0
    assert not cmp.environment.loc["gpu", "same"] and cmp.environment.loc["torch", "same"]


def test_a_different_protocol_is_said_first(seed: dict) -> None:
    b = copy.deepcopy(seed)
    b["quick"] = True
    for entry in b["results"].values():
        entry["batch_invariance"]["full_vs_sub_batches"].update(full_batch=1031, coverage="all")
    cmp = compare_runs(seed, b)
    assert cmp.changes[0].startswith("protocol differs (quick, sub_batches_full_batch, sub_batches_coverage)")
    assert cmp.environment.loc["protocol: sub_batches_coverage", "A: NVIDIA B200"] == "sampled"


def test_runs_of_different_ops_are_said_to_be_so_before_anything_else(seed: dict) -> None:
    """A D=256 silu run against a D=128 sigmoid run: not "0.60x, faster" but two different computations."""
    a, b = copy.deepcopy(seed), copy.deepcopy(seed)
    a["params"] = {"d": 256, "activation": "silu"}
    b["params"] = {"d": 128, "activation": "sigmoid", "weight_dtype": "bfloat16"}
    b["results"]["reference"]["accuracy_latency"]["fwd_us"] *= 0.6
    cmp = compare_runs(a, b)
    la, lb = "A: NVIDIA B200", "B: NVIDIA B200"
    assert cmp.different_ops == [f"d: 256 in {la}, 128 in {lb}", f"activation: silu in {la}, sigmoid in {lb}"]
    assert cmp.changes[0].startswith(f"the two runs computed different ops (d: 256 in {la}, 128 in {lb}; activation")
    assert any("0.60x, faster" in c for c in cmp.changes[1:]), "the latency move is still listed, after"
    assert cmp.changes_markdown().startswith(f"**These runs computed different ops** (d: 256 in {la}")
    same = compare_runs(seed, copy.deepcopy(seed))
    assert same.different_ops == [] and same.changes_markdown() == "*Nothing changed.*", "the same op: nothing said"


def test_latency_threshold_is_respected(seed: dict) -> None:
    b = copy.deepcopy(seed)
    b["results"]["vllm"]["accuracy_latency"]["fwd_us"] *= 1.05
    assert compare_runs(seed, b).changes == []
    assert len(compare_runs(seed, b, latency_move=0.01).changes) == 1


def test_skipped_backend_and_gate_failure_show_as_such(seed: dict) -> None:
    b = copy.deepcopy(seed)
    b["results"]["vllm"] = {**b["results"]["vllm"], "status": "skipped", "skip_reason": "no GPU driver"}
    b["results"]["transformers"]["contract_gates"]["gradient"].update(
        passed=False, returncode=-11, failed_lines=["x"], timed_out=False
    )
    cmp = compare_runs(seed, b)
    assert cmp.verdicts.loc[("vllm", "all_rows"), "verdict_b"] == "skipped"
    # one line for the backend, with its reason, instead of one per check
    assert "vllm: ran in A: NVIDIA B200, skipped in B: NVIDIA B200 (no GPU driver)" in cmp.changes
    assert not any(c.startswith("vllm all_rows") for c in cmp.changes)
    assert "transformers gate_gradient: pass -> FAIL (gate child killed by SIGSEGV (signal 11))" in cmp.changes


def test_a_backend_without_a_backward_has_no_gradient_gate_not_a_failed_one(seed: dict) -> None:
    """The gate child exits 3 for a forward-only backend: compare, the index's summary and the plots' "gates
    passed" read that as not applicable, as the page's verdict does, never as a failure."""
    b = copy.deepcopy(seed)
    no_backward = {"passed": False, "returncode": 3, "failed_lines": [], "timed_out": False,
                   "stderr_tail": ["backend 'vllm' has no backward"]}  # fmt: skip
    passed = {"passed": True, "returncode": 0, "failed_lines": [], "timed_out": False, "lines": ["ok"]}
    b["results"]["vllm"]["contract_gates"] = {"forward": passed, "gradient": no_backward}
    assert backend_verdicts(b["results"]["vllm"])["gate_gradient"] == ("n/a", "no backward")
    assert gates_passed(b["results"]["vllm"]) is True
    crashed = {**no_backward, "returncode": -11, "stderr_tail": []}
    b["results"]["transformers"]["contract_gates"] = {"forward": passed, "gradient": crashed}
    assert backend_verdicts(b["results"]["transformers"])["gate_gradient"][0] == "FAIL"
    assert gates_passed(b["results"]["transformers"]) is False


def test_sweep_counts_are_not_double_counted_and_unmeasured_is_not_a_flip(seed: dict) -> None:
    b = copy.deepcopy(seed)
    sweep = b["results"]["reference"]["batch_invariance"]["batch_size_sweep"]
    sweep.update(differ=6, fwd_differ=4, rowgrad_differ=2)  # our split of the report's total
    b["results"]["transformers"]["batch_invariance"]["dweight_repeatable"] = None
    v = backend_verdicts(b["results"]["reference"])
    assert v["batch_size_sweep"] == ("FAIL", "4 y / 2 dx,dz")
    changes = compare_runs(seed, b).changes
    assert "reference batch_size_sweep: pass -> FAIL (4 y / 2 dx,dz)" in changes
    assert "not measured in B: NVIDIA B200: transformers dweight_repeatable" in changes


def test_a_check_that_raised_is_an_error_not_a_pass(seed: dict) -> None:
    b = copy.deepcopy(seed)
    entry = b["results"]["reference"]
    entry["errors"] = {"batch_size_sweep": "RuntimeError: out of memory"}
    entry["batch_invariance"]["all_rows"]["error"] = "RuntimeError: boom"
    v = backend_verdicts(entry)
    assert v["batch_size_sweep"] == ("error", "RuntimeError: out of memory")
    assert v["all_rows"] == ("error", "RuntimeError: boom")
    changes = compare_runs(seed, b).changes
    assert "reference batch_size_sweep: pass -> error (RuntimeError: out of memory)" in changes


def test_load_artifact_from_path_folder_and_bad_input(seed: dict, tmp_path: Path) -> None:
    assert load_artifact(SEED)["results"].keys() == seed["results"].keys()
    run = tmp_path / "h200"
    doc = synthetic_h200(seed)
    write_artifact(doc, run / "rms_norm_gated_reuse_check.json")
    cmp = compare_runs(SEED, run)
    assert cmp.label_b == "B: NVIDIA H200"
    with pytest.raises(TypeError, match="source"):
        load_artifact(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="results"):
        compare_runs({"kind": "x"}, seed)
    assert seed_report_path().name == "rms_norm_gated_b200.json"


def test_plot_comparison_draws_latency_and_verdict_grid(seed: dict) -> None:
    fig = plot_comparison(compare_runs(seed, synthetic_h200(seed)))
    lat_ax, acc_ax, grid_ax = fig.axes[:3]
    assert lat_ax.get_yscale() == "log" and acc_ax.get_yscale() == "log"
    assert [t.get_text() for t in grid_ax.get_xticklabels()] == list(VERDICT_CHECKS)
