"""Every figure draws from a small synthetic artifact, from the seed report, and from the all-clean and
all-skipped extremes; each returns a Figure whose texts say what it shows and writes a non-empty PNG."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import figure_texts
from matplotlib.figure import Figure

from rlnorm.checkout import seed_report_path
from rlnorm.kit.artifact import build_artifact, read_artifact
from rlnorm.kit.environment import REPORT_LIBRARIES
from rlnorm.report import plots

SEED = seed_report_path()
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LIBS = dict.fromkeys(REPORT_LIBRARIES)


def _accuracy(
    cr: float, fwd_us: float | None, fwd_bwd_us: float | None, roof: float | None, rng: np.random.Generator
) -> dict[str, Any]:
    rows = 4097
    total = rows * 128
    off = round(total * (1 - cr))
    ulp = {str(i): 0 for i in range(16)} | {"16+": 0, "nan": 0}
    ulp["0"] = total - off
    ulp["1"] = off
    edges = list(np.logspace(-8, 0, 17))
    counts = rng.multinomial(total - total // 3, np.ones(16) / 16).tolist()
    acc: dict[str, Any] = {
        "rows": rows,
        "fwd_correctly_rounded": cr,
        "fwd_max_abs_err": 0.031,
        "fwd_us": fwd_us,
        "grad_rel_err": {"x": 0.002, "z": 0.002, "w": 0.002} if fwd_bwd_us is not None else None,
        "fwd_bwd_us": fwd_bwd_us,
        "fwd_us_p20": None if fwd_us is None else fwd_us * 0.97,
        "fwd_us_p80": None if fwd_us is None else fwd_us * 1.05,
        "roofline_add_us": roof,
        "fwd_ulp_hist": ulp,
        "fwd_abs_err_hist": {"edges": edges, "counts": counts, "zero": total // 3},
        "device": "cuda",
        "timed": fwd_us is not None,
    }
    return acc


def _bi(fwd_differ: int = 0, sub_differ: int = 0, backward: bool = True) -> dict[str, Any]:
    return {
        "all_rows": {
            "64": {"rows": 192, "fwd_differ": 0, "rowgrad_differ": 0},
            "4097": {"rows": 12291, "fwd_differ": fwd_differ, "rowgrad_differ": 0},
        },
        "dweight_repeatable": True if backward else None,
        "full_vs_sub_batches": {
            "full_batch": 262144,
            "sub_batch_sizes": [1, 7, 4097],
            "sub_batches": 262144 * 3,
            "fwd_differ": sub_differ,
            "rowgrad_differ": sub_differ * 2 if backward else 0,
        },
        "batch_size_sweep": {"batch_sizes": [1, 2, 3], "probe_rows": [0, 515], "comparisons": 18, "differ": 0},
        "batch_invariant": fwd_differ == 0 and sub_differ == 0,
    }


def synthetic(clean: bool = False, skipped: bool = False, timed: bool = True) -> tuple[dict[str, Any], pd.DataFrame]:
    """A six-backend artifact: clean, fast-but-variant, forward-only, inaccurate, skipped, failed."""
    rng = np.random.default_rng(0)
    roof = 53.1 if timed else None

    def us(v: float) -> float | None:
        return v if timed else None

    results: dict[str, Any] = {
        "rlnorm": {
            "source": "rlnorm 0.1.0 Triton",
            "backward": "full",
            "status": "ran",
            "batch_invariance": _bi(),
            "accuracy_latency": _accuracy(1.0, us(56.0), us(150.0), roof, rng),
        },
        "fla_fused_norm_gate": {
            "source": "FLA 0.5.2 fused_norm_gate.rms_norm_gated",
            "backward": "full",
            "status": "ran",
            "batch_invariance": _bi(0, 0 if clean else 95),
            "accuracy_latency": _accuracy(0.99999, us(64.0), us(700.0), roof, rng),
        },
        "vllm": {
            "source": "vLLM 0.30.0 RMSNormGated.forward_cuda",
            "backward": "none",
            "status": "ran",
            "batch_invariance": _bi(0 if clean else 3, 0 if clean else 3, backward=False),
            "accuracy_latency": _accuracy(0.99999, us(58.6), None, roof, rng),
        },
        "transformers": {
            "source": "transformers 5.17.0 Qwen3NextRMSNormGated",
            "backward": "full",
            "status": "ran",
            "batch_invariance": _bi(),
            "accuracy_latency": _accuracy(0.655, us(825.0), us(2442.0), roof, rng),
        },
        "fla_layernorm_gated": {
            "source": "FLA 0.5.2 layernorm_gated.rmsnorm_fn",
            "backward": "full",
            "status": "skipped",
            "skip_reason": "fla-core is not installed",
        },
        "torch_compile": {
            "source": "torch.compile(reference)",
            "backward": "full",
            "status": "failed",
            "skip_reason": "accuracy_latency raised RuntimeError: inductor crashed",
            "errors": {"accuracy_latency": "RuntimeError: inductor crashed"},
        },
    }
    if skipped:
        for entry in results.values():
            entry.update(status="skipped", skip_reason="no GPU here", batch_invariance=None, accuracy_latency=None)
    keys = [k for k, e in results.items() if e["status"] == "ran"]  # the runner's matrix: backends that ran
    k = len(keys)
    frac = np.ones((k, k))
    for i in range(k):
        for j in range(k):
            if i != j and "transformers" in (keys[i], keys[j]):
                frac[i, j] = 0.655
            elif i != j and "vllm" in (keys[i], keys[j]) and "rlnorm" in (keys[i], keys[j]):
                frac[i, j] = 0.999987
    agreement = {"tensor": "y", "rows": 4097, "seed": 11, "backends": keys, "equal_fraction": frac.tolist()}
    env = {
        "gpu": "NVIDIA H200" if timed else "cpu",
        "capability": [9, 0] if timed else None,
        "cuda": "12.8" if timed else None,
        "libraries": LIBS,
    }
    doc = build_artifact(
        {"param_set": "full", "coverage": "every_row"},
        env,
        results,
        None if skipped else agreement,
        "records.csv",
        {},
        False,
        ["all_rows", "full_vs_sub_batches", "batch_size_sweep", "accuracy_latency"],
        COMMIT,
        False,
    )
    recs = []
    if not clean and not skipped:
        for r in rng.choice(262144, 95, replace=False):
            recs.append(("fla_fused_norm_gate", "full_vs_sub_batches", 3, "sub=4097", int(r), "y"))
            recs.append(("fla_fused_norm_gate", "full_vs_sub_batches", 3, "sub=4097", int(r), "dx"))
            recs.append(("fla_fused_norm_gate", "full_vs_sub_batches", 3, "sub=4097", int(r), "dz"))
        for r in (17, 2048, 4000):
            recs.append(("vllm", "all_rows", 4, "n=4097", r, "y"))
            recs.append(("vllm", "full_vs_sub_batches", 4, "sub=7", r * 50, "y"))
    df = pd.DataFrame(recs, columns=["backend", "check", "seed", "case", "row", "tensor"])
    return doc, df


def _flat(fig: Figure) -> str:
    """The figure's texts with line wrapping undone."""
    return " ".join(figure_texts(fig).split())


def _png_ok(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, (path, len(data))


@pytest.fixture(scope="module")
def seed_report() -> dict[str, Any]:
    return read_artifact(SEED)


def test_title_carries_gpu_commit_and_param_set(tmp_path: Path) -> None:
    doc, _ = synthetic()
    fig = plots.plot_latency(doc, tmp_path)
    title = fig.get_suptitle()
    assert "NVIDIA H200" in title and COMMIT[:7] in title and "params full" in title
    _png_ok(tmp_path / "latency.png")


def test_differing_rows_shows_rows_counts_and_clean_and_missing_panels(tmp_path: Path) -> None:
    doc, df = synthetic()
    fig = plots.plot_differing_rows(df, doc, tmp_path)
    text = figure_texts(fig)
    # the lane label is the artifact's count of row comparisons (95 y, 190 dx or dz), not the records' rows
    assert "full_vs_sub_batches\nrow in a sub-batch vs the full batch\n95 y / 190 dx,dz" in text
    assert "all_rows\nrow in its batch vs the row alone\n3 y of 12,483 row comparisons" in text  # forward only
    assert "all 285 records kept" in text  # 95 row comparisons x (y, dx, dz): one record each
    flat = " ".join(text.split())
    assert "nothing differs in all_rows, dweight_repeatable, full_vs_sub_batches, batch_size_sweep" in flat
    assert "skipped: fla-core is not installed" in text
    assert "failed: accuracy_latency raised" in text
    assert "row index in the generated case (one point per kept record)" in text
    _png_ok(tmp_path / "differing_rows.png")
    # the scattered points are the recorded rows
    fla_ax = next(ax for ax in fig.axes if ax.get_title("left") == "fla_fused_norm_gate")
    xs = np.concatenate([c.get_offsets()[:, 0] for c in fla_ax.collections if len(c.get_offsets())])
    assert sorted(set(xs.astype(int))) == sorted(set(df[df.backend == "fla_fused_norm_gate"].row))
    assert len(xs) == (df.backend == "fla_fused_norm_gate").sum()  # one point per record


def test_differing_rows_all_clean_all_skipped_and_no_records(tmp_path: Path, seed_report: dict) -> None:
    doc, df = synthetic(clean=True)
    assert len(df) == 0
    text = figure_texts(plots.plot_differing_rows(df, doc, tmp_path / "clean"))
    assert text.count("nothing differs in all_rows") == 4
    doc, df = synthetic(skipped=True)
    text = figure_texts(plots.plot_differing_rows(df, doc, tmp_path / "skipped"))
    assert text.count("skipped: no GPU here") == 6
    text = " ".join(figure_texts(plots.plot_differing_rows(None, seed_report, tmp_path / "seed")).split())
    assert "per-row records not available" in text and "full_vs_sub_batches: 95 y / 152 dx,dz" in text
    for sub in ("clean", "skipped", "seed"):
        _png_ok(tmp_path / sub / "differing_rows.png")


def test_differing_rows_never_calls_clean_what_the_summary_counts(tmp_path: Path) -> None:
    """Records capped away or lost: the summary still counts differences, and the panel says so."""
    doc, df = synthetic()
    fig = plots.plot_differing_rows(df[df.backend != "vllm"], doc)
    vllm_ax = next(ax for ax in fig.axes if ax.get_title("left") == "vllm")
    lanes = [t.get_text() for t in vllm_ax.get_yticklabels()]
    assert lanes[0].endswith("3 y of 12,483 row comparisons") and lanes[1].endswith("3 y")
    assert [t.get_text() for t in vllm_ax.texts].count("no records kept for this check") == 2
    assert vllm_ax.get_title("right") == "0 records kept"
    doc["results"]["fla_fused_norm_gate"]["batch_invariance"]["full_vs_sub_batches"]["records_dropped"] = 40
    text = _flat(plots.plot_differing_rows(df, doc))
    assert "285 of 325 records kept (40 not kept: max_records)" in text
    for entry in doc["results"].values():
        if entry["status"] == "ran":
            entry["batch_invariance"] = None
    text = _flat(plots.plot_differing_rows(df.iloc[:0], doc))
    assert "no batch-invariance check ran" in text and "nothing differs" not in text


def test_differing_rows_shows_a_whole_batch_dweight_record(tmp_path: Path) -> None:
    doc, df = synthetic()
    extra = pd.DataFrame(
        [("fla_fused_norm_gate", "dweight_repeatable", 3, "repeat=1", None, "dweight")], columns=df.columns
    )
    fig = plots.plot_differing_rows(pd.concat([df, extra], ignore_index=True), doc, tmp_path)
    text = _flat(fig)
    assert "dweight_repeatable dweight of one batch, run vs run differs (1 record)" in text
    assert "dweight differs between two runs of one whole batch (1x)" in text
    _png_ok(tmp_path / "differing_rows.png")


def test_differing_rows_rejects_a_table_without_the_record_columns(seed_report: dict) -> None:
    with pytest.raises(ValueError, match="records_df"):
        plots.plot_differing_rows(pd.DataFrame({"row": [1]}), seed_report)


def test_error_distributions(tmp_path: Path, seed_report: dict) -> None:
    doc, _ = synthetic()
    fig = plots.plot_error_distributions(doc, tmp_path)
    text = figure_texts(fig)
    assert "ulp distance to the correctly rounded value" in text
    assert "|y - y_fp64| (absolute error, log scale)" in text
    assert "correctly rounded: 0.655000" in text
    assert "exact (error 0)" in text
    assert "skipped: fla-core is not installed" in text
    _png_ok(tmp_path / "error_distributions.png")
    # the seed report has no histograms: every panel says so
    text = figure_texts(plots.plot_error_distributions(seed_report, tmp_path / "seed"))
    assert text.count("no ulp histogram recorded") == 6
    _png_ok(tmp_path / "seed" / "error_distributions.png")
    doc, _ = synthetic(skipped=True)
    assert "no data (skipped" in figure_texts(plots.plot_error_distributions(doc))


def test_latency_marks_roofline_missing_backward_and_untimed(tmp_path: Path, seed_report: dict) -> None:
    doc, _ = synthetic()
    fig = plots.plot_latency(doc, tmp_path)
    text = figure_texts(fig)
    assert "torch.add timed beside each backend, same run (3 tensors)" in text
    assert "torch.add timed beside each backend, same run (8/3 x, 8 tensors)" in text
    assert "56.0 us  (1.05x its add)" in text  # 56.0 / 53.1: no ratio field here, so its parts
    assert "no backward" in text and "skipped" in text and "failed" in text
    assert "time per call (us" in text
    fwd_ax = fig.axes[0]
    assert fwd_ax.get_xscale() == "log"  # 53 us .. 825 us: a spread > 8x
    _png_ok(tmp_path / "latency.png")
    doc, _ = synthetic(timed=False)
    text = figure_texts(plots.plot_latency(doc, tmp_path / "cpu"))
    assert "no timings" in text and "not timed (cuda)" in text
    assert "CPU run: times say nothing about GPU speed" in text
    _png_ok(tmp_path / "cpu" / "latency.png")
    text = figure_texts(plots.plot_latency(seed_report, tmp_path / "seed"))
    assert "roofline not measured" in text and "115.3 ms" in text
    doc, _ = synthetic(skipped=True)
    assert "no timings: skipped" in figure_texts(plots.plot_latency(doc))


def test_latency_stars_a_time_taken_with_the_queue_dry(tmp_path: Path) -> None:
    """A time with host overhead in it carries * and the title says why; a clean run shows neither."""
    doc, _ = synthetic()
    clean = _flat(plots.plot_latency(doc))
    assert "*" not in clean and "queue ran dry" not in clean
    doc["results"]["fla_fused_norm_gate"]["accuracy_latency"]["host_bound"] = {"add": False, "fwd": True}
    text = _flat(plots.plot_latency(doc, tmp_path))
    assert "64.0 us*" in text and "56.0 us*" not in text and "700 us*" not in text
    assert "* the GPU queue ran dry while timing: host overhead included" in text
    assert "roofline may include host overhead" not in text
    doc["results"]["rlnorm"]["accuracy_latency"]["host_bound"] = {"add": True, "fwd": False, "fwd_bwd": False}
    assert "roofline may include host overhead" in _flat(plots.plot_latency(doc))
    _png_ok(tmp_path / "latency.png")


def test_agreement_matrix_annotates_every_pair(tmp_path: Path, seed_report: dict) -> None:
    doc, _ = synthetic()
    fig = plots.plot_agreement(doc, tmp_path)
    text = figure_texts(fig)
    assert "1\n(bitwise)" in text and "0.6550" in text and "0.999987" in text
    text = _flat(fig)
    assert "not in the matrix: fla_layernorm_gated (skipped), torch_compile (failed)" in text
    assert len(fig.axes[0].texts) == 16
    # a backend whose forward raised: its cells say n/a and the title says why
    doc["agreement"]["equal_fraction"][2] = [None] * 4
    doc["agreement"]["errors"] = {"vllm": "RuntimeError: no driver"}
    text = _flat(plots.plot_agreement(doc))
    assert text.count("n/a") >= 4 and "n/a: vllm: RuntimeError: no driver" in text
    _png_ok(tmp_path / "agreement.png")
    text = figure_texts(plots.plot_agreement(seed_report, tmp_path / "seed"))
    assert "no cross-backend agreement matrix" in text


def test_vs_reference_report(tmp_path: Path, seed_report: dict) -> None:
    doc, _ = synthetic()
    fig = plots.plot_vs_reference_report(doc, seed_report, tmp_path)
    text = figure_texts(fig)
    assert "NVIDIA B200" in text and "rl_kernel" in text and "rlnorm" in text
    assert "95  |  95" in text  # FLA fused sub-batch fwd: this run | report
    assert "gates passed" in text and "–  |  yes" in text  # transformers: no gates here, passed there
    assert "absent" in text
    assert "fraction NOT correctly rounded (log scale)" in text
    assert "0 (all correctly rounded)" in text  # rlnorm 1.0
    _png_ok(tmp_path / "vs_reference_report.png")
    # the report against itself: every shared measure present on both sides
    text = figure_texts(plots.plot_vs_reference_report(seed_report, seed_report))
    assert "absent" not in text


def test_plot_all_writes_every_png_and_survives_a_broken_plot(
    tmp_path: Path, seed_report: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, df = synthetic()
    paths = plots.plot_all(doc, df, tmp_path, seed_report=seed_report)
    assert set(paths) == set(plots.PLOT_NAMES)
    for p in paths.values():
        _png_ok(p)

    def broken(*args: Any, **kwargs: Any) -> Figure:
        raise RuntimeError("planted plot failure")

    monkeypatch.setattr(plots, "plot_agreement", broken)
    with pytest.warns(RuntimeWarning, match="agreement"):
        paths = plots.plot_all(doc, df, tmp_path / "broken")
    assert set(paths) == set(plots.PLOT_NAMES) - {"vs_reference_report"}
    for p in paths.values():
        _png_ok(p)


@pytest.mark.skipif("RLNORM_PLOT_DIR" not in os.environ, reason="set RLNORM_PLOT_DIR=folder to draw PNGs to look at")
def test_draws_into_a_folder_for_viewing(seed_report: dict) -> None:
    """Every figure for four artifacts (synthetic, seed report, clean CPU, all skipped), for a human to look at."""
    out = Path(os.environ["RLNORM_PLOT_DIR"])
    doc, df = synthetic()
    plots.plot_all(doc, df, out / "synthetic", seed_report=seed_report)
    plots.plot_all(seed_report, None, out / "seed", seed_report=seed_report)
    doc, df = synthetic(clean=True, timed=False)
    plots.plot_all(doc, df, out / "clean_cpu", seed_report=seed_report)
    doc, df = synthetic(skipped=True)
    plots.plot_all(doc, df, out / "skipped", seed_report=seed_report)


def test_checks_that_raised_are_shown_not_hidden() -> None:
    doc, _ = synthetic()
    acc = doc["results"]["transformers"]["accuracy_latency"]
    acc.update(fwd_ulp_hist=None, fwd_abs_err_hist=None, fwd_us=None, fwd_bwd_us=None, error="RuntimeError: OOM")
    doc["agreement"] = {"error": "ValueError: shapes differ"}
    doc["results"]["rlnorm"]["batch_invariance"]["all_rows"]["error"] = "RuntimeError: boom"
    _, df = synthetic()
    plots.plot_differing_rows(df, doc)
    plots.plot_differing_rows(None, doc)
    plots.plot_differing_rows(df.iloc[:0], doc)
    plots.plot_vs_reference_report(doc, doc)
    text = figure_texts(plots.plot_error_distributions(doc))
    assert "the check raised: RuntimeError: OOM" in text
    assert "check raised" in figure_texts(plots.plot_latency(doc))
    assert "agreement matrix failed: ValueError: shapes differ" in figure_texts(plots.plot_agreement(doc))


@pytest.mark.parametrize("case", ["clean", "skipped"])
@pytest.mark.parametrize("name", plots.PLOT_NAMES)
def test_every_plot_on_the_all_clean_and_all_skipped_runs(
    tmp_path: Path, seed_report: dict, case: str, name: str
) -> None:
    doc, df = synthetic(clean=case == "clean", skipped=case == "skipped")
    draw = {
        "verdict": lambda: plots.plot_verdict(doc, tmp_path),
        "differing_rows": lambda: plots.plot_differing_rows(df, doc, tmp_path),
        "error_distributions": lambda: plots.plot_error_distributions(doc, tmp_path),
        "latency": lambda: plots.plot_latency(doc, tmp_path),
        "agreement": lambda: plots.plot_agreement(doc, tmp_path),
        "vs_reference_report": lambda: plots.plot_vs_reference_report(doc, seed_report, tmp_path),
    }[name]
    fig = draw()
    assert plots.run_label(doc) in fig.get_suptitle()
    _png_ok(tmp_path / f"{name}.png")
    text = _flat(fig)
    if case == "skipped":
        assert "skipped" in text or "no cross-backend agreement matrix" in text
        assert "differing rows (" not in text  # nothing drawn as if measured
    else:
        assert "failed" in text  # the one failed backend stays visible in a clean run
