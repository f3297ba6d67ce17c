"""Both investigation notebooks executed end to end, asserting on what a reader sees: investigate_rows on the tiny
run's planted faulty backends, compare_runs on the seed B200 report beside an artifact with planted flips."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import pytest
from conftest import BATCH_FAULT, POSITION_FAULT

from rlnorm.checkout import seed_report_path
from rlnorm.cli import notebook
from rlnorm.kit.artifact import write_artifact
from rlnorm.kit.results import load_run
from rlnorm.report.investigate import rows_or_reason
from rlnorm.report.runs import records_of

pytestmark = pytest.mark.slow

SEED = seed_report_path()


def execute(name: str, workdir: Path, parameters: dict) -> tuple[str, int]:
    """The notebook run as the command line runs it: every text a reader sees in its outputs (stream text,
    plain-text and markdown renderings), and how many images it shows."""
    executed, failure = notebook.execute(name, parameters, workdir, progress=False, title=name)
    assert failure is None, failure
    outputs = [o for c in nbformat.read(executed, as_version=4).cells for o in c.get("outputs", [])]
    shown = [o.get("data", {}).get(mime) for o in outputs for mime in ("text/markdown", "text/plain")]
    texts = [o["text"] for o in outputs if o.get("output_type") == "stream"] + [t for t in shown if t]
    return "\n".join(texts), sum("image/png" in o.get("data", {}) for o in outputs)


def test_investigate_rows_notebook_explains_a_chosen_planted_row(tiny_run: Path, tmp_path: Path) -> None:
    """The backend, check and row chosen by parameters (the default pick is tests/report/test_investigate.py's)."""
    run = load_run(tiny_run)
    table, _ = rows_or_reason(records_of(run), run, POSITION_FAULT, "batch_size_sweep")
    index = len(table) - 1
    row, case = int(table.loc[index, "row"]), str(table.loc[index, "case"])
    params = {
        "run": str(tiny_run / "rms_norm_gated_reuse_check.json"),
        "backend": POSITION_FAULT,
        "check": "batch_size_sweep",
        "row_index": index,
        "others": ["reference", BATCH_FAULT],
        "device": "cpu",
    }
    shown, images = execute("investigate_rows", tmp_path, params)
    assert f"**{POSITION_FAULT}**: batch_size_sweep" in shown and "row comparisons" in shown
    assert f"'s y for row {row} (batch_size_sweep, case {case}, seed 3)" in shown
    # the explanation: columns differ by a nonzero number of ulps, reproduced here, and the planted cause named
    m = re.search(r"differs in (\d+) of 128 columns by at most (\d+) ulp", shown)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) >= 1
    assert "depends on the row's position" in shown
    # the differing-columns table carries the correctly rounded value and the ulp columns
    assert "correctly_rounded" in shown and "ulp_batch_vs_compared" in shown
    # rstd both ways, and the other backends compared on the same row
    assert "fp64_from_x" in shown and "fp32_from_x" in shown
    assert "reference" in shown and BATCH_FAULT in shown and "batch_equal_compared" in shown
    assert images == 1  # the per-column plot
    assert re.search(r"failed \(\d[\d,]* y", shown)  # the run's own verdicts table, in row comparisons


def test_compare_runs_notebook_shows_the_verdict_flip(tmp_path: Path) -> None:
    b = copy.deepcopy(load_run(SEED))
    b.environment["gpu"] = "NVIDIA H200"
    fused = b.results["fla_fused_norm_gate"].batch_invariance
    fused.full_vs_sub_batches.fwd_differ = fused.full_vs_sub_batches.rowgrad_differ = 0  # type: ignore[union-attr]
    fused.batch_invariant = True  # type: ignore[union-attr]
    b.results["vllm"].accuracy_latency.fwd_us = 58.6  # type: ignore[union-attr]
    write_artifact(b, tmp_path / "h200" / "rms_norm_gated_reuse_check.json")
    # artifact_a left at its default: the seed report shipped with rlnorm
    shown, images = execute("compare_runs", tmp_path, {"artifact_b": str(tmp_path / "h200")})
    assert "- fla_fused_norm_gate full_vs_sub_batches: failed (95 y / 152 dx,dz) -> passed" in shown
    assert "- fla_fused_norm_gate batch_invariant: not invariant (full_vs_sub_batches" in shown
    assert "- vllm fwd_us: 87.1 -> 58.6 us (0.67x, faster)" in shown
    assert "A: NVIDIA B200" in shown and "B: NVIDIA H200" in shown
    assert "fwd_us_ratio" in shown and "fwd_correctly_rounded_a" in shown
    assert images == 1
