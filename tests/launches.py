"""A recorder standing in for a Triton kernel: the tests read what each launch received (the kit's stack rows, the
kernel's variants, and vLLM's launches in the vLLM child, which imports it from this folder)."""

from __future__ import annotations

from typing import Any


class Launches:
    """Records each `kernel[grid](*args, **kwargs)`, then launches the real kernel."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.calls.append({"grid": tuple(grid), "args": args, "kwargs": kwargs})
            return self.kernel[grid](*args, **kwargs)

        return launch


def record(monkeypatch: Any, module: Any, name: str) -> Launches:
    """A recorder in place of `module.name` until the test ends."""
    rec = Launches(getattr(module, name))
    monkeypatch.setattr(module, name, rec)
    return rec
