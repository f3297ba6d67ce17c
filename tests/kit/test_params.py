"""Run parameters: defaults are the full protocol (docs/spec.md §4), the parameter files are complete and valid, and
every unknown or ill-typed parameter stops the run with a message naming it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from rlnorm.kit.params import (
    ALL_BACKENDS,
    ALL_CHECKS,
    CLI_KEYS,
    DEFAULT_SWEEP_PROBE_ROWS,
    DEFAULT_SWEEP_SIZES,
    ParamsError,
    RunParams,
    load_params,
)

PARAMS_DIR = REPO_ROOT / "params"
FIELDS = [f.name for f in dataclasses.fields(RunParams)]
USER_FIELDS = [f for f in FIELDS if f not in CLI_KEYS]  # what a parameter file may set


def test_defaults_are_the_spec_protocol() -> None:
    p = RunParams()
    assert p.all_rows_sizes == [64, 257, 4097] and p.all_rows_seeds == [3, 4, 5]
    assert p.sub_batches_rows == 262144 and p.sub_batch_sizes == [1, 7, 4097, 65536, 131072]
    assert p.coverage == "all"
    assert len(DEFAULT_SWEEP_SIZES) == 36 and DEFAULT_SWEEP_SIZES[-1] == 4097
    assert DEFAULT_SWEEP_PROBE_ROWS == [0, 515, 1027, 1539, 2051, 2563, 3075, 4096]
    assert p.accuracy_rows == 262144 and p.accuracy_seed == 11
    assert p.backends == ALL_BACKENDS and p.checks == ALL_CHECKS


@pytest.mark.parametrize("name", ["quick", "full", "seed", "kernel"])
def test_parameter_files_are_complete_and_valid(name: str) -> None:
    path = PARAMS_DIR / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    assert sorted(data) == sorted(USER_FIELDS), "a parameter file lists every parameter it may set"
    p = load_params(path)
    assert p.name == name and p.params_file == f"params/{name}.yaml"


def test_full_is_the_protocol_and_seed_only_samples() -> None:
    full, seed = load_params(PARAMS_DIR / "full.yaml"), load_params(PARAMS_DIR / "seed.yaml")
    protocol = {k: v for k, v in RunParams().as_dict().items() if k not in ("name", "params_file")}
    assert {k: v for k, v in full.as_dict().items() if k in protocol} == protocol
    diff = {k for k in FIELDS if getattr(full, k) != getattr(seed, k)}
    assert diff == {"name", "params_file", "coverage"} and seed.coverage == "sampled"
    # kernel.yaml: the same protocol on the kernel and one same-run peer
    kernel = load_params(PARAMS_DIR / "kernel.yaml")
    diff = {k for k in FIELDS if getattr(full, k) != getattr(kernel, k)}
    assert diff == {"name", "params_file", "backends"} and kernel.backends == ["rlnorm", "fla_fused_norm_gate"]


def test_notebook_parameters_cell_is_quick_yaml(repo_root: Path) -> None:
    """The notebook run by hand (no papermill) does what params/quick.yaml does."""
    import jupytext

    nb = jupytext.read(repo_root / "notebooks" / "reuse_check.py")
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1
    literals = {}
    for node in ast.parse(cells[0].source).body:
        assert isinstance(node, ast.Assign), "the parameters cell holds plain assignments only"
        literals[node.targets[0].id] = ast.literal_eval(node.value)
    assert literals == load_params(PARAMS_DIR / "quick.yaml").as_dict()
    assert set(literals) == set(FIELDS), "the command line's keys too: papermill injects them"


def test_unknown_parameter_is_named_with_a_suggestion() -> None:
    with pytest.raises(ParamsError, match=r"coverge: unknown parameter \(did you mean 'coverage'\?\)"):
        load_params({"coverge": "sampled"})


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("all_rows_sizes", [7, "64"], "a list of an int"),
        ("progress", "yes", "a bool"),
        ("d", True, "an int"),
        ("eps", "1e-6", "a number"),  # YAML reads 1e-6 (no dot) as a string
        ("group_size", 1.5, "an int or null"),
        ("backends", "rlnorm", "a list of a string"),
        ("timing_iters", 2.0, "an int"),
    ],
)
def test_ill_typed_parameter_is_named(key: str, value: object, expected: str) -> None:
    with pytest.raises(ParamsError) as info:
        load_params({key: value})
    assert f"{key}: expected {expected}, got {value!r}" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("device", "tpu"),
        ("coverage", "some"),
        ("activation", "relu"),
        ("weight_dtype", "float64"),
        ("backends", ["rlnorm", "cudnn"]),
        ("checks", ["all_rows", "speed"]),
        ("custom_backends", ["no_colon_here"]),
        ("sub_batch_sizes", [1, 10**9]),
        ("sweep_probe_rows", [0, 4097]),
        ("group_size", 48),
        ("name", "../escape"),
        ("timing_iters", 0),
        ("eps", -1e-6),  # 0 is allowed: the kernel takes it (an all-zero row is NaN, as in the peers)
    ],
)
def test_out_of_range_parameter_is_named(key: str, value: object) -> None:
    with pytest.raises(ParamsError, match=rf"^invalid run parameters:\n  {key}: expected"):
        load_params({key: value})


def test_all_errors_are_reported_at_once() -> None:
    with pytest.raises(ParamsError) as info:
        load_params({"bogus": 1, "seeds": [1], "progress": 3})
    msg = str(info.value)
    assert (
        "bogus: unknown parameter" in msg and "seeds: unknown parameter" in msg and "progress: expected a bool" in msg
    )


def test_yaml_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ParamsError, match=r"bad\.yaml.*expected a mapping"):
        load_params(bad)
    with pytest.raises(ParamsError, match="cannot be read"):
        load_params(tmp_path / "missing.yaml")
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


def test_overrides_and_derived_values(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("name: mine\ncoverage: sampled\neps: 1.0e-5\n")
    p = load_params(f, device="cpu")
    assert (p.name, p.coverage, p.eps, p.device) == ("mine", "sampled", 1e-5, "cpu")
    assert p.params_file == str(f)
    assert p.run_dir.parts[-2:] == ("outputs", "mine")
    assert load_params({"output_dir": "elsewhere/r"}).run_dir == Path("elsewhere/r")
    assert p.op_options().eps == 1e-5
    assert p.resolved_device() == "cpu"
    assert load_params({}).as_dict() == RunParams().as_dict()


def test_cuda_without_a_gpu_is_refused() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ParamsError, match="device: 'cuda' was asked for"):
        load_params({"device": "cuda"}).resolved_device()
    assert load_params({"device": "auto"}).resolved_device() == "cpu"


def test_params_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunParams().name = "x"  # type: ignore[misc]


@pytest.mark.parametrize("key", CLI_KEYS)
def test_a_parameter_file_cannot_say_where_its_run_goes(tmp_path: Path, key: str) -> None:
    """Where a run goes is the command line's business: a copied file that says it misstates its run."""
    f = tmp_path / "copied.yaml"
    f.write_text(f"name: mine\n{key}: {'true' if key == 'overwrite' else 'somewhere'}\n")
    with pytest.raises(ParamsError, match=rf"{key}: set by `python -m rlnorm run`, not by a parameter file"):
        load_params(f)
    assert load_params({key: True if key == "overwrite" else "x"})  # the command line and papermill may


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    """A wrong type, a value out of range and an unknown name: one message names all three."""
    f = tmp_path / "p.yaml"
    f.write_text("d: wide\ndevice: gpu\ncoverge: all\neps: -1.0\n")
    with pytest.raises(ParamsError) as err:
        load_params(f)
    text = str(err.value)
    for expected in ("d: expected an int, got 'wide'", "device: expected one of", "coverge: unknown parameter",
                     "eps: expected a number >= 0"):  # fmt: skip
        assert expected in text, text


def test_a_negative_seed_is_named_with_every_other_error() -> None:
    seeds = {"all_rows_seeds": [3, -1], "sub_batches_seeds": [-2], "sweep_seeds": [-3]}
    seeds.update(dweight_seed=-1, accuracy_seed=-4, agreement_seed=-5)
    with pytest.raises(ParamsError) as info:
        load_params({**seeds, "timing_iters": 0})
    msg = str(info.value)
    for key in seeds:
        assert f"{key}: expected" in msg, key
    assert "timing_iters: expected a positive int" in msg
    assert load_params({"dweight_seed": 0, "sweep_seeds": [0]}).dweight_seed == 0
