"""The environment block on this CPU machine, and the git helpers inside and outside a checkout."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT

from rlnorm.kit.environment import collect_environment, git_commit, library_version, tracked_tree_dirty


def test_library_version_prefers_the_imported_module(monkeypatch: pytest.MonkeyPatch) -> None:
    # a build whose metadata lacks the local version (the GPU image's torch: 2.11.0 against 2.11.0+cu130):
    # the module that runs is what the artifact records; a module not imported is read from metadata
    assert library_version("no-such-distribution-rlnorm") is None
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="9.9.9+planted"))
    assert library_version("torch") == "9.9.9+planted"
    monkeypatch.delitem(sys.modules, "jsonschema", raising=False)
    assert library_version("jsonschema") == importlib.metadata.version("jsonschema")


def test_bad_device_is_rejected() -> None:
    with pytest.raises(TypeError, match="device"):
        collect_environment(3)  # type: ignore[arg-type]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            collect_environment("cuda")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t", *args], check=True)


def test_dirty_flag_follows_tracked_files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLNORM_COMMIT", raising=False)
    monkeypatch.delenv("RLNORM_TREE_DIRTY", raising=False)  # set where a run's tree cannot be read (the H200)

    _git(tmp_path, "init", "-q")
    assert git_commit(tmp_path) is None  # no commit yet
    assert git_commit(tmp_path / "missing") is None
    (tmp_path / "a.txt").write_text("1")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "one")
    assert tracked_tree_dirty(tmp_path) is False
    (tmp_path / "untracked.txt").write_text("x")
    assert tracked_tree_dirty(tmp_path) is False
    (tmp_path / "a.txt").write_text("2")
    assert tracked_tree_dirty(tmp_path) is True


def test_a_stated_commit_wins_inside_and_outside_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU machine gets a copy of the tree (its .git, if any, can be stale): the caller's word wins."""
    monkeypatch.setenv("RLNORM_COMMIT", "ABCDEF0123456789")
    monkeypatch.setenv("RLNORM_TREE_DIRTY", "0")
    assert git_commit(tmp_path) == "abcdef0123456789"
    assert tracked_tree_dirty(tmp_path) is False
    monkeypatch.setenv("RLNORM_TREE_DIRTY", "1")
    assert tracked_tree_dirty(tmp_path) is True
    assert git_commit(REPO_ROOT) == "abcdef0123456789"  # over a real checkout too
    assert tracked_tree_dirty(REPO_ROOT) is True


def test_default_repo_is_this_package_checkout_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A package installed inside some other repository must not report that repository's commit."""
    import rlnorm.kit.environment as env

    _git(tmp_path, "init", "-q")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "x")
    (tmp_path / "site-packages").mkdir()
    monkeypatch.setattr(env, "_PACKAGE_ROOT", tmp_path / "site-packages")
    monkeypatch.delenv("RLNORM_COMMIT", raising=False)
    assert git_commit() is None
    assert git_commit(tmp_path) is not None  # asked explicitly: that repo's commit
