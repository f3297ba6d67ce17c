"""The repository is ruff-clean (lint and format, pyproject's rules), and its documents' links resolve in a clean
clone: CI proves both, not a reviewer's eye."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

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


LINK = re.compile(r"\]\(([^)\s]+)\)")  # a markdown link's target


def broken_links(md: Path) -> list[str]:
    """The relative link targets in `md` that do not exist (URLs and in-page anchors are not checked)."""
    bad = []
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (md.parent / target.split("#", 1)[0]).exists():
            bad.append(target)
    return bad


def documents() -> list:
    return [
        *sorted(REPO_ROOT.glob("*.md")),
        *sorted((REPO_ROOT / "docs").glob("*.md")),
        *sorted(REPO_ROOT.glob("outputs/**/*.md")),
    ]


def test_every_relative_link_in_the_documents_resolves():
    """Run in a clean clone (CI), this also catches a linked file that was never committed (an ignored folder)."""
    bad = {str(md.relative_to(REPO_ROOT)): b for md in documents() if (b := broken_links(md))}
    assert not bad, bad


def test_a_planted_broken_link_is_reported(tmp_path):
    (tmp_path / "there.md").write_text("x")
    md = tmp_path / "doc.md"
    md.write_text("[ok](there.md) [anchor](there.md#a) [web](https://x.org/y) [gone](outputs/missing/NOTE.md)")
    assert broken_links(md) == ["outputs/missing/NOTE.md"]
