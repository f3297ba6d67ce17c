"""The docs/spec.md §5 checks: each one catches exactly the planted fault it exists for, and nothing else.

CPU sizes; bitwise expectations are derived from the faults' own masks, so a check that counted
the wrong rows (not just "some" rows) fails here.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor

from rlnorm.inputs import make_case
from rlnorm.kit import checks
from rlnorm.kit.backends import Backend, ExactReferenceBackend, ReferenceBackend
from rlnorm.kit.checks import accuracy, common
from rlnorm.kit.checks.common import Check, CheckOutcome
from rlnorm.kit.checks.digests import agreement_from_outputs, agreement_output
from rlnorm.kit.checks.launch import ladder
from rlnorm.kit.checks.rows import AloneRunner, sub_batch_plan, sweep_positions
from rlnorm.kit.params import RunParams, check_kwargs, default_probe_rows
from rlnorm.kit.records import rebuild_case
from rlnorm.kit.results import AllRows, BatchInvariance, from_json, to_json
from rlnorm.numerics import round_once
from rlnorm.options import OpOptions
from rlnorm.reference import gated_rmsnorm_math
from rlnorm.timing import Timing
from tests.faults import (
    BatchSizeDependentOutput,
    ForwardOnlyBatchSize,
    NondeterministicDweight,
    OrderDependentDweight,
    PositionDependentOutput,
)

OPTS = OpOptions()
DEFAULTS = RunParams(progress=False, max_records=None)


@dataclass
class Ran:
    """A check's outcome as the artifact's JSON: what a reader of the run gets."""

    summary: dict[str, Any]
    records: list[dict[str, Any]]
    error: str | None


def checked(name: str, backend: Backend, opts: OpOptions | None = OPTS, device: str = "cpu", **kw: Any) -> Ran:
    """A check as these tests call it: a parameter a test leaves out takes the protocol's value (RunParams' default;
    the sweep's sizes and probes: those of its sweep_n), and the outcome is read back as JSON."""
    if "sweep_n" in kw:
        kw.setdefault("sweep_sizes", ladder([], kw["sweep_n"]))
        kw.setdefault("sweep_probe_rows", default_probe_rows(kw["sweep_n"]))
    check = getattr(checks, name)
    out: CheckOutcome = check(backend, opts, device, **{**check_kwargs(check, DEFAULTS), **kw})
    return Ran(to_json(out.summary), [to_json(r) for r in out.records], out.error)


def invariant(ar: Ran, dw: Ran, fvs: Ran, sw: Ran) -> bool | None:
    """batch_invariant of the four summaries, as the worker forms it from a backend's results."""
    inv = {"all_rows": ar.summary, "full_vs_sub_batches": fvs.summary, "batch_size_sweep": sw.summary}
    return common.batch_invariant(
        from_json(BatchInvariance, {**inv, "dweight_repeatable": dw.summary["dweight_repeatable"]})
    )


class ForwardOnly(ReferenceBackend):
    """The reference without a backward (like vLLM's forward_cuda)."""

    key = "test:ForwardOnly"
    has_backward = False


class Raises(ReferenceBackend):
    key = "test:Raises"

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        raise RuntimeError("planted crash in forward")

    def forward_backward(self, x, z, w, dy, opts):  # type: ignore[no-untyped-def]
        raise RuntimeError("planted crash in forward_backward")


class Rounding(ReferenceBackend):
    """The gated norm rounded to bf16 by `how`: "once" from fp64 (the measure's ceiling, must score exactly 1),
    "twice" (fp64 cast straight to bf16: torch goes through fp32), "truncated" (fp32, low 16 bits dropped)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.key = how, f"test:{how}"

    def _fn(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        y = gated_rmsnorm_math(x, z, w, opts, torch.float32 if self.how == "truncated" else torch.float64)
        if self.how == "twice":
            return y.to(x.dtype)
        if self.how == "once":
            return round_once(y.detach(), x.dtype) + 0 * y.to(x.dtype)  # keep autograd for the gradients
        bits = y.detach().contiguous().view(torch.int32) & ~0xFFFF
        return bits.view(torch.float32).to(x.dtype) + 0 * y.to(x.dtype)


@pytest.mark.parametrize("backend", [ReferenceBackend(), ExactReferenceBackend()], ids=lambda b: b.key)
def test_reference_passes_every_invariance_check(backend: Backend) -> None:
    ar = checked("all_rows", backend, all_rows_sizes=(1, 7, 63), all_rows_seeds=(3, 4))
    assert ar.summary == {
        str(n): {"rows": 2 * n, "fwd_differ": 0, "rowgrad_differ": 0, "alone_path": "eager"} for n in (1, 7, 63)
    }
    dw = checked("dweight_repeatable", backend, dweight_rows=257)
    assert dw.summary["dweight_repeatable"] is True
    for coverage in ("all", "sampled"):
        kw = {"sub_batches_rows": 300, "sub_batch_sizes": (1, 7, 64), "sub_batches_seeds": (3,), "sample_stride": 50}
        fvs = checked("full_vs_sub_batches", backend, coverage=coverage, **kw)
        assert (fvs.summary["fwd_differ"], fvs.summary["rowgrad_differ"]) == (0, 0), fvs.summary
        assert "error" not in fvs.summary
    sw = checked("batch_size_sweep", backend, sweep_n=33, sweep_seeds=(3,))
    assert (sw.summary["differ"], sw.summary["fwd_differ"], sw.summary["rowgrad_differ"]) == (0, 0, 0)
    assert ar.records == dw.records == sw.records == []
    assert invariant(ar, dw, fvs, sw) is True
    opts = OpOptions(group_size=32, norm_before_gate=False, activation="sigmoid")  # options reach the backend
    assert checked("all_rows", backend, opts, all_rows_sizes=(7,), all_rows_seeds=(3,)).summary["7"]["fwd_differ"] == 0


@pytest.mark.parametrize("b", [BatchSizeDependentOutput(), PositionDependentOutput()], ids=lambda b: b.key)
def test_an_output_fault_is_caught_on_exactly_the_rows_its_mask_moves(b: BatchSizeDependentOutput) -> None:
    """Row counts and positions where the fault's own mask differs between the batch and the row alone (or its
    sub-batch); the fault leaves dx, dz and dweight alone."""
    ar = checked("all_rows", b, all_rows_sizes=(7, 63), all_rows_seeds=(3, 4))
    expected = set()
    for n in (7, 63):
        per_n = 0
        for seed in (3, 4):
            x = make_case(n, 128, seed).x
            alone = torch.stack([b._mask(x[r : r + 1])[0] for r in range(n)])
            rows = (b._mask(x) != alone).nonzero().flatten().tolist()
            per_n += len(rows)
            expected |= {(seed, r, r) for r in rows}
        assert ar.summary[str(n)]["fwd_differ"] == per_n
    assert {(r["seed"], r["position"], r["row"]) for r in ar.records} == expected and len(expected) > 0
    assert all(v["rowgrad_differ"] == 0 for v in ar.summary.values())
    assert {r["tensor"] for r in ar.records} == {"y"}
    rec = ar.records[0]
    assert rec["cols_differ"] == 1 and rec["max_ulp"] == 1 and rec["max_abs"] > 0
    assert rec["batch_start"] == 0 and rec["batch_size"] == int(rec["case"].split("=")[1])

    fvs = checked("full_vs_sub_batches", b, sub_batches_rows=300, sub_batch_sizes=(1, 7, 100), sub_batches_seeds=(3,))
    x = make_case(300, 128, 3).x
    full_mask = b._mask(x)
    want = set()
    for size in (1, 7, 100):
        for s, m in sub_batch_plan(300, size):
            sub = b._mask(x[s : s + m])
            want |= {(s, m, r) for r in range(s, s + m) if bool(full_mask[r]) != bool(sub[r - s])}
    got = {(r["batch_start"], r["batch_size"], r["row"]) for r in fvs.records}
    assert got == want and fvs.summary["fwd_differ"] == len(want) and fvs.summary["rowgrad_differ"] == 0
    assert all(r["position"] == r["row"] - r["batch_start"] for r in fvs.records)

    sw = checked("batch_size_sweep", b, sweep_n=65, sweep_seeds=(3, 4))
    assert sw.summary["differ"] == sw.summary["fwd_differ"] == len(sw.records) > 0
    assert sw.summary["rowgrad_differ"] == 0
    assert all(r["case"].startswith(f"m={r['batch_size']}/") for r in sw.records)
    if isinstance(b, PositionDependentOutput):  # its count follows from the positions alone
        sizes, probes = ladder([], 65), default_probe_rows(65)
        expect = 2 * sum(1 for m in sizes for _ in probes for _, pos in sweep_positions(m) if pos % 3 == 1)
        assert sw.summary["differ"] == expect and all(r["position"] % 3 == 1 for r in sw.records)
    # dweight is exact in these faults: only the forward checks see them
    assert checked("dweight_repeatable", b, dweight_rows=63).summary["dweight_repeatable"] is True


def test_nondeterministic_dweight_is_caught_only_by_dweight_repeatable() -> None:
    b = NondeterministicDweight()
    dw = checked("dweight_repeatable", b, dweight_rows=257, dweight_seed=3)
    assert dw.summary["dweight_repeatable"] is False
    (rec,) = dw.records
    assert rec["tensor"] == "dweight" and rec["row"] is None and rec["cols_differ"] == 2 and rec["max_ulp"] == 1
    ar = checked("all_rows", b, all_rows_sizes=(7,), all_rows_seeds=(3,))
    sw = checked("batch_size_sweep", b, sweep_n=17, sweep_seeds=(3,))
    fvs = checked("full_vs_sub_batches", b, sub_batches_rows=30, sub_batch_sizes=(1, 7), sub_batches_seeds=(3,))
    assert ar.summary["7"]["fwd_differ"] == ar.summary["7"]["rowgrad_differ"] == 0
    assert sw.summary["differ"] == fvs.summary["fwd_differ"] == fvs.summary["rowgrad_differ"] == 0
    assert invariant(ar, dw, fvs, sw) is False
    # a serial fold is deterministic: dweight_repeatable must NOT flag it (the gates do)
    dw = checked("dweight_repeatable", OrderDependentDweight(), dweight_rows=257)
    assert dw.summary["dweight_repeatable"] is True and dw.records == []


def test_forward_only_backend() -> None:
    fo = ForwardOnly()
    ar = checked("all_rows", fo, all_rows_sizes=(7,), all_rows_seeds=(3,))
    assert ar.summary["7"]["rowgrad_differ"] is None  # no gradients compared: not "none differ"
    assert checked("dweight_repeatable", fo, dweight_rows=7).summary["dweight_repeatable"] is None
    bad = checked("all_rows", ForwardOnlyBatchSize(), all_rows_sizes=(63,), all_rows_seeds=(3,))
    assert bad.summary["63"]["fwd_differ"] > 0 and bad.summary["63"]["rowgrad_differ"] is None
    assert {r["tensor"] for r in bad.records} == {"y"}
    acc = checked("accuracy_latency", fo, accuracy_rows=63, timing_warmup=0, timing_iters=2)
    assert acc.summary["grad_rel_err"] is None and acc.summary["fwd_bwd_us"] is None and acc.summary["fwd_us"] > 0
    assert set(acc.summary["host_bound"]) == {"add", "fwd"}  # no backward: no fwd_bwd timing to flag
    fvs = checked("full_vs_sub_batches", fo, sub_batches_rows=15, sub_batch_sizes=(7,), sub_batches_seeds=(3,))
    sw = checked("batch_size_sweep", fo, sweep_n=17, sweep_sizes=[1, 9], sweep_probe_rows=[0, 16], sweep_seeds=[3])
    # the sweep's JSON leaves a None rowgrad_differ out (the reference report has no such key)
    assert fvs.summary["rowgrad_differ"] is None and sw.summary.get("rowgrad_differ") is None
    assert (fvs.summary["fwd_differ"], sw.summary["fwd_differ"], sw.summary["differ"]) == (0, 0, 0)
    assert invariant(ar, Ran({"dweight_repeatable": None}, [], None), fvs, sw) is True


def test_the_full_protocol_compares_2188_sampled_sub_batches_and_2520_sweep_rows() -> None:
    """The real checks on 262144 rows, forward only, narrow rows (the counts do not depend on d)."""
    sizes = (1, 7, 4097, 65536, 131072)
    assert [len(sub_batch_plan(262144, s, "sampled")) for s in sizes] == [512, 512, 64, 4, 2]
    assert sub_batch_plan(262144, 4097, "sampled")[-1] == (63 * 4097, 262144 - 63 * 4097)
    for s in sizes:  # every-row coverage: each size tiles the batch, the last tile partial
        plan = sub_batch_plan(262144, s, "all")
        assert len(plan) == math.ceil(262144 / s) and sum(m for _, m in plan) == 262144 and plan[0][0] == 0
        assert all(a + m == b for (a, m), (b, _) in itertools.pairwise(plan))
    s = checked("full_vs_sub_batches", ForwardOnly(), coverage="sampled", d=8).summary
    assert s["sub_batches"] == 2188 and s["full_batch"] == 262144 and s["sub_batch_sizes"] == list(sizes)
    assert s["rows_compared"] == 2 * (512 + 512 * 7 + 262144 * 3)
    assert s["fwd_differ"] == 0 and "error" not in s
    sw = checked("batch_size_sweep", ForwardOnly(), d=8).summary
    assert sw["comparisons"] == 2520 and sw["differ"] == 0 and "error" not in sw
    assert sw["batch_sizes"] == ladder([], 4097)


def test_correctly_rounded_measure_can_fail() -> None:
    rows = 4096  # 5 double roundings at this seed
    exact, dbl, trunc, ref = (
        checked("accuracy_latency", b, accuracy_rows=rows, timing=False).summary
        for b in (Rounding("once"), Rounding("twice"), Rounding("truncated"), ReferenceBackend())
    )
    assert exact["fwd_correctly_rounded"] == 1.0 and exact["timed"] is False and exact["fwd_us"] is None  # untimed
    assert exact["fwd_ulp_hist"]["0"] == rows * 128
    assert 0.999 < dbl["fwd_correctly_rounded"] < 1.0  # double rounding: rare, and caught
    assert dbl["fwd_ulp_hist"]["1"] == round((1 - dbl["fwd_correctly_rounded"]) * rows * 128)
    assert trunc["fwd_correctly_rounded"] < 0.7
    assert 0.9999 < ref["fwd_correctly_rounded"] <= 1.0
    # the error bound: a correctly rounded bf16 is within half an ulp (|y| < 32 here: < 2**-4)
    assert exact["fwd_max_abs_err"] <= 2**-4 < trunc["fwd_max_abs_err"] * 2


def test_accuracy_summary_fields_and_histograms() -> None:
    s = checked("accuracy_latency", ReferenceBackend(), accuracy_rows=257, timing_warmup=1, timing_iters=3).summary
    assert s["rows"] == 257 and s["timed"] is True and s["device"] == "cpu"
    assert s["host_bound"] == {"add": False, "fwd": False, "fwd_bwd": False}  # the CPU clock never is
    assert s["fwd_us_p20"] <= s["fwd_us"] <= s["fwd_us_p80"]
    assert s["fwd_bwd_us_p20"] <= s["fwd_bwd_us"] <= s["fwd_bwd_us_p80"]
    assert s["fwd_roofline_ratio"] == pytest.approx(s["fwd_us"] / s["roofline_add_us"])
    assert s["fwd_bwd_roofline_ratio"] == pytest.approx(s["fwd_bwd_us"] / (8 / 3 * s["roofline_add_us"]))
    assert s["fwd_gbps"] == pytest.approx(3 * 257 * 128 * 2 / (s["fwd_us"] * 1e3))
    assert set(s["grad_rel_err"]) == {"x", "z", "w"} and all(0 < v < 0.01 for v in s["grad_rel_err"].values())
    n = 257 * 128
    assert sum(s["fwd_ulp_hist"].values()) == n
    h = s["fwd_abs_err_hist"]
    assert len(h["counts"]) == len(h["edges"]) - 1
    assert sum(h["counts"]) + h["zero"] + h["under"] + h["over"] + h["nan"] == n


def star_clock() -> Any:
    """A clock that says the GPU queue ran dry on every timing but the add's (the first)."""
    calls = itertools.count(1)

    def events(fn: Callable[[], Any], reps: int, warmup: int) -> Timing:
        fn()
        k = next(calls)
        return Timing(10.0 * k, 9.0 * k, 11.0 * k, host_bound=k > 1)

    return SimpleNamespace(events=events)


def test_accuracy_latency_records_which_timings_ran_host_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A time with host overhead in it is flagged, per timing, never silently reported as GPU time."""
    monkeypatch.setattr(accuracy, "CpuClock", star_clock)  # the check runs on the CPU
    s = checked("accuracy_latency", ReferenceBackend(), accuracy_rows=7, timing_warmup=0, timing_iters=2).summary
    assert s["host_bound"] == {"add": False, "fwd": True, "fwd_bwd": True}
    assert (s["roofline_add_us"], s["fwd_us"], s["fwd_us_p20"], s["fwd_bwd_us"]) == (10.0, 20.0, 18.0, 30.0)


def test_agreement_matrix_counts_bitwise_equal_outputs() -> None:
    rows = 63
    params = RunParams(agreement_rows=rows, agreement_seed=3, progress=False)
    outputs: dict[str, Tensor | None] = {}
    errors: dict[str, str] = {}
    for b in (ReferenceBackend(), PositionDependentOutput(), Raises()):
        try:
            outputs[b.key] = agreement_output(b, params.op_options(), "cpu", **check_kwargs(agreement_output, params))
        except RuntimeError as exc:
            outputs[b.key], errors[b.key] = None, str(exc)
    s = to_json(agreement_from_outputs(outputs, rows, 3, errors))
    assert s["backends"] == ["reference", PositionDependentOutput.key, "test:Raises"]
    bumped = sum(1 for r in range(rows) if r % 3 == 1)  # one element (column 0) per bumped row
    f = 1 - bumped / (rows * 128)
    assert s["equal_fraction"][0][:2] == [1.0, pytest.approx(f)]
    assert s["equal_fraction"][1][0] == pytest.approx(f)
    assert s["equal_fraction"][2] == [None, None, None] and s["equal_fraction"][0][2] is None
    assert "planted crash" in s["errors"]["test:Raises"]
    assert s["tensor"] == "y" and s["rows"] == rows and s["seed"] == 3


# -- failures and bad input ----------------------------------------------------------------------------


def test_a_raising_backend_is_recorded_not_fatal() -> None:
    b = Raises()
    for res in (
        checked("all_rows", b, all_rows_sizes=(7,), all_rows_seeds=(3,)),
        checked("dweight_repeatable", b, dweight_rows=7),
        checked("full_vs_sub_batches", b, sub_batches_rows=10, sub_batch_sizes=(1,), sub_batches_seeds=(3,)),
        checked("batch_size_sweep", b, sweep_n=9, sweep_seeds=(3,)),
        checked("accuracy_latency", b, accuracy_rows=7),
    ):
        assert "planted crash" in res.summary["error"]
    assert common.batch_invariant(BatchInvariance(all_rows=AllRows(error="x"))) is None


@pytest.mark.parametrize(
    ("name", "kw", "error", "match"),
    [
        ("all_rows", {"all_rows_sizes": ()}, ValueError, "all_rows_sizes"),
        ("all_rows", {"opts": OpOptions(group_size=48), "all_rows_sizes": (7,)}, ValueError, "group_size"),
        ("all_rows", {"all_rows_sizes": (0,)}, ValueError, r"all_rows_sizes\[0\]"),
        ("full_vs_sub_batches", {"coverage": "some"}, ValueError, "coverage"),
        ("batch_size_sweep", {"sweep_n": 9, "sweep_sizes": (10,)}, ValueError, "sweep_sizes"),
        ("batch_size_sweep", {"sweep_n": 9, "sweep_probe_rows": (9,)}, ValueError, "sweep_probe_rows"),
        ("dweight_repeatable", {"dweight_rows": 7, "repeats": 1}, ValueError, "repeats"),
        ("configurations", {"configurations_rows": 4, "configurations_sizes": [5]}, ValueError, "configurations_sizes"),
        ("accuracy_latency", {"accuracy_rows": 0}, ValueError, "accuracy_rows"),
        ("all_rows", {"all_rows_sizes": (7,), "device": "gpu0"}, ValueError, "device"),
        ("all_rows", {"backend": object(), "all_rows_sizes": (7,)}, TypeError, "backend"),
        ("all_rows", {"opts": {"eps": 1e-6}, "all_rows_sizes": (7,)}, TypeError, "opts"),
        ("all_rows", {"all_rows_sizes": (7,), "all_rows_seeds": 3}, TypeError, "all_rows_seeds"),
    ],
)
def test_bad_parameters_name_themselves(name: str, kw: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        checked(name, **{"backend": ReferenceBackend(), **kw})


def test_max_records_caps_records_not_counts() -> None:
    kw = {"sub_batches_rows": 60, "sub_batch_sizes": (7,), "sub_batches_seeds": (3,), "max_records": 5}
    fvs = checked("full_vs_sub_batches", PositionDependentOutput(), **kw)
    assert len(fvs.records) == 5 and fvs.summary["fwd_differ"] > 5
    assert fvs.summary["records_dropped"] == fvs.summary["fwd_differ"] - 5
    ar = checked("all_rows", PositionDependentOutput(), all_rows_sizes=(7, 63), all_rows_seeds=(3,), max_records=1)
    assert len(ar.records) == 1
    assert (ar.summary["7"]["records_dropped"], ar.summary["63"]["records_dropped"]) == (1, 21)
    dw = checked("dweight_repeatable", NondeterministicDweight(), dweight_rows=63, repeats=3, max_records=0)
    assert dw.summary["dweight_repeatable"] is False and dw.records == []
    assert dw.summary["records_dropped"] == 2  # each repeat that differed from the first


# -- the CUDA-graph path (GPU only: run on the H200) ------------------------------------------------

cuda_only = pytest.mark.gpu(reason="CUDA graphs need a GPU")


class ForwardOnlyPosition(PositionDependentOutput):
    """Position fault, forward only: all on the GPU, so its single-row calls can be graph-captured."""

    key = "test:ForwardOnlyPosition"
    has_backward = False


@cuda_only
@pytest.mark.parametrize("backend", [ReferenceBackend(), ForwardOnly()], ids=lambda b: b.key)
def test_graph_path_gives_what_eager_gives(backend: Backend) -> None:
    case = make_case(3000, 128, 3, device="cuda")
    got = []
    for use_graphs in (True, False):
        runner = AloneRunner(Check("test", backend, OPTS, "cuda", 128, "bfloat16"), use_graphs, graph_rows=512)
        got.append((*runner.run(case, torch.arange(0, 2995, 5), 5), runner.paths[5]))
    wg, we = got
    assert (wg[3], we[3]) == ("cuda_graph", "eager")
    for g, e in zip(wg[:3], we[:3], strict=True):
        assert (g is None) == (e is None)
        if g is not None:
            assert torch.equal(g.view(torch.int16), e.view(torch.int16))


@cuda_only
def test_graph_path_still_catches_a_planted_fault() -> None:
    b = ForwardOnlyPosition()
    kw = {"sub_batches_rows": 20000, "sub_batch_sizes": (1, 7), "sub_batches_seeds": (3,), "device": "cuda"}
    g = checked("full_vs_sub_batches", b, **kw)
    e = checked("full_vs_sub_batches", b, use_graphs=False, **kw)
    assert g.summary["alone_path"] == {"1": "cuda_graph", "7": "cuda_graph"}
    assert g.summary["fwd_differ"] == e.summary["fwd_differ"] > 0
    assert [r["row"] for r in g.records] == [r["row"] for r in e.records]


@cuda_only
def test_uncapturable_backend_falls_back_to_eager_and_says_so() -> None:
    """ExactReferenceBackend sums dweight on the CPU (a sync): capture fails, eager runs, the result stands."""
    res = checked("all_rows", ExactReferenceBackend(), all_rows_sizes=(4097,), all_rows_seeds=(3,), device="cuda")
    assert res.summary["4097"]["alone_path"].startswith("eager (")
    assert res.summary["4097"]["fwd_differ"] == res.summary["4097"]["rowgrad_differ"] == 0


class SlowHostAfterWarmup(ReferenceBackend):
    """A forward whose host path takes 3 ms once timing starts: the first calls (the accuracy pass, the warm-up and
    the clock's probe of the host time) are quick, so the queue's prime is sized for them and runs out."""

    key = "test:SlowHostAfterWarmup"
    has_backward = False

    def __init__(self, quick_calls: int) -> None:
        super().__init__()
        self.quick_calls = quick_calls

    def forward(self, x: Tensor, z: Tensor | None, w: Tensor, opts: OpOptions) -> Tensor:
        self.quick_calls -= 1
        if self.quick_calls < 0:
            time.sleep(0.003)
        return super().forward(x, z, w, opts)


@pytest.mark.gpu(reason="the queue-dry flag reads CUDA events")
def test_accuracy_latency_flags_a_host_bound_forward_on_the_gpu() -> None:
    warmup = 1
    quick = 1 + warmup + 1  # the accuracy pass's forward, the warm-up, the clock's probe of the host time
    kw = {"accuracy_rows": 4096, "timing_warmup": warmup, "timing_iters": 20, "device": "cuda"}
    s = checked("accuracy_latency", SlowHostAfterWarmup(quick), **kw).summary
    assert s["host_bound"] == {"add": False, "fwd": True}
    assert s["fwd_us"] > 1000  # the 3 ms host gaps are inside the events: the flag says so


def test_the_trail_names_each_batch_before_the_backend_gets_it() -> None:
    """The breadcrumb a crashed backend leaves: the last batch named is the one it was given, rebuilt exactly."""
    seen: list[dict[str, Any]] = []
    kw = {"sub_batches_rows": 10, "sub_batch_sizes": (4,), "sub_batches_seeds": (5,), "trail": seen.append}
    checked("full_vs_sub_batches", ReferenceBackend(), **kw)
    assert [s["batch"] for s in seen] == [
        {"kind": "slice", "start": s, "size": m} for s, m in ((0, 10), (0, 4), (8, 2))
    ]
    assert {s["check"] for s in seen} == {"full_vs_sub_batches"}
    assert torch.equal(rebuild_case(seen[-1]).batch.x, make_case(10, 128, 5).x[8:10])
    checked("all_rows", ReferenceBackend(), all_rows_sizes=(3,), all_rows_seeds=(3,))  # no trail: nothing named
    assert len(seen) == 3
