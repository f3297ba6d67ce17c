"""Digests: one flipped bit changes a digest, and two runs' digests say backend by backend whether the bits match."""

from __future__ import annotations

import torch
from faults import PositionDependentOutput, bump_one_ulp

from rlnorm.kit.backends import ExactReferenceBackend
from rlnorm.kit.checks.digests import digest, output_digests, same_bits
from rlnorm.kit.results import BackendResult, RunResult
from rlnorm.options import OpOptions
from rlnorm.report.compare import digest_table


def test_one_flipped_bit_changes_the_digest() -> None:
    t = torch.randn(5, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    mask = torch.zeros(t.shape, dtype=torch.bool)
    mask[3, 77] = True
    assert digest(t) == digest(t.clone())
    assert digest(t) != digest(bump_one_ulp(t, mask))


def test_digests_of_two_backends_say_which_tensors_differ() -> None:
    opts = OpOptions()
    exact = output_digests(ExactReferenceBackend(), opts, "cpu")
    assert exact.error is None and set(exact.tensors) == {"y", "dx", "dz", "dweight"}
    assert same_bits(exact, output_digests(ExactReferenceBackend(), opts, "cpu"))[0] is True
    planted = output_digests(PositionDependentOutput(), opts, "cpu")  # y moved one ulp, gradients untouched
    same, why = same_bits(exact, planted)
    assert same is False and "y" in why and "dx" not in why
    other_case = output_digests(ExactReferenceBackend(), OpOptions(activation="sigmoid"), "cpu")
    assert same_bits(exact, other_case)[0] is None
    assert same_bits(exact, None)[0] is None


def test_compare_says_backend_by_backend_whether_two_runs_computed_the_same_bits() -> None:
    exact = output_digests(ExactReferenceBackend(), OpOptions(), "cpu")
    planted = output_digests(PositionDependentOutput(), OpOptions(), "cpu")

    def run(digests: dict) -> RunResult:
        results = {k: BackendResult(source=k, backward="full", status="ran", digests=d) for k, d in digests.items()}
        return RunResult(schema_version="1", kind="k", op="o", commit=None, environment={}, quick=True, checks=[],
                         results=results)  # fmt: skip

    table = digest_table(run({"same": exact, "moved": exact}), run({"same": exact, "moved": planted, "new": exact}))
    assert table["same bits"].to_dict() == {"same": True, "moved": False, "new": None}
    undigested = run({"a": None})  # runs without digests compare as cannot tell
    assert digest_table(undigested, undigested)["same bits"].to_dict() == {"a": None}
