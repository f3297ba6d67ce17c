"""Running combinations as processes (`rlnorm.cli.runs`): how many at once, and an interrupt that reaches them."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from rlnorm.cli import runs
from rlnorm.cli.plan import Combination

# a combination's process: says it is up, then waits; told to stop (SIGTERM, as rlnorm's own handler takes it), it
# leaves a mark where the test looks
CHILD = r"""
import signal, sys, time
from pathlib import Path
def stop(signum, frame):
    Path(sys.argv[1]).write_text("stopped")
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)
print("up", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize(
    ("jobs", "gpus", "total", "expected"),
    [(1, ["0", "1"], 4, 2), (1, ["0", "1", "2"], 2, 2), (3, [], 2, 2), (1, [], 5, 1), (4, [], 9, 4)],
)
def test_one_process_per_gpu_whatever_jobs_says(jobs: int, gpus: list[str], total: int, expected: int) -> None:
    assert runs.workers(jobs, gpus, total) == expected


def test_an_interrupt_reaches_every_running_combination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marks = [tmp_path / f"mark{k}" for k in range(2)]
    monkeypatch.setattr(runs, "_child_command", lambda index, argv: [sys.executable, "-c", CHILD, str(marks[index])])
    combos = [Combination(params=None, folder=tmp_path / f"run{k}", values={}, source="t") for k in range(2)]  # type: ignore[arg-type]
    # SIGINT to this process alone, as a scheduler's SIGTERM reaches only the parent: the children must be told
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            runs.run_many(combos, [0, 1], [], jobs=2, gpus=[], progress=False)
    finally:
        timer.cancel()
    assert [m.read_text() for m in marks] == ["stopped", "stopped"]
