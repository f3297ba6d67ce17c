"""Run parameters: a file holds what differs from the defaults, the notebook's cell gives a file and overrides, and
every unknown, ill-typed or out-of-range parameter stops the run with a message naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlnorm.kit.params import CLI_KEYS, ParamsError, RunParams, load_params, params_from_namespace


def test_the_notebook_cell_gives_a_file_overrides_and_injected_names(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # a relative parameter file is found in the checkout, as from notebooks/
    cell = {
        "params_file": "params/quick.yaml",
        "overrides": {"d": 256},
        "name": "",
        "output_dir": "",
        "overwrite": False,
    }
    p = params_from_namespace({"before": 1, **cell}, {"before"})
    assert (p.name, p.params_file, p.d, p.sub_batches_rows) == ("quick", "params/quick.yaml", 256, 65)
    # papermill -p coverage sampled -p name other: one more override, and the cell's name
    p = params_from_namespace({**cell, "coverage": "sampled", "name": "other"}, set())
    assert (p.coverage, p.name, p.d) == ("sampled", "other", 256)
    with pytest.raises(ParamsError, match=r"coverge: unknown parameter \(did you mean 'coverage'\?\)"):
        params_from_namespace({**cell, "coverge": "sampled"}, set())
    with pytest.raises(ParamsError, match="overrides: expected a mapping"):
        params_from_namespace({**cell, "overrides": [("d", 256)]}, set())
    assert params_from_namespace({**cell, "params_file": ""}, set()).sub_batches_rows == 262144  # no file: defaults


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("all_rows_sizes", [7, "64"], "a list of an int"), ("progress", "yes", "a bool"), ("d", True, "an int"),
        ("eps", "1e-6", "a number"),  # YAML reads 1e-6 (no dot) as a string
        ("group_size", 1.5, "an int or null"), ("backends", "rlnorm", "a list of a string"),
        ("device", "tpu", "one of"), ("checks", ["all_rows", "speed"], "names from"),
        ("custom_backends", ["no_colon_here"], "'package.module:attr'"),
        ("sub_batch_sizes", [1, 10**9], "sizes no larger than sub_batches_rows"),
        ("sweep_probe_rows", [0, 4097], "a non-empty list of rows in [0, sweep_n=4097)"),
        ("group_size", 48, "null or a positive divisor of d=128"), ("name", "../escape", "a folder name"),
        ("timing_iters", 0, "a positive int"),
        ("eps", -1e-6, "a number >= 0"),  # 0 is allowed: the kernel takes it (an all-zero row is NaN, as the peers')
        ("sweep_seeds", [-3], "a non-empty list of seeds >= 0"),
    ],
)  # fmt: skip
def test_a_bad_parameter_is_named_with_what_was_expected(key: str, value: object, expected: str) -> None:
    with pytest.raises(ParamsError) as info:
        load_params({key: value})
    assert f"{key}: expected {expected}" in str(info.value)


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    """A wrong type, a value out of range and an unknown name: one message names all three."""
    f = tmp_path / "p.yaml"
    f.write_text("d: wide\ndevice: gpu\ncoverge: all\neps: -1.0\n")
    with pytest.raises(ParamsError) as err:
        load_params(f)
    for expected in ("d: expected an int, got 'wide'", "device: expected one of", "coverge: unknown parameter",
                     "eps: expected a number >= 0"):  # fmt: skip
        assert expected in str(err.value)


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
    f.write_text("coverage: sampled\neps: 1.0e-5\n")
    p = load_params(f, device="cpu")
    assert (p.name, p.coverage, p.eps, p.device) == ("p", "sampled", 1e-5, "cpu")  # named after its file
    assert p.params_file == str(f)
    assert p.run_dir.parts[-2:] == ("outputs", "p")
    assert load_params({"output_dir": "elsewhere/r"}).run_dir == Path("elsewhere/r")
    assert p.op_options().eps == 1e-5
    assert load_params({}) == RunParams()


@pytest.mark.parametrize("key", CLI_KEYS)
def test_a_parameter_file_cannot_say_where_its_run_goes(tmp_path: Path, key: str) -> None:
    """Where a run goes is the command line's business: a copied file that says it misstates its run."""
    f = tmp_path / "copied.yaml"
    f.write_text(f"name: mine\n{key}: {'true' if key == 'overwrite' else 'somewhere'}\n")
    with pytest.raises(ParamsError, match=rf"{key}: set by `python -m rlnorm run`, not by a parameter file"):
        load_params(f)
    assert load_params({key: True if key == "overwrite" else "x"})  # the command line and papermill may
