"""The page's first screen: the headline figure (backend x check, coloured by state) and the verdict lines; a
backend whose process crashed or timed out shows as such, with the cause and where, in every figure; the latency
plot's ratio is the table's; the agreement plot's colour bar and its numbers read in one direction."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TINY_SIZES, figure_texts
from matplotlib import colors as mcolors
from matplotlib.figure import Figure

from rlnorm.checkout import seed_report_path
from rlnorm.kit import isolation
from rlnorm.kit.artifact import build_artifact, read_artifact
from rlnorm.kit.environment import REPORT_LIBRARIES
from rlnorm.kit.params import RunParams, load_params
from rlnorm.kit.steps import Run
from rlnorm.report import plots, tables
from rlnorm.report.plots.verdict import STATE_COLORS
from rlnorm.report.runs import load_artifact

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
SEGV = "tests.faults:SegfaultPastRows"
HANG = "tests.faults:HangPastRows"
FULL_VS_SUB = {"full_batch": 15, "sub_batch_sizes": [1, 7], "sub_batches": 6, "rows_compared": 30}
SWEEP = {"batch_sizes": [1, 2, 9], "probe_rows": [0, 16], "comparisons": 12}
GATE_LINES = [f"bitwise pair=('BN/full', 'c{i}') tensor=y max_abs=0.00000000e+00 passed=True" for i in range(7)]
GRAD_FAILED = [
    "singleton_aggregate pair=('BN/full', 'B1-singleton_aggregate/full') tensor=dweight max_abs=2e-06 passed=False",
    "singleton_aggregate pair=('BN/full', 'B1-singleton_aggregate/chunked') tensor=dweight max_abs=2e-06 passed=False",
    "dweight pair=('BN/full', 'BN/permuted') tensor=dweight max_abs=1.9e-06 passed=False",
]


def _bi(sub_y: int = 0, sub_grad: int = 0, upto: str = "batch_size_sweep") -> dict[str, Any]:
    """Batch-invariance summaries of the checks up to and including `upto`, in run order."""
    out: dict[str, Any] = {
        "all_rows": {"7": {"rows": 7, "fwd_differ": 0, "rowgrad_differ": 0, "alone_path": "eager"}},
        "dweight_repeatable": True,
        "full_vs_sub_batches": {**FULL_VS_SUB, "fwd_differ": sub_y, "rowgrad_differ": sub_grad},
        "batch_size_sweep": {**SWEEP, "differ": 0, "fwd_differ": 0, "rowgrad_differ": 0},
    }
    order = list(out)
    kept = {k: v for k, v in out.items() if order.index(k) <= order.index(upto)}
    if upto == "batch_size_sweep":
        kept["batch_invariant"] = sub_y + sub_grad == 0
    return kept


def _acc(fwd_us: float, fwd_bwd_us: float, add_us: float, cr: float = 0.999986) -> dict[str, Any]:
    """Timings and the ratios the kit writes: each over this backend's own same-run add."""
    return {
        "rows": 63,
        "fwd_correctly_rounded": cr,
        "fwd_max_abs_err": 0.03,
        "fwd_us": fwd_us,
        "fwd_bwd_us": fwd_bwd_us,
        "roofline_add_us": add_us,
        "fwd_roofline_ratio": fwd_us / add_us,
        "fwd_bwd_roofline_ratio": fwd_bwd_us / (8 / 3 * add_us),
        "device": "cuda",
        "timed": True,
    }


def _gates(grad_failed: list[str] | None = None, grad_code: int = 0) -> dict[str, Any]:
    def gate(failed: list[str], code: int) -> dict[str, Any]:
        return {
            "returncode": code,
            "passed": not failed and code == 0,
            "failed_lines": failed,
            "singleton_aggregate": [],
            "stderr_tail": [],
            "timed_out": False,
            "lines": GATE_LINES + failed,
        }

    return {"forward": gate([], 0), "gradient": gate(grad_failed or [], grad_code)}


def _crash(cause: str, check: str, size: int, finished: list[str], *, signal: str | None = None) -> dict[str, Any]:
    return {
        "cause": cause,
        "signal": signal,
        "exit_code": None,
        "timed_out": cause.startswith("timed out"),
        "check": check,
        "batch_size": size,
        "rebuild": None,
        "finished_checks": finished,
        "seconds": 3.5,
        "stderr_tail": "planted",
    }


def crashed_artifact() -> dict[str, Any]:
    """A clean backend, one that fails a sub-batch check, one killed by SIGSEGV in full_vs_sub_batches, one timed out
    in batch_size_sweep after a failing full_vs_sub_batches, one skipped, and one whose gate child aborted."""

    def entry(status: str = "ran", **kw: Any) -> dict[str, Any]:
        base = {
            "source": "planted",
            "backward": "full",
            "status": status,
            "skip_reason": None,
            "batch_invariance": None,
            "accuracy_latency": None,
            "contract_gates": None,
            "errors": {},
        }
        return {**base, **kw}

    results = {
        "rlnorm": entry(batch_invariance=_bi(), accuracy_latency=_acc(52.0, 153.0, 49.6, 1.0), contract_gates=_gates()),
        "fla_fused_norm_gate": entry(
            batch_invariance=_bi(736, 3128),
            accuracy_latency=_acc(52.0, 158.0, 49.8),
            contract_gates=_gates(GRAD_FAILED),
        ),
        SEGV: entry(
            "crashed",
            skip_reason="killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 64 rows",
            batch_invariance=_bi(upto="dweight_repeatable"),
            crash=_crash(
                "killed by SIGSEGV (signal 11)",
                "full_vs_sub_batches",
                64,
                ["all_rows", "dweight_repeatable"],
                signal="SIGSEGV",
            ),
        ),
        HANG: entry(
            "timed_out",
            skip_reason="timed out after 20 s in batch_size_sweep at a batch of 9 rows",
            batch_invariance=_bi(3, 0, upto="full_vs_sub_batches"),
            crash=_crash(
                "timed out after 20 s", "batch_size_sweep", 9, ["all_rows", "dweight_repeatable", "full_vs_sub_batches"]
            ),
        ),
        "vllm": entry("skipped", skip_reason="vllm is not installed", backward="none"),
        "transformers": entry(
            batch_invariance=_bi(), accuracy_latency=_acc(815.0, 2427.0, 49.6, 0.6537), contract_gates=_gates([], -6)
        ),
    }
    ran = ["rlnorm", "fla_fused_norm_gate", "transformers"]
    agreement = {
        "tensor": "y",
        "rows": 15,
        "seed": 11,
        "backends": ran,
        "equal_fraction": [[1.0, 0.99997, 0.6573], [0.99997, 1.0, 0.6573], [0.6573, 0.6573, 1.0]],
    }
    env = {"gpu": "NVIDIA H200", "capability": [9, 0], "cuda": "12.8", "libraries": dict.fromkeys(REPORT_LIBRARIES)}
    return build_artifact(
        {"name": "planted"}, env, results, agreement, "records.csv", {}, True, ["all_rows"], COMMIT, False
    )


def _grid(fig: Figure) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], tuple], list[str]]:
    """(backend, column) -> the cell's text and its colour; and the status column's notes."""
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    cols = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()][:8]
    im = ax.images[0]
    arr = np.asarray(im.get_array())
    texts, colours, notes = {}, {}, []
    for t in ax.texts:
        x, y = t.get_position()
        if float(x).is_integer() and int(x) < len(cols):
            texts[(rows[int(y)], cols[int(x)])] = t.get_text()
        else:
            notes.append(t.get_text().replace("\n", " "))
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            colours[(r, c)] = tuple(np.round(im.cmap(im.norm(arr[i, j])), 3))
    return texts, colours, notes


def _colour(state: str) -> tuple:
    return tuple(np.round(mcolors.to_rgba(STATE_COLORS[state]), 3))


def test_verdict_figure_colours_each_state_and_a_crash_as_a_crash(tmp_path: Path) -> None:
    art = crashed_artifact()
    fig = plots.plot_verdict(art, tmp_path)
    assert (tmp_path / "verdict.png").read_bytes()[:4] == b"\x89PNG"
    assert plots.run_label(art) in fig.get_suptitle() and COMMIT[:7] in fig.get_suptitle()
    texts, colours, notes = _grid(fig)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "backend" and ax.get_xlabel().startswith("check")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(STATE_COLORS)
    # the checks the crashed backend finished are what they are; where it died, and after, it is crashed
    assert colours[(SEGV, "all_rows")] == _colour("passed") and texts[(SEGV, "all_rows")] == "0 differ\nof 7"
    assert colours[(SEGV, "dweight_repeatable")] == _colour("passed")
    assert texts[(SEGV, "full_vs_sub_batches")] == "crashed here:\nSIGSEGV\nat 64 rows"
    for col in ("full_vs_sub_batches", "batch_size_sweep", "forward gate", "gradient gate", "correctly rounded"):
        assert colours[(SEGV, col)] == _colour("crashed"), col
    assert colours[(SEGV, "batch_invariant")] == _colour("crashed")  # never passed, never not run
    assert not any(colours[(SEGV, c)] == _colour("not run") for c in [k[1] for k in colours if k[0] == SEGV])
    segv_note = next(n for n in notes if "SIGSEGV" in n)
    assert "crashed: killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 64 rows" in segv_note
    assert "finished: all_rows, dweight_repeatable" in segv_note
    # timed out after a check that found differences: that check failed, the verdict is failed, the rest timed out
    assert colours[(HANG, "full_vs_sub_batches")] == _colour("failed")
    assert texts[(HANG, "full_vs_sub_batches")] == "3 y / 0 dx,dz\nof 30"
    assert colours[(HANG, "batch_size_sweep")] == _colour("timed out")
    assert texts[(HANG, "batch_size_sweep")] == "timed out here:\nafter 20 s\nat 9 rows"
    assert colours[(HANG, "batch_invariant")] == _colour("failed")
    assert any("timed out: timed out after 20 s in batch_size_sweep at a batch of 9 rows" in n for n in notes)
    # the others: counts in the failing cell, the gate child's crash, a skip
    assert texts[("fla_fused_norm_gate", "full_vs_sub_batches")] == "736 y / 3,128 dx,dz\nof 30"
    assert colours[("fla_fused_norm_gate", "gradient gate")] == _colour("failed")
    assert texts[("fla_fused_norm_gate", "gradient gate")] == "3 of 10\nlines failed"
    assert colours[("rlnorm", "correctly rounded")] == _colour("passed")
    assert colours[("fla_fused_norm_gate", "correctly rounded")] == _colour("failed")
    assert texts[("transformers", "gradient gate")] == "gate child\nkilled by SIGABRT\n(signal 6)"
    assert colours[("transformers", "gradient gate")] == _colour("crashed")
    assert all(colours[("vllm", c)] == _colour("not run") for c in [k[1] for k in colours if k[0] == "vllm"])
    assert any(n.startswith("skipped: vllm is not installed") for n in notes)
    assert colours[("rlnorm", "batch_invariant")] == _colour("passed")


def test_every_figure_shows_the_crash_with_its_cause_and_where(tmp_path: Path) -> None:
    art = crashed_artifact()
    seed = read_artifact(seed_report_path())
    brief = "crashed in full_vs_sub_batches at 64 rows (SIGSEGV)"
    full = "crashed: killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 64 rows"
    figs = {
        "differing_rows": plots.plot_differing_rows(None, art),
        "error_distributions": plots.plot_error_distributions(art),
        "latency": plots.plot_latency(art),
        "agreement": plots.plot_agreement(art),
        "vs_reference_report": plots.plot_vs_reference_report(art, seed),
    }
    said = {name: " ".join(figure_texts(fig).split()) for name, fig in figs.items()}
    assert full in said["differing_rows"] and full in said["error_distributions"]
    assert brief in said["latency"] and f"{SEGV} ({brief})" in said["agreement"]
    assert f"{SEGV} ({brief})" in said["vs_reference_report"]
    for name, text in said.items():  # never drawn as a backend that did not run
        assert "no data (crashed:" not in text and f"{SEGV} (skipped" not in text, name
    # vs_reference_report: what it finished stands, what it did not reach reads crashed
    ax = next(a for a in figs["vs_reference_report"].axes if any("|" in t.get_text() for t in a.texts))
    cols = [t.get_text() for t in ax.get_xticklabels()]
    row = [t.get_text().split("\n")[0] for t in ax.get_yticklabels()].index(SEGV)
    cells = {cols[round(t.get_position()[0])]: t.get_text() for t in ax.texts if round(t.get_position()[1]) == row}
    assert cells["all_rows\ny"].startswith("0  |") and cells["dweight_repeatable"].startswith("yes  |")
    assert cells["full_vs_sub_batches\ny"].startswith("crashed  |") and cells["gates passed"].startswith("crashed")


def test_verdict_lines_lead_with_the_answer_per_backend() -> None:
    art = crashed_artifact()
    text = tables.verdict_markdown(art)
    lines = text.split("\n")
    assert [ln.split("**")[1] for ln in lines] == list(art["results"])
    line = dict(zip(art["results"], lines, strict=True))
    assert line["rlnorm"].startswith(
        "- **rlnorm**: batch invariant (0 of 49 row comparisons differ; dweight repeatable)"
    )
    forward_only = copy.deepcopy(art)
    forward_only["results"]["rlnorm"]["batch_invariance"]["dweight_repeatable"] = None
    forward_only["results"]["rlnorm"]["backward"] = "none"
    assert "differ; no dweight: forward only)" in tables.verdict_markdown(forward_only).split("\n")[0]
    assert "correctly rounded 1.0 (every output)" in line["rlnorm"]
    assert "forward 52.0 us = 1.05x the torch.add timed beside it" in line["rlnorm"]  # 52.0 / 49.6
    fused = line["fla_fused_norm_gate"]
    assert "**not** batch invariant (full_vs_sub_batches: y differs in 736 and dx or dz in 3,128 of 30 row" in fused
    failed = "gradient gate **failed**: its own fp32 dweight is not the exact sum of single-row dweights (2 lines)"
    assert failed in fused
    assert "it moves with row order or padding (1 lines)" in fused and "correctly rounded 0.999986" in fused
    assert "gradient gate passed (dx, dz across batch arrangements; its own dweight against the exact" in line["rlnorm"]
    segv = line[SEGV]
    assert segv.startswith(
        f"- **{SEGV}**: **crashed** (killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 64 rows);"
        " finished before it: all_rows, dweight_repeatable"
    )
    assert "no batch-invariance verdict (it crashed before its checks ended" in segv and "batch invariant (" not in segv
    hang = line[HANG]
    assert "**timed out** (timed out after 20 s in batch_size_sweep at a batch of 9 rows)" in hang
    assert "**not** batch invariant (full_vs_sub_batches: y differs in 3 and dx or dz in 0 of 30" in hang
    assert line["vllm"] == "- **vllm**: skipped: vllm is not installed"
    assert "gradient gate **crashed** (gate child killed by SIGABRT (signal 6))" in line["transformers"]
    # the same lines from the kit's Run, and from a loaded artifact dict
    run = Run(params=RunParams(), device="cuda", results=art["results"])
    assert tables.verdict_markdown(run) == text == tables.verdict_markdown(load_artifact(art))


def test_latency_plot_prints_the_tables_ratio_for_each_backend() -> None:
    """Each backend over the add timed beside it: 1.05x and 1.04x here, where a median add would say otherwise."""
    art = crashed_artifact()
    acc = art["results"]["fla_fused_norm_gate"]["accuracy_latency"]
    acc.update(fwd_us=51.9, roofline_add_us=49.9, fwd_roofline_ratio=51.9 / 49.9)
    art["results"]["rlnorm"]["accuracy_latency"]["fwd_roofline_ratio"] = None  # an artifact without the field
    table = tables.accuracy_table(Run(params=RunParams(), device="cuda", results=art["results"]))
    fig = plots.plot_latency(art)
    for ax, column in zip(fig.axes[:2], ("fwd / its add", "fwd+bwd / its add (8/3)"), strict=True):
        rows = [t.get_text() for t in ax.get_yticklabels()]
        shown = {}
        for t in ax.texts:
            m = re.search(r"\((\S+x) its add\)", t.get_text())
            if m:
                shown[rows[round(t.get_position()[1])]] = m.group(1)
        assert shown == {k: table.loc[k, column] for k in table.index}, (column, shown)
        # each backend's own add is drawn on its own row
        adds = {round(line.get_ydata()[0] + 0.42): line.get_xdata()[0] for line in ax.get_lines() if line.get_label()}
        for k in table.index:
            add = art["results"][k]["accuracy_latency"]["roofline_add_us"] * (1 if "bwd" not in column else 8 / 3)
            assert adds[rows.index(k)] == pytest.approx(add)
    assert table.loc["rlnorm", "fwd / its add"] == "1.05x"
    assert table.loc["fla_fused_norm_gate", "fwd / its add"] == "1.04x"
    median_add = float(np.median([49.6, 49.9, 49.6]))
    assert f"{51.9 / median_add:.2f}x" != table.loc["fla_fused_norm_gate", "fwd / its add"]  # the test can tell


def test_agreement_colour_bar_and_numbers_both_read_as_the_fraction_that_agrees() -> None:
    fig = plots.plot_agreement(crashed_artifact())
    ax, cbar_ax = fig.axes[0], fig.axes[1]
    im = ax.images[0]
    arr = np.ma.filled(np.ma.asarray(im.get_array()), np.nan)
    keys = [t.get_text() for t in ax.get_yticklabels()]
    compared = 0
    for t in ax.texts:
        j, i = (round(v) for v in t.get_position())
        if "bitwise" in t.get_text():
            assert np.isnan(arr[i, j])  # exactly 1: drawn green apart from the scale
            continue
        assert arr[i, j] == pytest.approx(float(t.get_text()), abs=1e-4), (keys[i], keys[j])  # one quantity
        compared += 1
    assert compared == 6
    assert "bitwise equal" in cbar_ax.get_ylabel() and "differ" not in cbar_ax.get_ylabel()
    ticks = [float(t.get_text()) for t in cbar_ax.get_yticklabels()]
    assert all(0.0 <= t <= 1.0 for t in ticks) and 0.99999 in ticks
    positions = list(cbar_ax.get_yticks())
    assert positions == sorted(positions) and ticks == sorted(ticks)  # higher on the bar: more agreement
    # less agreement takes the colour from the bar's bottom, as its tick says
    assert im.norm(0.6573) < im.norm(0.99997) < im.norm(0.999999)


@pytest.mark.slow
def test_a_real_crash_shows_as_crashed_in_the_headline(tmp_path: Path) -> None:
    """SegfaultPastRows through the kit's own process isolation: it finishes all_rows and dweight_repeatable
    (7 rows) and dies on full_vs_sub_batches' 64-row batch."""
    params = load_params(
        {
            "name": "crash",
            "device": "cpu",
            "progress": False,
            "backends": [],
            "custom_backends": [SEGV],
            "checks": ["all_rows", "dweight_repeatable", "full_vs_sub_batches", "batch_size_sweep"],
            **TINY_SIZES,
            "sub_batches_rows": 64,
            "output_dir": str(tmp_path / "run"),
        }
    )
    out = isolation.run_backend(SEGV, params.as_dict(), "cpu", 120.0)
    env = {"gpu": "cpu", "capability": None, "cuda": None, "libraries": dict.fromkeys(REPORT_LIBRARIES)}
    art = build_artifact({"name": "crash"}, env, {SEGV: out.result}, None, None, None, True, [], None, False)
    texts, colours, notes = _grid(plots.plot_verdict(art))
    assert art["results"][SEGV]["status"] == "crashed"
    assert colours[(SEGV, "all_rows")] == _colour("passed")
    assert colours[(SEGV, "dweight_repeatable")] == _colour("passed")
    assert texts[(SEGV, "full_vs_sub_batches")] == "crashed here:\nSIGSEGV\nat 64 rows"
    assert colours[(SEGV, "batch_invariant")] == _colour("crashed")
    assert "killed by SIGSEGV (signal 11) in full_vs_sub_batches at a batch of 64 rows" in " ".join(notes)
