"""One number for one thing: on planted faulty backends, the artifact's counts of row comparisons that differ,
and the records kept, read the same in every plot (read back from the figure's texts), in investigate, in the
page's tables and verdict lines, and in compare. The expected numbers come from the artifact's raw fields here,
never through `rlnorm.report.counts`, so a plot or table that counts anything else fails."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from conftest import BATCH_FAULT, DWEIGHT_FAULT, POSITION_FAULT
from matplotlib.figure import Figure

from rlnorm.checkout import seed_report_path
from rlnorm.kit import checks
from rlnorm.kit.artifact import build_artifact, read_artifact
from rlnorm.kit.environment import REPORT_LIBRARIES
from rlnorm.kit.params import RunParams
from rlnorm.kit.records import records_frame
from rlnorm.kit.steps import Run
from rlnorm.options import OpOptions
from rlnorm.report import plots, tables
from rlnorm.report.compare import run_verdicts
from rlnorm.report.investigate import differing_rows, failing_summary, records_dropped
from rlnorm.report.runs import load_run
from tests.faults import BatchSizeDependentOutput, bump_one_ulp

ROW_CHECKS = ("all_rows", "full_vs_sub_batches", "batch_size_sweep")
NUM = r"(\d[\d,]*)"


class GradientsMoveToo(BatchSizeDependentOutput):
    """The kit's batch-size fault on y, plus dx one ulp off at positions r % 3 == 1 and dz at r % 4 == 1 in any
    batch of more than one row: y and dx,dz differ in different row comparisons, some in both dx and dz."""

    key = f"{__name__}:GradientsMoveToo"

    def forward_backward(self, x, z, w, dy, opts):  # type: ignore[no-untyped-def]
        g = super().forward_backward(x, z, w, dy, opts)
        if x.shape[0] > 1:
            r = torch.arange(x.shape[0], device=x.device)
            for name, rows in (("dx", r % 3 == 1), ("dz", r % 4 == 1)):
                t = getattr(g, name)
                mask = torch.zeros(t.shape, dtype=torch.bool, device=t.device)
                mask[:, 0] = rows
                setattr(g, name, bump_one_ulp(t, mask))
        return g


CAPPED = GradientsMoveToo.key


@pytest.fixture(scope="module")
def capped() -> tuple[dict[str, Any], pd.DataFrame, Run]:
    """The planted fault through the real checks (in this process), 4 records kept per check: an artifact whose
    counts the records alone would undercount."""
    b, common = GradientsMoveToo(), {"device": "cpu", "max_records": 4, "progress": False}
    ar = checks.all_rows(b, ns=[7, 12], seeds=[3], **common)
    dw = checks.dweight_repeatable(b, rows=7, **common)
    fvs = checks.full_vs_sub_batches(b, full_rows=15, sub_sizes=[1, 7], seeds=[3], use_graphs=False, **common)
    sw = checks.batch_size_sweep(b, n=17, sizes=[1, 2, 9], probe_rows=[0, 16], seeds=[3], **common)
    results = {
        CAPPED: {
            "source": b.source,
            "backward": "full",
            "status": "ran",
            "skip_reason": None,
            "batch_invariance": {
                "all_rows": ar.summary,
                "dweight_repeatable": dw.summary["dweight_repeatable"],
                "full_vs_sub_batches": fvs.summary,
                "batch_size_sweep": sw.summary,
                "batch_invariant": checks.batch_invariant(ar.summary, dw.summary, fvs.summary, sw.summary),
            },
            "accuracy_latency": None,
            "contract_gates": None,
            "errors": {},
        }
    }
    env = {"gpu": "cpu", "capability": None, "cuda": None, "libraries": dict.fromkeys(REPORT_LIBRARIES)}
    records = ar.records + fvs.records + sw.records + dw.records
    art = build_artifact(
        {"name": "capped"}, env, results, None, "records.csv", {}, True, list(checks.INVARIANCE_CHECKS), None, False
    )
    run = Run(params=RunParams(), device="cpu", results=art["results"], records=records)
    return art, records_frame(records), run


def expected(entry: dict[str, Any], check: str, records: pd.DataFrame, backend: str) -> dict[str, int]:
    """The numbers straight from the artifact's fields (and the records table's lines)."""
    node = entry["batch_invariance"][check]
    if check == "all_rows":
        sizes = [v for v in node.values() if isinstance(v, dict)]
        got = {
            "y": sum(v["fwd_differ"] for v in sizes),
            "grad": sum(v["rowgrad_differ"] for v in sizes),
            "compared": sum(v["rows"] for v in sizes),
            "dropped": sum(v.get("records_dropped", 0) for v in sizes),
        }
    else:
        got = {
            "y": node["fwd_differ"],
            "grad": node["rowgrad_differ"],
            "compared": node["rows_compared" if check == "full_vs_sub_batches" else "comparisons"],
            "dropped": node.get("records_dropped", 0),
        }
        if check == "batch_size_sweep":
            got["any"] = node["differ"]
    got["kept"] = int(((records["backend"] == backend) & (records["check"] == check)).sum())
    return got


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def _lane_numbers(label: str) -> dict[str, int]:
    out = {}
    for name, pattern in (("y", NUM + r" y\b"), ("grad", NUM + r" dx,dz"), ("compared", r"of " + NUM + r" row")):
        m = re.search(pattern, label)
        if m:
            out[name] = _n(m.group(1))
    return out


def _axis_of(fig: Figure, backend: str) -> Any:
    return next(ax for ax in fig.axes if ax.get_title("left").split("  (")[0] == backend)


def _verdict_cells(fig: Figure) -> dict[tuple[str, str], str]:
    """(backend, column) -> the cell's text, by the text's position in the grid."""
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    cols = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()]
    cells = {}
    for t in ax.texts:
        x, y = t.get_position()
        if float(x).is_integer() and float(y).is_integer() and int(x) < len(cols):
            cells[(rows[int(y)], cols[int(x)])] = t.get_text()
    return cells


def _vs_report_cells(fig: Figure) -> dict[tuple[str, str], str]:
    """(backend, column) -> 'this run | report' text of the counts panel."""
    ax = next(a for a in fig.axes if any("|" in t.get_text() for t in a.texts))
    rows = [t.get_text().split("\n")[0] for t in ax.get_yticklabels()]
    cols = [t.get_text() for t in ax.get_xticklabels()]
    return {(rows[round(t.get_position()[1])], cols[round(t.get_position()[0])]): t.get_text() for t in ax.texts}


def assert_one_count_everywhere(art: dict[str, Any], records: pd.DataFrame, run: Run, backends: list[str]) -> None:
    rows_fig = plots.plot_differing_rows(records, art)
    verdict = _verdict_cells(plots.plot_verdict(art))
    vs = _vs_report_cells(plots.plot_vs_reference_report(art, read_artifact(seed_report_path())))
    summary = failing_summary(records, art).set_index(["backend", "check"])
    inv, rec = tables.invariance_table(run), tables.record_table(run)
    lines = tables.verdict_markdown(art)
    compare = run_verdicts(art)
    for key in backends:
        entry = art["results"][key]
        ax = _axis_of(rows_fig, key)
        lanes = {t.get_text().split("\n")[0]: t.get_text() for t in ax.get_yticklabels()}
        kept_total = dropped_total = 0
        for check in ROW_CHECKS:
            want = expected(entry, check, records, key)
            kept_total, dropped_total = kept_total + want["kept"], dropped_total + want["dropped"]
            differs = want["y"] + want["grad"] > 0
            # the differing_rows plot: a lane per check that differs, labelled with the artifact's counts
            assert (check in lanes) == differs, (key, check, lanes)
            if differs:
                assert _lane_numbers(lanes[check]) == {k: want[k] for k in ("y", "grad", "compared")}, lanes[check]
            # the headline figure's cell
            cell = verdict[(key, check)]
            if differs:
                assert _lane_numbers(cell.replace("\nof ", " of ") + " row") == {
                    k: want[k] for k in ("y", "grad", "compared")
                }, cell
            else:
                assert cell == f"0 differ\nof {want['compared']:,}", cell
            # this run's side of the report comparison (the sweep's column is the report's total, `differ`)
            if check == "batch_size_sweep":
                assert vs[(key, "batch_size_sweep\ny, dx or dz")].split("  |  ")[0] == f"{want['any']:,}"
            else:
                assert vs[(key, f"{check}\ny")].split("  |  ")[0] == f"{want['y']:,}"
                assert vs[(key, f"{check}\ndx,dz")].split("  |  ")[0] == f"{want['grad']:,}"
            # the page's table, in the artifact's field names
            assert inv.loc[key, f"{check} row comparisons"] == want["compared"]
            if check == "batch_size_sweep":
                assert inv.loc[key, "batch_size_sweep differ"] == want["any"]
            else:
                assert (inv.loc[key, f"{check} fwd_differ"], inv.loc[key, f"{check} rowgrad_differ"]) == (
                    want["y"],
                    want["grad"],
                )
            if not differs:
                assert (key, check) not in summary.index
                continue
            # investigate and the page's records table: one table, the same numbers
            for table in (summary, rec):
                line = table.loc[(key, check)]
                got = [int(line[c]) for c in ("y differs", "dx or dz differs", "row comparisons")]
                assert got == [want["y"], want["grad"], want["compared"]], (key, check)
                assert (int(line["records kept"]), int(line["records not kept (max_records)"])) == (
                    want["kept"],
                    want["dropped"],
                )
            assert records_dropped(art, key, check) == want["dropped"]
            sentence = differing_rows(records, key, check, artifact=art).attrs["counts"]
            said = (
                f"y differs in {want['y']:,} and dx or dz in {want['grad']:,} of {want['compared']:,} row comparisons"
            )
            assert said in sentence and said in lines, (sentence, lines)
            if want["dropped"]:
                kept_said = f"{want['kept']:,} of {want['kept'] + want['dropped']:,} records kept"
                assert kept_said in sentence and kept_said in " ".join(t.get_text() for t in ax.texts), sentence
            else:
                assert f"all {want['kept']:,} records kept" in sentence
            assert compare.loc[key, check] == f"FAIL ({want['y']:,} y / {want['grad']:,} dx,dz)"
        title = ax.get_title("right")
        if dropped_total:
            assert title.startswith(f"{kept_total:,} of {kept_total + dropped_total:,} records kept"), title
        elif kept_total:
            assert title == f"all {kept_total:,} records kept", title
        assert inv.loc[key, "records kept"] == int((records["backend"] == key).sum())
        assert inv.loc[key, "records not kept (max_records)"] == sum(
            expected(entry, c, records, key)["dropped"] for c in ROW_CHECKS
        )


def test_counts_are_one_number_everywhere_with_records_capped(capped: tuple) -> None:
    art, records, run = capped
    entry = art["results"][CAPPED]
    wants = {c: expected(entry, c, records, CAPPED) for c in ROW_CHECKS}
    # the planted fault makes every count that could be confused for another differ: records were capped away,
    # dx and dz both differ in some comparisons (pairs > comparisons), and a row index repeats across sizes
    assert all(w["dropped"] > 0 for w in wants.values()), wants
    assert all(w["y"] > 0 and w["grad"] > 0 for w in wants.values()), wants
    sub = records[records["check"] == "full_vs_sub_batches"]
    assert (sub["tensor"] == "y").sum() < wants["full_vs_sub_batches"]["y"]  # the records alone undercount
    fvs = entry["batch_invariance"]["full_vs_sub_batches"]
    assert fvs["records_dropped"] + wants["full_vs_sub_batches"]["kept"] > fvs["fwd_differ"] + fvs["rowgrad_differ"]
    assert_one_count_everywhere(art, records, run, [CAPPED])


def test_counts_are_one_number_everywhere_in_a_real_run(tiny_run: Path) -> None:
    loaded = load_run(tiny_run)
    art, records = loaded.artifact, loaded.records
    run = Run(params=RunParams(), device="cpu", results=art["results"], records=records.to_dict("records"))
    assert_one_count_everywhere(art, records, run, [BATCH_FAULT, POSITION_FAULT, DWEIGHT_FAULT, "reference"])
    # the dweight fault: the one check it fails, said as such everywhere
    cells = _verdict_cells(plots.plot_verdict(art))
    assert cells[(DWEIGHT_FAULT, "dweight_repeatable")] == "differs\nrun to run"
    assert run_verdicts(art).loc[DWEIGHT_FAULT, "dweight_repeatable"] == "FAIL"
    lane = [t.get_text() for t in _axis_of(plots.plot_differing_rows(records, art), DWEIGHT_FAULT).get_yticklabels()]
    assert lane == ["dweight_repeatable\ndweight of one batch, run vs run\ndiffers (1 record)"]


def test_without_the_artifact_investigate_does_not_guess_the_counts(capped: tuple) -> None:
    """The records cannot give the counts (some were capped away): with no artifact those columns stay empty."""
    art, records, _ = capped
    alone = failing_summary(records).set_index(["backend", "check"])
    line = alone.loc[(CAPPED, "full_vs_sub_batches")]
    assert pd.isna(line["y differs"]) and pd.isna(line["records not kept (max_records)"])
    assert int(line["records kept"]) == expected(art["results"][CAPPED], "full_vs_sub_batches", records, CAPPED)["kept"]


def test_titles_say_what_each_check_compares(capped: tuple) -> None:
    art, records, _ = capped
    lanes = [t.get_text() for t in _axis_of(plots.plot_differing_rows(records, art), CAPPED).get_yticklabels()]
    said = {lane.split("\n")[0]: lane.split("\n")[1] for lane in lanes}
    assert said == {
        "all_rows": "row in its batch vs the row alone",
        "full_vs_sub_batches": "row in a sub-batch vs the full batch",
        "batch_size_sweep": "probe row in a batch of m vs alone",
    }
    ticks = [t.get_text() for t in plots.plot_verdict(art).axes[0].get_xticklabels()]
    assert "full_vs_sub_batches\nsub-batch\nvs full batch" in ticks and "all_rows\nrow in batch\nvs alone" in ticks
    assert "alone" not in ticks[1]  # full_vs_sub_batches compares with the full batch, never the row alone


def test_the_planted_fault_differs_where_it_should() -> None:
    """The fault behind the capped artifact moves dx at positions 1, 4 and dz at 1 of a 5-row batch, none alone."""
    from rlnorm.inputs import make_case

    case, b, opts = make_case(5, 128, 3), GradientsMoveToo(), OpOptions()
    batch = b.forward_backward(case.x, case.z, case.w, case.dy, opts)
    moved = {"dx": [], "dz": []}
    for r in range(5):
        alone = b.forward_backward(case.x[r : r + 1], case.z[r : r + 1], case.w, case.dy[r : r + 1], opts)
        for name in moved:
            if not torch.equal(getattr(batch, name)[r], getattr(alone, name)[0]):
                moved[name].append(r)
    assert moved == {"dx": [1, 4], "dz": [1]}
