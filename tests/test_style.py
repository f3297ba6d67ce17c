"""What a reader of a clean clone follows leads somewhere: every relative link in a committed document goes to a
committed file, and every repository path a document cites exists. Nothing narrates how it was built."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import REPO_ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")  # a markdown link's target
TOP = ("rlnorm/", "tests/", "notebooks/", "params/", "docs/", "tools/", "benchmarks/", "outputs/", ".ci/")
ROOT_FILES = ("README.md", "CONTRIBUTING.md", "pyproject.toml", "environment.yml")
CITED = re.compile(r"`([^`\s]+)`|\]\(([^)\s]+)\)")
HISTORY = re.compile(r"\b(sessions?|issues?|sprints?)\s+#?\d+", re.IGNORECASE)


def tracked_files(root: Path) -> set[str]:
    git = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True)
    return set(git.stdout.splitlines())


def broken_links(md: Path, root: Path, tracked: set[str]) -> list[str]:
    """Relative link targets that are not committed (a clean clone lacks them). URLs and anchors are not checked."""
    bad = []
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (md.parent / target.split("#", 1)[0]).resolve()
        rel = path.relative_to(root.resolve()).as_posix() if path.is_relative_to(root.resolve()) else None
        if rel is None or not (rel in tracked or any(f.startswith(rel.rstrip("/") + "/") for f in tracked)):
            bad.append(target)
    return bad


def missing_paths(md: Path, root: Path) -> list[str]:
    """Repository paths cited in code spans or links that do not exist (placeholders such as NAME or <gpu> skipped)."""
    missing = []
    for code, link in CITED.findall(md.read_text(encoding="utf-8")):
        target = re.sub(r":\d+(-\d+)?$", "", (code or link).split("#", 1)[0].rstrip(".,:;)"))  # path:line
        if not (target.startswith(TOP) or target in ROOT_FILES) or re.search(
            r"[<>{}]|\bNAME\b|\.\.\.|[A-Z]{3,}/", target
        ):
            continue
        if not (list(root.glob(target)) if any(ch in target for ch in "*?[") else (root / target).exists()):
            missing.append(target)
    return missing


def test_every_link_and_cited_path_in_the_documents_resolves() -> None:
    tracked = tracked_files(REPO_ROOT)
    docs = [REPO_ROOT / f for f in sorted(tracked) if f.endswith(".md")]
    assert len(docs) >= 4, docs
    links = {str(md.relative_to(REPO_ROOT)): b for md in docs if (b := broken_links(md, REPO_ROOT, tracked))}
    paths = {
        str(md.relative_to(REPO_ROOT)): m
        for md in docs
        if not md.is_relative_to(REPO_ROOT / "outputs") and (m := missing_paths(md, REPO_ROOT))
    }
    assert not links and not paths, {"links": links, "paths": paths}


def test_planted_broken_links_and_missing_paths_are_found(tmp_path: Path) -> None:
    (tmp_path / "params").mkdir()
    for name in ("there.md", "untracked.md", "params/quick.yaml"):
        (tmp_path / name).write_text("x")
    md = tmp_path / "doc.md"
    md.write_text(
        "[ok](there.md) [anchor](there.md#a) [web](https://x.org/y) [gone](outputs/missing/NOTE.md) "
        "[uncommitted](untracked.md) [out](../elsewhere.md)\n"
        "Run `params/quick.yaml`, `params/*.yaml`, `outputs/NAME/`, `outputs/<gpu>-full/`, `scripts/gone.py` (not a top"
        " folder), `docs/gone.md`, `tools/x.py:12`."
    )
    tracked = {"there.md", "doc.md", "params/quick.yaml"}
    assert broken_links(md, tmp_path, tracked) == ["outputs/missing/NOTE.md", "untracked.md", "../elsewhere.md"]
    assert missing_paths(md, tmp_path) == ["outputs/missing/NOTE.md", "docs/gone.md", "tools/x.py"]


def test_documents_and_code_do_not_narrate_their_history() -> None:
    """Say why, not when: no session or issue numbers (outputs/ holds runs' own notes)."""
    texts = [f for f in tracked_files(REPO_ROOT) if not f.startswith("outputs/") and (REPO_ROOT / f).is_file()]
    found = [
        f"{f}:{i}"
        for f in texts
        if f.endswith((".md", ".py", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".txt")) or f.startswith(".ci/")
        for i, line in enumerate((REPO_ROOT / f).read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, found
