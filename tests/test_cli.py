"""The command line: refuses to overwrite a run, names a failing cell (and keeps the partial
notebook), replaces a run atomically with --force, validates artifacts and parameter files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
import yaml

from rlnorm import cli
from rlnorm.checkout import seed_report_path

SEED_REPORT = seed_report_path()

# a stand-in for notebooks/reuse_check.py: the same parameters cell contract, tiny work
TOY_NOTEBOOK = """# %% [markdown]
# # toy

# %% Setup
import os
from pathlib import Path

# %% Parameters tags=["parameters"]
name = "toy"
output_dir = ""
staging_dir = ""
explode = False

# %% Write a file
Path(staging_dir, "result.txt").write_text(f"{name} TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}")

# %% Explode on request
if explode:
    raise RuntimeError("planted failure")
"""


@pytest.fixture
def toy_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "toy.py"
    src.write_text(TOY_NOTEBOOK)
    monkeypatch.setattr(cli, "notebook_source", lambda name=cli.NOTEBOOK: src)
    return src


def _params(tmp_path: Path, **values: object) -> Path:
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"name": "tiny", "device": "cpu", "progress": False, **values}))
    return f


def test_refuses_to_overwrite_an_existing_run(tmp_path: Path, outputs_dir: Path, capsys) -> None:
    existing = outputs_dir / "tiny"
    existing.mkdir()
    (existing / "keep.txt").write_text("previous run")
    rc = cli.main(["run", str(_params(tmp_path)), "--outputs", str(outputs_dir)])
    assert rc == cli.EXIT_EXISTS
    err = capsys.readouterr().err
    assert "already exists" in err and "--force" in err
    assert (existing / "keep.txt").read_text() == "previous run"
    assert sorted(p.name for p in outputs_dir.iterdir()) == ["tiny"]


def test_bad_parameters_stop_before_any_work(tmp_path: Path, outputs_dir: Path, capsys) -> None:
    rc = cli.main(["run", str(_params(tmp_path, coverge="all", progress=3)), "--outputs", str(outputs_dir)])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_USAGE
    assert "coverge: unknown parameter (did you mean 'coverage'?)" in err and "progress: expected a bool" in err
    assert not any(outputs_dir.iterdir())


def test_run_places_the_folder_and_sets_triton_interpret(
    toy_notebook: Path, tmp_path: Path, outputs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    run_dir = cli.run_notebook({"name": "tiny", "device": "cpu"}, outputs_dir / "tiny", progress=False)
    assert run_dir == outputs_dir / "tiny"
    assert (run_dir / "result.txt").read_text().startswith("tiny TRITON_INTERPRET=")
    if not torch.cuda.is_available():
        assert (run_dir / "result.txt").read_text() == "tiny TRITON_INTERPRET=1"
    assert "TRITON_INTERPRET" not in os.environ, "the CLI restores its own environment"
    assert sorted(p.name for p in run_dir.iterdir()) == ["result.txt", "reuse_check.html", "reuse_check.ipynb"]
    assert [p.name for p in outputs_dir.iterdir()] == ["tiny"], "no staging folder left behind"
    html = (run_dir / "reuse_check.html").read_text()
    assert "write_text" not in html, "the rendered HTML hides the code"


def test_failing_cell_is_named_and_the_partial_notebook_written(
    toy_notebook: Path, tmp_path: Path, outputs_dir: Path, capsys
) -> None:
    rc = cli.main(["run", str(_params(tmp_path)), "--outputs", str(outputs_dir), "--no-progress"])
    assert rc == 0
    # the same run with the failure planted, forced over the first
    monkey_src = toy_notebook.read_text().replace("explode = False", "explode = True")
    toy_notebook.write_text(monkey_src)
    rc = cli.main(["run", str(_params(tmp_path)), "--outputs", str(outputs_dir), "--force", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_CELL_FAILED
    assert (
        "cell 5 'Explode on request' failed: RuntimeError: planted failure" in err
    )  # 5: papermill's injected cell counts
    executed = outputs_dir / "tiny" / "reuse_check.ipynb"
    assert str(executed) in err
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].evalue == "planted failure"
    assert (outputs_dir / "tiny" / "result.txt").exists(), "cells before the failure ran"
    assert (outputs_dir / "tiny" / "reuse_check.html").exists()
    assert [p.name for p in outputs_dir.iterdir()] == ["tiny"], "the old run was swapped out whole"


def test_force_replaces_atomically(toy_notebook: Path, tmp_path: Path, outputs_dir: Path) -> None:
    run_dir = outputs_dir / "tiny"
    run_dir.mkdir()
    (run_dir / "stale.txt").write_text("old")
    cli.run_notebook({"name": "second"}, run_dir, force=True, progress=False)
    assert not (run_dir / "stale.txt").exists()
    assert (run_dir / "result.txt").read_text().startswith("second")
    assert [p.name for p in outputs_dir.iterdir()] == ["tiny"]
    with pytest.raises(FileExistsError, match="--force"):
        cli.run_notebook({"name": "third"}, run_dir, progress=False)


def test_place_keeps_the_old_run_when_the_swap_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If moving the new run in fails, the old run is not lost half-deleted."""
    staging, run_dir = tmp_path / ".r.partial", tmp_path / "r"
    staging.mkdir()
    run_dir.mkdir()
    (run_dir / "old.txt").write_text("old")
    real_replace = os.replace

    def flaky(src, dst):  # the first move (old run aside) works, the second (staging in) fails
        if Path(src) == staging:
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(cli.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        cli._place(staging, run_dir)
    assert (run_dir / "old.txt").read_text() == "old"


def test_validate_artifact_and_params(tmp_path: Path, capsys) -> None:
    assert cli.main(["validate", str(SEED_REPORT)]) == 0
    out = capsys.readouterr().out
    assert "valid artifact" in out and "fla_fused_norm_gate" in out
    broken = json.loads(SEED_REPORT.read_text())
    del broken["results"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    assert cli.main(["validate", str(bad)]) == 1
    assert "results" in capsys.readouterr().err
    assert cli.main(["validate", str(Path(__file__).parent.parent / "params" / "quick.yaml")]) == 0
    assert cli.main(["validate", str(_params(tmp_path, sweep_n="4097"))]) == 1
    assert "sweep_n: expected an int" in capsys.readouterr().err


def test_module_entry_point_runs() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "rlnorm", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "run" in proc.stdout and "validate" in proc.stdout


def test_readme_holds_the_two_commands_ci_runs(repo_root: Path) -> None:
    """.ci/run executes the README's test command verbatim; both commands install torch==2.13.0 first."""
    import re

    readme = (repo_root / "README.md").read_text()
    blocks = {}
    for name in ("main-command", "test-command"):
        m = re.search(rf"<!-- {name} -->\n```bash\n(.+?)\n```\n<!-- /{name} -->", readme, re.S)
        assert m, f"README.md lacks the {name} block"
        blocks[name] = m.group(1).strip()
    for cmd in blocks.values():
        assert cmd.startswith("python3 -m pip install torch==2.13.0 && "), cmd
    assert blocks["main-command"].endswith("python3 -m rlnorm run params/quick.yaml")
    assert blocks["test-command"].endswith("python3 -m pytest -ra")
    ci = (repo_root / ".ci" / "run").read_text()
    assert "test-command" in ci and 'eval "$test_command"' in ci and "set -euo pipefail" in ci


def test_a_dead_kernel_names_the_cell_and_keeps_the_partial_notebook(toy_notebook: Path, outputs_dir: Path) -> None:
    """A kernel that dies (here: os._exit, as an out-of-memory kill would) is a failure of that cell too."""
    toy_notebook.write_text(toy_notebook.read_text().replace('raise RuntimeError("planted failure")', "os._exit(9)"))
    with pytest.raises(cli.RunFailed, match=r"cell 5 'Explode on request' did not finish"):
        cli.run_notebook({"name": "tiny", "explode": True}, outputs_dir / "tiny", progress=False)
    assert (outputs_dir / "tiny" / "reuse_check.ipynb").exists()
    assert (outputs_dir / "tiny" / "result.txt").exists()


def test_a_run_that_appears_meanwhile_is_not_replaced(
    toy_notebook: Path, outputs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one name at once: the second keeps its staging folder instead of replacing the first."""
    run_dir = outputs_dir / "tiny"
    real_render = cli.render_html

    def render_then_race(executed: Path, html: Path, title: str) -> Path:
        run_dir.mkdir()  # the other run finished first
        (run_dir / "first.txt").write_text("first")
        return real_render(executed, html, title)

    monkeypatch.setattr(cli, "render_html", render_then_race)
    with pytest.raises(FileExistsError, match="appeared while this run was going"):
        cli.run_notebook({"name": "tiny"}, run_dir, progress=False)
    assert (run_dir / "first.txt").read_text() == "first"
    staged = [p for p in outputs_dir.iterdir() if p.name.startswith(".tiny.partial-")]
    assert len(staged) == 1 and (staged[0] / "result.txt").exists()
