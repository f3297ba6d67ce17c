"""Benchmark table logic on the CPU: ratios, rotation, unavailable/failing backends, JSON. No timing claims."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import rlnorm  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU)
from rlnorm import bench
from rlnorm.backends import Backend, UnavailableBackend, load_backends


def fixed_timer(us: float):
    """A fake timer: each call of the timed function once, then a fixed time (the logic, not the clock)."""

    def timer(fn):
        fn()
        return us, us * 0.9, us * 1.1

    return timer


class Eager(Backend):
    key = "eager_test"
    source = "test"

    def _fn(self, x, z, w, opts):
        from rlnorm.reference import rms_norm_gated_reference

        return rms_norm_gated_reference(x, z, w, opts)


class Broken(Eager):
    key = "broken_test"

    def forward(self, x, z, w, opts):
        raise RuntimeError("planted failure")

    def _probe(self, device):
        return True, ""


class ForwardOnly(Eager):
    key = "fwd_only_test"
    has_backward = False


def test_entry_ratios_use_the_add_and_eight_thirds_of_it():
    fwd = bench.entry("k", "fwd", (60.0, 55.0, 65.0), 50.0, 3 * 1000)
    assert fwd["ratio"] == pytest.approx(1.2)
    assert fwd["gbps"] == pytest.approx(3000 / 60e-6 / 1e9)
    fb = bench.entry("k", "fwd_bwd", (200.0, 190.0, 210.0), 50.0, 8 * 1000)
    assert fb["ratio"] == pytest.approx(200.0 / (50.0 * 8 / 3))
    na = bench.entry("k", "fwd", None, 50.0, 1, "unavailable", "why")
    assert na["us"] is None and na["ratio"] is None and na["reason"] == "why"


def test_rotation_never_repeats_a_buffer_back_to_back():
    sets = bench.make_sets(4, 128, torch.bfloat16, "cpu")
    assert len(sets) == bench.MAX_SETS  # tiny sets: as many as allowed
    assert len({s[0].data_ptr() for s in sets}) == len(sets)
    nxt = bench._rotating(sets)
    ptrs = [nxt()[0].data_ptr() for _ in range(2 * len(sets))]
    assert all(a != b for a, b in itertools.pairwise(ptrs))


def test_bench_shape_lists_every_backend_with_status():
    backends = [Eager(), Broken(), ForwardOnly(), UnavailableBackend("vllm", "planted: not installed")]
    shape = bench.bench_shape(3, 128, backends, "cpu", fixed_timer(10.0))
    by = {(e["name"], e["mode"]): e for e in shape["entries"]}
    assert shape["add_us"] == 10.0 and by[("torch.add", "fwd")]["ratio"] == 1.0
    assert by[("eager_test", "fwd")]["status"] == "ok" and by[("eager_test", "fwd_bwd")]["status"] == "ok"
    assert by[("broken_test", "fwd")]["status"] == "failed"
    assert "planted failure" in by[("broken_test", "fwd")]["reason"]
    assert by[("fwd_only_test", "fwd_bwd")]["status"] == "unavailable"
    assert by[("vllm", "fwd")]["status"] == "unavailable" and "planted" in by[("vllm", "fwd")]["reason"]
    text = bench.format_table(shape)
    assert "broken_test" in text and "planted: not installed" in text and "x floor" in text


def test_rlnorm_backend_runs_in_the_table_on_cpu():
    shape = bench.bench_shape(2, 128, load_backends(["rlnorm"]), "cpu", fixed_timer(5.0))
    by = {(e["name"], e["mode"]): e for e in shape["entries"]}
    assert by[("rlnorm", "fwd")]["status"] == "ok"


def test_main_writes_json(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "cpu_timer", lambda reps=3: fixed_timer(1.0))
    out = tmp_path / "bench.json"
    assert bench.main(["--d", "128", "--rows", "2", "--small-rows", "--backends", "reference", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "rlnorm.bench"
    assert [s["rows"] for s in data["shapes"]] == [2]
    assert {e["name"] for e in data["shapes"][0]["entries"]} == {"torch.add", "reference"}
    assert "torch" in data["environment"]
