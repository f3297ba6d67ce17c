"""The verdict figure's status column: each skipped or crashed backend says why in one line, and no two lines (nor a
line and the figure's edge) overlap, however long the reasons are; the stack pairs figure draws every pair."""

from __future__ import annotations

import itertools

from matplotlib.backends.backend_agg import FigureCanvasAgg
from planted import planted_run

from rlnorm.kit.results import BackendResult, StackPair, StackPairs
from rlnorm.report.plots.counts import COLUMNS, plot_verdict
from rlnorm.report.plots.pairs import plot_stack_pairs

LONG = (
    "cannot import vllm.model_executor.layers.layernorm: ModuleNotFoundError: No module named 'vllm'; "
    "`bash .ci/install-vllm.sh` installs vllm==0.30.0 beside the installed torch where a package index is "
    "reachable; `python tools/stack_sources.py` packs an installed vLLM's Python files for a machine without one"
)


def _extents(fig, texts):
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return [t.get_window_extent(renderer) for t in texts], fig.bbox


def test_long_skip_reasons_are_one_line_each_and_nothing_overlaps() -> None:
    run, _ = planted_run()
    for i in range(5):  # five vLLM-like rows skipped with the same long reason, one under the other
        run.results[f"vllm_{i}"] = BackendResult(f"vllm {i}", "none", "skipped", LONG)
    fig = plot_verdict(run)
    ax = fig.axes[0]
    notes = [t for t in ax.texts if t.get_position()[0] > len(COLUMNS) - 1 and t.get_text()]  # the status column
    assert len(notes) == 8  # the five, the planted skipped, unloadable and crashed backends
    assert all("\n" not in t.get_text() for t in notes)
    assert sum(t.get_text() == "skipped: No module named 'vllm'" for t in notes) == 5  # the error's own words
    boxes, figure = _extents(fig, notes)
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b)
    assert all(figure.x0 <= b.x0 and b.x1 <= figure.x1 for b in boxes)


def test_the_stack_pairs_figure_has_a_bar_per_pair_and_says_why_one_was_skipped() -> None:
    run, _ = planted_run()
    pairs = [
        StackPair("same", "ran", trainer="rlnorm", sampler="rlnorm", bitwise_equal=True, elements_differ=0, max_ulp=0),
        StackPair("differs", "ran", trainer="a", sampler="b", bitwise_equal=False, elements_differ=640, max_ulp=2),
        StackPair("missing", "skipped", trainer="x", sampler="y", reason=LONG),
    ]
    run.stack_pairs = StackPairs(rows=10, d=128, seed=3, device="cpu", pairs=pairs)
    ax = plot_stack_pairs(run).axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert widths == [0.0, 50.0, 0.0]  # 640 of 1280 elements: 50 %
    words = [t.get_text() for t in ax.texts]
    assert words[0] == "bitwise equal" and "max 2 ulp" in words[1] and words[2].startswith("skipped: cannot import")
    assert ax.get_xlabel() and ax.get_ylabel()
