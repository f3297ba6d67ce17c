"""The parts of the reuse-check page that frame the evidence: who ran what where, and how to read a gate.

The page is what an RFC reader opens first, often as a lone attachment: its first lines say which GPU, which
code and which run it is (the run's timestamp also ties the page to its artifact, which `validate` checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlnorm.kit.steps import Run

__all__ = ["GATE_EXPLANATION", "page_header", "placeholder", "plot_sections", "shown"]

GATE_EXPLANATION = (
    "**Reading the gradient gate.** It compares the backend's *own* dweight (the weight's gradient) with the "
    "exact sum of the single-row dweights, rounded once. A library that sums dweight in fp32 in whatever order "
    "its reduction takes fails it, and its dweight changes when the rows of a batch are permuted or padded: "
    "a trainer then gets a weight gradient that depends on how tokens were packed. rlnorm adds the rows' "
    "contributions exactly (integer counters), so its dweight is the same for every packing."
)


def shown(obj: Any) -> Any:
    """What a cell displays: text (what a table says when it has no rows) as Markdown, a table as it is."""
    from IPython.display import Markdown  # the notebooks' dependency, not the package's

    return Markdown(obj) if isinstance(obj, str) else obj


def plot_sections(figures: Mapping[str, Path]) -> list[tuple[str, Path]]:
    """(heading, PNG) for each figure of the evidence; the verdict figure is shown at the top instead."""
    return [(name.replace("_", " "), png) for name, png in figures.items() if name != "verdict"]


def placeholder(what: str) -> str:
    return f"*The {what} appears here when the run has finished; if it is missing, a cell below failed.*"


def page_header(run: Run) -> str:
    """One line: the run, its device, its code and when it was made (the artifact's own timestamp)."""
    art = run.artifact or {}
    env = art.get("environment") or run.environment or {}
    gpu = env.get("gpu") or f"{run.device} (no GPU)"
    commit = (art.get("commit") or "no commit")[:9] + (
        " (uncommitted changes)" if art.get("tracked_tree_dirty") else ""
    )
    libs = env.get("libraries") or {}
    versions = ", ".join(f"{k} {libs[k]}" for k in ("torch", "triton") if libs.get(k))
    return (
        f"**Run `{run.params.name}`** on **{gpu}** · code `{commit}` · {versions} · "
        f"created {art.get('created_at', 'not yet')} · {len(run.results)} backends"
    )
