"""Shared fixtures, and the suite's two modes: `python3 -m pytest` is the CPU suite anywhere (the Triton interpreter,
GPUs hidden from torch); Triton picks interpreter or compiler once per process, so the tests marked `gpu` run in a
process of their own: `python3 -m pytest --gpu`.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from torch import Tensor

    from rlnorm.options import OpOptions

REPO_ROOT = Path(__file__).resolve().parent.parent
# the planted faulty backends are named `tests.faults:...`: every child a test starts (backend workers, notebook
# kernels) must import them as pytest itself does, from the repository root
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
GPU_HINT = "run `python3 -m pytest --gpu` on a machine with a CUDA GPU"
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_addoption(parser: pytest.Parser) -> None:
    said = "run only the tests marked gpu, with compiled Triton on a CUDA GPU (default: the CPU suite)"
    parser.addoption("--gpu", action="store_true", help=said)


def pytest_configure(config: pytest.Config) -> None:
    # before anything imports rlnorm or Triton, and before torch initialises CUDA
    import torch

    if config.getoption("--gpu"):
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise pytest.UsageError("--gpu runs compiled Triton kernels: unset TRITON_INTERPRET (it is '1')")
        if not torch.cuda.is_available():
            raise pytest.UsageError("--gpu: no CUDA GPU is visible (torch.cuda.is_available() is False)")
    else:
        if torch.cuda.is_initialized():
            raise pytest.UsageError("the CPU suite must hide the GPUs, but CUDA was initialised before the tests")
        if torch.version.cuda or torch.version.hip:  # a CPU build (CI's) sees no GPU anyway: its env stays as it is
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # read when torch initialises CUDA, which it has not yet
        os.environ["TRITON_INTERPRET"] = "1"
    import rlnorm  # noqa: F401  (with the mode set: rlnorm and Triton read it at import)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # a module without a gpu mark, read as text: --gpu imports no other module, so a GPU machine without the
    # notebook extras can still run it
    if config.getoption("--gpu") and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return "mark.gpu" not in collection_path.read_text(encoding="utf-8")
    return None


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--gpu"):
        return "rlnorm: GPU tests only (compiled Triton)"
    return f"rlnorm: CPU suite (Triton interpreter, GPUs hidden); the tests marked gpu are skipped: {GPU_HINT}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--gpu"):
        deselected = [item for item in items if item.get_closest_marker("gpu") is None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.get_closest_marker("gpu") is not None]
        return
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is not None:
            why = marker.kwargs.get("reason", "needs a CUDA GPU")
            item.add_marker(pytest.mark.skip(reason=f"{why}: {GPU_HINT}"))


def needs_installed_vllm(what: str) -> None:
    """Skip where vllm is not installed; fail on CI, which installs it so that `what` is checked against it."""
    from rlnorm.kit.backends import stack_files as sf

    if sf.installed(sf.PINS["vllm"]) is None:
        msg = "vllm 0.30.0 is not installed here (bash .ci/install-vllm.sh installs it)"
        if IN_CI:
            pytest.fail(f"{msg}: CI must check {what} against the real package")
        pytest.skip(msg)


@pytest.fixture(scope="session")
def installed_vllm() -> Any:
    """The installed vLLM's files (`rlnorm.kit.backends.stack_files.StackFiles`); skips, or fails on CI, without it."""
    from rlnorm.kit.backends import stack_files as sf

    needs_installed_vllm("vLLM's rows")
    return sf.find(sf.PINS["vllm"], sf.installed(sf.PINS["vllm"]))[0]


@pytest.fixture(scope="session")
def vllm_archive(installed_vllm: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tools/stack_sources.py's archive of the installed vLLM's files, packed once per session."""
    out = tmp_path_factory.mktemp("vllm-src")
    tool = REPO_ROOT / "tools" / "stack_sources.py"
    run = [sys.executable, str(tool), "--out", str(out), "vllm"]
    proc = subprocess.run(run, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return out / "vllm-src.tar.gz"


@pytest.fixture(scope="session")
def vllm_facts(vllm_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    """What each section of the suite's one vLLM child (tests/vllm_child.py) found: vllm never enters this process."""
    from rlnorm.kit.process import child_env

    out = tmp_path_factory.mktemp("vllm-facts") / "facts.json"
    run = [sys.executable, str(REPO_ROOT / "tests" / "vllm_child.py"), str(vllm_archive), str(out)]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=900, env=child_env(), check=False)
    assert out.is_file(), f"the vLLM child exited {proc.returncode} without its facts:\n{proc.stderr[-3000:]}"
    found = json.loads(out.read_text())

    def facts(name: str) -> Any:
        assert "error" not in found[name], found[name]["error"]
        return found[name]["facts"]

    return facts


def require(module: str) -> ModuleType:
    """Import `module`; where it is missing, skip (the whole test module, at its top), but fail on CI, which installs
    every extra so that the tests needing it run."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        msg = f"{module} cannot be imported here ({e})"
        if IN_CI:
            pytest.fail(f"{msg}: CI installs it, so the tests that need it must run", pytrace=False)
        pytest.skip(msg, allow_module_level=True)


def oracle(x: Tensor, z: Tensor | None, w: Tensor | None, opts: OpOptions | None = None) -> Tensor:
    """What the kernel must give: the gated norm in fp64, rounded once to x's dtype (w None: a weight of ones)."""
    import torch  # here, not at the top: rlnorm and Triton must not load before pytest_configure sets the mode

    from rlnorm.numerics import round_once
    from rlnorm.options import OpOptions
    from rlnorm.reference import gated_rmsnorm_math

    w = torch.ones(x.shape[-1], dtype=torch.float64) if w is None else w
    return round_once(gated_rmsnorm_math(x, z, w, opts or OpOptions(), torch.float64), x.dtype)


def child_result(script: str, *args: str) -> Any:
    """Run a script in a fresh interpreter (vllm imported there, never here); its last `RESULT <json>` line."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600, check=False
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture
def outputs_dir(tmp_path: Path) -> Path:
    """An empty folder standing in for outputs/ (run folders go under it)."""
    out = tmp_path / "outputs"
    out.mkdir()
    return out


# Check sizes small enough for the Triton interpreter, shared by every test that runs the kit end to end.
TINY_SIZES: dict = {
    "all_rows_sizes": [7],
    "all_rows_seeds": [3],
    "dweight_rows": 7,
    "sub_batches_rows": 15,
    "sub_batch_sizes": [1, 7],
    "sub_batches_seeds": [3],
    "sweep_n": 9,
    "sweep_sizes": [1, 2, 9],
    "sweep_probe_rows": [0, 8],
    "sweep_seeds": [3],
    "accuracy_rows": 63,
    "timing_warmup": 0,
    "timing_iters": 1,
    "agreement_rows": 15,
}


# the checks a verdict needs (docs/spec.md §5.11), and the per-backend checks the suite's kit runs give: all but
# configurations, which only its own tests (test_configurations.py) need
ROW_CHECKS = ["all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep", "launch"]
KIT_CHECKS = [*ROW_CHECKS, "accuracy_latency"]

BATCH_FAULT = "tests.faults:BatchSizeDependentOutput"
POSITION_FAULT = "tests.faults:PositionDependentOutput"
DWEIGHT_FAULT = "tests.faults:NondeterministicDweight"
UNLOADABLE = "no_such_package.anywhere:fn"
SEGFAULT = "tests.faults:SegfaultPastRows"  # dies on its first batch of more than 50 rows


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run (`python -m rlnorm run`) at tiny sizes of `reference`, three planted faulty backends, one that
    segfaults and one that cannot be loaded, read by the notebook and command line tests; its stderr in stderr.txt."""
    base = tmp_path_factory.mktemp("tiny_runs")
    params = {"name": "tiny", "device": "cpu", "progress": False, "backends": ["reference"], **TINY_SIZES}
    params["custom_backends"] = [BATCH_FAULT, POSITION_FAULT, DWEIGHT_FAULT, SEGFAULT, UNLOADABLE]
    # stack_pairs starts processes of its own, proven by its own tests
    params["checks"] = [*KIT_CHECKS, "contract_gates", "agreement", "digests"]
    (base / "tiny.yaml").write_text(json.dumps(params))  # JSON is YAML
    proc = subprocess.run(
        [sys.executable, "-m", "rlnorm", "run", str(base / "tiny.yaml"), "--outputs", str(base)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    (base / "stderr.txt").write_text(proc.stderr)
    # 4 (EXIT_BACKEND): complete, but a custom backend could not be loaded or crashed (a script must hear about it)
    assert proc.returncode == 4, f"tiny run: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return base / "tiny"


class Doorbell:
    """A localhost socket planted code rings (RING_AND_HOLD) where a test acts on it, holding until `close`: the
    test waits for an event, never for a guess of how long a run takes."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._calls: list[socket.socket] = []

    def wait(self, n: int = 1, timeout: float = 300, alive: Callable[[], bool] = lambda: True) -> list[int]:
        """The pids of the first `n` rings; fails where they did not come within `timeout` s or `alive()` turned
        False first."""
        pids: list[int] = []
        deadline = time.monotonic() + timeout
        while len(pids) < n:
            if not alive() or time.monotonic() > deadline:
                raise AssertionError(f"{len(pids)} of {n} rings (the run ended or {timeout} s passed)")
            self._server.settimeout(1.0)  # wakes to look at alive(); a ring is taken the moment it comes
            try:
                call, _ = self._server.accept()
            except TimeoutError:
                continue
            call.settimeout(timeout)
            self._calls.append(call)
            pids.append(int(call.makefile().readline()))
        return pids

    def close(self) -> None:
        for call in self._calls:
            call.close()
        self._server.close()


# planted code's side of a Doorbell: ring with this process's pid, then hold until the test lets go
RING_AND_HOLD = """
import os as _os, socket as _socket
def ring_and_hold(port):
    bell = _socket.create_connection(("127.0.0.1", port))
    bell.sendall(f"{_os.getpid()}\\n".encode())
    bell.recv(1)
"""
