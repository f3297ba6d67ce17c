"""The command line end to end on the real notebook at tiny sizes: a parallel matrix with its index, exit codes, a
one-line interrupt, pages beside a run, and the papermill route's same guarantees."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import KIT_CHECKS, REPO_ROOT, RING_AND_HOLD, ROW_CHECKS, SEGFAULT, TINY_SIZES, UNLOADABLE, Doorbell

from rlnorm import cli
from rlnorm.cli.runs import EXIT_INTERRUPTED
from rlnorm.report.compare import INDEX_FILE, SUMMARY_FILE

pytestmark = pytest.mark.slow

FAST = {**TINY_SIZES, "device": "cpu", "backends": ["reference"], "checks": KIT_CHECKS}  # no gates: seconds a run


def params_file(tmp_path: Path, stem: str, **values: object) -> str:
    f = tmp_path / f"{stem}.yaml"
    f.write_text(yaml.safe_dump({**FAST, **values}, sort_keys=False))
    return str(f)


def test_a_matrix_runs_its_combinations_in_parallel_and_its_index_is_rebuilt_from_the_folders(tmp_path: Path) -> None:
    f = params_file(tmp_path, "grid", checks=ROW_CHECKS)  # accuracy_latency only times
    out = str(tmp_path / "o")
    run = [sys.executable, "-m", "rlnorm", "run", f, "-p", "activation", "[silu, sigmoid]", "--jobs", "2"]
    proc = subprocess.run([*run, "--outputs", out], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    grid = tmp_path / "o" / "grid"
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p.name for p in grid.iterdir() if p.is_dir())
    assert runs == ["activation-sigmoid", "activation-silu"]
    for r in runs:
        assert (grid / r / "rms_norm_gated_reuse_check.json").is_file() and (grid / r / "reuse_check.html").is_file()
    summary = pd.read_csv(grid / SUMMARY_FILE)
    assert sorted(summary["activation"]) == ["sigmoid", "silu"] and set(summary["verdict"]) == {"invariant"}
    index = (grid / INDEX_FILE).read_text()
    assert index.count('href="activation-') == 2 and "varying activation" in index
    assert "2 at a time" in proc.stderr and "[2/2]" in proc.stderr, "progress across runs"
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr, "a log, not a terminal: lines, no redrawn bars"
    assert "IPKernelApp" not in proc.stderr
    # as after a cluster's array tasks: the run folders gathered, the index built from them
    assert cli.main(["index", *(str(grid / r) for r in runs), "--out", str(tmp_path / "idx")]) == 0
    assert len(pd.read_csv(tmp_path / "idx" / SUMMARY_FILE)) == 2
    assert (tmp_path / "idx" / INDEX_FILE).read_text().count("<tr>") == 1 + 2, "a header and a line per run"


def test_a_backend_that_fails_or_crashes_gives_a_nonzero_exit_and_a_complete_folder(
    tiny_run: Path, tmp_path: Path, capsys
) -> None:
    """conftest's tiny run holds a backend that cannot be loaded and one that segfaults: its fixture sees the run end
    with EXIT_BACKEND; here, what the command said and that the folder it placed reads whole."""
    said = (tiny_run.parent / "stderr.txt").read_text()
    assert f"{UNLOADABLE}: failed: cannot load" in said and f"{SEGFAULT}: crashed: killed by SIGSEGV" in said
    folder = Path(shutil.copytree(tiny_run, tmp_path / "tiny"))  # the pages below go beside the copy
    capsys.readouterr()
    assert cli.main(["validate", str(folder)]) == 0, "the run folder is complete"
    assert cli.main(["investigate", str(folder), "--backend", SEGFAULT]) == 0
    page = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert page.parent == folder and "died on a batch of 63 rows" in page.read_text()
    assert cli.main(["compare", "seed", str(folder)]) == 0 and (folder / "compare-seed.html").is_file()


# a custom backend that, once its checks run, rings and holds: the interrupt lands while the run is going
BLOCKING_BACKEND = (
    RING_AND_HOLD
    + """
def norm(x, z, w, *, eps, group_size, norm_before_gate, activation):
    ring_and_hold(PORT)
    raise RuntimeError("let go by the test")
"""
)


def test_ctrl_c_says_so_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    bell = Doorbell()
    (tmp_path / "planted_hold.py").write_text(BLOCKING_BACKEND.replace("PORT", str(bell.port)))
    f = params_file(
        tmp_path, "stop", backends=[], custom_backends=["planted_hold:norm"], checks=["all_rows"], progress=False
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    with (tmp_path / "stderr.txt").open("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlnorm", "run", f, "--outputs", str(tmp_path / "o")],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # the signal goes to the whole group, as a terminal's Ctrl-C does
            # as from a terminal: a suite started in the background (`cmd &`) ignores SIGINT, and children inherit it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            (held,) = bell.wait(1, alive=lambda: proc.poll() is None)
            before = (tmp_path / "stderr.txt").read_text()
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            bell.close()
    said = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == EXIT_INTERRUPTED, said[-3000:]
    after = [ln for ln in said[len(before) :].splitlines() if ln.strip()]
    assert len(after) == 1 and after[0].startswith("rlnorm: interrupted"), said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir()), "no run folder, no staging left"
    with pytest.raises(ProcessLookupError):
        os.kill(held, 0)  # the backend's process was stopped with the run


def test_papermill_over_an_existing_run_is_refused_and_overwrite_replaces_it_whole(tmp_path: Path) -> None:
    """The papermill route keeps the CLI's guarantees: an existing run folder is never half-rewritten."""
    import jupytext
    import nbformat

    nb = tmp_path / "reuse_check.ipynb"
    nbformat.write(jupytext.read(REPO_ROOT / "notebooks" / "reuse_check.py"), nb)
    run_dir = tmp_path / "outputs" / "pm"
    run_dir.mkdir(parents=True)
    (run_dir / "reuse_check.html").write_text("an older page")
    f = params_file(tmp_path, "pm", checks=["all_rows"])

    def papermill(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "papermill", str(nb), str(tmp_path / "out.ipynb"), "-f", f, "-p", "name", "pm"]
        return subprocess.run([*cmd, "-p", "output_dir", str(run_dir), *extra], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=600)  # fmt: skip

    refused = papermill()
    assert refused.returncode != 0 and "already exists" in refused.stderr + refused.stdout
    assert [p.name for p in run_dir.iterdir()] == ["reuse_check.html"], "nothing written over it"
    replaced = papermill("-p", "overwrite", "True")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert not (run_dir / "reuse_check.html").exists(), "the older page went with the older run"
    assert (run_dir / "rms_norm_gated_reuse_check.json").is_file()
    assert [p.name for p in run_dir.parent.iterdir()] == ["pm"], "no staging folder left"
