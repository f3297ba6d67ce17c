"""The one way the kit starts a child process, which may crash, hang or poison its device at no cost to the run:
a fresh interpreter (never a fork of a process holding a CUDA context) in a session of its own, killed with its
process group when the wait ends, the end of its stderr kept to say why it died.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

TAIL_LINES = 30


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment, its import path (what `extra` puts on PYTHONPATH first), unbuffered output."""
    extra = dict(extra or {})
    env = dict(os.environ)
    paths = [extra.pop("PYTHONPATH", ""), *sys.path, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    return env


def describe_exit(returncode: int | None) -> tuple[str, str | None]:
    """('killed by SIGSEGV (signal 11)' or 'exited with code 3', the signal's name or None)."""
    if returncode is None:
        return "did not exit", None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (signal {-returncode})", name
    return f"exited with code {returncode}", None


@dataclass
class Ended:
    """How a child ended."""

    returncode: int | None
    timed_out: bool
    timeout_s: float
    seconds: float
    stderr_tail: str  # its last lines
    stdout: str = ""  # only where the child was started with `stdout=True`

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0

    @property
    def cause(self) -> str:
        return f"timed out after {self.timeout_s:g} s" if self.timed_out else describe_exit(self.returncode)[0]

    @property
    def signal(self) -> str | None:
        return None if self.timed_out else describe_exit(self.returncode)[1]

    @property
    def exit_code(self) -> int | None:
        return None if self.timed_out or self.returncode is None or self.returncode < 0 else self.returncode


class Child:
    """`argv` started at once; `wait` ends it. With `hold`, its stdin stays open until `release` writes "go"."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        hold: bool = False,
        stdout: bool = False,
        relay: Callable[[str], None] | None = None,
    ) -> None:
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._out: list[str] = []
        self._relay = relay
        self._held: list[str] = []  # lines printed before release, relayed at release so progress shows in order
        self._released = not hold
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if hold else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=child_env(env),
            start_new_session=True,
        )
        # both pipes drained by threads: a child blocked on a full pipe would look hung
        self._readers = [threading.Thread(target=self._pump_err, daemon=True)]
        if stdout:
            self._readers.append(threading.Thread(target=self._out.extend, args=(self.proc.stdout,), daemon=True))
        for t in self._readers:
            t.start()

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self.tail.append(line.rstrip("\n"))
                if not self._released:
                    self._held.append(line)
                elif self._relay is not None:
                    self._relay(line)

    def release(self) -> None:
        """Let a held child go on (it may still be importing: it goes on when it reads the line)."""
        with self._lock:
            self._released = True
            held, self._held = self._held, []
            for line in held if self._relay is not None else ():
                self._relay(line)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):  # it has ended already: wait() says how
                self.proc.stdin.write("go\n")
                self.proc.stdin.close()

    def kill(self) -> None:
        """Kill whatever is left of the child's process group (itself, compile workers it started)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc.wait()

    def wait(self, timeout_s: float) -> Ended:
        """Release it if held, wait at most `timeout_s` seconds, and say how it ended; never raises for what the
        child did. Whatever ends the wait (the limit, an interrupt of the parent), the child's group is killed."""
        t0 = time.monotonic()
        if not self._released:
            self.release()
        timed_out = False
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            self.kill()
        for t in self._readers:
            t.join(timeout=5)
        seconds = round(time.monotonic() - t0, 2)
        return Ended(self.proc.returncode, timed_out, timeout_s, seconds, "\n".join(self.tail), "".join(self._out))


def run_child(argv: list[str], timeout_s: float, *, env: dict[str, str] | None = None, stdout: bool = False) -> Ended:
    """Run `argv` to its end, or for at most `timeout_s` seconds."""
    return Child(argv, env=env, stdout=stdout).wait(timeout_s)
