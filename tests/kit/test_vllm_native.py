"""vLLM's forward_native rows (eager, compiled, VLLM_BATCH_INVARIANT=1) run what vLLM runs: proven against the
installed vLLM in the suite's one vLLM child (tests/vllm_child.py).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch

from rlnorm.inputs import make_case
from rlnorm.kit.backends import load_backend
from rlnorm.kit.backends import stack_files as sf
from rlnorm.kit.backends.stacks import (
    VllmNativeBackend,
    VllmNativeBatchInvariantBackend,
    VllmNativeCompiledBackend,
)
from rlnorm.numerics import ulp_distance
from rlnorm.options import OpOptions

OPTIONS = (OpOptions(), OpOptions(eps=1e-5, group_size=32, norm_before_gate=False, activation="sigmoid"))


@pytest.mark.slow
def test_the_rows_give_vllms_forward_native_bits(vllm_facts: Any) -> None:
    """The eager row is the installed forward_native bit for bit; the compiled row within a bf16 ulp of it."""
    results = vllm_facts("native_bits")
    assert len(results) == 8
    for r in results:
        assert r["eager"], r
        assert r["compiled_ulps"] <= 1, r


@pytest.mark.slow
def test_default_vllm_runs_forward_native_and_enforce_eager_forward_cuda(vllm_facts: Any) -> None:
    r = vllm_facts("dispatch")
    # a default config compiles with Inductor: every custom op disabled, RMSNormGated's forward is forward_native
    assert r["default"]["mode"] == 3 and r["default"]["backend"] == "inductor"
    assert r["default"]["custom_ops"] == ["none"] and r["default"]["forward"] == "forward_native"
    assert r["compiled"] == r["default"]
    # enforce_eager=True sets mode NONE: every custom op enabled, forward is forward_cuda (layernorm_guard)
    assert r["enforce_eager_sets_none"]
    assert r["none"]["custom_ops"] == ["all"] and r["none"]["forward"] == "forward_cuda"
    # the compiled row compiles with the options vLLM's config gives, on a GPU platform and on vLLM's CPU platform
    assert r["default"]["inductor"] == r["ours_gpu"]
    assert r["cpu_platform"] == r["ours_cpu"] and "combo_kernels" not in r["ours_cpu"]


@pytest.mark.slow
def test_batch_invariant_mode_changes_only_the_eager_native_path(vllm_facts: Any) -> None:
    """Under vLLM's own enable_batch_invariant_mode() only the eager forward_native's mean goes to vLLM's kernel (with
    the row's bits); neither RMSNormGated nor layernorm_guard reads VLLM_BATCH_INVARIANT (RMSNorm does)."""
    r = vllm_facts("batch_invariant")
    assert r["native"]["calls"] >= 1 and r["native"]["equal"] and r["mean_differs_in_fp32"], r
    assert r["cuda"] == r["compiled"] == {"equal": True, "calls": 0}, r
    assert r["reads_flag"] == {"RMSNormGated": False, "layernorm_guard": False, "RMSNorm.forward_cuda": True}


def test_the_rows_are_forward_only_and_read_vllms_files(installed_vllm: sf.StackFiles) -> None:
    for key in ("vllm_native", "vllm_native_compiled", "vllm_native_batch_invariant"):
        b = load_backend(key)  # the base class refuses a backward where there is none (tests/kit/test_gates.py)
        assert f"read from the installed package ({installed_vllm.root / 'vllm'}), vllm not imported" in b.source
        assert not b.has_backward


def test_the_compiled_row_compiles_once_per_option_set_and_serves_every_size(installed_vllm: sf.StackFiles) -> None:
    """One graph serves every row count, 1 included (vLLM drops the guards); other options get a graph of their own
    (with every guard dropped, sharing one would silently reuse the first)."""
    from torch._dynamo.utils import counters

    b = VllmNativeCompiledBackend()
    b.compile_rows = 64
    eager = VllmNativeBackend()
    start = counters["stats"]["unique_graphs"]
    for opts in OPTIONS:
        for rows in (1, 2, 7, 65):
            c = make_case(rows, 128, seed=rows)
            y = b.forward(c.x, c.z, c.w, opts)
            assert int(ulp_distance(y, eager.forward(c.x, c.z, c.w, opts)).max()) <= 1, (opts, rows)
    assert counters["stats"]["unique_graphs"] - start == 2
    assert len(b._made) == 3  # the file read once, a graph per option set


def test_the_batch_invariant_override_lasts_one_call(installed_vllm: sf.StackFiles) -> None:
    b = VllmNativeBatchInvariantBackend()
    b.loaded()
    b.mean = mock.Mock(wraps=b.mean)
    c = make_case(9, 128, seed=2)
    y = b.forward(c.x, c.z, c.w, OpOptions())
    assert b.mean.call_count == 1 and y.shape == (9, 128)
    x = make_case(9, 128, seed=2, dtype=torch.float32).x
    expected = x.sum(-1, keepdim=True) / 128  # torch's own mean, exact here: 128 is a power of two
    assert torch.equal(x.mean(-1, keepdim=True), expected)
    assert b.mean.call_count == 1  # after the call, aten::mean.dim is torch's again
