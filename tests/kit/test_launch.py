"""The launch check sees a launch parameter that changes with the row count, where no row check can; the three
verdicts follow from the typed results of real checks; `--require` and a raised check set the exit status."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlnorm.cli import main
from rlnorm.cli.runs import EXIT_BACKEND, EXIT_REQUIRED, EXIT_USAGE, verdict_status
from rlnorm.kit import worker
from rlnorm.kit.checks import common
from rlnorm.kit.checks.launch import CONFIG, LAUNCH_ENV, LAUNCHED, _Kernel, ladder, launch, summarise
from rlnorm.kit.params import load_params
from rlnorm.kit.results import BackendResult, ConfigPair, Configurations, RunResult, from_json
from rlnorm.options import OpOptions
from rlnorm.report.verdict import State, backend_verdict
from tests.faults import OneRowPerProgram, RowsPerProgramByRowCount

PLANTED = "tests.faults:RowsPerProgramByRowCount"
KERNEL = "tests.faults._rows_per_program_kernel"
SIZES = {"all_rows_sizes": [5], "sub_batch_sizes": [1, 3], "sub_batches_rows": 9, "sweep_sizes": [1, 5, 9],
         "dweight_rows": 3, "accuracy_rows": 3, "agreement_rows": 3}  # fmt: skip


def test_the_ladder_holds_every_size_and_the_powers_of_two_around_them() -> None:
    assert ladder([5, 40], 40) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40]
    assert ladder([], 3) == [1, 2, 3]


def test_a_constexpr_chosen_by_the_row_count_is_seen_with_its_row_counts() -> None:
    out = launch(RowsPerProgramByRowCount(), OpOptions(), "cpu", launch_rows=17, **SIZES)
    assert out.error is None
    (k,) = out.summary.kernels
    assert (k.kernel, k.passes, k.seen_by, k.varying) == (KERNEL, ["forward"], "jit_hook", ["ROWS"])
    assert k.evidence == "ROWS=1 at 1..4, 4 at 5..17"
    assert k.configs == {
        "D=128, HALVES=False, ROWS=1": [1, 2, 3, 4],
        "D=128, HALVES=False, ROWS=4": [5, 6, 7, 8, 9, 15, 16, 17],
    }
    assert k.specializations == {"n_rows==1": [1], "n_rows%16==0": [16]}
    assert out.summary.unseen  # a CPU says what it cannot see
    # the control: one configuration at every row count is no variation
    (k,) = launch(OneRowPerProgram(), OpOptions(), "cpu", launch_rows=17, **SIZES).summary.kernels
    assert k.varying == [] and k.evidence is None and list(k.configs) == ["D=128, HALVES=False, ROWS=1"]


def _checked(tmp_path: Path, spec: str) -> BackendResult:
    """The backend's checks as a run gives them (the worker, in this process): its typed result."""
    params = load_params(None, checks=[*common.INVARIANCE_CHECKS, "launch"], progress=False, launch_rows=9, **SIZES)
    job = {"backend": spec, "device": "cpu", "folder": str(tmp_path), "params": params.as_dict()}
    assert worker.work(job) == 0
    report = from_json(worker.WorkerReport, json.loads((tmp_path / worker.RESULT_FILE).read_text()))
    return report.result


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> BackendResult:
    return _checked(tmp_path_factory.mktemp("planted"), PLANTED)


def test_three_verdicts_from_the_checks_typed_results(planted: BackendResult, tmp_path: Path) -> None:
    inv = planted.batch_invariance
    assert inv is not None and not planted.errors
    # no row differs, yet ROWS changes with the row count and nothing ran it at each value: by construction
    assert common.batch_invariant(inv, {}) is True
    assert (inv.verdict, inv.batch_invariant) == (common.BY_CONSTRUCTION, False)
    v = backend_verdict("planted", planted)
    assert v.overall is State.BY_CONSTRUCTION and f"{KERNEL} (forward): ROWS=1 at 1..4, 4 at 5..9" in v.why
    assert v.checks["launch"].state is State.BY_CONSTRUCTION
    # the configurations check ran ROWS at both values and no bit changed: cleared, invariant
    cleared = dataclasses.replace(planted, configurations=Configurations(cleared=[f"{KERNEL}.ROWS"]))
    assert common.verdict(cleared, {}) == common.INVARIANT
    # an autotuner's configs that could not all be run here (the interpreter cannot time them): by construction
    untimed = dataclasses.replace(cleared, configurations=Configurations(
        cleared=[f"{KERNEL}.ROWS"], unexercised={f"{KERNEL}.config": "the interpreter ignores num_warps"}))  # fmt: skip
    assert common.verdict(untimed, {}) == common.BY_CONSTRUCTION
    assert f"{KERNEL}.config: not run at each value here: the interpreter ignores num_warps" in backend_verdict(
        "planted", untimed).why  # fmt: skip
    # a pair of configurations under which rows differ: not invariant, and the pair is named
    pair = ConfigPair(KERNEL, "ROWS", "ROWS=4", "ROWS=1", fwd_differ=3)
    differs = dataclasses.replace(planted, configurations=Configurations(pairs=[pair], cleared=[f"{KERNEL}.ROWS"]))
    assert common.verdict(differs, {}) == common.NOT_INVARIANT
    said = backend_verdict("planted", differs)
    assert said.overall is State.FAILED and "ROWS=4 (full batch) vs ROWS=1 (alone)" in said.why
    # the control: one configuration at every row count, nothing to clear
    control = _checked(tmp_path, "tests.faults:OneRowPerProgram")
    assert control.batch_invariance is not None and control.batch_invariance.verdict == common.INVARIANT
    assert backend_verdict("control", control).overall is State.PASSED
    # no launch evidence (the check raised): no verdict
    assert common.verdict(planted, {"launch": "planted"}) is None


def _run(results: dict[str, BackendResult]) -> RunResult:
    return RunResult(schema_version="1", kind="k", op="op", commit=None, environment={}, quick=True, checks=[],
                     results=results)  # fmt: skip


def test_require_and_a_raised_check_set_the_exit_status(planted: BackendResult) -> None:
    code, lines = verdict_status(_run({"planted": planted}), {"planted": "invariant"})
    assert code == EXIT_REQUIRED and any(line.startswith("  planted: required invariant, is not invariant by")
                                         for line in lines)  # fmt: skip
    cleared = dataclasses.replace(planted, configurations=Configurations(cleared=[f"{KERNEL}.ROWS"]))
    cleared.batch_invariance = dataclasses.replace(planted.batch_invariance, verdict=common.INVARIANT)
    assert verdict_status(_run({"planted": cleared}), {"planted": "invariant"})[0] == 0
    assert verdict_status(_run({"planted": cleared}), {"absent": "invariant"})[0] == EXIT_REQUIRED
    # a candidate that raised in every check: never a clean exit, even unrequired
    raised = BackendResult("src", "full", "ran", errors=dict.fromkeys(common.INVARIANCE_CHECKS, "boom"))
    assert verdict_status(_run({"raised": raised}), {})[0] == EXIT_BACKEND
    assert verdict_status(_run({"raised": raised}), {"raised": "invariant"})[0] == EXIT_REQUIRED


@pytest.mark.parametrize("spec", ["rlnorm", "rlnorm=fast", "=invariant"])
def test_a_bad_require_is_refused_before_anything_runs(spec: str, tmp_path: Path) -> None:
    assert main(["run", "params/quick.yaml", "--outputs", str(tmp_path), "--require", spec]) == EXIT_USAGE
    assert not any(tmp_path.iterdir())


@pytest.mark.gpu
def test_an_inductor_kernel_goes_by_one_name_at_every_row_count() -> None:
    """Inductor's generated modules have throwaway names: each launch of its kernel, the first and every later one,
    is filed under `inductor.<kernel>`, or one kernel reads as two, each launched at some row counts only."""
    code = ("import json, sys; from rlnorm.kit.backends import load_backend; from rlnorm.kit.checks.launch import "
            "launch; from rlnorm.options import OpOptions; out = launch(load_backend('torch_compile'), OpOptions(), "
            f"'cuda', launch_rows=17, **{SIZES!r}); print(json.dumps([out.summary.error] + "
            "[k.kernel for k in out.summary.kernels]))")  # fmt: skip
    # in a process of its own, as the worker runs it: Inductor's static launcher off before torch is imported
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **LAUNCH_ENV}, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    error, *names = json.loads(proc.stdout.strip().splitlines()[-1])
    assert error is None and any(n.startswith("inductor.") for n in names), names
    assert not any(n.startswith("torch._inductor") for n in names), names


def test_a_kernel_at_some_row_counts_only_and_an_autotuners_pick_each_change_with_the_row_count() -> None:
    """A kernel launched at some row counts only (torch.compile's graphs of another shape put another in its place)
    varies as `launched`; an autotuner's pick is one parameter, `config`, which the configurations check clears
    whole or not."""
    k = _Kernel("launch_hook", {"forward"})
    for rows in (2, 3, 4):
        k.launches[rows].append({"XBLOCK": "8"})
    s = summarise("inductor.triton_per_fused_0", k, [1, 2, 3, 4])
    assert s.varying == [LAUNCHED] and s.evidence == "launched at 2..4, not at 1"
    k = _Kernel("launch_hook", {"forward"}, tuned={"BT", "num_warps"})
    for rows, bt, warps in ((1, "16", "16"), (2, "16", "16"), (3, "32", "8")):
        k.launches[rows].append({"BT": bt, "num_warps": warps, "grid[1]": "2"})
    s = summarise("fla.fused_fwd", k, [1, 2, 3])
    assert s.varying == [CONFIG] and s.evidence == "BT=16 at 1..2, 32 at 3; num_warps=16 at 1..2, 8 at 3"
