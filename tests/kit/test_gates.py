"""Contract gates: the workload's cells, the report's line format, and each planted fault caught by its gate.

Gate bodies are tested in-process (fast); `run_gates` is tested end to end in child processes on a
narrow workload (1 head of width 32), including a child that crashes and one that hangs.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from rlnorm.checkout import seed_report_path
from rlnorm.kit.backends import load_backend
from rlnorm.kit.backends.local import ExactReferenceBackend
from rlnorm.kit.gates import (
    CHUNK_TOKENS,
    EXIT_UNAVAILABLE,
    SAMPLE_TOKENS,
    build_cells,
    format_line,
    forward_gate,
    gradient_gate,
    parse_line,
    run_gates,
)
from rlnorm.options import OpOptions

SEED_REPORT = seed_report_path()
SMALL = {"heads": 1, "d": 32}
OPTS = OpOptions()
RESULT_KEYS = {"returncode", "passed", "failed_lines", "singleton_aggregate", "stderr_tail", "timed_out", "lines"}


def _failed_pairs(lines: list[str]) -> set[tuple[str, str]]:
    return {(p["b"], p["tensor"]) for p in map(parse_line, lines) if not p["passed"]}


def _quiet(line: str) -> None:
    pass


# --- workload ----------------------------------------------------------------------------------------------
def test_cells_cover_every_token_once_and_pad_with_zeros():
    n = sum(SAMPLE_TOKENS)
    assert n == 59
    cells = build_cells(0)
    assert cells[0].name == "BN/full"
    assert {c.name for c in cells} == {
        "BN/full", "BN/chunked", "B1/full", "B1/chunked", "BN/padded-left", "BN/padded-right", "BN/permuted",
        "BN/packed",
    }  # fmt: skip
    for cell in cells:
        tokens = [t for call in cell.calls for t in call if t >= 0]
        assert sorted(tokens) == list(range(n)), cell.name
    by = {c.name: c for c in cells}
    assert all(len(call) <= CHUNK_TOKENS for call in by["BN/chunked"].calls)
    assert [len(c) for c in by["B1/full"].calls] == list(SAMPLE_TOKENS)
    left, right = by["BN/padded-left"].calls[0], by["BN/padded-right"].calls[0]
    assert len(left) == len(right) == 4 * max(SAMPLE_TOKENS)
    assert left[:8] == [-1] * 8 and left[8] == 0 and right[:11] == list(range(11)) and right[11:19] == [-1] * 8
    assert by["BN/permuted"].calls[0] != list(range(n))


def test_line_format_is_the_seed_report_format():
    seed = json.loads(SEED_REPORT.read_text())
    expected = seed["results"]["rl_kernel"]["contract_gates"]["gradient"]["singleton_aggregate"]
    z = torch.zeros(4)
    ours = [
        format_line("singleton_aggregate", "BN/full", "B1-singleton_aggregate/full", "dweight", z, z),
        format_line("singleton_aggregate", "BN/full", "B1-singleton_aggregate/chunked", "dweight", z, z),
    ]
    assert ours == expected
    for line in expected:
        assert parse_line(line)["passed"] is True
    bad = format_line("dweight", "BN/full", "BN/permuted", "dweight", z, z + torch.tensor([0, 2.0**-20, 0, 0]))
    assert bad.endswith("max_abs=9.53674316e-07 passed=False") and parse_line(bad)["passed"] is False
    assert parse_line("some stray output") is None


def test_bitwise_means_bits_not_values():
    a = torch.tensor([0.0])
    assert "passed=False" in format_line("bitwise", "a", "b", "y", a, -a)  # -0.0 == 0.0 but not bitwise


# --- gate bodies in-process --------------------------------------------------------------------------------
def test_exact_reference_passes_both_gate_bodies():
    b = ExactReferenceBackend()
    fwd = forward_gate(b, OPTS, "cpu", emit=_quiet, **SMALL)
    grad = gradient_gate(b, OPTS, "cpu", emit=_quiet, **SMALL)
    assert len(fwd) == 7 and all(parse_line(x)["passed"] for x in fwd)
    assert len(grad) == 7 * 2 + 2 + 4 and all(parse_line(x)["passed"] for x in grad)


def test_batch_size_fault_fails_the_forward_gate_only():
    b = load_backend("tests.faults:BatchSizeDependentOutput")
    fwd = forward_gate(b, OPTS, "cpu", emit=_quiet, **SMALL)
    failed = _failed_pairs(fwd)
    assert ("B1/full", "y") in failed and ("BN/permuted", "y") not in failed  # size, not position
    assert not _failed_pairs(gradient_gate(b, OPTS, "cpu", emit=_quiet, **SMALL))


def test_position_fault_fails_the_forward_gate_only():
    b = load_backend("tests.faults:PositionDependentOutput")
    failed = _failed_pairs(forward_gate(b, OPTS, "cpu", emit=_quiet, **SMALL))
    assert {("B1/full", "y"), ("BN/permuted", "y"), ("BN/padded-left", "y")} <= failed
    assert not _failed_pairs(gradient_gate(b, OPTS, "cpu", emit=_quiet, **SMALL))


def test_nondeterministic_dweight_fails_the_dweight_lines_only():
    b = load_backend("tests.faults:NondeterministicDweight")
    assert not _failed_pairs(forward_gate(b, OPTS, "cpu", emit=_quiet, **SMALL))
    failed = _failed_pairs(gradient_gate(b, OPTS, "cpu", emit=_quiet, **SMALL))
    assert failed and all(t == "dweight" for _, t in failed)


def test_eager_reference_fails_only_the_dweight_lines():
    """Eager autograd sums dweight in fp32 in the reduction's order: not the exact aggregate (docs/spec.md §2)."""
    b = load_backend("reference")
    assert not _failed_pairs(forward_gate(b, OPTS, "cpu", emit=_quiet, heads=2, d=128))
    failed = _failed_pairs(gradient_gate(b, OPTS, "cpu", emit=_quiet, heads=2, d=128))
    assert ("B1-singleton_aggregate/full", "dweight") in failed
    assert all(t == "dweight" for _, t in failed)


# --- end to end, in child processes ------------------------------------------------------------------------
def test_run_gates_exact_reference_passes():
    res = run_gates("rlnorm.kit.backends.local:ExactReferenceBackend", OPTS, "cpu", timeout_s=300, **SMALL)
    for gate in ("forward", "gradient"):
        r = res[gate]
        assert set(r) == RESULT_KEYS
        assert r["returncode"] == 0 and r["passed"] and not r["timed_out"] and not r["failed_lines"], r
    assert len(res["gradient"]["singleton_aggregate"]) == 2
    assert res["forward"]["singleton_aggregate"] == []


def test_run_gates_order_dependent_dweight_fails_singleton_and_permuted():
    res = run_gates("tests.faults:OrderDependentDweight", {"eps": 1e-6}, "cpu", timeout_s=300, **SMALL)
    assert res["forward"]["passed"]
    g = res["gradient"]
    assert g["returncode"] == 0 and not g["passed"]
    failed = _failed_pairs(g["failed_lines"])
    assert ("B1-singleton_aggregate/full", "dweight") in failed and ("BN/permuted", "dweight") in failed
    # zero-gradient padding adds exact zeros to a fold: those lines pass
    assert ("BN/padded-left", "dweight") not in failed and ("BN/padded-right", "dweight") not in failed
    assert all(t == "dweight" for _, t in failed)
    assert any("passed=False" in x for x in g["singleton_aggregate"])


def test_run_gates_records_a_crashing_child_and_goes_on():
    res = run_gates("tests.faults:GateChildCrash", OPTS, "cpu", timeout_s=300, **SMALL)
    for r in res.values():
        assert r["returncode"] not in (0, None) and not r["passed"] and not r["timed_out"]
        assert any("GateChildCrash aborting" in x for x in r["stderr_tail"])
    # the parent is alive and can run the next backend
    assert run_gates("rlnorm.kit.backends.local:ExactReferenceBackend", OPTS, "cpu", gates=("forward",), **SMALL)[
        "forward"
    ]["passed"]


@pytest.mark.slow
def test_run_gates_records_a_hanging_child_as_timed_out() -> None:
    # time for the children to import torch and Triton and reach the planted hang, which says so on stderr: a child
    # still importing at the deadline would time out too, without that line
    res = run_gates("tests.faults:GateChildHang", OPTS, "cpu", timeout_s=60, **SMALL)
    for r in res.values():
        assert r["timed_out"] and not r["passed"]
        assert "planted fault: GateChildHang sleeping" in r["stderr_tail"], r["stderr_tail"]
        assert "timeout" in r["stderr_tail"][-1]


def test_run_gates_user_backend_from_parent_sys_path_and_unavailable_child(tmp_path, monkeypatch):
    (tmp_path / "gate_user_mod.py").write_text(
        textwrap.dedent(
            """
            from rlnorm.kit.backends import Backend
            from rlnorm.reference import rms_norm_gated_reference

            class NeverHere(Backend):
                def available(self, device):
                    return False, "needs hardware this test does not have"

                def _fn(self, x, z, w, opts):
                    return rms_norm_gated_reference(x, z, w, opts)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    res = run_gates("gate_user_mod:NeverHere", OPTS, "cpu", timeout_s=300, gates=("forward",), **SMALL)
    r = res["forward"]
    assert r["returncode"] == EXIT_UNAVAILABLE and not r["passed"]
    assert "needs hardware this test does not have" in r["stderr_tail"][-1]


def test_run_gates_validates_its_arguments():
    with pytest.raises(ValueError, match="gates"):
        run_gates("reference", OPTS, gates=("sideways",))
    with pytest.raises(ValueError, match="weight_dtype"):
        run_gates("reference", OPTS, weight_dtype="int8")
    with pytest.raises(TypeError, match="opts"):
        run_gates("reference", "silu")
    with pytest.raises(ValueError, match="timeout_s"):
        run_gates("reference", OPTS, timeout_s=0)
    with pytest.raises(ValueError, match="backend_spec"):
        run_gates(None, OPTS)
