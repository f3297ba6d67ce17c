"""Benchmark logic on the CPU: ratios, rotation, clocks and graph fallback, statuses, JSON. No timing claims."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from bench_fakes import (
    TINY,
    Broken,
    Eager,
    FakeEvent,
    FakeGraph,
    FakeGraphClock,
    FakeStream,
    FixedClock,
    ForwardOnly,
    HostSync,
    by_key,
)

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU)
from rlnorm import timing
from rlnorm.bench import runner, table
from rlnorm.kit.backends import Grads, UnavailableBackend, load_backends


def test_entry_ratios_use_the_same_method_add_and_eight_thirds_of_it():
    t = timing.Timing(60.0, 55.0, 65.0)
    fwd = runner.entry("k", "fwd", t, 50.0, 3 * 1000, method="graph", wall=timing.Timing(90, 80, 100), add_wall_us=9.0)
    assert fwd["ratio"] == pytest.approx(1.2)
    assert fwd["gbps"] == pytest.approx(3000 / 60e-6 / 1e9)
    assert fwd["wall_ratio"] == pytest.approx(10.0) and fwd["method"] == "graph"
    fb = runner.entry("k", "fwd_bwd", timing.Timing(200.0, 190.0, 210.0), 50.0, 8 * 1000, add_wall_us=9.0)
    assert fb["ratio"] == pytest.approx(200.0 / (50.0 * 8 / 3))
    assert fb["wall_us"] is None and fb["wall_ratio"] is None
    na = runner.entry("k", "fwd", None, 50.0, 1, "unavailable", "why")
    assert na["us"] is None and na["ratio"] is None and na["reason"] == "why"
    assert runner.entry("k", "fwd", t, None, 1)["ratio"] is None  # no yardstick: no ratio, not a made-up one


def test_summarize_quantiles():
    t = timing.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.us, t.p20, t.p80) == (3.0, 1.8, 4.2)
    assert timing.summarize([7.0]).us == 7.0
    with pytest.raises(ValueError, match="samples"):
        timing.summarize([])
    assert t.scaled(0.5).us == 1.5


def test_rotation_never_repeats_a_buffer_back_to_back():
    sets = timing.make_sets(4, 128, torch.bfloat16, "cpu")
    assert len(sets) == timing.MAX_SETS  # tiny sets: as many as allowed
    assert len({s[0].data_ptr() for s in sets}) == len(sets)
    nxt = timing.rotating(sets)
    ptrs = [nxt()[0].data_ptr() for _ in range(2 * len(sets))]
    assert all(a != b for a, b in itertools.pairwise(ptrs))
    calls = runner._calls(lambda s: s[0].data_ptr(), sets, 5)
    assert len({c() for c in calls}) == 5  # each captured call reads its own static buffers


def test_bench_shape_lists_every_backend_with_status():
    backends = [Eager(), Broken(), ForwardOnly(), UnavailableBackend("vllm", "planted: not installed")]
    shape = runner.bench_shape(3, 128, backends, "cpu", FixedClock(10.0), TINY)
    by = by_key(shape)
    assert shape["add_us"] == 10.0 and by[("torch.add", "fwd")]["ratio"] == 1.0
    assert by[("eager_test", "fwd")]["status"] == "ok" and by[("eager_test", "fwd_bwd")]["status"] == "ok"
    assert by[("eager_test", "fwd")]["method"] == "events"
    assert "no CUDA graphs" in by[("eager_test", "fwd")]["method_reason"]
    assert by[("broken_test", "fwd")]["status"] == "failed"
    assert "planted failure" in by[("broken_test", "fwd")]["reason"]
    assert by[("fwd_only_test", "fwd_bwd")]["status"] == "unavailable"
    assert by[("vllm", "fwd")]["status"] == "unavailable" and "planted" in by[("vllm", "fwd")]["reason"]
    assert by[("vllm", "fwd_bwd")]["status"] == "unavailable"
    text = table.format_table(shape)
    assert "broken_test" in text and "planted: not installed" in text and "x floor" in text
    md = table.format_markdown([shape])
    assert md.startswith("| rows | D | backend |") and "planted failure" in md and "planted: not installed" in md


def test_graph_clock_times_per_call_against_the_graph_timed_add():
    clock = FakeGraphClock(us=10.0, wall_us=30.0, per_call_us=2.0)
    shape = runner.bench_shape(3, 128, [Eager()], "cpu", clock, TINY)
    by = by_key(shape)
    assert set(shape["add"]) == {"wall", "events", "graph"}
    assert shape["add_us"] == pytest.approx(2.0)  # per call: replay time / calls captured
    assert by[("torch.add", "fwd")]["graph_check"] == "bitwise"
    for mode, floor in (("fwd", 2.0), ("fwd_bwd", 2.0 * 8 / 3)):
        e = by[("eager_test", mode)]
        assert e["method"] == "graph" and e["graph_check"] == "bitwise", e
        assert e["us"] == pytest.approx(2.0) and e["ratio"] == pytest.approx(2.0 / floor)
        assert e["wall_us"] == 30.0 and e["wall_ratio"] == pytest.approx(30.0 / (floor / 2.0 * 30.0))
    fp = shape["fastest_peer"]["fwd"]
    assert fp["name"] == "eager_test" and fp["rlnorm_over_fastest"] is None
    assert fp["wall"] == {"name": "eager_test", "us": 30.0, "rlnorm_us": None, "rlnorm_over_fastest": None}


def test_uncapturable_backend_falls_back_to_events_with_its_reason():
    shape = runner.bench_shape(3, 128, [Eager(), HostSync()], "cpu", FakeGraphClock(us=10.0), TINY)
    by = by_key(shape)
    for mode in ("fwd", "fwd_bwd"):
        e = by[("host_sync_test", mode)]
        assert e["status"] == "ok" and e["method"] == "events"
        assert "capture failed" in e["method_reason"] and "planted" in e["method_reason"]
        assert e["add_us"] == 10.0  # its ratio is against the events-timed add, not the graph-timed one
        assert e["ratio"] == pytest.approx(10.0 / timing.floor_us(10.0, mode))
        assert by[("eager_test", mode)]["method"] == "graph"
    md = table.format_markdown([shape])
    assert "host_sync_test: events, not graph: capture failed" in md


def test_a_graph_that_replays_nothing_is_refused():
    """Poisoned outputs left unwritten by the replay: the graph's time would not be the backend's."""
    shape = runner.bench_shape(3, 128, [Eager()], "cpu", FakeGraphClock(lazy=True), TINY)
    e = by_key(shape)[("eager_test", "fwd")]
    assert e["method"] == "events" and "differs from an eager call" in e["method_reason"]
    assert "graph" in shape["add_notes"]  # the add's lazy graph is refused too, and said so


def test_verify_graph_accepts_close_and_names_the_tensor():
    y = torch.ones(2, 4)
    g = Grads(y=y.clone(), dx=y.clone(), dz=None, dw=torch.ones(4))
    cap = timing.Captured([g], lambda: (g.y.fill_(1.0), g.dx.fill_(1.0), g.dw.fill_(1.0 + 1e-4)))
    assert timing.verify_graph(cap, [lambda: Grads(y=y, dx=y, dz=None, dw=torch.ones(4))], lambda: None) == "close"
    cap_bad = timing.Captured([g], lambda: (g.y.fill_(1.0), g.dx.fill_(2.0), g.dw.fill_(1.0)))
    with pytest.raises(timing.GraphMismatch, match="dx"):
        timing.verify_graph(cap_bad, [lambda: Grads(y=y, dx=y, dz=None, dw=torch.ones(4))], lambda: None)


def test_large_shapes_skip_graphs_and_say_why():
    shape = runner.bench_shape(65, 128, [Eager()], "cpu", FakeGraphClock(), TINY)  # 65 > graph_max_rows
    e = by_key(shape)[("eager_test", "fwd")]
    assert e["method"] == "events" and "graph_max_rows" in e["method_reason"]
    assert "graph" not in shape["add"]


def test_fastest_peer_compares_rlnorm_with_the_best_other_backend():
    t = timing.Timing
    entries = [
        runner.entry("torch.add", "fwd", t(1, 1, 1), 1.0, 3, method="graph"),
        runner.entry("rlnorm", "fwd", t(4, 4, 4), 1.0, 3, method="graph"),
        runner.entry("a", "fwd", t(3, 3, 3), 1.0, 3, method="events"),
        runner.entry("b", "fwd", t(5, 5, 5), 1.0, 3, method="graph"),
        runner.entry("c", "fwd", None, 1.0, 3, "failed", "x"),
    ]
    fp = runner.fastest_peer(entries)
    assert fp["fwd"]["name"] == "a" and fp["fwd"]["rlnorm_over_fastest"] == pytest.approx(4 / 3)
    assert fp["fwd"]["same_method"] is False and fp["fwd_bwd"] is None
    assert fp["fwd"]["wall"] is None  # no wall times given: none made up
    assert "(different clocks)" in table.format_markdown(
        [{"rows": 1, "d": 128, "entries": entries, "fastest_peer": fp, "graph_tried": True}]
    )


def test_rlnorm_backend_runs_in_the_table_on_cpu():
    shape = runner.bench_shape(2, 128, load_backends(["rlnorm"]), "cpu", FixedClock(5.0), TINY)
    assert by_key(shape)[("rlnorm", "fwd")]["status"] == "ok"


def test_cpu_clock_returns_ordered_quantiles():
    t = timing.CpuClock().events(lambda: None, 3, 1)
    assert t.p20 <= t.us <= t.p80 and not t.host_bound
    w = timing.CpuClock().wall(lambda: None, 2, 3)
    assert w.p20 <= w.us <= w.p80
    with pytest.raises(timing.GraphUnavailable, match="CUDA"):
        timing.CpuClock().capture([lambda: None], 1)


def test_cuda_clock_code_paths_with_a_fake_cuda(monkeypatch):
    """Every line of CudaClock runs (no GPU here): a typo there would cost the one GPU run."""
    for name, value in {
        "Event": FakeEvent,
        "_sleep": lambda cycles: None,
        "synchronize": lambda device=None: None,
        "current_stream": lambda device=None: FakeStream(),
        "Stream": FakeStream,
        "stream": lambda s: contextlib.nullcontext(),
        "CUDAGraph": FakeGraph,
        "graph": lambda g: contextlib.nullcontext(),
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)
    clock = timing.CudaClock("cuda")
    assert clock.cycles_per_us() == pytest.approx(20_000_000 / 4.0)
    t = clock.events(lambda: None, 13, 1)  # two chunks
    assert t.us == pytest.approx(4.0) and not t.host_bound
    assert clock.wall(lambda: None, 2, 2).us >= 0
    shape = runner.bench_shape(3, 128, [Eager(), HostSync()], "cpu", clock, TINY)
    by = by_key(shape)
    for key in ("eager_test", "host_sync_test"):
        e = by[(key, "fwd_bwd")]
        assert e["status"] == "ok" and e["method"] == "events"
        assert "differs from an eager call" in e["method_reason"]  # the fake graph replays nothing
    assert shape["add_notes"]["graph"].startswith("replay's y differs")


def test_fastest_peer_by_wall_time_too():
    t, w = timing.Timing, timing.Timing
    entries = [
        runner.entry("rlnorm", "fwd", t(4, 4, 4), 1.0, 3, method="graph", wall=w(20, 20, 20), add_wall_us=5.0),
        runner.entry("a", "fwd", t(3, 3, 3), 1.0, 3, method="graph", wall=w(40, 40, 40), add_wall_us=5.0),
        runner.entry("b", "fwd", t(5, 5, 5), 1.0, 3, method="graph", wall=w(10, 10, 10), add_wall_us=5.0),
    ]
    fp = runner.fastest_peer(entries)["fwd"]
    assert fp["name"] == "a" and fp["rlnorm_over_fastest"] == pytest.approx(4 / 3) and fp["same_method"]
    assert fp["wall"]["name"] == "b" and fp["wall"]["rlnorm_over_fastest"] == pytest.approx(2.0)
    md = table.format_markdown([{"rows": 32, "d": 128, "entries": entries, "fastest_peer": {"fwd": fp}}])
    assert "rlnorm 1.33x the fastest peer (a, 3.0 us, graph); eager 2.00x (b, 10.0 us)" in md


def test_a_stated_commit_wins_over_git(monkeypatch):
    """The GPU copy of the tree may carry a stale .git: $RLNORM_COMMIT, when given, is what is recorded."""
    from rlnorm.kit import environment

    monkeypatch.setattr(environment, "git_commit", lambda repo_dir=None: "0" * 40)
    monkeypatch.setattr(environment, "tracked_tree_dirty", lambda repo_dir=None: True)
    monkeypatch.delenv(environment.COMMIT_ENV, raising=False)
    monkeypatch.delenv(environment.DIRTY_ENV, raising=False)
    assert runner.code_version() == {"commit": "0" * 40, "tracked_tree_dirty": True, "commit_source": "git"}
    monkeypatch.setenv(environment.COMMIT_ENV, "A5D5072")
    monkeypatch.setenv(environment.DIRTY_ENV, "0")
    v = runner.code_version()
    assert v["commit"] == "a5d5072" and v["tracked_tree_dirty"] is False and v["commit_source"] == "RLNORM_COMMIT"
    assert v["git_head"] == "0" * 40 and v["git_dirty"] is True
    monkeypatch.setenv(environment.DIRTY_ENV, "maybe")
    with pytest.raises(ValueError, match="RLNORM_TREE_DIRTY"):
        runner.code_version()
    monkeypatch.setenv(environment.COMMIT_ENV, "not-a-hash")
    with pytest.raises(ValueError, match="RLNORM_COMMIT"):
        runner.code_version()
