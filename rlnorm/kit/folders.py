"""Run folders are written whole or not at all: assembled in a staging folder beside their place, then moved.

Whoever executes the notebook (the command line, papermill, JupyterLab), `outputs/NAME/` is absent, the previous
run untouched, or a complete new run, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["RunExists", "make_readable", "place", "staging_for"]


class RunExists(FileExistsError):
    """The run folder is there already and replacing it was not asked for."""


def staging_for(run_dir: Path, overwrite: bool) -> Path:
    """A fresh staging folder beside `run_dir` (hidden, so a half-written run never looks like one)."""
    if run_dir.exists() and not overwrite:
        raise RunExists(
            f"{run_dir} already exists: choose another name (--name / -p name NEW) or replace it "
            "(--force / -p overwrite True)"
        )
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.partial-", dir=run_dir.parent))


def make_readable(folder: Path) -> None:
    """Run folders are outputs like any other: readable by the group and others as the umask allows, though a
    staging folder is made by `mkdtemp` (0700)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        with contextlib.suppress(OSError):
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def place(staging: Path, run_dir: Path, overwrite: bool = True) -> None:
    """Move the staged folder into place; an existing one is swapped out whole, then deleted."""
    make_readable(staging)
    if run_dir.exists() and not overwrite:  # another run took the name meanwhile: keep both
        raise RunExists(f"{run_dir} appeared while this run was going; this run is kept in {staging}")
    old = None
    if run_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.old-", dir=run_dir.parent))
        os.replace(run_dir, old / run_dir.name)
    try:
        os.replace(staging, run_dir)
    except BaseException:
        if old is not None:  # put the previous run back rather than leave nothing
            os.replace(old / run_dir.name, run_dir)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
