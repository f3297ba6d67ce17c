"""What every figure shares: titles that say where a run came from, saving, empty panels, number formats."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rlnorm.kit.results import RunResult
from rlnorm.report.runs import run_label

MISSING_COLOR = "#888888"
OK_COLOR = "#2e7d32"
BAD_COLOR = "#c62828"


def save(fig: Figure, folder: Path | None, name: str) -> Figure:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        fig.savefig(folder / f"{name}.png", dpi=100, facecolor="white")
    return fig


def finish(fig: Figure, folder: Path | None, name: str, what: str, run: RunResult, extra: str | None = None) -> Figure:
    """Title the figure, then the GPU, commit and parameter set: a PNG pasted alone still says its source."""
    lines = [what, run_label(run), *(extra.split("\n") if extra else [])]
    width = max(int(fig.get_figwidth() * 8.5), 40)  # ~characters of 12pt bold per inch: no clipped titles
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in lines), fontsize=12, fontweight="bold")
    return save(fig, folder, name)


def message(ax: Any, text: str, color: str = MISSING_COLOR, fontsize: float = 11) -> None:
    """Fill a panel with a message instead of data."""
    wrapped = "\n".join(textwrap.fill(line, 70) for line in text.split("\n"))
    ax.text(0.5, 0.5, wrapped, ha="center", va="center", transform=ax.transAxes, color=color, fontsize=fontsize)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_color("#dddddd")


def fmt_us(us: float) -> str:
    """Microseconds as a reader scans them: '53.1 us', '865 us', '115.3 ms', '2.16 s'."""
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e4:
        return f"{us / 1e3:,.1f} ms"
    return f"{us:,.0f} us" if us >= 100 else f"{us:.1f} us"


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else (f"{r:.1f}x" if r < 100 else f"{r:,.0f}x")


def cpu_note(run: RunResult) -> str | None:
    """A CPU run's times (Triton interpreted) say nothing about a GPU: say so on the figure."""
    if run.environment.get("gpu") not in (None, "cpu") or run.is_seed:
        return None
    interp = " (Triton interpreted)" if run.environment.get("triton_interpret") == "1" else ""
    return f"CPU run{interp}: times say nothing about GPU speed"
