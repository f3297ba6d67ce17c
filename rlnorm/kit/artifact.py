"""The run artifact on disk: validated against its JSON Schema when written and when read.

The document is `results.to_json(RunResult)`; it keeps every key of the reference B200 report
(`rlnorm/data/rms_norm_gated_b200.json`), and its schema lives in `rlnorm/kit/schema/artifact.schema.json`.
`load_artifact` reads ours (validated as written) or the reference report (validated once typed) as a `RunResult`.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from rlnorm.kit.folders import write_atomic
from rlnorm.kit.results import SCHEMA_VERSION, RunResult, run_from_doc, to_json

DEFAULT_RFC = "RL-Align/RL-Kernel#428"
ENDED_EARLY = ("crashed", "timed_out")  # statuses of a backend whose own process ended before its checks did


class ArtifactValidationError(ValueError):
    """The document does not match artifact.schema.json; `problems` lists (key path, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        shown = "\n".join(f"  at {path}: {msg}" for path, msg in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        hint = ""
        if any("Additional properties" in msg for _, msg in problems):
            hint = "\n(a misspelled key, or a NEW field that needs its line in the schema and in docs/design.md)"
        super().__init__(
            f"artifact does not match rlnorm/kit/schema/artifact.schema.json ({len(problems)} problem(s)):\n"
            f"{shown}{more}{hint}"
        )


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    text = importlib.resources.files("rlnorm.kit").joinpath("schema/artifact.schema.json").read_text(encoding="utf-8")
    schema = json.loads(text)
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


def write_artifact(doc: RunResult | Mapping[str, Any], path: str | os.PathLike[str], overwrite: bool = True) -> Path:
    """Write `doc` as JSON to `path`, validated first, whole or not at all (an existing file replaced only with
    overwrite=True)."""
    data = to_json(doc)
    validate_artifact(data)
    return write_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n", overwrite=overwrite)


def load_artifact(path: str | os.PathLike[str]) -> RunResult:
    """An artifact file (ours, or the reference report) as a validated `RunResult`; an invalid one raises naming
    the file and each failing key."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"path: {str(path)!r} is not valid JSON ({exc})") from exc
    try:
        # ours as written (a misspelled key is caught, which typing would drop); the report once typed
        ours = isinstance(doc, dict) and doc.get("schema_version") == SCHEMA_VERSION
        if ours:
            validate_artifact(doc)
        run = run_from_doc(doc, path)
        if not ours:
            validate_artifact(run)
    except ArtifactValidationError as exc:
        raise ArtifactValidationError([(f"{path.name}:{p}", m) for p, m in exc.problems]) from None
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    return run
