"""Contract gates, in-process on a narrow workload: the cells, the report's line format, and each planted fault
caught by its gate (a crash or a hang in a gate: tests/kit/test_isolation.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rlnorm.checkout import seed_report_path
from rlnorm.kit.backends import ExactReferenceBackend, load_backend
from rlnorm.kit.gates import (
    CHUNK_TOKENS,
    SAMPLE_TOKENS,
    build_cells,
    format_line,
    run_gates,
)
from rlnorm.options import OpOptions

SEED_REPORT = seed_report_path()
SMALL = {"heads": 1, "d": 32}
OPTS = OpOptions()


def _failed_pairs(lines: list[str]) -> set[tuple[str, str]]:
    return {re.search(r"'([^']*)'\) tensor=(\w+)", ln).groups() for ln in lines if ln.endswith(" passed=False")}


# --- workload ----------------------------------------------------------------------------------------------
def test_cells_cover_every_token_once_and_pad_with_zeros():
    n = sum(SAMPLE_TOKENS)
    assert n == 59
    cells = build_cells(0)
    assert next(iter(cells)) == "BN/full"
    for name, calls in cells.items():
        assert sorted(t for call in calls for t in call if t >= 0) == list(range(n)), name
    assert all(len(call) <= CHUNK_TOKENS for call in cells["BN/chunked"])
    assert [len(c) for c in cells["B1/full"]] == list(SAMPLE_TOKENS)
    (left,), (right,) = cells["BN/padded-left"], cells["BN/padded-right"]
    assert len(left) == len(right) == 4 * max(SAMPLE_TOKENS)
    assert left[:8] == [-1] * 8 and left[8] == 0 and right[:11] == list(range(11)) and right[11:19] == [-1] * 8
    assert cells["BN/permuted"][0] != list(range(n))


def test_line_format_is_the_seed_report_format():
    seed = json.loads(SEED_REPORT.read_text())
    expected = seed["results"]["rl_kernel"]["contract_gates"]["gradient"]["singleton_aggregate"]
    z = torch.zeros(4)
    ours = [
        format_line("singleton_aggregate", "BN/full", "B1-singleton_aggregate/full", "dweight", z, z),
        format_line("singleton_aggregate", "BN/full", "B1-singleton_aggregate/chunked", "dweight", z, z),
    ]
    assert ours == expected
    bad = format_line("dweight", "BN/full", "BN/permuted", "dweight", z, z + torch.tensor([0, 2.0**-20, 0, 0]))
    assert bad.endswith("max_abs=9.53674316e-07 passed=False")
    assert "passed=False" in format_line("bitwise", "a", "b", "y", z, -z)  # -0.0 == 0.0 but not bitwise


# --- gate bodies in-process --------------------------------------------------------------------------------
SINGLETON = {("B1-singleton_aggregate/full", "dweight")}
PADDED = {("BN/padded-left", "dweight"), ("BN/padded-right", "dweight")}


@pytest.mark.parametrize(
    ("spec", "fails", "passes"),
    [
        ("tests.faults:BatchSizeDependentOutput", {("B1/full", "y")}, {("BN/permuted", "y")}),  # size, not position
        ("tests.faults:PositionDependentOutput", {("B1/full", "y"), ("BN/permuted", "y"), ("BN/padded-left", "y")},
         set()),
        ("tests.faults:NondeterministicDweight", SINGLETON, set()),
        # a serial fold: permuting rows moves its bits, zero-gradient padding adds exact zeros
        ("tests.faults:OrderDependentDweight", SINGLETON | {("BN/permuted", "dweight")}, PADDED),
        # eager autograd sums dweight in fp32 in the reduction's order: not the exact aggregate (docs/spec.md §2)
        ("reference", SINGLETON, set()),
    ],
)  # fmt: skip
def test_a_planted_fault_fails_its_own_gates_lines_only(spec, fails, passes):
    """Both gates, as the worker runs them: each fails on the fault's lines only (y forward, dweight gradient)."""
    res = run_gates(load_backend(spec), OPTS, "cpu", **SMALL)
    for name, tensor in (("forward", "y"), ("gradient", "dweight")):
        gate, want = res[name], {p for p in fails if p[1] == tensor}
        failed = _failed_pairs(gate.lines)
        assert want <= failed and not failed & passes and bool(failed) == bool(want) == (not gate.passed)
        assert gate.returncode == 0 and all(t == tensor for _, t in failed)
    assert bool(fails & SINGLETON) == any("passed=False" in x for x in res["gradient"].singleton_aggregate)


# --- run_gates: both gates, as the worker runs them ----------------------------------------------------------
def test_run_gates_exact_reference_passes_and_marks_each_call_on_the_trail():
    marked: list[dict] = []
    res = run_gates(ExactReferenceBackend(), OPTS, "cpu", d=32, heads=1, trail=marked.append)
    for r in res.values():
        assert r.returncode == 0 and r.passed and not r.failed_lines and r.lines
    assert len(res["gradient"].singleton_aggregate) == 2 and res["forward"].singleton_aggregate == []
    first = marked[0]
    assert first["check"] == "contract_gates" and first["case"]["rows"] == sum(SAMPLE_TOKENS)
    assert first["batch"] == {"kind": "gate", "cell": "BN/full", "size": sum(SAMPLE_TOKENS)}


class RaisingBackward(ExactReferenceBackend):
    def forward_backward(self, x, z, w, dy, opts):
        raise RuntimeError("planted: no gradient today")


class ForwardOnly(ExactReferenceBackend):
    has_backward = False


@pytest.mark.parametrize(
    ("backend", "returncode", "said"),
    [(RaisingBackward, 1, "RuntimeError: planted: no gradient today"), (ForwardOnly, 3, "no backward")],
)
def test_a_gradient_gate_not_taken_fails_saying_why_and_the_forward_gate_still_runs(backend, returncode, said):
    res = run_gates(backend(), OPTS, "cpu", **SMALL)
    g = res["gradient"]
    assert res["forward"].passed and g.returncode == returncode and not g.passed and not g.lines
    assert said in g.stderr_tail[-1]
