"""The verdict model and everything that reads it: a planted run's counts read alike everywhere, each backend's state
follows what happened to it, and the report draws every figure (long reasons never overlap) without writing the
artifact."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from planted import FAULTY, KEPT, PLANTED, load_planted, planted_run, write_run

from rlnorm.checkout import seed_report_path
from rlnorm.kit.results import BackendResult, RunResult, StackPair, StackPairs, load_run
from rlnorm.report import plots, tables
from rlnorm.report.compare import compare_runs, verdict_table
from rlnorm.report.investigate import rows_or_reason
from rlnorm.report.runs import records_of
from rlnorm.report.verdict import COLUMNS, INVARIANCE, State, run_verdicts, summary_lines


@pytest.fixture
def planted(tmp_path: Path) -> RunResult:
    return load_planted(tmp_path / "planted")


def _texts(fig) -> str:  # type: ignore[no-untyped-def]
    out = [fig.get_suptitle()]
    for ax in fig.axes:
        out += [ax.get_title(loc) for loc in ("left", "center", "right")]
        out += [t.get_text() for t in ax.texts + ax.get_yticklabels() + ax.get_xticklabels()]
    return "\n".join(out)


def test_the_planted_counts_read_alike_everywhere(planted: RunResult) -> None:
    records = records_of(planted)
    assert records is not None and len(records) == sum(KEPT.values())
    verdict_fig, rows_fig = _texts(plots.plot_verdict(planted)), _texts(plots.plot_differing_rows(planted, records))
    vs_fig = _texts(plots.plot_comparison(compare_runs(load_run(seed_report_path()), planted)))
    recs = tables.record_table(planted)
    lines, summary = tables.verdict_markdown(planted), "\n".join(summary_lines(planted))
    compare = verdict_table(planted, planted, "a", "b")
    for check, (compared, y, grad, not_kept) in PLANTED.items():
        short, of = f"{y:,} y / {grad:,} dx,dz", f"of {compared:,} row comparisons"
        sentence = f"y differs in {y:,} and dx or dz in {grad:,} {of}"
        assert f"{short}\nof {compared:,}" in verdict_fig, check
        assert f"{check}\n" in rows_fig and f"{short} {of}" in rows_fig, check
        assert f"–\n{short}" in vs_fig
        assert f"{check}: {sentence}" in lines and f"{check}: {sentence}" in summary
        assert compare.loc[(FAULTY, check), "a"] == f"failed ({short} {of})"
        line = recs.loc[(FAULTY, check)]
        if check == "batch_size_sweep":
            assert line["y, dx or dz differs"] == y + grad
        assert [line["row comparisons"], line["y differs"], line["dx or dz differs"]] == [compared, y, grad]
        assert (line["records kept"], line["records not kept (max_records)"]) == (KEPT[check], not_kept)
        said = rows_or_reason(records, planted, FAULTY, check)[0].attrs["counts"]
        assert sentence in said and f"{KEPT[check]:,}" in said
    kept, not_kept = sum(KEPT.values()), sum(p[3] for p in PLANTED.values())
    assert f"{kept:,} of {kept + not_kept:,} records kept ({not_kept:,} not kept: max_records)" in rows_fig
    totals = recs.loc[FAULTY][["records kept", "records not kept (max_records)"]].sum()
    assert tuple(totals) == (kept, not_kept)
    # the clean backend differs nowhere, and nothing of it reaches the differing-rows table
    assert "clean" not in recs.index.get_level_values(0)
    said = "nothing differs in all_rows, dweight_repeatable, full_vs_sub_batches, batch_size_sweep"
    assert said in " ".join(rows_fig.split())


def test_each_backend_takes_the_state_of_what_happened_to_it(planted: RunResult) -> None:
    v = run_verdicts(planted)
    assert v["clean"].overall is State.PASSED and v["clean"].headline == "invariant"
    assert v[FAULTY].overall is State.FAILED and v[FAULTY].headline == "not invariant"
    assert {c for c in INVARIANCE if v[FAULTY].checks[c].state is State.FAILED} == set(INVARIANCE)
    assert v[FAULTY].checks["gradient_gate"].state is State.FAILED
    assert v[FAULTY].checks["forward_gate"].state is State.PASSED
    # a check that raised is no pass, and leaves no verdict
    assert v["raises"].checks["batch_size_sweep"].state is State.RAISED
    assert v["raises"].overall is State.RAISED and "batch_size_sweep raised" in v["raises"].why
    # a backend that died keeps what it finished; where it died and what came after take the crash
    crashed = v["crashes"].checks
    assert crashed["all_rows"].state is State.PASSED and crashed["dweight_repeatable"].state is State.PASSED
    assert crashed["full_vs_sub_batches"].state is State.CRASHED and "SIGSEGV" in crashed["full_vs_sub_batches"].detail
    assert crashed["batch_size_sweep"].state is State.CRASHED and crashed["gradient_gate"].state is State.CRASHED
    assert v["crashes"].overall is State.CRASHED and "full_vs_sub_batches at a batch of 7 rows" in v["crashes"].why
    assert v["skipped"].overall is State.SKIPPED and v["broken"].overall is State.NOT_LOADED
    assert all(c.state is State.SKIPPED for c in v["skipped"].checks.values())
    # a crash after a difference: all_rows and dweight finished and differ, and the crash changes nothing of that
    planted.results[FAULTY].status, planted.results[FAULTY].crash = "crashed", planted.results["crashes"].crash
    v = run_verdicts(planted)
    assert v[FAULTY].overall is State.FAILED and v[FAULTY].checks["full_vs_sub_batches"].state is State.CRASHED


def test_a_step_that_failed_after_the_backends_is_on_the_page_and_in_the_summary(planted: RunResult) -> None:
    lines = tables.verdict_markdown(planted)
    assert "step `trainer_sampler` failed" in lines and "RuntimeError: planted step failure" in lines
    assert 'File "x.py", line 1' in lines  # the traceback's tail
    assert any("step trainer_sampler failed" in s for s in summary_lines(planted))
    assert "**step `" not in tables.verdict_markdown(dataclasses.replace(planted, failed_steps=None))


def test_make_plots_draws_every_figure_writes_nothing_else_and_survives_a_broken_one(planted: RunResult) -> None:
    folder = planted.folder
    assert folder is not None
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    records = records_of(planted)
    assert records is not None
    # records without their `row` column break the differing-rows figure: it alone becomes a PNG that says so
    with pytest.warns(RuntimeWarning) as caught:
        paths = plots.make_plots(planted, folder / "plots", records=records.drop(columns="row"))
    assert [str(w.message).split(":")[0] for w in caught] == ["plot 'differing_rows' failed"]
    assert list(paths) == list(plots.PLOT_NAMES)
    assert all(p.is_file() and p.stat().st_size > 10_000 for p in paths.values())
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before  # the artifact as it was


def test_the_page_tables_read_a_run(planted: RunResult) -> None:
    assert tables.backend_table(planted).loc["skipped", "why"] == "needs a CUDA GPU"
    assert tables.accuracy_table(planted).loc["clean", "fwd / its add"] == f"{50 / 45:.2f}x"
    gates = tables.gates_table(planted)
    assert list(gates["gradient gate"]) == ["passed", "failed (6 of 20 lines failed)"]  # clean, faulty
    assert tables.agreement_table(planted).loc["clean", FAULTY] == 0.9
    assert "planted" in tables.header(planted) and "abc1234de" in tables.header(planted)
    assert tables.device_notice(planted).startswith("> **CPU run.**")


def test_a_run_without_records_still_shows_its_counts(tmp_path: Path) -> None:
    run, _ = planted_run()
    run.records = None
    loaded = load_run(write_run(run, [], tmp_path / "r"))
    assert records_of(loaded) is None
    text = " ".join(_texts(plots.plot_differing_rows(loaded, None)).split())
    compared, y, grad, _ = PLANTED["all_rows"]
    assert "per-row records not available" in text and f"{y} y / {grad} dx,dz of {compared} row comparisons" in text


LONG = (
    "cannot import vllm.model_executor.layers.layernorm: ModuleNotFoundError: No module named 'vllm'; "
    "`bash .ci/install-vllm.sh` installs vllm==0.30.0 beside the installed torch where a package index is "
    "reachable; `python tools/stack_sources.py` packs an installed vLLM's Python files for a machine without one"
)


def test_long_skip_reasons_are_one_line_each_and_nothing_overlaps() -> None:
    run, _ = planted_run()
    for i in range(5):  # five vLLM-like rows skipped with the same long reason, one under the other
        run.results[f"vllm_{i}"] = BackendResult(f"vllm {i}", "none", "skipped", LONG)
    fig = plots.plot_verdict(run)
    ax = fig.axes[0]
    notes = [t for t in ax.texts if t.get_position()[0] > len(COLUMNS) - 1 and t.get_text()]  # the status column
    assert len(notes) == 8  # the five, the planted skipped, unloadable and crashed backends
    assert all("\n" not in t.get_text() for t in notes)
    assert sum(t.get_text() == "skipped: No module named 'vllm'" for t in notes) == 5  # the error's own words
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [t.get_window_extent(renderer) for t in notes]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    assert all(fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 for b in boxes)


def test_the_stack_pairs_figure_has_a_bar_per_pair_and_says_why_one_was_skipped() -> None:
    run, _ = planted_run()
    pairs = [
        StackPair("same", "ran", trainer="rlnorm", sampler="rlnorm", bitwise_equal=True, elements_differ=0, max_ulp=0),
        StackPair("differs", "ran", trainer="a", sampler="b", bitwise_equal=False, elements_differ=640, max_ulp=2),
        StackPair("missing", "skipped", trainer="x", sampler="y", reason=LONG),
    ]
    run.stack_pairs = StackPairs(rows=10, d=128, seed=3, device="cpu", pairs=pairs)
    ax = plots.plot_stack_pairs(run).axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert widths == [0.0, 50.0, 0.0]  # 640 of 1280 elements: 50 %
    words = [t.get_text() for t in ax.texts]
    assert words[0] == "bitwise equal" and "max 2 ulp" in words[1] and words[2].startswith("skipped: cannot import")
    assert ax.get_xlabel() and ax.get_ylabel()
