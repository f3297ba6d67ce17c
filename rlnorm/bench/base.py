"""`--base REV`: the kernel of another commit timed against the working tree's, shape by shape.

The same bench runs twice, each time in a process of its own: first on a copy of this package whose
`rlnorm/kernel/` is REV's (`git archive REV rlnorm/kernel`, into a temporary folder put first on
PYTHONPATH), then on the working tree. Only the kernel differs between the two runs: the clocks,
inputs, settings and backends' code are the working tree's, so a difference in time is the kernel's.
Each run's ratio is to its own add, which also cancels a process that ran slow throughout. REV may also
be a folder holding `rlnorm/kernel/` (a tree extracted elsewhere, for a machine without the repository).
The temporary folder is removed whatever happens.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlnorm.bench.files import BASE, BenchFileError, load_doc
from rlnorm.checkout import PACKAGE_DIR
from rlnorm.kit import environment as env

KERNEL = Path("rlnorm") / "kernel"


class BaseError(RuntimeError):
    """The base tree could not be made or one of the two runs failed: the message says which."""


def resolve(rev: str, repo: Path) -> str:
    """The full hash of commit `rev` in the repository at `repo`."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BaseError(f"--base: cannot run git in {repo}: {exc}") from exc
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BaseError(f"--base: {rev!r} is not a commit of the repository at {repo}")
    return proc.stdout.strip()


def _extract_kernel(commit: str, repo: Path, dest: Path) -> None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, KERNEL.as_posix()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise BaseError(f"--base: commit {commit[:12]} has no {KERNEL.as_posix()}/ ({err})")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python without extraction filters: git's own archive, regular files only
            tar.extractall(dest)


def build_tree(base: str, dest: Path, repo: Path) -> tuple[str, str | None]:
    """This package at dest/rlnorm with the kernel of `base` (a commit, or a folder holding rlnorm/kernel/).

    Returns (label, commit): the commit is None where a folder without git history was given.
    """
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE_DIR, dest / "rlnorm", ignore=ignore)
    shutil.rmtree(dest / KERNEL)
    folder = Path(base)
    if folder.is_dir():
        src = folder / KERNEL
        if not (src / "__init__.py").is_file():
            raise BaseError(f"--base: folder {base!r} holds no rlnorm/kernel/ package")
        shutil.copytree(src, dest / KERNEL, ignore=ignore)
        head = env.git_output(folder, "rev-parse", "--verify", "HEAD")
        return str(folder), head.strip() if head else None
    commit = resolve(base, repo)
    _extract_kernel(commit, repo, dest)
    if not (dest / KERNEL / "__init__.py").is_file():
        raise BaseError(f"--base: commit {commit[:12]} has no {KERNEL.as_posix()}/__init__.py")
    return base, commit


def run_tree(tree: Path, args: Sequence[str], out: Path, commit: str | None, stated: bool) -> dict:
    """`python -m rlnorm.bench ARGS --out OUT` with `tree` first on the import path; the run's document.

    stated: the run's commit is `commit` (the base's kernel), not what git says about the folder.
    """
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    if stated:
        child_env.pop(env.COMMIT_ENV, None)
        child_env.pop(env.DIRTY_ENV, None)
        if commit:
            child_env[env.COMMIT_ENV], child_env[env.DIRTY_ENV] = commit, "0"
    sys.stdout.flush()
    # cwd is the tree: `python -m` puts the working folder first on the path, ahead of PYTHONPATH
    proc = subprocess.run(
        [sys.executable, "-m", "rlnorm.bench", *args, "--out", str(out)], cwd=tree, env=child_env, check=False
    )
    if proc.returncode != 0 or not out.is_file():
        raise BaseError(f"--base: the bench in {tree} failed (exit status {proc.returncode})")
    try:
        return load_doc(out)
    except BenchFileError as exc:
        raise BaseError(f"--base: {exc}") from exc


def _rlnorm(doc: dict, rows: int, d: int, mode: str) -> dict | None:
    for sh in doc["shapes"]:
        if (sh["rows"], sh["d"]) == (rows, d):
            return next((e for e in sh["entries"] if e["name"] == "rlnorm" and e["mode"] == mode), None)
    return None


def compare(base_doc: dict, head_doc: dict, base_label: str, base_commit: str | None) -> dict:
    """The comparison document: both runs whole, and per shape and mode rlnorm's entry from each."""
    shapes = list(dict.fromkeys((sh["rows"], sh["d"]) for doc in (head_doc, base_doc) for sh in doc["shapes"]))
    rows = [
        {"rows": r, "d": d, "mode": m, "base": _rlnorm(base_doc, r, d, m), "head": _rlnorm(head_doc, r, d, m)}
        for r, d in shapes
        for m in ("fwd", "fwd_bwd")
    ]
    return {
        "kind": BASE,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": head_doc.get("environment"),
        "base": {"label": base_label, "commit": base_commit, "run": base_doc},
        "head": {
            "label": "working tree",
            "commit": head_doc.get("commit"),
            "tracked_tree_dirty": head_doc.get("tracked_tree_dirty"),
            "run": head_doc,
        },
        "rows": rows,
    }


def run_base(base: str, args: Sequence[str], repo: Path | None = None, head_tree: Path | None = None) -> dict[str, Any]:
    """Both runs, base first, and their comparison; the temporary tree is gone when this returns.

    args: the bench's options for both runs (shapes, settings, device); `--backends rlnorm` is added.
    """
    repo = repo or PACKAGE_DIR.parent
    head_tree = head_tree or PACKAGE_DIR.parent
    args = [*args, "--backends", "rlnorm", "--no-progress"]
    with tempfile.TemporaryDirectory(prefix="rlnorm-base-") as tmp:
        tree = Path(tmp) / "tree"
        label, commit = build_tree(base, tree, repo)
        print(f"== base: the kernel of {label} ({commit or 'no commit'}), in {tree}", flush=True)
        base_doc = run_tree(tree, args, Path(tmp) / "base.json", commit, stated=True)
        print("== head: the working tree", flush=True)
        head_doc = run_tree(head_tree, args, Path(tmp) / "head.json", None, stated=False)
    return compare(base_doc, head_doc, label, commit)
