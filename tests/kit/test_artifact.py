"""The artifact: the seed report and our artifacts load into one validated, typed run; the schema catches planted
faults by key path; writes are atomic and never clobber a run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rlnorm.checkout import seed_report_path
from rlnorm.kit.artifact import ArtifactValidationError, load_artifact, validate_artifact, write_artifact
from rlnorm.kit.environment import collect_environment
from rlnorm.kit.results import ARTIFACT_KIND, OP, StepFailure, run_from_doc, to_json

SEED = seed_report_path()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _ran_backend(backward: str = "full") -> dict[str, Any]:
    gate = {"returncode": 0, "passed": True, "failed_lines": [], "singleton_aggregate": [], "stderr_tail": []}
    return {
        "source": "rlnorm 0.1.0 Triton", "backward": backward, "status": "ran", "skip_reason": None,
        "batch_invariance": {
            "all_rows": {"7": {"rows": 21, "fwd_differ": 0, "rowgrad_differ": 0}},
            "dweight_repeatable": True,
            "full_vs_sub_batches": {"full_batch": 257, "sub_batch_sizes": [1, 7], "sub_batches": 294, "fwd_differ": 0,
                                    "rowgrad_differ": 0, "coverage": "every_row"},
            "batch_size_sweep": {"batch_sizes": [1, 2], "probe_rows": [0], "comparisons": 6, "differ": 0},
            "batch_invariant": True,
        },
        "accuracy_latency": {
            "rows": 257, "fwd_correctly_rounded": 1.0, "fwd_max_abs_err": 0.0078125, "fwd_us": None,
            "grad_rel_err": {"x": 0.002, "z": 0.002, "w": 0.001}, "fwd_bwd_us": None,
            "fwd_ulp_hist": {"0": 257 * 128, "1": 0, "16+": 0, "nan": 0},
            "fwd_abs_err_hist": {"edges": [1e-6, 1e-3, 1.0], "counts": [3, 4], "zero": 100}, "device": "cpu",
            "timed": False,
        },
        "contract_gates": {"forward": dict(gate), "gradient": dict(gate)},
        "errors": {},
    }  # fmt: skip


def built(**overrides: Any) -> dict[str, Any]:
    """A small artifact as the steps write it on this machine: one backend ran, one skipped."""
    skipped = {"source": "vLLM", "backward": "none", "status": "skipped", "errors": {}, "skip_reason": "no vllm"}
    doc: dict[str, Any] = {
        "schema_version": "1", "kind": ARTIFACT_KIND, "rfc": None, "op": OP, "commit": COMMIT,
        "rl_kernel_commit": None, "tracked_tree_dirty": False, "created_at": "2026-01-01T00:00:00+00:00",
        "wall_time_s": 1.0, "param_set": "quick", "environment": collect_environment("cpu"), "quick": True,
        "checks": ["all_rows", "accuracy_latency"], "params": {"name": "quick", "coverage": "all"},
        "records": "records.csv", "plots": {"latency": "plots/latency.png"},
        "agreement": {"tensor": "y", "rows": 7, "seed": 11, "backends": ["rlnorm"], "equal_fraction": [[1.0]]},
        "trainer_sampler": None, "results": {"rlnorm": _ran_backend(), "vllm": skipped},
    }  # fmt: skip
    doc.update(overrides)
    return to_json(run_from_doc(doc))


def test_seed_report_loads_typed_and_valid() -> None:
    run = load_artifact(SEED)
    raw = json.loads(SEED.read_text())
    assert run.is_seed and run.commit == raw["rl_kernel_commit"] and run.params is None and run.records is None
    assert run.environment["megatron_source_commit"] == "52fbcbc"
    assert all(r.status == "ran" and r.errors is None for r in run.results.values())
    assert run.results["reference"].contract_gates is None  # the report ran no gates for it
    assert run.results["vllm"].accuracy_latency.fwd_bwd_us is None  # forward only
    assert run.results["fla_fused_norm_gate"].batch_invariance.full_vs_sub_batches.fwd_differ == 95
    # every key of the report's backends survives the typed round trip
    ours = to_json(run)
    for key, entry in raw["results"].items():
        assert set(entry) <= set(ours["results"][key]), key


def test_an_artifact_round_trips_through_its_file_and_a_later_schema_is_refused(tmp_path: Path) -> None:
    doc = built(failed_steps=[{"step": "plots", "error": "RuntimeError: x", "traceback": ["line"]}])
    run = run_from_doc(doc)
    assert run.failed_steps == [StepFailure("plots", "RuntimeError: x", ["line"])]
    path = write_artifact(run, tmp_path / "run" / "artifact.json")
    assert to_json(load_artifact(path)) == doc
    assert load_artifact(path).resolve(doc["records"]) == tmp_path / "run" / "records.csv"
    path.write_text(json.dumps({**doc, "schema_version": "99"}))  # a later rlnorm's: refused, not misread
    with pytest.raises(ValueError, match="schema_version '99'"):
        load_artifact(path)


# ---------------------------------------------------------------------------------------------
# planted faults: each is caught, and the message names where


def _set(path: str, value: Any = None) -> Any:
    """A fault that sets (or, with no value, deletes) the key at `path` ("results.rlnorm.status")."""

    def plant(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            doc = doc[key]
        doc.pop(last) if value is None else doc.__setitem__(last, value)

    return plant


def _rename(doc: dict[str, Any]) -> None:
    r = doc["results"]["rlnorm"]
    r["batch_invarance"] = r.pop("batch_invariance")


R = "results.rlnorm."
# fault -> (how it is planted, the key path the error must name)
FAULTS = {
    "missing top-level key": (_set("environment"), r"at \$: 'environment' is a required property"),
    "misspelled backend field": (_rename, r"at \$\.results\.rlnorm: .*'batch_invarance' was unexpected"),
    "misspelled accuracy field": (
        _set(R + "accuracy_latency.fwd_correctly_rounded"),
        r"at \$\.results\.rlnorm\.accuracy_latency: 'fwd_correctly_rounded' is a required property",
    ),
    "count as a string": (
        _set(R + "batch_invariance.all_rows.7.fwd_differ", "0"),
        r"at \$\.results\.rlnorm\.batch_invariance\.all_rows\.7\.fwd_differ: '0' is not of type 'integer'",
    ),
    "fraction above one": (
        _set(R + "accuracy_latency.fwd_correctly_rounded", 1.5),
        r"at \$\.results\.rlnorm\.accuracy_latency\.fwd_correctly_rounded: 1\.5 is greater than",
    ),
    "unknown status": (_set(R + "status", "ok"), r"at \$\.results\.rlnorm\.status: 'ok' is not one of"),
    "skipped without a reason": (
        _set(R + "status", "skipped"),
        r"at \$\.results\.rlnorm\.skip_reason: None is not of type 'string'",
    ),
    "failed step without its traceback": (
        _set("failed_steps", [{"step": "plots", "error": "RuntimeError: x"}]),
        r"at \$\.failed_steps\[0\]: 'traceback' is a required property",
    ),
    "bad commit": (_set("commit", "not-a-hash"), r"at \$\.commit: 'not-a-hash' does not match"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_schema_catches_planted_fault_and_names_the_key(fault: str) -> None:
    doc = built()
    validate_artifact(doc)  # clean before the fault
    plant, where = FAULTS[fault]
    plant(doc)
    with pytest.raises(ArtifactValidationError, match=where) as info:
        validate_artifact(doc)
    assert info.value.problems


@pytest.mark.parametrize("fault", ["misspelled backend field", "count as a string", "missing top-level key"])
def test_reader_catches_planted_fault_in_a_file(tmp_path: Path, fault: str) -> None:
    doc = built()
    FAULTS[fault][0](doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactValidationError, match=r"bad\.json"):
        load_artifact(path)


def test_planted_fault_in_the_seed_report_is_caught(tmp_path: Path) -> None:
    raw = json.loads(SEED.read_text())
    raw["results"]["vllm"]["accuracy_latency"]["fwd_us"] = "87 us"
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"seed\.json.*results\.vllm\.accuracy_latency\.fwd_us"):
        load_artifact(path)


# ---------------------------------------------------------------------------------------------
# atomic, non-clobbering writes


def test_write_replaces_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid document is never written; a valid one replaces the file whole, or leaves it as it was."""
    path, invalid = tmp_path / "artifact.json", built()
    del invalid["results"]["rlnorm"]["status"]
    with pytest.raises(ArtifactValidationError, match="status"):
        write_artifact(invalid, path)
    assert not list(tmp_path.iterdir())
    write_artifact(built(param_set="first"), path)
    write_artifact(built(), path)
    before = path.read_bytes()
    assert load_artifact(path).param_set == "quick"

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_artifact(built(param_set="second"), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["artifact.json"]


def test_a_check_that_raised_keeps_its_error_in_the_artifact() -> None:
    """A check's own `error` beside what it measured is valid; an all_rows key that is neither is a fault."""
    backend = _ran_backend()
    backend["batch_invariance"]["all_rows"]["error"] = "RuntimeError: boom"
    backend["batch_invariance"]["full_vs_sub_batches"]["error"] = "RuntimeError: boom"
    backend["accuracy_latency"]["error"] = "RuntimeError: boom"
    backend["errors"] = {"all_rows": "RuntimeError: boom"}
    doc = built(results={"rlnorm": backend})
    validate_artifact(doc)
    doc["results"]["rlnorm"]["batch_invariance"]["all_rows"]["64 "] = {"rows": 1, "fwd_differ": 0, "rowgrad_differ": 0}
    with pytest.raises(ArtifactValidationError, match=r"all_rows: '64 ' does not match"):
        validate_artifact(doc)
