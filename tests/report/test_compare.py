"""Two runs side by side, the index across runs, and the published run read end to end."""

from __future__ import annotations

import copy
from pathlib import Path

from planted import FAULTY, planted_run, write_run

from rlnorm.checkout import CHECKOUT, seed_report_path
from rlnorm.kit.results import RowsAtSize, load_run
from rlnorm.report.compare import compare_runs, summary_table, write_index
from rlnorm.report.plots.counts import plot_comparison
from rlnorm.report.verdict import State, run_verdicts

PUBLISHED = (CHECKOUT or Path(__file__).parents[2]) / "outputs" / "h200-full"


def test_compare_names_the_backend_that_moved(tmp_path: Path) -> None:
    before, records = planted_run()
    after = copy.deepcopy(before)
    after.results["clean"].batch_invariance.all_rows.sizes[7] = RowsAtSize(7, 2, 0)  # type: ignore[union-attr]
    after.results["clean"].batch_invariance.batch_invariant = False  # type: ignore[union-attr]
    after.results["clean"].accuracy_latency.fwd_us = 100.0  # type: ignore[union-attr]
    a, b = write_run(before, records, tmp_path / "a"), write_run(after, records, tmp_path / "b")
    cmp = compare_runs(a, b)
    flips = [c for c in cmp.changes if c.startswith("clean all_rows:")]
    assert flips == ["clean all_rows: passed (0 y / 0 dx,dz of 19 row comparisons) -> failed (2 y / 0 dx,dz of 19 "
                     "row comparisons)"]  # fmt: skip
    assert any(c.startswith("clean batch_invariant: invariant") for c in cmp.changes)
    assert any(c.startswith("clean fwd_us: 50.0 -> 100.0 us (2.00x, slower)") for c in cmp.changes)
    assert not [c for c in cmp.changes if c.startswith(FAULTY)]  # what did not move is not said
    assert cmp.verdicts.loc[("clean", "all_rows"), "changed"] and not cmp.verdicts.loc[(FAULTY, "all_rows"), "changed"]
    assert compare_runs(a, a).changes == []
    assert len(plot_comparison(cmp).axes) >= 3


def test_runs_of_different_ops_say_so_first(tmp_path: Path) -> None:
    run, records = planted_run()
    other = copy.deepcopy(run)
    other.params = {**(run.params or {}), "d": 256}
    cmp = compare_runs(write_run(run, records, tmp_path / "a"), write_run(other, records, tmp_path / "b"))
    assert cmp.changes[0].startswith("the two runs computed different ops (d: 128 in A")
    assert cmp.different_ops and "different ops" in cmp.changes_markdown()


def test_the_seed_and_the_published_run_load_compare_and_index(tmp_path: Path) -> None:
    seed = load_run(seed_report_path())
    v = run_verdicts(seed)
    assert v["fla_fused_norm_gate"].overall is State.FAILED
    assert v["fla_fused_norm_gate"].checks["full_vs_sub_batches"].counts.short() == "95 y / 152 dx,dz"  # type: ignore[union-attr]
    assert v["vllm"].checks["dweight_repeatable"].state is State.NOT_RUN  # no backward: not a failure
    run = load_run(PUBLISHED)
    v = run_verdicts(run)
    not_invariant = {k for k, bv in v.items() if bv.overall is State.FAILED}
    assert not_invariant == {"vllm", "torch_compile"}
    assert v["torch_compile"].checks["full_vs_sub_batches"].counts.sentence() == (  # type: ignore[union-attr]
        "y differs in 172 and dx or dz in 6,566 of 2,621,440 row comparisons"
    )
    cmp = compare_runs(seed, run)
    assert "fla_fused_norm_gate full_vs_sub_batches: failed (95 y / 152 dx,dz) -> passed" in " ".join(cmp.changes)
    assert any(c.startswith("devices differ (NVIDIA B200 vs NVIDIA H200)") for c in cmp.changes)
    table = summary_table([PUBLISHED])
    assert set(table.loc[table["state"] == "failed", "backend"]) == not_invariant
    index, csv = write_index([PUBLISHED], tmp_path)
    assert "h200-full" in index.read_text() and csv.read_text().count("\n") == len(run.results) + 1
