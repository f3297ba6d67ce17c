"""The `configurations` check: every launch configuration a kernel could pick, run against each other."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
import triton
import triton.language as tl
from conftest import REPO_ROOT

from rlnorm.kit.backends import load_backend
from rlnorm.kit.backends.pins import autotuner, autotuner_settings, patched
from rlnorm.kit.checks import common
from rlnorm.kit.checks.launch import configurations
from rlnorm.kit.checks.rows import all_rows, full_vs_sub_batches
from rlnorm.kit.results import Configurations, load_run
from tests.faults import RowCountOrder

SMALL = {"configurations_rows": 8, "configurations_sizes": [1, 3], "configurations_seed": 3}
OP = {"d": 128, "weight_dtype": "bfloat16"}


def test_planted_order_is_caught_only_by_the_configuration_pairs() -> None:
    """The planted kernel reduces a row in two orders, picked by row count: the row checks, at sizes that all
    pick one order, see nothing; the pairs of its two values see rows differ, and HALVES is not cleared."""
    backend = RowCountOrder()
    rows = all_rows(backend, None, "cpu", all_rows_sizes=[9], all_rows_seeds=[3], progress=False, **OP)
    assert rows.error is None and rows.summary.sizes[9].fwd_differ == 0
    sub = full_vs_sub_batches(backend, None, "cpu", sub_batches_rows=9, sub_batch_sizes=[1, 4],
                              sub_batches_seeds=[3], coverage="all", progress=False, **OP)  # fmt: skip
    assert sub.error is None and sub.summary.fwd_differ == 0

    out = configurations(backend, None, "cpu", progress=False, **SMALL, **OP).summary
    assert out.error is None
    key = "tests.faults._rows_per_program_kernel.HALVES"
    assert out.values == {key: ["0", "1"]}
    crossed = {(p.full, p.alone): p.fwd_differ for p in out.pairs}
    assert crossed[("0", "0")] == crossed[("1", "1")] == 0
    assert crossed[("0", "1")] > 0 and crossed[("1", "0")] > 0
    assert all(p.rowgrad_differ is None for p in out.pairs)  # forward only: no gradient compared
    assert key not in out.cleared


@triton.heuristics({"DOUBLE": lambda args: True})
@triton.autotune(configs=[triton.Config({"V": 1}), triton.Config({"V": 2}), triton.Config({"V": 3}, num_warps=8)],
                 key=["n"])  # fmt: skip
@triton.jit
def _write_v(out, n, V: tl.constexpr, DOUBLE: tl.constexpr):
    tl.store(out + tl.arange(0, 4), tl.full([4], V * (2 if DOUBLE else 1), tl.int32))


def _launch() -> int:
    out = torch.zeros(4, dtype=torch.int32)
    _write_v[(1,)](out, 4)
    return int(out[0])


def test_pin_runs_the_pinned_config_and_restores() -> None:
    at = autotuner(_write_v)  # under @triton.heuristics
    configs = list(at.configs)
    with pytest.raises(RuntimeError, match="active drivers"):
        _launch()  # no driver to time the configs with under the interpreter
    for cfg in configs:
        with patched(at, "configs", [cfg]):
            assert _launch() == 2 * cfg.kwargs["V"]
    assert at.configs == configs
    # the interpreter ignores num_warps: one setting per set of constexprs there, each pinned alone
    settings = autotuner_settings([at], distinct_kwargs_only=True)
    assert [s.value for s in settings] == ["V=1", "V=2", "V=3"]
    for s in settings:
        with s.pin():
            assert _launch() == 2 * int(s.value[-1])
    with pytest.raises(ValueError, match="autotuner"):
        autotuner(_launch)


def test_rlnorm_row_count_choices_are_cleared() -> None:
    """The forward's BLOCK_R, the backward's TILES (with HOT_WIDTH) and STRIPES, each forced to every value the
    launchers can pick: bitwise the same rows, and the same dweight under each value."""
    out = configurations(load_backend("rlnorm"), None, "cpu", progress=False,
                         configurations_rows=8, configurations_sizes=[3], configurations_seed=3, **OP)  # fmt: skip
    assert out.error is None
    kernel = "rlnorm.kernel._bwd._rms_norm_gated_bwd_kernel"
    finalize = "rlnorm.kernel._dweight._dweight_finalize_kernel.STRIPES"  # the same launcher value
    forward = "rlnorm.kernel._fwd._rms_norm_gated_fwd_kernel.BLOCK_R"
    assert out.summary.values[f"{kernel}.TILES"] == ["1", "2", "4", "8", "16", "31"]
    assert out.summary.values[f"{kernel}.STRIPES"] == out.summary.values[finalize] == ["1", "2", "4", "8"]
    assert out.summary.values[forward] == ["1", "4"]  # decode-sized launches, then the wide tile of D = 128
    backward = {f"{kernel}.{p}" for p in ("TILES", "HOT_WIDTH", "STRIPES")}
    assert set(out.summary.cleared) == backward | {finalize, forward}
    # every parameter an H100 saw change with the row count (the published run's launches) is cleared here
    h100 = load_run(REPO_ROOT / "outputs/h100-full/kernels").results["rlnorm"]
    assert len(h100.launches.kernels) == 3 and common.uncleared(h100) == {}  # the GPU's own credit, too
    assert common.uncleared(dataclasses.replace(h100, configurations=out.summary)) == {}
    # credit that leaves out the finalize kernel (the launcher's second kernel) leaves its STRIPES uncleared
    partial = dataclasses.replace(out.summary, cleared=[c for c in out.summary.cleared if c != finalize])
    assert list(common.uncleared(dataclasses.replace(h100, configurations=partial))) == [finalize]
    crossed = [p for p in out.summary.pairs if p.full != p.alone]
    assert len(crossed) == 6 * 5 + 4 * 3 + 2 * 1 and all(p.dweight_equal for p in crossed)


def test_fla_fused_runs_on_a_cpu_and_says_what_it_cannot_run() -> None:
    backend = load_backend("fla_fused_norm_gate")
    assert backend.available("cpu") == (True, "")
    sizes = {"configurations_rows": 4, "configurations_sizes": [1], "configurations_seed": 3}
    out = configurations(backend, None, "cpu", progress=False, **sizes, **OP).summary
    fwd = "fla.modules.fused_norm_gate.layer_norm_gated_fwd_kernel.config"
    assert out.error is None and out.values[fwd] == ["BT=16", "BT=32", "BT=64"]
    assert "num_warps" in out.unexercised[fwd] and fwd not in out.cleared
    assert len(out.pairs) == 2 * 3 * 3


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_rows_per_block_values_are_run_against_each_other() -> None:
    out = configurations(load_backend("vllm"), None, "cpu", progress=False, **SMALL, **OP).summary
    key = "vllm.third_party.flash_linear_attention.ops.layernorm_guard.layer_norm_fwd_kernel.ROWS_PER_BLOCK"
    assert out.error is None and out.values == {key: ["1", "2", "4"]}
    assert len(out.pairs) == 9


def test_a_backend_with_one_configuration_reports_none() -> None:
    out = configurations(load_backend("reference"), None, "cpu", **SMALL, **OP)
    assert out.error is None and out.summary == Configurations()
