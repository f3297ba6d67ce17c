"""Double-click a jupytext source in a real JupyterLab, in headless Chromium, and say what opened.

    python tools/lab_check.py [--chromium PATH] [--file notebooks/investigate_rows.py] [--config-path DIR|none]

The shipped `.jupyter/labconfig/default_setting_overrides.json` makes "Jupytext Notebook" the default viewer for
Python files; the settings API accepting it does not show that a double click in the file browser honours it, so
this drives the file browser as a person would. It starts `jupyter lab` from the repository root with
JUPYTER_CONFIG_PATH set to --config-path (`none`: unset, the control that must open a text editor) and the user's
own Jupyter config, settings and workspaces replaced by empty ones (a per-user default viewer would hide a broken
shipped one), double-clicks each folder of --file and then the file, and prints what opened. Exit status: 0 a
notebook (cells and a started kernel), 1 a text editor, 2 anything else.

Needs jupyterlab and jupytext importable by this Python, Playwright for Python, and a Chromium binary (Debian's
`chromium`; Playwright's own browser download is not used).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a closed network: without these Chromium keeps dialling update and sync services
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NOTEBOOK = "#jp-main-dock-panel .jp-NotebookPanel:visible"
EDITOR = "#jp-main-dock-panel .jp-FileEditor:visible"
TAB = "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel"


@dataclass(frozen=True)
class Opened:
    """What the double click left in the main area."""

    kind: str  # "notebook", "editor", "notebook without a kernel" or "nothing"
    tab: str
    cells: int
    kernel: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(port: int, config_path: str, home: Path, log: Path) -> subprocess.Popen:
    """`jupyter lab` on 127.0.0.1:port, rooted at the checkout, with nothing of the user's Jupyter set-up and its
    checkpoints under home."""
    env = dict(os.environ)
    env.pop("JUPYTER_CONFIG_PATH", None)
    if config_path != "none":
        env["JUPYTER_CONFIG_PATH"] = str(Path(config_path).resolve())
    for var, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
    ]:
        env[var] = str(home / sub)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}"]
    cmd += ["--ip=127.0.0.1", "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={ROOT}"]
    cmd += [f"--FileCheckpoints.root_dir={home / 'checkpoints'}"]  # opening a file checkpoints it: not in the tree
    with log.open("w") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(url: str, server: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with status {server.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"jupyter lab did not serve {url} within {timeout:.0f} s")


def double_click_open(url: str, chromium: str, rel: Path, profile: Path, screenshot: Path) -> Opened:
    """Open JupyterLab, double-click through the file browser to rel, and read what the main area shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            page = ctx.new_page()
            page.goto(url)
            listing = page.locator(".jp-FileBrowser .jp-DirListing-content")
            listing.wait_for(timeout=60_000)
            for name in rel.parts:
                listing.locator(".jp-DirListing-itemText").get_by_text(name, exact=True).dblclick(timeout=30_000)
            kind, title, cells, kernel = "nothing", "", 0, ""
            try:
                page.locator(f"{NOTEBOOK}, {EDITOR}").first.wait_for(timeout=60_000)
                title = page.locator(TAB).first.inner_text().strip()
                kind = "editor" if page.locator(EDITOR).count() else "notebook without a kernel"
                if kind != "editor":
                    panel = page.locator(NOTEBOOK).first
                    panel.locator(".jp-Cell").first.wait_for(timeout=30_000)
                    page.wait_for_timeout(1_000)  # the cells' rendering settles before counting them
                    cells = panel.locator(".jp-Cell").count()
                    name = panel.locator(".jp-Toolbar-kernelName").first
                    # the toolbar names the kernel once a session runs for the notebook ("No Kernel" until then)
                    page.wait_for_function(
                        "el => !/no kernel|kernel$/i.test(el.innerText.trim())",
                        arg=name.element_handle(),
                        timeout=60_000,
                    )
                    # and the kernel started: the status bar reads "<kernel> | Idle"
                    page.locator("#jp-main-statusbar").get_by_text("| Idle").wait_for(timeout=60_000)
                    kind, kernel = "notebook", name.inner_text().strip()
            except PlaywrightTimeout:
                pass
            page.screenshot(path=str(screenshot))
            return Opened(kind, title, cells, kernel)
        finally:
            ctx.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/lab_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium binary (default %(default)s)")
    parser.add_argument("--file", default="notebooks/investigate_rows.py", help="relative to the repository root")
    parser.add_argument(
        "--config-path", default=str(ROOT / ".jupyter"), help="JUPYTER_CONFIG_PATH for jupyter lab, or `none`"
    )
    parser.add_argument(
        "--screenshot", default=str(Path(tempfile.gettempdir()) / "lab_check.png"), help="PNG after the double click"
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds for jupyter lab to start")
    args = parser.parse_args(argv)

    rel = Path(args.file)
    if rel.is_absolute() or not (ROOT / rel).is_file():
        parser.error(f"--file: expected a file relative to {ROOT}, got {args.file}")
    if args.config_path != "none" and not Path(args.config_path).is_dir():
        parser.error(f"--config-path: expected a Jupyter config folder or `none`, got {args.config_path}")
    if not Path(args.chromium).is_file():
        parser.error(f"--chromium: expected a Chromium binary, got {args.chromium} (no such file)")
    screenshot = Path(args.screenshot).resolve()
    with tempfile.TemporaryDirectory(prefix="lab_check.") as tmp:
        home, port = Path(tmp), free_port()
        log = home / "jupyter-lab.log"
        server = start_lab(port, args.config_path, home, log)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(f"{base}/api/status", server, args.timeout)
            opened = double_click_open(f"{base}/lab", args.chromium, rel, home / "chromium", screenshot)
        except Exception as e:  # the server's log says why, and the status stays apart from "a text editor"
            print(f"{log.read_text()[-4000:]}\nlab_check: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
    print(f"{rel}: opened as {opened.kind}; tab {opened.tab!r}, {opened.cells} cells, kernel {opened.kernel!r}")
    print(f"screenshot: {screenshot}")
    return {"notebook": 0, "editor": 1}.get(opened.kind, 2)


if __name__ == "__main__":
    sys.exit(main())
