"""What every figure shares: titles that say where a run came from, saving, empty panels, number formats."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rlnorm.kit.results import Accuracy, BackendResult, RunResult
from rlnorm.report.runs import run_label
from rlnorm.report.verdict import crash_words

MISSING_COLOR = "#888888"
OK_COLOR = "#2e7d32"
BAD_COLOR = "#c62828"
THIS_COLOR = "#1f77b4"


def save(fig: Figure, folder: Path | None, name: str) -> Figure:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        fig.savefig(folder / f"{name}.png", dpi=100, facecolor="white")
    return fig


def finish(fig: Figure, folder: Path | None, name: str, what: str, run: RunResult, extra: str | None = None) -> Figure:
    """Title the figure, then the GPU, commit and parameter set (a PNG pasted alone still says its source), and save
    it as `<name>.png` in `folder` (if given)."""
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


def compact(n: int) -> str:
    """12 -> '12', 524283 -> '524k', 2.6e6 -> '2.6M': labels that fit above a narrow bar."""
    return f"{n:,}" if n < 10_000 else (f"{n / 1000:.0f}k" if n < 1_000_000 else f"{n / 1e6:.1f}M")


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


ADD_TENSORS = {"fwd_us": 1.0, "fwd_bwd_us": 8 / 3}  # the add moves 3 tensors; forward+backward must move 8


def own_add_us(acc: Accuracy, field: str) -> float | None:
    """The floor `field` is measured against: the torch.add timed beside this backend in the same run."""
    add = acc.roofline_add_us
    return None if add is None or add <= 0 else add * ADD_TENSORS[field]


def roofline_ratio(acc: Accuracy, field: str) -> float | None:
    """`field`'s time over this backend's own same-run add: the artifact's ratio, or the quotient of its parts."""
    ratio = acc.fwd_roofline_ratio if field == "fwd_us" else acc.fwd_bwd_roofline_ratio
    if ratio is not None:
        return ratio
    t, floor = getattr(acc, field), own_add_us(acc, field)
    return None if t is None or floor is None else t / floor


def missing_reason(result: BackendResult, field: str) -> str:
    """Why a backend has no `field` (a time, or the correctly rounded fraction)."""
    if result.status in ("skipped", "failed"):
        return result.status
    acc = result.accuracy_latency
    if acc is None:
        return crash_words(result, brief=True) or "accuracy_latency not run"
    if field == "fwd_bwd_us" and not result.has_backward:
        return "no backward"
    if acc.error:
        return "check raised"
    if acc.timed is False and field.endswith("_us"):
        return f"not timed ({acc.device or 'this device'})"
    return "not measured"
