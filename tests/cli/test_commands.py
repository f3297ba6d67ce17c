"""The command line on a toy notebook: no overwritten run, a failing cell named (its partial notebook kept), --force
replacing a run whole, readable run folders with an offline page, and `validate`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
import yaml

from rlnorm import cli
from rlnorm.checkout import seed_report_path
from rlnorm.cli import notebook as cli_notebook
from rlnorm.cli import runs
from rlnorm.cli.plan import expand
from rlnorm.kit import artifact
from rlnorm.kit.artifact import RECORD_COLUMNS, write_artifact, write_records
from rlnorm.kit.results import load_run

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
device = "cpu"

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
    monkeypatch.setattr(cli_notebook, "notebook_source", lambda name: src)
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
    assert rc == runs.EXIT_EXISTS
    err = capsys.readouterr().err
    assert "already exists" in err and "--force" in err
    assert (existing / "keep.txt").read_text() == "previous run"
    assert sorted(p.name for p in outputs_dir.iterdir()) == ["tiny"]


def test_a_run_places_a_readable_folder_with_an_offline_page(
    toy_notebook: Path, tmp_path: Path, outputs_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    """Triton interpreted on a CPU run, the CLI's environment restored, files readable, no staging folder left, the
    kernel over IPC (no TCP warning), and a page without the code that loads nothing from a URL (read offline)."""
    toy_notebook.write_text(toy_notebook.read_text() + "\n# %% [markdown]\n# Some math: $x^2$ and a\n")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cli.main(["run", str(_params(tmp_path)), "--outputs", str(outputs_dir), "--no-progress"]) == 0
    run_dir = outputs_dir / "tiny"
    assert (run_dir / "result.txt").read_text() == "tiny TRITON_INTERPRET=1"  # the CPU suite sees no GPU
    assert "TRITON_INTERPRET" not in os.environ, "the CLI restores its own environment"
    assert sorted(p.name for p in run_dir.iterdir()) == ["result.txt", "reuse_check.html", "reuse_check.ipynb"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in [run_dir, *run_dir.iterdir()]}
    umask = os.umask(0)
    os.umask(umask)
    assert modes == {p: (0o777 if p == "tiny" else 0o666) & ~umask for p in modes}, "readable like any output"
    assert [p.name for p in outputs_dir.iterdir()] == ["tiny"], "no staging folder left behind"
    out, err = capfd.readouterr()
    assert "without encryption" not in out + err and "IPKernelApp" not in out + err
    page = (run_dir / "reuse_check.html").read_text()
    assert "write_text" not in page, "the rendered HTML hides the code"
    assert external_urls(page) == []
    planted = '<script src="https://cdn.example/x.js"></script><link href="http://x/y.css" rel="stylesheet">'
    assert len(external_urls(page + planted)) == 2, "the check sees a planted one"


@pytest.mark.parametrize(
    ("failure", "said", "errors"),
    [
        ('raise RuntimeError("planted failure")', "failed: RuntimeError: planted failure", ["planted failure"]),
        ("os._exit(9)", "did not finish", []),  # a kernel that dies, as an out-of-memory kill does
    ],
)
def test_a_failing_or_dead_cell_is_named_and_the_partial_notebook_written(
    failure: str, said: str, errors: list[str], toy_notebook: Path, tmp_path: Path, outputs_dir: Path, capsys
) -> None:
    (outputs_dir / "tiny").mkdir()
    (outputs_dir / "tiny" / "old.txt").write_text("an older run")
    # the failure planted, forced over the older run
    planted = toy_notebook.read_text().replace("explode = False", "explode = True")
    toy_notebook.write_text(planted.replace('raise RuntimeError("planted failure")', failure))
    rc = cli.main(["run", str(_params(tmp_path)), "--outputs", str(outputs_dir), "--force", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == runs.EXIT_CELL_FAILED
    assert f"cell 5 'Explode on request' {said}" in err  # 5: papermill's injected cell counts
    executed = outputs_dir / "tiny" / "reuse_check.ipynb"
    assert str(executed) in err
    nb = nbformat.read(executed, as_version=4)
    assert [
        o.evalue for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ] == errors
    assert (outputs_dir / "tiny" / "result.txt").exists(), "cells before the failure ran"
    assert (outputs_dir / "tiny" / "reuse_check.html").exists()
    assert not (outputs_dir / "tiny" / "old.txt").exists(), "the old run was swapped out whole"
    assert [p.name for p in outputs_dir.iterdir()] == ["tiny"]


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

    monkeypatch.setattr(artifact.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        artifact.place(staging, run_dir)
    assert (run_dir / "old.txt").read_text() == "old"


def test_a_run_that_appears_meanwhile_is_not_replaced(
    toy_notebook: Path, outputs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one name at once: the second keeps its staging folder instead of replacing the first."""
    run_dir = outputs_dir / "tiny"
    real_render = cli_notebook.render_html

    def render_then_race(executed: Path, html: Path, title: str) -> Path:
        run_dir.mkdir()  # the other run finished first
        (run_dir / "first.txt").write_text("first")
        return real_render(executed, html, title)

    monkeypatch.setattr(cli_notebook, "render_html", render_then_race)
    (run,) = expand([str(_params(outputs_dir.parent))], outputs=outputs_dir).runs
    code, message = runs.run_one(run, force=False, progress=False, require={})
    assert code == runs.EXIT_EXISTS and "appeared while this run was going" in message
    assert (run_dir / "first.txt").read_text() == "first"
    staged = [p for p in outputs_dir.iterdir() if p.name.startswith(".tiny.partial-")]
    assert len(staged) == 1 and (staged[0] / "result.txt").exists()


def external_urls(page: str) -> list[str]:
    import re

    tags = re.findall(r"<(?:script|link|img|iframe)[^>]*(?:src|href)=[\"'](https?:)?//[^\"']+[\"']", page)
    modules = re.findall(r"import[^;'\"]*from\s+['\"]https?://", page)
    return tags + modules


def test_validate_takes_a_file_or_a_run_folder_and_finds_what_does_not_belong(tmp_path: Path, capsys) -> None:
    for shipped in sorted((Path(__file__).parents[2] / "params").glob("*.yaml")):  # every shipped file loads
        assert cli.main(["validate", str(shipped)]) == 0, shipped
    assert cli.main(["validate", str(_params(tmp_path, sweep_n="4097"))]) == 1
    assert "sweep_n: expected an int" in capsys.readouterr().err
    # a run folder as a finished run leaves it: the seed report as its artifact, records, a page of this run
    run = load_run(SEED_REPORT)
    run.schema_version, run.created_at, run.records, run.plots = "1", "2026-12-05T00:00:00+00:00", "records.csv", {}
    folder = tmp_path / "r"
    folder.mkdir()
    write_artifact(run, folder / "rms_norm_gated_reuse_check.json")
    write_records([], folder / "records.csv")
    (folder / "reuse_check.html").write_text(f"<html>created {run.created_at}</html>")
    assert cli.main(["validate", str(folder)]) == 0, capsys.readouterr().err
    art = folder / "rms_norm_gated_reuse_check.json"
    good = art.read_text()
    broken = json.loads(good)
    del broken["results"]
    art.write_text(json.dumps(broken))
    assert cli.main(["validate", str(art)]) == 1
    assert "results" in capsys.readouterr().err
    art.write_text(good.replace('"wall_time_s"', '"wall_time"', 1))  # a misspelled key: typing alone drops it
    assert cli.main(["validate", str(folder)]) == 1
    assert "'wall_time' was unexpected" in capsys.readouterr().err
    art.write_text(good)
    (folder / "reuse_check.html").write_text("<html>created 2026-01-01T00:00:00+00:00</html>")  # a stale page
    assert cli.main(["validate", str(folder)]) == 1
    assert "reuse_check.html: written by another run than this artifact" in capsys.readouterr().err
    (folder / "reuse_check.html").unlink()
    (folder / "records.csv").write_text("backend,check\nfla_fused_norm_gate,all_rows\n")
    assert cli.main(["validate", str(folder)]) == 1
    assert "records.csv: cannot be read" in capsys.readouterr().err
    row = {c: "" for c in RECORD_COLUMNS} | {"backend": "not_in_the_run", "check": "all_rows", "tensor": "y"}
    (folder / "records.csv").write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    assert cli.main(["validate", str(folder)]) == 1
    assert "rows of backends the artifact does not have: ['not_in_the_run']" in capsys.readouterr().err
