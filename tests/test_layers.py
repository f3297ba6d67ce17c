"""The package's shape holds: its layers and no import cycle (pyproject's [tool.importlinter] contracts, read from
the source, function-level imports included), modules outside the kernel that fit in a head, and notebooks that
only call into the package."""

from __future__ import annotations

import ast
import importlib.util

import pytest
from conftest import IN_CI, REPO_ROOT

MAX_LINES = 600  # a kernel keeps its launch and its kernel together: rlnorm/kernel is not bound by it


def test_the_import_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("importlinter") is None:
        (pytest.fail if IN_CI else pytest.skip)("import-linter is not installed (the `test` extra installs it)")
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(REPO_ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out


def test_no_module_outside_the_kernel_is_over_600_lines() -> None:
    package = REPO_ROOT / "rlnorm"
    long = {
        str(p.relative_to(REPO_ROOT)): n
        for p in package.rglob("*.py")
        if not p.is_relative_to(package / "kernel")
        and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long


def test_notebooks_only_call_into_the_package() -> None:
    """A function or class defined in a notebook is logic the package should hold."""
    notebooks = sorted((REPO_ROOT / "notebooks").glob("*.py"))
    assert notebooks
    for nb in notebooks:
        tree = ast.parse(nb.read_text(encoding="utf-8"))
        defined = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{nb.name} defines {defined}"
