"""The repository is ruff-clean (lint and format, pyproject's rules), its documents' links and cited paths resolve
in a clean clone, and neither documents nor code narrate how they were built: CI proves it, not a reviewer's eye."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI, REPO_ROOT


def needs_ruff() -> None:
    """Skip where ruff is missing; fail on CI, which installs the `test` extra so that the lint gate runs."""
    if importlib.util.find_spec("ruff") is None:
        (pytest.fail if IN_CI else pytest.skip)("ruff is not installed (the `test` extra installs it)")


def ruff(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True)


def test_the_repository_passes_ruff_check_and_format() -> None:
    needs_ruff()
    lint = ruff("check", "--no-cache", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = ruff("format", "--check", "--no-cache", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_ruff_with_the_repository_rules_catches_a_planted_violation(tmp_path: Path) -> None:
    """The gate can fail: a 130-character line and an unformatted call, checked under pyproject's rules."""
    needs_ruff()
    bad = tmp_path / "planted.py"
    bad.write_text("x = [" + ", ".join(["1"] * 42) + "]\ny = dict( a = 1 )\n")
    config = str(REPO_ROOT / "pyproject.toml")
    lint = ruff("check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert lint.returncode == 1 and "E501" in lint.stdout
    fmt = ruff("format", "--check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert fmt.returncode == 1 and "planted.py" in fmt.stdout + fmt.stderr


LINK = re.compile(r"\]\(([^)\s]+)\)")  # a markdown link's target


def tracked_files(root: Path) -> set[str] | None:
    """The repository's committed files (relative paths), or None where git cannot say (not a checkout)."""
    git = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    return set(git.stdout.split("\n")) - {""} if git.returncode == 0 and git.stdout.strip() else None


def broken_links(md: Path, root: Path = REPO_ROOT, tracked: set[str] | None = None) -> list[str]:
    """The relative link targets in `md` that do not exist, or, given the committed files, are not committed
    (a clean clone would lack them). URLs and in-page anchors are not checked."""
    bad = []
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (md.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            bad.append(target)
        elif tracked is not None and path.is_relative_to(root.resolve()):
            rel = path.relative_to(root.resolve()).as_posix()
            if rel not in tracked and not any(f.startswith(rel.rstrip("/") + "/") for f in tracked):
                bad.append(target)
    return bad


def test_every_relative_link_in_the_documents_resolves():
    """Every committed document's links lead to committed files (a folder that .gitignore keeps out of the
    repository is present in the checkout that wrote the link, and absent from every clone)."""
    tracked = tracked_files(REPO_ROOT)
    docs = (
        [REPO_ROOT / f for f in sorted(tracked) if f.endswith(".md")]
        if tracked is not None
        else [*REPO_ROOT.glob("*.md"), *REPO_ROOT.glob("docs/*.md"), *REPO_ROOT.glob("outputs/**/*.md")]
    )
    assert len(docs) >= 3, docs
    bad = {str(md.relative_to(REPO_ROOT)): b for md in docs if (b := broken_links(md, REPO_ROOT, tracked))}
    assert not bad, bad


def test_a_planted_broken_link_is_reported(tmp_path):
    (tmp_path / "there.md").write_text("x")
    (tmp_path / "untracked.md").write_text("x")
    md = tmp_path / "doc.md"
    md.write_text(
        "[ok](there.md) [anchor](there.md#a) [web](https://x.org/y) [gone](outputs/missing/NOTE.md) "
        "[uncommitted](untracked.md)"
    )
    assert broken_links(md) == ["outputs/missing/NOTE.md"]  # no git: existence only
    tracked = {"there.md", "doc.md"}
    assert broken_links(md, tmp_path, tracked) == ["outputs/missing/NOTE.md", "untracked.md"]


# -- no development history in documents and code -----------------------------------------------------------------
HISTORY = re.compile(r"\b(sessions?|issues?|sprints?)\s+#?\d+", re.IGNORECASE)
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".txt"}


def history_words(path: Path) -> list[str]:
    """Lines that say when something was built (a session or an issue, by number) instead of why."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [f"{path.name}:{i}: {ln.strip()[:100]}" for i, ln in enumerate(lines, 1) if HISTORY.search(ln)]


def _text_files(root: Path) -> list[Path]:
    tracked = tracked_files(root)
    names = sorted(tracked) if tracked is not None else [p.relative_to(root).as_posix() for p in root.rglob("*")]
    return [
        root / f
        for f in names
        if (root / f).is_file()
        and (Path(f).suffix in TEXT_SUFFIXES or f.startswith(".ci/"))
        and not f.startswith("outputs/")
    ]


def test_documents_and_code_do_not_narrate_their_history():
    found = [hit for path in _text_files(REPO_ROOT) for hit in history_words(path)]
    assert not found, found


def test_a_planted_history_word_is_found(tmp_path):
    doc = tmp_path / "x.md"
    planted = "Added in " + "session" + " 12 (" + "issue" + " #5)."  # spelled apart: this file is scanned too
    doc.write_text(f"Why: the bound is the proof.\n{planted}\nstart_new_session=True\n")
    assert history_words(doc) == [f"x.md:2: {planted}"]


# -- every repository path a document cites exists ----------------------------------------------------------------
TOP = ("rlnorm/", "tests/", "notebooks/", "params/", "docs/", "tools/", "benchmarks/", "outputs/", ".ci/")
ROOT_FILES = ("README.md", "CONTRIBUTING.md", "pyproject.toml", "environment.yml")
CITED = re.compile(r"`([^`\s]+)`|\]\(([^)\s]+)\)")


def cited_paths(md: Path) -> list[str]:
    """Repository paths a document names in code spans or links (placeholders such as NAME or <gpu> skipped)."""
    out = []
    for code, link in CITED.findall(md.read_text(encoding="utf-8")):
        target = (code or link).split("#", 1)[0].rstrip(".,:;)")
        target = re.sub(r":\d+(-\d+)?$", "", target)  # path:line
        if not (target.startswith(TOP) or target in ROOT_FILES):
            continue
        if re.search(r"[<>{}]|\bNAME\b|\.\.\.|[A-Z]{3,}/", target):
            continue
        out.append(target)
    return out


def missing_paths(md: Path, root: Path = REPO_ROOT) -> list[str]:
    missing = []
    for target in cited_paths(md):
        if any(ch in target for ch in "*?["):
            if not list(root.glob(target)):
                missing.append(target)
        elif not (root / target).exists():
            missing.append(target)
    return missing


def test_every_repository_path_the_documents_cite_exists():
    tracked = tracked_files(REPO_ROOT)
    docs = (
        [REPO_ROOT / f for f in sorted(tracked) if f.endswith(".md") and not f.startswith("outputs/")]
        if tracked
        else []
    )
    assert len(docs) >= 4, docs
    bad = {str(md.relative_to(REPO_ROOT)): m for md in docs if (m := missing_paths(md))}
    assert not bad, bad


def test_a_planted_missing_path_is_found(tmp_path):
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "quick.yaml").write_text("")
    md = tmp_path / "doc.md"
    md.write_text(
        "Run `params/quick.yaml`, see [x](params/quick.yaml#top), `params/*.yaml`, `outputs/NAME/`,"
        " `outputs/<gpu>-full/`, and `scripts/gone.py` (not a top folder), `docs/gone.md`, `tools/x.py:12`."
    )
    assert missing_paths(md, tmp_path) == ["docs/gone.md", "tools/x.py"]
