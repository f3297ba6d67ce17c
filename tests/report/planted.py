"""A run with planted counts, written and read back the way a finished run is: every reader must show these numbers.
(A module of its own, not a conftest: the tests' shared conftest keeps its name.)"""

from __future__ import annotations

import json
from pathlib import Path

from rlnorm.kit.artifact import records_frame, write_records
from rlnorm.kit.results import (
    ARTIFACT_KIND,
    OP,
    Accuracy,
    Agreement,
    AllRows,
    BackendResult,
    BatchInvariance,
    Crash,
    Gate,
    RowsAtSize,
    RunResult,
    StepFailure,
    SubBatches,
    Sweep,
    load_run,
    to_json,
)

FAULTY = "faulty"
# what the faulty backend planted, per row check: (row comparisons, y differs, dx or dz differs, not kept)
PLANTED = {"all_rows": (19, 3, 3, 1), "full_vs_sub_batches": (30, 4, 5, 2), "batch_size_sweep": (12, 2, 1, 0)}
KEPT = {"all_rows": 5, "full_vs_sub_batches": 7, "batch_size_sweep": 3, "dweight_repeatable": 1}
GATE_LINES = [f"bitwise pair=('BN/full', 'B{i}') tensor=y passed=True" for i in range(7)]


def _invariance(planted: bool) -> BatchInvariance:
    (_, y, g, dropped), (ns, ys, gs, ds), (nw, yw, gw, _) = (
        PLANTED[c] if planted else (PLANTED[c][0], 0, 0, 0) for c in PLANTED
    )
    return BatchInvariance(
        all_rows=AllRows(
            {7: RowsAtSize(7, max(y - 1, 0), g, records_dropped=dropped), 12: RowsAtSize(12, 1 if y else 0, 0)}
        ),
        dweight_repeatable=not planted,
        full_vs_sub_batches=SubBatches(15, [1, 7], 17, ys, gs, coverage="all", rows_compared=ns, records_dropped=ds),
        batch_size_sweep=Sweep([1, 2, 9], [0, 16], nw, yw + gw, yw, gw),
        batch_invariant=not planted,
    )


def _accuracy(cr: float) -> Accuracy:
    return Accuracy(
        rows=64, fwd_correctly_rounded=cr, fwd_max_abs_err=1e-3, fwd_us=50.0, fwd_us_p20=48.0, fwd_us_p80=53.0,
        fwd_bwd_us=150.0, roofline_add_us=45.0, fwd_roofline_ratio=50 / 45, fwd_bwd_roofline_ratio=150 / 120,
        fwd_ulp_hist={"0": 8000, "1": 192}, device="cpu", timed=True,
        fwd_abs_err_hist={"edges": [1e-6, 1e-4, 1e-2], "counts": [100, 92], "zero": 8000},
    )  # fmt: skip


def _gates(failed: int) -> dict[str, Gate]:
    grad = [f"dweight line {i}" for i in range(failed)]
    return {
        "forward": Gate(0, True, lines=GATE_LINES),
        "gradient": Gate(0, not failed, failed_lines=grad, lines=GATE_LINES + [f"g{i}" for i in range(13)]),
    }


def planted_run() -> tuple[RunResult, list[dict]]:
    """Six backends (clean, faulty, raising, crashed, skipped, unloadable) and a step that failed after them."""
    clean = BackendResult("clean", "full", "ran", None, _invariance(False), _accuracy(1.0), _gates(0), {})
    faulty = BackendResult(FAULTY, "full", "ran", None, _invariance(True), _accuracy(0.99), _gates(6), {})
    raising_inv = _invariance(False)
    raising_inv.batch_size_sweep.error = "RuntimeError: planted"  # type: ignore[union-attr]
    raising_inv.batch_invariant = None
    raising = BackendResult("raises", "full", "ran", None, raising_inv, None, None, {"batch_size_sweep": "boom"})
    crashed_inv = BatchInvariance(all_rows=_invariance(False).all_rows, dweight_repeatable=True)
    crash = Crash("killed by SIGSEGV (signal 11)", signal="SIGSEGV", check="full_vs_sub_batches", batch_size=7,
                  finished_checks=["all_rows", "dweight_repeatable"])  # fmt: skip
    crashed = BackendResult("crashes", "full", "crashed", crash.cause, crashed_inv, None, None, {}, crash)
    skipped = BackendResult("gpu only", "none", "skipped", "needs a CUDA GPU")
    unloadable = BackendResult("broken", "full", "failed", "ImportError: no module named broken")
    results = {"clean": clean, FAULTY: faulty, "raises": raising, "crashes": crashed, "skipped": skipped,
               "broken": unloadable}  # fmt: skip
    run = RunResult(
        schema_version="1", kind=ARTIFACT_KIND, rfc=None, op=OP, commit="abc1234def5678", rl_kernel_commit=None,
        tracked_tree_dirty=False, created_at="2026-12-06T00:00:00+00:00", wall_time_s=1.0, param_set="planted",
        environment={"gpu": "cpu", "device": "cpu", "libraries": {"torch": "2.13.0"}}, quick=True,
        checks=["all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep"],
        params={"name": "planted", "d": 128, "eps": 1e-6, "max_records": 4}, records="records.csv", plots=None,
        agreement=Agreement("y", 64, 3, ["clean", FAULTY], [[1.0, 0.9], [0.9, 1.0]]),
        results=results,
        failed_steps=[StepFailure("trainer_sampler", "RuntimeError: planted step failure",
                                  ["Traceback (most recent call last):", '  File "x.py", line 1', "RuntimeError: "
                                   "planted step failure"])],
    )  # fmt: skip
    records = []
    for check, kept in KEPT.items():
        for i in range(kept):
            tensor = "dweight" if check == "dweight_repeatable" else ("y" if i % 2 == 0 else "dx")
            row = None if tensor == "dweight" else i
            records.append({"backend": FAULTY, "check": check, "seed": 3, "case": "n=7", "row": row, "tensor": tensor,
                            "cols_differ": 2, "max_ulp": 1 + i, "rebuild": "{}"})  # fmt: skip
    return run, records


def write_run(run: RunResult, records: list[dict], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rms_norm_gated_reuse_check.json").write_text(json.dumps(to_json(run), indent=1))
    write_records(records_frame(records), folder / "records.csv")
    return folder


def load_planted(folder: Path) -> RunResult:
    """The planted run as a reader gets it: written to a run folder, then `load_run`."""
    run, records = planted_run()
    return load_run(write_run(run, records, folder))
