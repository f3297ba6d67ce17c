"""Files of a run are written whole or not at all (`write_atomic`), the run folder assembled in a staging folder
beside its place and moved there (`place`): `outputs/NAME/` is absent, the previous run, or a complete new run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


class RunExists(FileExistsError):
    """The run folder is there already and replacing it was not asked for."""


def write_atomic(
    path: str | os.PathLike[str], content: str | bytes | Callable[[IO[bytes]], None], overwrite: bool = True
) -> Path:
    """Write `content` (text, bytes, or a function writing to a binary file) to `path`, whole or not at all: a
    fsynced temporary file moved into place (`os.link` when not overwriting: one that appeared is never clobbered)."""
    path = Path(path)
    if not overwrite and path.exists():
        raise FileExistsError(f"path: {str(path)!r} already exists; pass overwrite=True to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content.encode("utf-8") if isinstance(content, str) else content)
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # atomic create-if-absent
            except FileExistsError:
                raise FileExistsError(f"path: {str(path)!r} appeared while writing; pass overwrite=True") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def staging_for(run_dir: Path, overwrite: bool) -> Path:
    """A fresh staging folder beside `run_dir` (hidden, so a half-written run never looks like one)."""
    if run_dir.exists() and not overwrite:
        raise RunExists(
            f"{run_dir} already exists: choose another name (--name / -p name NEW) or replace it "
            "(--force / -p overwrite True)"
        )
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.partial-", dir=run_dir.parent))


def _make_readable(folder: Path) -> None:
    """Run folders are outputs like any other: readable as the umask allows, though `mkdtemp` made them 0700."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        with contextlib.suppress(OSError):
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def place(staging: Path, run_dir: Path, overwrite: bool = True) -> None:
    """Move the staged folder into place; an existing one is swapped out whole, then deleted."""
    _make_readable(staging)
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
