"""What every figure shares: titles that say where a run came from, saving, empty panels, number formats."""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rlnorm.kit.artifact import normalize_artifact
from rlnorm.report.verdicts import NOT_RUN, PASSED, crash_brief, ended_state, gate_cell

MISSING_COLOR = "#888888"
OK_COLOR = "#2e7d32"
BAD_COLOR = "#c62828"
THIS_COLOR = "#1f77b4"
REPORT_COLOR = "#9e9e9e"


def as_doc(artifact: Mapping[str, Any]) -> dict[str, Any]:
    """Normalized view (the seed report works as well as our artifacts)."""
    if not isinstance(artifact, Mapping):
        raise TypeError(f"artifact: expected an artifact dict, got {type(artifact).__name__}")
    return normalize_artifact(artifact)


def run_label(artifact: Mapping[str, Any]) -> str:
    """'NVIDIA H200 · commit 1a2b3c4 · params quick': where a figure's numbers come from."""
    env = artifact.get("environment") or {}
    gpu = env.get("gpu") or "unknown device"
    commit = artifact.get("commit") or artifact.get("rl_kernel_commit")
    short = commit[:7] if isinstance(commit, str) else "no commit"
    if artifact.get("tracked_tree_dirty"):
        short += "+dirty"
    if artifact.get("schema_version") == "seed":
        params = "B200 reference report"
    else:
        params = f"params {artifact.get('param_set') or 'unnamed'}"
        if artifact.get("quick"):
            params += " (quick)"
    return f"{gpu} · commit {short} · {params}"


def set_title(fig: Figure, what: str, artifact: Mapping[str, Any], extra: str | None = None) -> None:
    lines = [what, run_label(artifact)]
    if extra:
        lines.extend(extra.split("\n"))
    width = max(int(fig.get_figwidth() * 8.5), 40)  # ~characters of 12pt bold per inch: no clipped titles
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in lines), fontsize=12, fontweight="bold")


def save(fig: Figure, out_dir: str | os.PathLike[str] | None, name: str) -> Path | None:
    if out_dir is None:
        return None
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=100, facecolor="white")
    fig.rlnorm_png = path  # type: ignore[attr-defined]  # where plot_all finds it
    return path


def message(ax: Any, text: str, color: str = MISSING_COLOR, fontsize: float = 11) -> None:
    """Fill a panel with a message instead of data."""
    wrapped = "\n".join(textwrap.fill(line, 70) for line in text.split("\n"))
    ax.text(0.5, 0.5, wrapped, ha="center", va="center", transform=ax.transAxes, color=color, fontsize=fontsize)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_color("#dddddd")


def backend_keys(doc: Mapping[str, Any]) -> list[str]:
    return list((doc.get("results") or {}).keys())


def not_ran(entry: Mapping[str, Any]) -> str | None:
    """Why a backend has no data: 'skipped: reason' / 'failed: reason'; None when it ran, even in part (a backend
    whose process crashed or timed out keeps the checks it finished: each plot shows those, and the crash)."""
    status = entry.get("status") or "ran"
    if status == "ran" or ended_state(entry) is not None:
        return None
    reason = entry.get("skip_reason") or "no reason recorded"
    return f"{status}: {shorten(reason, 90)}"


def shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def accuracy_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    return entry.get("accuracy_latency") or {}


def num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def compact(n: int) -> str:
    """12 -> '12', 524283 -> '524k', 2.6e6 -> '2.6M': bar labels that fit above a narrow bar."""
    if n < 10_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n / 1000:.0f}k"
    return f"{n / 1e6:.1f}M"


def fmt_us(us: float) -> str:
    """Microseconds as a reader scans them: '53.1 us', '865 us', '115.3 ms', '2.16 s'."""
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e4:
        return f"{us / 1e3:,.1f} ms"
    return f"{us:,.0f} us" if us >= 100 else f"{us:.1f} us"


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else (f"{r:.1f}x" if r < 100 else f"{r:,.0f}x")


def cpu_note(doc: Mapping[str, Any]) -> str | None:
    """A CPU run's times (Triton interpreted) say nothing about a GPU: say so on the figure."""
    env = doc.get("environment") or {}
    if env.get("gpu") == "cpu":
        interp = " (Triton interpreted)" if env.get("triton_interpret") == "1" else ""
        return f"CPU run{interp}: times say nothing about GPU speed"
    return None


def rows_measured(doc: Mapping[str, Any]) -> int | None:
    for e in (doc.get("results") or {}).values():
        rows = accuracy_of(e).get("rows")
        if isinstance(rows, int) and rows > 0:
            return rows
    return None


def latency_missing_reason(entry: Mapping[str, Any], field: str) -> str:
    why = not_ran(entry)
    if why is not None:
        return why.split(":")[0]
    acc = accuracy_of(entry)
    if not acc and ended_state(entry) is not None:
        return crash_brief(entry) or "crashed"
    if field == "fwd_bwd_us" and entry.get("backward") == "none":
        return "no backward"
    if not acc:
        return "accuracy_latency not run"
    if acc.get("error"):
        return "check raised"
    if acc.get("timed") is False:
        device = acc.get("device") or "this device"
        return f"not timed ({device})"
    return "not measured"


RATIO_FIELDS = {"fwd_us": "fwd_roofline_ratio", "fwd_bwd_us": "fwd_bwd_roofline_ratio"}
ADD_TENSORS = {"fwd_us": 1.0, "fwd_bwd_us": 8 / 3}  # the add moves 3 tensors; forward+backward must move 8


def own_add_us(acc: Mapping[str, Any], field: str) -> float | None:
    """The floor `field` is measured against: the torch.add timed in the same run beside this backend (3 tensors;
    8/3 of it for forward+backward)."""
    add = num(acc.get("roofline_add_us"))
    return None if add is None or add <= 0 else add * ADD_TENSORS[field]


def roofline_ratio(acc: Mapping[str, Any], field: str) -> float | None:
    """`field`'s time over this backend's own same-run add: the artifact's `fwd_roofline_ratio` /
    `fwd_bwd_roofline_ratio`, or the same quotient from its parts when an artifact lacks the ratio."""
    ratio = num(acc.get(RATIO_FIELDS[field]))
    if ratio is not None:
        return ratio
    t, floor = num(acc.get(field)), own_add_us(acc, field)
    return None if t is None or floor is None else t / floor


def gates_passed(entry: Mapping[str, Any]) -> bool | None:
    """The contract gates the backend could take all passed (None when it could take none: not run, or no
    backward and so no gradient gate)."""
    gates = entry.get("contract_gates") or {}
    cells = [gate_cell(gates.get(name)) for name in ("forward", "gradient")]
    taken = [c for c in cells if c.state != NOT_RUN]
    return all(c.state == PASSED for c in taken) if taken else None
