"""The run folder on disk, written whole or not at all (`write_atomic`, `place`): the artifact, validated against
`rlnorm/kit/schema/artifact.schema.json` when written and read (it keeps every key of the reference B200 report),
and `records.csv`, one line per differing (row comparison, tensor)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import pandas as pd

from rlnorm.kit.results import SCHEMA_VERSION, Record, RunResult, run_from_doc, to_json


class RunExists(FileExistsError):
    """The run folder is there already and replacing it was not asked for."""


def write_atomic(
    path: str | os.PathLike[str], content: str | bytes | Callable[[IO[bytes]], None], overwrite: bool = True
) -> Path:
    """Write `content` (text, bytes, or a function writing to a binary file) to `path`, whole or not at all: a
    fsynced temporary file moved into place (`os.link` when not overwriting: one that appeared is never clobbered)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
                raise FileExistsError(f"path: {str(path)!r} exists; pass overwrite=True to replace it") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def read_json(path: Path) -> Any:
    """A JSON file a child process left, or None where it left none or half a one."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


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


DEFAULT_RFC = "RL-Align/RL-Kernel#428"


class ArtifactValidationError(ValueError):
    """The document does not match artifact.schema.json; `problems` lists (key path, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        shown = "\n".join(f"  at {path}: {msg}" for path, msg in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        hint = "\n(a misspelled key, or a NEW field that needs its line in the schema and in docs/design.md)"
        hint = hint if any("Additional properties" in msg for _, msg in problems) else ""
        super().__init__(
            f"artifact does not match rlnorm/kit/schema/artifact.schema.json ({len(problems)} problem(s)):\n"
            f"{shown}{more}{hint}"
        )


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    schema = json.loads((Path(__file__).parent / "schema" / "artifact.schema.json").read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _deepest(err: jsonschema.exceptions.ValidationError) -> jsonschema.exceptions.ValidationError:
    """An anyOf/oneOf error hides its cause in .context: follow the branch that got furthest in."""
    while err.context:
        err = max(err.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
    return err


def validate_artifact(doc: Mapping[str, Any] | RunResult) -> None:
    """Raise ArtifactValidationError naming each failing key path; return None when `doc` is valid."""
    if isinstance(doc, RunResult):
        doc = to_json(doc)
    if not isinstance(doc, Mapping):
        raise TypeError(f"doc: expected an artifact (a dict or a RunResult), got {type(doc).__name__}")
    problems = []
    for err in _validator().iter_errors(doc):
        best = _deepest(err)
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in best.absolute_path)
        problems.append((where, best.message))
    if problems:
        raise ArtifactValidationError(sorted(problems))


def write_artifact(doc: RunResult | Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `doc` as JSON to `path`, validated first, whole or not at all."""
    data = to_json(doc)
    validate_artifact(data)
    return write_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


def load_artifact(path: str | os.PathLike[str]) -> RunResult:
    """An artifact file (ours, or the reference report) as a validated `RunResult`; an invalid one raises naming
    the file and each failing key."""
    path = Path(path)
    try:  # a file that is not JSON raises a ValueError naming it too
        doc = json.loads(path.read_text(encoding="utf-8"))
        # ours as written (a misspelled key is caught, which typing would drop); the report once typed
        if ours := isinstance(doc, dict) and doc.get("schema_version") == SCHEMA_VERSION:
            validate_artifact(doc)
        run = run_from_doc(doc, path)
        if not ours:
            validate_artifact(run)
    except ArtifactValidationError as exc:
        raise ArtifactValidationError([(f"{path.name}:{p}", m) for p, m in exc.problems]) from None
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    return run


# -- records.csv: one line per differing (row comparison, tensor) -------------------------------------------------
RECORD_COLUMNS = [f.name for f in dataclasses.fields(Record)]
# column -> pandas dtype; nullable ints because a dweight record has no row / position
_COLUMN_DTYPES = {
    c: "string" if c in ("backend", "check", "case", "tensor", "rebuild") else "float64" if c == "max_abs" else "Int64"
    for c in RECORD_COLUMNS
}


def records_frame(records: list[Record] | list[dict[str, Any]]) -> pd.DataFrame:
    """Records -> DataFrame with exactly RECORD_COLUMNS, typed (an empty frame keeps the columns)."""
    if not isinstance(records, (list, tuple)):
        raise TypeError(f"records: expected a list of Record, got {type(records).__name__}")
    rows = [dataclasses.asdict(r) if isinstance(r, Record) else r for r in records]
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"records[{i}]: expected a Record, got {type(row).__name__}")
        if unknown := set(row) - set(RECORD_COLUMNS):
            raise ValueError(f"records[{i}]: unknown columns {sorted(unknown)}; expected a subset of {RECORD_COLUMNS}")
    return _typed(pd.DataFrame.from_records(rows, columns=RECORD_COLUMNS), "records")


def _typed(df: pd.DataFrame, where: str) -> pd.DataFrame:
    if missing := [c for c in RECORD_COLUMNS if c not in df.columns]:
        raise ValueError(f"{where}: missing record columns {missing}")
    df = df.reset_index(drop=True)
    typed = {c: df[c].astype(t) if t == "string" else pd.to_numeric(df[c]).astype(t) for c, t in _COLUMN_DTYPES.items()}
    return pd.DataFrame(typed)


def write_records(records: list[Record] | pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the records as CSV, whole or not at all."""
    df = records if isinstance(records, pd.DataFrame) else records_frame(records)
    return write_atomic(path, _typed(df, "records").to_csv(index=False))


def read_records(path: str | os.PathLike) -> pd.DataFrame:
    """Read a records CSV written by `write_records` back into the typed frame."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no records file at {path}")
    numeric = {c: [""] for c, t in _COLUMN_DTYPES.items() if t != "string"}  # empty: NA; a string stays as written
    return _typed(pd.read_csv(path, dtype=_COLUMN_DTYPES, keep_default_na=False, na_values=numeric), f"path: {path}")
