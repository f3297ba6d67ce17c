"""`--base REV`: another commit's kernel in a copy of this package, timed in a process of its own beside the
working tree's."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess

import pytest

from benchmarks import base, run
from rlnorm.checkout import PACKAGE_DIR


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(base.REPO), *args], capture_output=True, text=True, check=True).stdout


def test_the_base_tree_is_this_package_with_the_commits_kernel(tmp_path):
    label, commit = base.build_tree("HEAD", tmp_path)
    assert label == "HEAD" and commit == git("rev-parse", "HEAD").strip()
    kernel = base.KERNEL.as_posix()
    for name in git("ls-tree", "--name-only", "HEAD", f"{kernel}/").split():
        assert (tmp_path / name).read_text() == git("show", f"HEAD:{name}"), name
    assert filecmp.cmp(tmp_path / "rlnorm" / "timing.py", PACKAGE_DIR / "timing.py", shallow=False)
    # a folder holding rlnorm/kernel/ stands for a commit; inside another checkout it is not that checkout's HEAD
    outer = tmp_path / "outer"
    quiet = {"capture_output": True, "check": True}
    subprocess.run(["git", "init", "-q", str(outer)], **quiet)
    subprocess.run(["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "a checkout with a HEAD"], **quiet)  # fmt: skip
    inside = outer / "carried"
    shutil.copytree(tmp_path / "rlnorm", inside / "rlnorm")
    label, commit = base.build_tree(str(inside), tmp_path / "again")
    assert (tmp_path / "again" / base.KERNEL / "__init__.py").is_file() and label == str(inside) and commit is None


@pytest.mark.parametrize("rev", ["no-such-rev", "HEAD:rlnorm"])
def test_a_rev_that_is_not_a_commit_is_refused(rev, tmp_path, capsys):
    with pytest.raises(base.BaseError, match="not a commit"):
        base.build_tree(rev, tmp_path / "t")
    assert run.main(["--base", rev, "--smoke"]) == 1 and "not a commit" in capsys.readouterr().err


@pytest.mark.slow
def test_base_times_the_head_commits_kernel_against_the_working_tree(tmp_path, capsys):
    out = tmp_path / "base.json"
    assert run.main(["--base", "HEAD", "--d", "128", "--rows", "3", "--small-rows", "--smoke", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["base"]["commit"] == git("rev-parse", "HEAD").strip()
    assert doc["base"]["run"]["package_dir"] != doc["head"]["run"]["package_dir"]  # two trees, two processes
    assert [(r["mode"], r["base"]["status"], r["head"]["status"]) for r in doc["rows"]] == [
        ("fwd", "ok", "ok"),
        ("fwd_bwd", "ok", "ok"),
    ]
    assert "| 3 | 128 | fwd |" in capsys.readouterr().out
