"""Where a run happened: the seed report's fields (`gpu`, `capability`, `cuda`, its nine `libraries`), what
reproduces a CPU run too, the code's commit and whether the tree was dirty. Versions never import a package
(importing vLLM beside a CPU torch can fail or take seconds).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from rlnorm import __version__ as rlnorm_version
from rlnorm.checkout import PACKAGE_DIR

# The seed report's library names (its order), then the ones a reader of our runs also needs.
REPORT_LIBRARIES: tuple[str, ...] = tuple(
    "torch triton transformers vllm flashinfer-python liger-kernel fla-core transformer_engine megatron-core".split()
)
EXTRA_LIBRARIES: tuple[str, ...] = ("numpy", "pandas", "matplotlib", "jsonschema", "papermill")

# Distribution names a library is published under, tried in order (TE ships as several).
_DIST_ALIASES: dict[str, tuple[str, ...]] = {
    "transformer_engine": ("transformer_engine", "transformer-engine", "transformer_engine_torch"),
    "fla-core": ("fla-core", "flash-linear-attention"),
}

_PACKAGE_ROOT = PACKAGE_DIR.parent


def library_version(name: str) -> str | None:
    """Version of library `name` (or a known alias), None when not installed; an imported module's own
    `__version__` first (a build's metadata can lack its local part: 2.11.0 for torch 2.11.0+cu130)."""
    loaded = getattr(sys.modules.get(name), "__version__", None)
    if isinstance(loaded, str):
        return str(loaded)  # torch's is a str subclass
    for dist in _DIST_ALIASES.get(name, (name,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def collect_environment(device: str | torch.device = "cpu") -> dict[str, Any]:
    """The artifact's `environment` block for a run on `device`: the seed report's keys, then ours."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device: expected a str like 'cuda' or 'cpu' or a torch.device, got {type(device).__name__}")
    gpu, capability, gpu_memory_gib = "cpu", None, None
    if torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device")
        props = torch.cuda.get_device_properties(torch.device(device))  # no index: the current device
        gpu, capability = props.name, [int(props.major), int(props.minor)]
        gpu_memory_gib = round(props.total_memory / 2**30, 1)
    return {
        "gpu": gpu,
        "capability": capability,
        "cuda": torch.version.cuda,
        "libraries": {name: library_version(name) for name in (*REPORT_LIBRARIES, *EXTRA_LIBRARIES)},
        "device": str(device),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "gpu_memory_gib": gpu_memory_gib,
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.release()}-{platform.machine()}",
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "rlnorm": rlnorm_version,
        "torch_cuda_available": bool(torch.cuda.is_available()),
    }


# The caller may state what `git` says (RLNORM_COMMIT=$(git rev-parse HEAD), RLNORM_TREE_DIRTY=0|1), and that
# wins: a working tree copied to another machine may carry a .git that does not match the files beside it.
COMMIT_ENV = "RLNORM_COMMIT"
DIRTY_ENV = "RLNORM_TREE_DIRTY"


def git_output(repo_dir: str | os.PathLike[str] | None, *args: str) -> str | None:
    """Output of `git -C repo_dir args...`, None when git or the checkout is not there. With repo_dir None the
    checkout must be this package's own, so an install inside another repository never reports its commit."""
    if repo_dir is None:
        top = git_output(_PACKAGE_ROOT, "rev-parse", "--show-toplevel")
        if top is None or Path(top.strip()).resolve() != _PACKAGE_ROOT:
            return None
    try:
        argv = ["git", "-C", str(_PACKAGE_ROOT if repo_dir is None else repo_dir), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def commit_from_env() -> str | None:
    value = os.environ.get(COMMIT_ENV, "").strip().lower()
    if not value:
        return None
    if not (7 <= len(value) <= 64 and all(c in "0123456789abcdef" for c in value)):
        raise ValueError(f"{COMMIT_ENV}: expected a git commit hash (7-64 hex digits), got {value!r}")
    return value


def git_commit(repo_dir: str | os.PathLike[str] | None = None) -> str | None:
    """$RLNORM_COMMIT when set, else the hash of HEAD in `repo_dir` (default: this package's checkout), else None."""
    out = commit_from_env() or git_output(repo_dir, "rev-parse", "--verify", "HEAD")
    return out.strip() if out else None


def tracked_tree_dirty(repo_dir: str | os.PathLike[str] | None = None) -> bool | None:
    """$RLNORM_TREE_DIRTY (0/1) when set, else whether a tracked file differs from HEAD, else None (no checkout)."""
    if value := os.environ.get(DIRTY_ENV, "").strip().lower():
        if value not in ("0", "1", "true", "false"):
            raise ValueError(f"{DIRTY_ENV}: expected 0 or 1, got {value!r}")
        return value in ("1", "true")
    if git_output(repo_dir, "rev-parse", "--verify", "HEAD") is None:
        return None
    out = git_output(repo_dir, "status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out.strip())
