"""`--base REV`: another commit's kernel in a temporary copy of this package, both trees timed in processes of
their own, the comparison per shape and mode, and no temporary tree left behind."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rlnorm import timing
from rlnorm.bench import base, cli, files, results, runner, table
from rlnorm.bench.files import timing_args
from rlnorm.checkout import PACKAGE_DIR


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def kernel_repo(tmp_path: Path) -> Path:
    """A real repository whose rlnorm/kernel/ says which commit it is: one, then two."""
    repo = tmp_path / "repo"
    (repo / "rlnorm" / "kernel").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    for mark in ("one", "two"):
        (repo / "rlnorm" / "kernel" / "__init__.py").write_text(f"MARK = {mark!r}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", mark)
    return repo


def test_the_base_tree_is_this_package_with_the_other_commits_kernel(kernel_repo, tmp_path):
    dest = tmp_path / "tree"
    label, commit = base.build_tree("HEAD~1", dest, kernel_repo)
    assert label == "HEAD~1" and commit == git(kernel_repo, "rev-parse", "HEAD~1")
    assert (dest / "rlnorm" / "kernel" / "__init__.py").read_text() == "MARK = 'one'\n"
    assert sorted(p.name for p in (dest / "rlnorm" / "kernel").iterdir()) == ["__init__.py"]  # nothing of ours
    assert (dest / "rlnorm" / "bench" / "cli.py").read_bytes() == (PACKAGE_DIR / "bench" / "cli.py").read_bytes()
    assert not list(dest.rglob("__pycache__"))


def test_a_folder_can_stand_for_the_commit(kernel_repo, tmp_path):
    label, commit = base.build_tree(str(kernel_repo), tmp_path / "tree", kernel_repo)
    assert label == str(kernel_repo) and commit == git(kernel_repo, "rev-parse", "HEAD")
    assert (tmp_path / "tree" / "rlnorm" / "kernel" / "__init__.py").read_text() == "MARK = 'two'\n"
    with pytest.raises(base.BaseError, match="holds no rlnorm/kernel"):
        base.build_tree(str(tmp_path / "tree" / "rlnorm" / "bench"), tmp_path / "other", kernel_repo)


def test_a_rev_that_is_not_a_commit_or_has_no_kernel_is_refused(kernel_repo, tmp_path):
    with pytest.raises(base.BaseError, match="not a commit"):
        base.build_tree("no-such-rev", tmp_path / "a", kernel_repo)
    (kernel_repo / "README").write_text("x\n")
    git(kernel_repo, "rm", "-q", "-r", "rlnorm")
    git(kernel_repo, "add", "-A")
    git(kernel_repo, "commit", "-q", "-m", "no kernel")
    with pytest.raises(base.BaseError, match="has no rlnorm/kernel"):
        base.build_tree("HEAD", tmp_path / "b", kernel_repo)


def doc_of(us: float, add_us: float, commit: str) -> dict:
    """A run whose rlnorm takes `us` (forward) against an add of `add_us`."""
    entries = [
        runner.entry("torch.add", "fwd", timing.Timing(add_us, add_us, add_us), add_us, 3, method="graph"),
        runner.entry("rlnorm", "fwd", timing.Timing(us, us, us), add_us, 3, method="graph"),
        runner.entry("rlnorm", "fwd_bwd", None, None, 8, "failed", "planted"),
    ]
    shape = {"rows": 32, "d": 128, "dtype": "bfloat16", "entries": entries}
    return {"kind": files.RUN, "commit": commit, "environment": {"gpu": "NVIDIA H200"}, "shapes": [shape]}


def test_the_comparison_is_per_shape_and_mode_with_both_ratios():
    doc = base.compare(doc_of(3.0, 1.0, "aaaaaaa"), doc_of(2.0, 2.0, "bbbbbbb"), "v1", "aaaaaaa")
    assert doc["kind"] == files.BASE and [(r["rows"], r["mode"]) for r in doc["rows"]] == [(32, "fwd"), (32, "fwd_bwd")]
    md = table.format_base(doc)
    # head 2.0 us against base 3.0: 0.667 of the time; per own add 1.0x against 3.0x: 0.333
    assert "| 32 | 128 | fwd | graph | 3.00 (3.000x) | 2.00 (1.000x) | 0.667 | 0.333 |" in md
    assert "| 32 | 128 | fwd_bwd | - | failed | failed | - | - |" in md
    assert "base: v1 (kernel of commit aaaaaaa)" in md


def test_the_options_both_runs_get():
    def both(argv: list[str]) -> list[str]:
        return timing_args(argv, cli.build_parser().parse_args(argv), drop=("--base",))

    argv = ["--base", "HEAD~2", "--d", "128", "--out", "x.json", "--smoke", "--append-results", "--force"]
    assert both(argv) == ["--d", "128", "--smoke"]
    assert both(["--base=v1", "--append-results", "t.csv", "--quick"]) == ["--quick"]


def test_base_refuses_backends_and_variants():
    for extra in (["--backends", "reference"], ["--variant", "fwd.EXACT=0"]):
        with pytest.raises(SystemExit):
            cli.main(["--base", "HEAD", *extra])


def test_a_failing_run_is_reported_and_the_tree_removed(kernel_repo, monkeypatch):
    made = []
    real = base.build_tree

    def spy(b, dest, repo):
        made.append(dest)
        return real(b, dest, repo)

    monkeypatch.setattr(base, "build_tree", spy)
    with pytest.raises(base.BaseError, match="failed"):
        base.run_base("HEAD", ["--no-such-option"], repo=kernel_repo)
    assert made and not made[0].exists() and not made[0].parent.exists()


@pytest.mark.slow
def test_base_times_this_repositorys_head_against_the_working_tree(tmp_path):
    """End to end on the CPU: two processes, the kernel in the Triton interpreter, one call of each."""
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"]).returncode:
        pytest.skip("not a git checkout")
    out, csv_path = tmp_path / "base.json", tmp_path / "results.csv"
    argv = ["--base", "HEAD", "--d", "128", "--rows", "2", "--small-rows", "--smoke", "--device", "cpu", "--out"]
    assert cli.main([*argv, str(out), "--append-results", str(csv_path), "--allow-cpu"]) == 0
    doc = json.loads(out.read_text())
    head_commit = git(PACKAGE_DIR, "rev-parse", "HEAD")
    assert doc["kind"] == files.BASE and doc["base"]["commit"] == head_commit
    b, h = doc["base"]["run"], doc["head"]["run"]
    assert b["commit"] == head_commit and b["complete"] and h["complete"]
    assert "rlnorm-base-" in b["package_dir"] and not Path(b["package_dir"]).exists()  # the copy is gone
    assert h["package_dir"] == str(PACKAGE_DIR)
    for r in doc["rows"]:
        assert r["base"]["status"] == "ok" and r["head"]["status"] == "ok", r
    rows = results.rows_from_doc(doc)
    assert {r["commit"] for r in rows} >= {head_commit[:7]}
    assert {r["command"] for r in rows} == {f"python -m rlnorm bench {' '.join(argv[:-1])}"}
    assert len(results.rows_from_doc(doc)) == len(list(csv_path.read_text().splitlines())) - 1


def test_rows_of_a_comparison_carry_each_sides_commit():
    b = {**doc_of(3.0, 1.0, "aaaaaaa"), "created_at": "t"}
    h = {**doc_of(2.0, 2.0, "bbbbbbb"), "created_at": "t"}
    doc = {**base.compare(b, h, "v1", "aaaaaaa"), "command": "python -m rlnorm bench --base v1"}
    commits = [(r["commit"], r["backend"]) for r in results.rows_from_doc(doc) if r["clock"] == "graph"]
    assert commits == [("aaaaaaa", "torch.add"), ("aaaaaaa", "rlnorm"), ("bbbbbbb", "torch.add"), ("bbbbbbb", "rlnorm")]
