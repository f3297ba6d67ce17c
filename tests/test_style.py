"""The repository is ruff-clean (lint and format, pyproject's rules): CI proves it, not a reviewer's eye."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(
    shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"]).returncode != 0,
    reason="ruff is not installed (the `test` extra installs it)",
)


def ruff(*args: str, cwd=REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True)


def test_the_repository_passes_ruff_check_and_format():
    lint = ruff("check", "--no-cache", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = ruff("format", "--check", "--no-cache", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_ruff_with_the_repository_rules_catches_a_planted_violation(tmp_path):
    """The gate can fail: a 130-character line and an unformatted call, checked under pyproject's rules."""
    bad = tmp_path / "planted.py"
    bad.write_text("x = [" + ", ".join(["1"] * 42) + "]\ny = dict( a = 1 )\n")
    config = str(REPO_ROOT / "pyproject.toml")
    lint = ruff("check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert lint.returncode == 1 and "E501" in lint.stdout
    fmt = ruff("format", "--check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert fmt.returncode == 1 and "planted.py" in fmt.stdout + fmt.stderr
