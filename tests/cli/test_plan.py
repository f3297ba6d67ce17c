"""From parameter files and overrides to runs: papermill's -p / -y conventions, matrices, and every problem of every
file reported at once, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlnorm.cli import main
from rlnorm.cli.plan import PlanError, combination_name, expand
from rlnorm.cli.runs import EXIT_USAGE
from rlnorm.kit.params import params_from_namespace


def _file(tmp_path: Path, stem: str = "p", **values: object) -> str:
    f = tmp_path / f"{stem}.yaml"
    f.write_text(yaml.safe_dump({"device": "cpu", **values}, sort_keys=False))
    return str(f)


def test_overrides_apply_in_papermill_order(tmp_path: Path) -> None:
    f = _file(tmp_path, d=128, activation="silu", eps=1e-6)
    plan = expand([f], "{d: 256, eps: 1.0e-5}", [("d", "64")], outputs=tmp_path / "o")
    (run,) = plan.runs
    assert (run.params.d, run.params.eps, run.params.activation) == (64, 1e-5, "silu"), "-p over -y over the file"
    assert run.folder == tmp_path / "o" / "p" and not plan.matrices, "no list: one run, named from the file"


def test_a_list_for_a_one_value_key_is_a_matrix(tmp_path: Path) -> None:
    f = _file(tmp_path, "grid", d=[128, 256], activation=["silu", "sigmoid"], backends=["reference"])
    plan = expand([f], outputs=tmp_path / "o")
    names = [r.folder.name for r in plan.runs]
    assert names == ["d-128_activation-silu", "d-128_activation-sigmoid", "d-256_activation-silu",
                     "d-256_activation-sigmoid"]  # fmt: skip
    assert {r.folder.parent for r in plan.runs} == {tmp_path / "o" / "grid"}
    assert [(r.params.d, r.params.activation) for r in plan.runs][1] == (128, "sigmoid")
    assert all(r.params.backends == ["reference"] for r in plan.runs), "a list-valued key stays a value"
    assert list(plan.matrices) == [tmp_path / "o" / "grid"]
    assert combination_name({"weight_dtype": "float32", "group_size": None}) == "weight_dtype-float32_group_size-null"


def test_every_problem_of_every_run_is_named_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _file(tmp_path, "bad", d=[128, "wide"], coverge="all", device="gpu", progress=3)
    assert main(["run", bad, "--outputs", str(tmp_path / "o")]) == EXIT_USAGE
    err = capsys.readouterr().err
    for expected in ("coverge: unknown parameter (did you mean 'coverage'?)", "progress: expected a bool",
                     "device: expected one of", "(d-wide): d: expected an int"):  # fmt: skip
        assert expected in err, err
    assert not (tmp_path / "o").exists(), "nothing ran"


@pytest.mark.parametrize("key", ["output_dir", "staging_dir", "params_file", "overwrite"])
def test_where_a_run_goes_is_not_a_parameter(tmp_path: Path, key: str) -> None:
    with pytest.raises(PlanError, match=f"{key}: set by the command line"):
        expand([_file(tmp_path)], overrides=[(key, "x")])


def test_runs_that_would_share_a_folder_are_refused(tmp_path: Path) -> None:
    a, b = _file(tmp_path, "a", name="same"), _file(tmp_path, "b", name="same")
    with pytest.raises(PlanError, match="two runs would write the same folder"):
        expand([a, b], outputs=tmp_path / "o")
    with pytest.raises(PlanError, match="an empty list gives no run"):
        expand([_file(tmp_path, d=[])])


def test_list_only_and_no_guessed_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _file(tmp_path, "grid", d=[128, 256], weight_dtype=["bfloat16", "float32"])
    assert main(["run", f, "--outputs", str(tmp_path / "o"), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[3].startswith("3\t")
    assert lines[3].split("\t")[1].endswith("d-256_weight_dtype-float32")
    assert main(["run", f, "--only", "4"]) == EXIT_USAGE
    assert "--only: expected 0..3" in capsys.readouterr().err
    assert main(["run", f, "--d", "256"]) == EXIT_USAGE  # not `--device 256`: refused, not guessed
    assert "unrecognized arguments: --d 256" in capsys.readouterr().err
    assert not (tmp_path / "o").exists(), "nothing ran"


def test_the_notebook_is_given_its_file_and_what_differs_from_it(tmp_path: Path) -> None:
    """What the notebook's parameters cell receives makes the very run the command line planned."""
    f = _file(tmp_path, "grid", d=[128, 256], timing_iters=3)
    plan = expand([f], "{eps: 1.0e-5}", outputs=tmp_path / "o")
    for run in plan.runs:
        given = run.notebook_parameters()
        assert given["params_file"] == f and given["name"] == run.folder.name
        assert given["overrides"] == {"d": run.params.d, "eps": 1e-5}  # the file has the rest (device: cpu)
        again = params_from_namespace({**given, "output_dir": str(run.folder)}, set())
        assert again == run.params
