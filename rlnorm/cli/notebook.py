"""Execute a notebook of this checkout with papermill into a folder, and render its page (without the code)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from rlnorm.checkout import CHECKOUT, PACKAGE_DIR
from rlnorm.kit.artifact import write_atomic
from rlnorm.kit.steps import PROGRESS_ENV
from rlnorm.kit.worker import PLAIN_ENV


def notebook_source(name: str) -> Path:
    """The jupytext source of a notebook of this checkout."""
    path = (CHECKOUT or Path.cwd()) / "notebooks" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"notebook source {path} not found (run from a checkout: pip install -e .)")
    return path


@contextlib.contextmanager
def _echo_progress(path: Path) -> Iterator[None]:
    """Copy what the kernel writes to `path` (the run's progress lines) to our stderr while the notebook runs."""
    stop = threading.Event()

    def pump() -> None:
        with open(path, encoding="utf-8", errors="replace") as f:
            done = False
            while not done:  # after the stop, one last read: everything the kernel wrote is in the file by then
                done = stop.wait(0.2)
                sys.stderr.write(f.read())
                sys.stderr.flush()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _engine(started: list[str]) -> str:
    """A papermill engine that notes each code cell as it starts (so a kernel that dies mid-cell still has that
    cell named) and runs its kernel over IPC sockets (a local kernel needs no TCP port, and ipykernel warns about
    every unencrypted one)."""
    from jupyter_client.manager import AsyncKernelManager
    from papermill.engines import NBClientEngine, papermill_engines

    class IpcKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.transport = "ipc"
            # sockets in a folder of this kernel's own: two runs at once (--jobs) never share one
            self._sockets = tempfile.mkdtemp(prefix="rlnorm-kernel-")
            self.ip = os.path.join(self._sockets, "kernel")

        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            # the kernel's own log (ipykernel's warnings, its complaints while a run is interrupted) is not the
            # run's output: what the run says comes through the notebook and the progress file
            self._log = open(os.path.join(self._sockets, "kernel.log"), "w")
            await super()._async_launch_kernel(kernel_cmd, stdout=self._log, stderr=self._log, **kw)

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart)
            if not restart:
                with contextlib.suppress(AttributeError, OSError):
                    self._log.close()
                shutil.rmtree(self._sockets, ignore_errors=True)

    class RlnormEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
            original = nb_man.cell_start
            code_cells = [c for c in nb_man.nb.cells if c.cell_type == "code"]

            def cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
                if cell.cell_type == "code" and cell in code_cells:  # named by its title, else its first line
                    title = cell.get("metadata", {}).get("title")
                    first = next((ln for ln in cell.get("source", "").splitlines() if ln.strip()), "")
                    said = repr(title) if title else f"({first[:60]!r})"
                    started.append(f"cell {code_cells.index(cell) + 1} {said}")
                return original(cell, cell_index, **kw)

            nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, kernel_manager_class=IpcKernelManager,
                                                    **kwargs)  # fmt: skip

    papermill_engines.register("rlnorm", RlnormEngine)
    return "rlnorm"


def render_html(executed: Path, html: Path, title: str) -> Path:
    """The executed notebook as one self-contained HTML page without the code: what an RFC reader opens."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    # the lab page with nothing fetched from the network (see the template's own comment)
    exporter = HTMLExporter(extra_template_basedirs=[str(PACKAGE_DIR / "cli/templates")], template_name="rlnorm_page",
                            exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)  # fmt: skip
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    return write_atomic(html, body)


def execute(notebook: str, params: dict[str, Any], workdir: Path, *, progress: bool = True, title: str,
            env: dict[str, str] | None = None) -> tuple[Path, str | None]:  # fmt: skip
    """Execute `notebooks/<notebook>.py` with `params` into `workdir` (`<notebook>.ipynb` and `.html` there):
    (executed notebook, None or why it failed); raises only for what is not the notebook's doing (an interrupt)."""
    import jupytext
    import nbformat
    import papermill as pm

    source = jupytext.read(notebook_source(notebook))
    source.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    input_nb = workdir / f".{notebook}.input.ipynb"
    nbformat.write(source, input_nb)
    progress_file = Path(tempfile.mkstemp(prefix="rlnorm-progress-", suffix=".log")[1])
    started: list[str] = []
    failure: str | None = None
    executed = workdir / f"{notebook}.ipynb"
    kernel_env = {
        # the kernel must be this interpreter, whatever `python` a system kernelspec names
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        PROGRESS_ENV: str(progress_file),
        # inline, so display(fig) puts PNGs in the notebook whatever MPLBACKEND the shell has
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        # a log file or a pipe: lines, not bars redrawn with cursor codes
        **({} if sys.stderr.isatty() else {PLAIN_ENV: "1"}),
        **(env or {}),
    }
    # a dead kernel or a failing cell comes back as an exception, said once below: not also as log lines
    quiet = {lg: lg.level for lg in map(logging.getLogger, ("papermill", "traitlets"))}
    try:
        for lg in quiet:
            lg.setLevel(logging.CRITICAL)
        echo = _echo_progress(progress_file) if progress else contextlib.nullcontext()
        with mock.patch.dict(os.environ, kernel_env), echo:
            pm.execute_notebook(str(input_nb), str(executed), parameters=params, kernel_name="python3",
                                engine_name=_engine(started), progress_bar=False, log_output=False,
                                cwd=os.getcwd())  # fmt: skip
    except pm.PapermillExecutionError as exc:  # papermill stops at the failing cell: the last one started
        failure = f"{started[-1] if started else 'an unknown cell'} failed: {exc.ename}: {exc.evalue}"
    except Exception as exc:  # the kernel died (out of memory, a crash in native code) or would not start
        where = started[-1] if started else "the kernel start"
        failure = f"{where} did not finish: {type(exc).__name__}: {str(exc).strip()[:500]}"
    finally:
        for lg, level in quiet.items():
            lg.setLevel(level)
        progress_file.unlink(missing_ok=True)
    input_nb.unlink(missing_ok=True)
    if executed.exists():
        render_html(executed, workdir / f"{notebook}.html", title)
    return executed, failure
