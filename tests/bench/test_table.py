"""The bench's tables: footnotes said once, the launch-bound note, a comparison of two trees."""

from __future__ import annotations

from bench_fakes import TINY, FixedClock

from rlnorm import timing
from rlnorm.bench import runner, table
from rlnorm.kit.backends import UnavailableBackend


def test_the_launch_bound_note_names_only_shapes_whose_add_is_short():
    """--graph-max-rows can put 262144 rows in a graph: its 47 us add is a memory floor, not a launch."""
    t = timing.Timing

    def shape(rows: int, add_us: float) -> dict:
        entries = [runner.entry("torch.add", "fwd", t(add_us, add_us, add_us), add_us, 3, method="graph")]
        return {"rows": rows, "d": 128, "entries": entries, "graph_tried": True}  # a merge's shape has no "add"

    md = table.format_markdown([shape(32, 1.6), shape(262144, 47.1)])
    launch = next(line for line in md.splitlines() if "launch-bound" in line)
    floor = next(line for line in md.splitlines() if "memory floor." in line)
    assert "32x128" in launch and "262144x128" not in launch
    assert "262144x128" in floor and "32x128" not in floor
    assert "launch-bound" not in table.format_markdown([shape(262144, 47.1)])


def test_a_reason_that_holds_everywhere_is_said_once():
    backends = [UnavailableBackend("vllm", "planted: not installed")]
    shapes = [runner.bench_shape(r, 128, backends, "cpu", FixedClock(), TINY) for r in (2, 3)]
    md = table.format_markdown(shapes)
    assert md.count("planted: not installed") == 1 and "[every shape]" in md
