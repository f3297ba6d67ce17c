"""The artifact: the seed report and our artifacts load into one validated shape; the schema catches
planted faults by key path; writes are atomic and never clobber a run."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlnorm.checkout import seed_report_path
from rlnorm.kit import artifact as art
from rlnorm.kit.artifact import (
    SCHEMA_VERSION,
    ArtifactValidationError,
    build_artifact,
    normalize_artifact,
    read_artifact,
    validate_artifact,
    write_artifact,
)
from rlnorm.kit.environment import collect_environment

SEED = seed_report_path()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _ran_backend(backward: str = "full") -> dict[str, Any]:
    return {
        "source": "rlnorm 0.1.0 Triton",
        "backward": backward,
        "status": "ran",
        "skip_reason": None,
        "batch_invariance": {
            "all_rows": {"7": {"rows": 21, "fwd_differ": 0, "rowgrad_differ": 0}},
            "dweight_repeatable": True,
            "full_vs_sub_batches": {
                "full_batch": 257,
                "sub_batch_sizes": [1, 7],
                "sub_batches": 294,
                "fwd_differ": 0,
                "rowgrad_differ": 0,
                "coverage": "every_row",
            },
            "batch_size_sweep": {"batch_sizes": [1, 2], "probe_rows": [0], "comparisons": 6, "differ": 0},
            "batch_invariant": True,
        },
        "accuracy_latency": {
            "rows": 257,
            "fwd_correctly_rounded": 1.0,
            "fwd_max_abs_err": 0.0078125,
            "fwd_us": None,
            "grad_rel_err": {"x": 0.002, "z": 0.002, "w": 0.001},
            "fwd_bwd_us": None,
            "fwd_ulp_hist": {"0": 257 * 128, "1": 0, "16+": 0, "nan": 0},
            "fwd_abs_err_hist": {"edges": [1e-6, 1e-3, 1.0], "counts": [3, 4], "zero": 100},
            "device": "cpu",
            "timed": False,
        },
        "contract_gates": {
            "forward": {
                "returncode": 0,
                "passed": True,
                "failed_lines": [],
                "singleton_aggregate": [],
                "stderr_tail": [],
                "timed_out": False,
                "lines": ["forward ok"],
            },
            "gradient": {
                "returncode": 0,
                "passed": True,
                "failed_lines": [],
                "singleton_aggregate": [
                    "singleton_aggregate pair=('BN/full', 'B1') tensor=dweight max_abs=0 passed=True"
                ],
                "stderr_tail": [],
                "timed_out": False,
                "lines": [],
            },
        },
        "errors": {},
    }


def built(tmp_path: Path | None = None, **overrides: Any) -> dict[str, Any]:
    """A small artifact as the runner builds it on this machine: one backend ran, one skipped."""
    results = {
        "rlnorm": _ran_backend(),
        "vllm": {
            "source": "vLLM RMSNormGated.forward_cuda",
            "backward": "none",
            "status": "skipped",
            "skip_reason": "vllm is not installed",
        },
    }
    kwargs: dict[str, Any] = {
        "params": {"param_set": "quick", "n_all_rows": [7], "seeds": [3], "coverage": "every_row"},
        "environment": collect_environment("cpu"),
        "results": results,
        "agreement": {"tensor": "y", "rows": 7, "seed": 11, "backends": ["rlnorm"], "equal_fraction": [[1.0]]},
        "records_path": "records.csv",
        "plots": {"latency": "plots/latency.png"},
        "quick": True,
        "checks": ["all_rows", "accuracy_latency"],
        "commit": COMMIT,
        "dirty": False,
    }
    kwargs.update(overrides)
    return build_artifact(**kwargs)


def _raw_seed() -> dict[str, Any]:
    return json.loads(SEED.read_text())


def _contains(big: Any, small: Any, where: str = "$") -> None:
    """Every key and value of `small` is in `big` unchanged."""
    if isinstance(small, dict):
        assert isinstance(big, dict), where
        for k, v in small.items():
            assert k in big, f"{where}.{k} lost"
            _contains(big[k], v, f"{where}.{k}")
    else:
        assert big == small, where


# ---------------------------------------------------------------------------------------------
# the seed report


def test_seed_report_loads_unchanged_plus_the_new_fields() -> None:
    doc = read_artifact(SEED)
    raw = _raw_seed()
    _contains(doc, raw)  # nothing of the report is lost or altered
    assert doc["schema_version"] == "seed"
    assert doc["commit"] == raw["rl_kernel_commit"]
    for key in ("params", "param_set", "records", "plots", "agreement", "created_at", "wall_time_s"):
        assert doc[key] is None, key
    assert doc["environment"]["python"] is None and doc["environment"]["megatron_source_commit"] == "52fbcbc"
    for key, entry in doc["results"].items():
        assert entry["status"] == "ran" and entry["skip_reason"] is None and entry["errors"] is None, key
    assert doc["results"]["reference"]["contract_gates"] is None  # the report ran no gates for it
    assert doc["results"]["vllm"]["accuracy_latency"]["fwd_bwd_us"] is None  # forward only
    assert doc["results"]["fla_fused_norm_gate"]["batch_invariance"]["full_vs_sub_batches"]["fwd_differ"] == 95
    assert doc["results"]["rl_kernel"]["contract_gates"]["gradient"]["timed_out"] is None


def test_normalizing_is_idempotent_and_leaves_the_input_alone() -> None:
    raw = _raw_seed()
    once = normalize_artifact(raw)
    assert raw == _raw_seed()
    assert normalize_artifact(once) == once
    ours = built()
    assert normalize_artifact(ours) == ours


def test_seed_and_built_artifacts_share_one_shape(tmp_path: Path) -> None:
    seed = read_artifact(SEED)
    ours = built()
    assert list(seed) == list(ours)
    assert set(seed["environment"]) - {"megatron_source_commit"} <= set(ours["environment"])
    assert list(seed["results"]["rl_kernel"]) == list(ours["results"]["rlnorm"])
    seed_acc = seed["results"]["rl_kernel"]["accuracy_latency"]
    assert set(seed_acc) == set(ours["results"]["rlnorm"]["accuracy_latency"])
    # every key of the raw report, at every level where ours has the same object
    raw = _raw_seed()
    assert set(raw) <= set(ours)
    assert set(raw["environment"]) - {"megatron_source_commit"} <= set(ours["environment"])
    assert set(raw["environment"]["libraries"]) <= set(ours["environment"]["libraries"])
    assert set(raw["results"]["rl_kernel"]) <= set(ours["results"]["rlnorm"])


def test_raw_seed_report_needs_the_reader() -> None:
    with pytest.raises(ArtifactValidationError, match="schema_version"):
        validate_artifact(_raw_seed())
    validate_artifact(normalize_artifact(_raw_seed()))


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    doc = built()
    doc["schema_version"] = "99"
    path = tmp_path / "future.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="schema_version '99'"):
        read_artifact(path)


# ---------------------------------------------------------------------------------------------
# the built artifact


def test_built_artifact_has_every_field_and_round_trips(tmp_path: Path) -> None:
    doc = built()
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["commit"] == COMMIT and doc["rl_kernel_commit"] is None and doc["tracked_tree_dirty"] is False
    assert doc["param_set"] == "quick" and doc["quick"] is True
    assert doc["created_at"].endswith("+00:00")
    vllm = doc["results"]["vllm"]
    assert vllm["status"] == "skipped" and vllm["skip_reason"] == "vllm is not installed"
    assert vllm["batch_invariance"] is None and vllm["errors"] == {}
    path = write_artifact(doc, tmp_path / "run" / "artifact.json")
    assert read_artifact(path) == doc


def test_paths_are_stored_relative_to_the_artifact_folder(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "r1"
    doc = built(records_path=run / "records.csv", plots={"latency": run / "png" / "latency.png"}, base_dir=run)
    assert doc["records"] == "records.csv" and doc["plots"] == {"latency": "png/latency.png"}
    assert art.resolve_path(run / "artifact.json", doc["records"]) == (run / "records.csv").resolve()
    with pytest.raises(ValueError, match=r"records_path.*absolute"):
        built(records_path=run / "records.csv")
    doc = built()
    doc["records"] = "/abs/records.csv"
    with pytest.raises(ArtifactValidationError, match=r"\$\.records"):
        validate_artifact(doc)


def test_numpy_values_and_non_finite_numbers_become_json() -> None:
    backend = _ran_backend()
    backend["accuracy_latency"]["fwd_max_abs_err"] = np.float32(0.5)
    backend["accuracy_latency"]["rows"] = np.int64(257)
    backend["accuracy_latency"]["fwd_us"] = float("nan")
    backend["batch_invariance"]["batch_invariant"] = np.bool_(True)
    doc = built(results={"rlnorm": backend})
    acc = doc["results"]["rlnorm"]["accuracy_latency"]
    assert acc["fwd_max_abs_err"] == 0.5 and type(acc["rows"]) is int and acc["fwd_us"] is None
    assert doc["results"]["rlnorm"]["batch_invariance"]["batch_invariant"] is True
    json.dumps(doc, allow_nan=False)


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(TypeError, match="quick"):
        built(quick="yes")
    with pytest.raises(TypeError, match="checks"):
        built(checks="all_rows")
    with pytest.raises(TypeError, match="results"):
        built(results=[1])


# ---------------------------------------------------------------------------------------------
# planted faults: each is caught, and the message names where


def _plant(doc: dict[str, Any], fault: str) -> str:
    """Apply one fault; return the key path the error must name."""
    r = doc["results"]["rlnorm"]
    if fault == "missing top-level key":
        del doc["environment"]
        return r"at \$: 'environment' is a required property"
    if fault == "wrong top-level type":
        doc["quick"] = "false"
        return r"at \$\.quick: 'false' is not of type 'boolean'"
    if fault == "misspelled backend field":
        r["batch_invarance"] = r.pop("batch_invariance")
        return r"at \$\.results\.rlnorm: .*'batch_invarance' was unexpected"
    if fault == "misspelled accuracy field":
        r["accuracy_latency"]["fwd_correct_rounded"] = r["accuracy_latency"].pop("fwd_correctly_rounded")
        return r"at \$\.results\.rlnorm\.accuracy_latency: 'fwd_correctly_rounded' is a required property"
    if fault == "count as a string":
        r["batch_invariance"]["all_rows"]["7"]["fwd_differ"] = "0"
        return r"at \$\.results\.rlnorm\.batch_invariance\.all_rows\.7\.fwd_differ: '0' is not of type 'integer'"
    if fault == "fraction above one":
        r["accuracy_latency"]["fwd_correctly_rounded"] = 1.5
        return r"at \$\.results\.rlnorm\.accuracy_latency\.fwd_correctly_rounded: 1\.5 is greater than"
    if fault == "unknown status":
        r["status"] = "ok"
        return r"at \$\.results\.rlnorm\.status: 'ok' is not one of"
    if fault == "skipped without a reason":
        r["status"] = "skipped"
        return r"at \$\.results\.rlnorm\.skip_reason: None is not of type 'string'"
    if fault == "missing library":
        del doc["environment"]["libraries"]["vllm"]
        return r"at \$\.environment\.libraries: 'vllm' is a required property"
    if fault == "gate without returncode":
        del r["contract_gates"]["gradient"]["returncode"]
        return r"at \$\.results\.rlnorm\.contract_gates\.gradient: 'returncode' is a required property"
    if fault == "bad commit":
        doc["commit"] = "not-a-hash"
        return r"at \$\.commit: 'not-a-hash' does not match"
    raise AssertionError(fault)


FAULTS = [
    "missing top-level key",
    "wrong top-level type",
    "misspelled backend field",
    "misspelled accuracy field",
    "count as a string",
    "fraction above one",
    "unknown status",
    "skipped without a reason",
    "missing library",
    "gate without returncode",
    "bad commit",
]


@pytest.mark.parametrize("fault", FAULTS)
def test_schema_catches_planted_fault_and_names_the_key(fault: str) -> None:
    doc = built()
    validate_artifact(doc)  # clean before the fault
    where = _plant(doc, fault)
    with pytest.raises(ArtifactValidationError, match=where) as info:
        validate_artifact(doc)
    assert info.value.problems


@pytest.mark.parametrize("fault", ["misspelled backend field", "count as a string", "missing top-level key"])
def test_reader_catches_planted_fault_in_a_file(tmp_path: Path, fault: str) -> None:
    doc = built()
    _plant(doc, fault)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactValidationError, match=r"bad\.json"):
        read_artifact(path)
    read_artifact(path, validate=False)  # still loadable for salvage


def test_planted_fault_in_the_seed_report_is_caught(tmp_path: Path) -> None:
    raw = _raw_seed()
    raw["results"]["vllm"]["accuracy_latency"]["fwd_us"] = "87 us"
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ArtifactValidationError, match=r"results\.vllm\.accuracy_latency\.fwd_us"):
        read_artifact(path)


def test_build_refuses_an_invalid_result() -> None:
    backend = _ran_backend()
    backend["backward"] = True
    with pytest.raises(ArtifactValidationError, match=r"results\.rlnorm\.backward"):
        built(results={"rlnorm": backend})


# ---------------------------------------------------------------------------------------------
# atomic, non-clobbering writes


class _Explodes:
    """Serializes to nothing: json.dump fails on it after writing what came before."""


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_refuses_to_overwrite_unless_told(tmp_path: Path) -> None:
    path = tmp_path / "artifact.json"
    write_artifact(built(), path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_artifact(built(), path)
    assert path.read_bytes() == before
    doc = built(param_set="second")
    write_artifact(doc, path, overwrite=True)
    assert read_artifact(path)["param_set"] == "second"
    assert _leftovers(tmp_path) == ["artifact.json"]


def test_failed_serialization_leaves_no_partial_file(tmp_path: Path) -> None:
    doc = built()
    # params is free-form, so the schema lets an unserializable value through to json.dump,
    # which fails midway: after the keys before "params" are already written to the temp file
    doc["params"]["big"] = ["x" * 1000] * 2000
    doc["params"]["zz_bad"] = _Explodes()
    path = tmp_path / "artifact.json"
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_artifact(doc, path)
    assert _leftovers(tmp_path) == []
    # over an existing file: the old one survives whole
    write_artifact(built(), path)
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_artifact(doc, path, overwrite=True)
    assert path.read_bytes() == before and _leftovers(tmp_path) == ["artifact.json"]


def test_nan_is_refused_at_write_time_not_written_as_invalid_json(tmp_path: Path) -> None:
    doc = built()
    doc["params"]["x"] = math.nan
    with pytest.raises(ValueError, match="Out of range float"):
        write_artifact(doc, tmp_path / "a.json")
    assert _leftovers(tmp_path) == []


def test_invalid_document_is_not_written(tmp_path: Path) -> None:
    doc = built()
    del doc["results"]["rlnorm"]["status"]
    with pytest.raises(ArtifactValidationError, match="status"):
        write_artifact(doc, tmp_path / "a.json")
    assert _leftovers(tmp_path) == []
    write_artifact(doc, tmp_path / "a.json", validate=False)  # salvage path
    assert (tmp_path / "a.json").exists()


def test_write_is_atomic_against_a_crash_before_the_move(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "artifact.json"

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_artifact(built(), path)
    assert _leftovers(tmp_path) == []


def test_schema_ships_with_the_package() -> None:
    schema = art.load_schema()
    assert schema["$schema"].startswith("https://json-schema.org/draft/2020-12")
    assert set(schema["required"]) == set(built())
    doc = copy.deepcopy(built())
    validate_artifact(doc)


def test_a_check_that_raised_keeps_its_error_in_the_artifact() -> None:
    """The runner stores a check's own `error` beside what it measured; the schema accepts that."""
    backend = _ran_backend()
    backend["batch_invariance"]["all_rows"]["error"] = "RuntimeError: boom"
    backend["batch_invariance"]["full_vs_sub_batches"]["error"] = "RuntimeError: boom"
    backend["accuracy_latency"]["error"] = "RuntimeError: boom"
    backend["errors"] = {"all_rows": "RuntimeError: boom"}
    doc = built(results={"rlnorm": backend}, agreement={"error": "ValueError: no backends"})
    assert doc["agreement"] == {"error": "ValueError: no backends"}
    # but an all_rows key that is neither a size nor `error` is a fault
    doc["results"]["rlnorm"]["batch_invariance"]["all_rows"]["64 "] = {"rows": 1, "fwd_differ": 0, "rowgrad_differ": 0}
    with pytest.raises(ArtifactValidationError, match=r"all_rows: '64 ' does not match"):
        validate_artifact(doc)


def test_a_skip_without_a_reason_says_so() -> None:
    doc = built(results={"vllm": {"source": "vLLM", "backward": "none", "status": "skipped", "skip_reason": ""}})
    assert doc["results"]["vllm"]["skip_reason"] == "no reason given"
    backend = _ran_backend()
    backend["skip_reason"] = ""
    assert built(results={"rlnorm": backend})["results"]["rlnorm"]["skip_reason"] is None
