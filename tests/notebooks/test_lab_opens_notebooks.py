"""A double click on a notebook source in a real JupyterLab opens a notebook with the shipped .jupyter config and a
text editor without it (so the check can fail). Opt-in: it needs Chromium and a Python with jupyterlab, jupytext
and Playwright (RLNORM_LAB_PYTHON, default this one), none of which the package installs; without them it skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow

PYTHON = os.environ.get("RLNORM_LAB_PYTHON", sys.executable)
CHROMIUM = os.environ.get("RLNORM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
NEEDS = ("jupyterlab", "jupytext", "playwright")


def missing() -> str:
    """Why the check cannot run here, or "" when it can."""
    if not os.path.isfile(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set RLNORM_CHROMIUM)"
    probe = f"import importlib.util as u; print(' '.join(m for m in {NEEDS!r} if u.find_spec(m) is None))"
    gone = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    return f"{PYTHON} cannot import {', '.join(gone)} (set RLNORM_LAB_PYTHON to one that can)" if gone else ""


@pytest.mark.parametrize(
    ("config", "status"), [(".jupyter", 0), ("none", 1)], ids=["shipped-config-notebook", "no-config-editor"]
)
def test_double_click_opens_a_notebook_only_with_the_shipped_config(config, status, tmp_path):
    why = missing()
    if why:
        pytest.skip(why)
    shot = tmp_path / "lab.png"
    cmd = [PYTHON, str(REPO_ROOT / "tools" / "lab_check.py"), "--chromium", CHROMIUM, "--screenshot", str(shot)]
    cmd += ["--config-path", config if config == "none" else str(REPO_ROOT / config)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == status, done.stdout + done.stderr[-3000:]
    assert shot.read_bytes().startswith(b"\x89PNG")
