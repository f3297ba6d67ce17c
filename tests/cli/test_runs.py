"""Running combinations as processes (`rlnorm.cli.runs`): how many at once, and an interrupt that reaches them."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from conftest import RING_AND_HOLD, Doorbell

from rlnorm.cli import runs
from rlnorm.cli.plan import Combination

# a combination's process: ready to be told to stop (SIGTERM, as rlnorm's own handler takes it: it leaves a mark
# where the test looks), it rings and holds until then
CHILD = (
    RING_AND_HOLD
    + r"""
import signal, sys
from pathlib import Path
def stop(signum, frame):
    Path(sys.argv[2]).write_text("stopped")
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)
ring_and_hold(int(sys.argv[1]))
"""
)


@pytest.mark.parametrize(
    ("jobs", "gpus", "total", "expected"),
    [(1, ["0", "1"], 4, 2), (1, ["0", "1", "2"], 2, 2), (3, [], 2, 2), (1, [], 5, 1), (4, [], 9, 4)],
)
def test_one_process_per_gpu_whatever_jobs_says(jobs: int, gpus: list[str], total: int, expected: int) -> None:
    assert runs.workers(jobs, gpus, total) == expected


def test_an_interrupt_reaches_every_running_combination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bell = Doorbell()
    marks = [tmp_path / f"mark{k}" for k in range(2)]
    child = [sys.executable, "-c", CHILD, str(bell.port)]
    monkeypatch.setattr(runs, "_child_command", lambda index, argv: [*child, str(marks[index])])
    monkeypatch.setattr(runs, "INTERRUPT_GRACE_S", (0.1, 60.0))  # the children here wait to be told: no Ctrl-C came
    combos = [Combination(params=None, folder=tmp_path / f"run{k}", values={}, source="t") for k in range(2)]  # type: ignore[arg-type]
    rang: list[int | AssertionError] = []

    def interrupt_once_both_run() -> None:
        # SIGINT to this process alone, as a scheduler's SIGTERM reaches only the parent: the children must be told
        try:
            rang.extend(bell.wait(2))
        except AssertionError as e:
            rang.append(e)
        os.kill(os.getpid(), signal.SIGINT)

    # as from a terminal: a suite started in the background (`cmd &`) inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=interrupt_once_both_run, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            runs.run_many(combos, [], jobs=2, gpus=[], progress=False)
    finally:
        watcher.join()
        bell.close()
        signal.signal(signal.SIGINT, previous)
    assert len(rang) == 2 and all(isinstance(pid, int) for pid in rang), rang
    assert [m.read_text() for m in marks] == ["stopped", "stopped"]
