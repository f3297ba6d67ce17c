"""`--base REV`: the kernel of another commit timed against the working tree's, shape by shape.

The benchmark runs twice, each time in a process of its own: first on a copy of this package whose
`rlnorm/kernel/` is REV's (`git archive REV rlnorm/kernel`, put first on the import path), then on the
working tree. Only the kernel differs: clocks, inputs, settings and the backends' code are the working
tree's, and each run's ratio is to its own add. REV may also be a folder holding `rlnorm/kernel/` (for a
machine without the repository). The temporary folder is removed whatever happens.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rlnorm.checkout import PACKAGE_DIR
from rlnorm.kit import environment as env

BASE = "rlnorm.bench.base"
KERNEL = Path("rlnorm") / "kernel"
REPO = PACKAGE_DIR.parent  # the checkout: the working tree, and where benchmarks/ lives


class BaseError(RuntimeError):
    """The base tree could not be made, or one of the two runs failed: the message says which."""


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=120, check=False)


def build_tree(base: str, dest: Path) -> tuple[str, str | None]:
    """This package at dest/rlnorm with the kernel of `base` (a commit, or a folder holding rlnorm/kernel/);
    returns (label, commit), commit None for a folder without git history."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE_DIR, dest / "rlnorm", ignore=ignore)
    shutil.rmtree(dest / KERNEL)
    if Path(base).is_dir():
        if not (Path(base) / KERNEL / "__init__.py").is_file():
            raise BaseError(f"--base: folder {base!r} holds no rlnorm/kernel/ package")
        shutil.copytree(Path(base) / KERNEL, dest / KERNEL, ignore=ignore)
        # a folder inside another checkout (a copy carried in .whl/, say) is not that checkout's HEAD
        top = env.git_output(Path(base), "rev-parse", "--show-toplevel")
        head = env.git_output(Path(base), "rev-parse", "--verify", "HEAD")
        same = top is not None and Path(top.strip()).resolve() == Path(base).resolve()
        return base, head.strip() if head and same else None
    rev = _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    if rev.returncode != 0:
        raise BaseError(f"--base: {base!r} is not a commit of the repository at {REPO}")
    commit = rev.stdout.decode().strip()
    tar = _git("archive", "--format=tar", commit, KERNEL.as_posix())
    if tar.returncode != 0:
        raise BaseError(f"--base: commit {commit[:12]} has no {KERNEL.as_posix()}/ ({tar.stderr.decode().strip()})")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(dest, filter="data")
        else:  # a Python without extraction filters: git's own archive, regular files only
            archive.extractall(dest)
    return base, commit


def run_tree(tree: Path, args: Sequence[str], out: Path, commit: str | None = None) -> dict:
    """`python -m benchmarks.run ARGS --out OUT` with `tree` first on the import path; the run's document.
    commit: the commit the run records (the base's kernel), not what git says about the temporary folder."""
    child = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), str(REPO), os.environ.get("PYTHONPATH")]))
    )
    if tree != REPO:
        child.pop(env.COMMIT_ENV, None)
        child.pop(env.DIRTY_ENV, None)
        if commit:
            child.update({env.COMMIT_ENV: commit, env.DIRTY_ENV: "0"})
    sys.stdout.flush()
    # cwd is the tree: `python -m` puts the working folder first on the path, ahead of PYTHONPATH
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *args, "--out", str(out)], cwd=tree, env=child, check=False
    )
    if proc.returncode != 0 or not out.is_file():
        raise BaseError(f"--base: the benchmark in {tree} failed (exit status {proc.returncode})")
    return json.loads(out.read_text())


def _rlnorm(doc: dict, rows: int, d: int, mode: str) -> dict | None:
    shape = next((sh for sh in doc["shapes"] if (sh["rows"], sh["d"]) == (rows, d)), {"entries": []})
    return next((e for e in shape["entries"] if e["name"] == "rlnorm" and e["mode"] == mode), None)


def run_base(base: str, args: Sequence[str]) -> dict:
    """Both runs, base first, and their comparison: both documents whole, and rlnorm's entries per shape."""
    args = [*args, "--backends", "rlnorm", "--no-progress"]
    with tempfile.TemporaryDirectory(prefix="rlnorm-base-") as tmp:
        tree = Path(tmp) / "tree"
        label, commit = build_tree(base, tree)
        print(f"== base: the kernel of {label} ({commit or 'no commit'})", flush=True)
        base_doc = run_tree(tree, args, Path(tmp) / "base.json", commit)
        print("== head: the working tree", flush=True)
        head_doc = run_tree(REPO, args, Path(tmp) / "head.json")
    shapes = dict.fromkeys((sh["rows"], sh["d"]) for doc in (head_doc, base_doc) for sh in doc["shapes"])
    return {
        "kind": BASE,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": head_doc.get("environment"),
        "base": {"label": label, "commit": commit, "run": base_doc},
        "head": {
            "label": "working tree",
            "commit": head_doc.get("commit"),
            "tracked_tree_dirty": head_doc.get("tracked_tree_dirty"),
            "run": head_doc,
        },
        "rows": [
            {"rows": r, "d": d, "mode": m, "base": _rlnorm(base_doc, r, d, m), "head": _rlnorm(head_doc, r, d, m)}
            for r, d in shapes
            for m in ("fwd", "fwd_bwd")
        ],
    }
