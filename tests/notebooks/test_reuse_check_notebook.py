"""notebooks/reuse_check.py executed end to end by papermill (through the CLI: conftest's `tiny_run`) on tiny
parameters: the artifact is schema-valid, every backend is present with its status, each planted fault is caught,
and the plots exist both as PNG files and inline in the notebook and its HTML."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import nbformat
import pytest
from conftest import BATCH_FAULT, DWEIGHT_FAULT, POSITION_FAULT, SEGFAULT, UNLOADABLE

from rlnorm.cli.notebook import execute
from rlnorm.kit.artifact import load_artifact, read_records
from rlnorm.kit.results import to_json
from rlnorm.report.plots import PLOT_NAMES

pytestmark = pytest.mark.slow

FAULTS = {BATCH_FAULT, POSITION_FAULT, DWEIGHT_FAULT}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _outputs(executed: Path) -> list:
    nb = nbformat.read(executed, as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_run_folder_holds_every_file_and_the_notebook_ran_without_errors(tiny_run: Path) -> None:
    errors = [f"{o.ename}: {o.evalue}" for o in _outputs(tiny_run / "reuse_check.ipynb") if o.output_type == "error"]
    # what the page shows is displayed on purpose: no cell leaks the repr of a value it returned
    assert [o for o in _outputs(tiny_run / "reuse_check.ipynb") if o.output_type == "execute_result"] == []
    assert errors == []
    names = {str(p.relative_to(tiny_run)) for p in tiny_run.rglob("*") if p.is_file()}
    assert {"reuse_check.ipynb", "reuse_check.html", "rms_norm_gated_reuse_check.json", "records.csv"} <= names
    assert {f"plots/{p}.png" for p in PLOT_NAMES} <= names
    assert not [n for n in names if n.endswith(".tmp") or n.startswith(".")], "no temp files left"


def test_artifact_is_schema_valid_with_every_backend_and_its_status(tiny_run: Path) -> None:
    art = to_json(load_artifact(tiny_run / "rms_norm_gated_reuse_check.json"))  # validated against the schema
    assert art["quick"] is True and art["params"]["name"] == "tiny" and art["param_set"] == "tiny"
    assert art["environment"]["gpu"] == "cpu" and art["environment"]["libraries"]["torch"]
    results = art["results"]
    assert set(results) == {"reference", UNLOADABLE, SEGFAULT, *FAULTS}
    for key, r in results.items():
        assert r["status"] in ("ran", "skipped", "failed", "crashed", "timed_out"), key
        if r["status"] != "ran":
            assert r["skip_reason"], f"{key} was not run and says why"
    assert results[UNLOADABLE]["status"] == "failed" and "no_such_package" in results[UNLOADABLE]["skip_reason"]
    assert results[SEGFAULT]["status"] == "crashed" and results[SEGFAULT]["crash"]["signal"] == "SIGSEGV"

    ref = results["reference"]
    assert ref["status"] == "ran" and not ref["errors"]
    bi = ref["batch_invariance"]
    assert bi["batch_invariant"] is True and bi["dweight_repeatable"] is True
    assert bi["all_rows"]["7"] == {**bi["all_rows"]["7"], "rows": 7, "fwd_differ": 0, "rowgrad_differ": 0}
    assert ref["accuracy_latency"]["rows"] == 63
    gates = ref["contract_gates"]
    assert gates["forward"]["passed"] is True and gates["forward"]["returncode"] == 0
    # the reference's own dweight is a float sum (order dependent): the gate may fail it, but it ran
    assert gates["gradient"]["returncode"] == 0 and gates["gradient"]["singleton_aggregate"]

    for fault in FAULTS:  # each planted fault is caught
        assert results[fault]["status"] == "ran" and results[fault]["batch_invariance"]["batch_invariant"] is False

    agreement = art["agreement"]
    ran = [k for k, r in results.items() if r["status"] == "ran"]
    assert agreement["backends"] == ran
    assert agreement["equal_fraction"][0][0] == 1.0

    assert art["records"] == "records.csv"
    assert sorted(art["plots"]) == sorted(PLOT_NAMES) and all((tiny_run / p).is_file() for p in art["plots"].values())


def test_records_name_the_faults_rows(tiny_run: Path) -> None:
    df = read_records(tiny_run / "records.csv")
    assert not df.empty and set(df["backend"]) == FAULTS, "only the planted faults have differing rows"
    assert {"all_rows", "full_vs_sub_batches", "batch_size_sweep"} & set(df["check"])
    assert all(json.loads(s) for s in df["rebuild"])


def test_plots_are_pngs_and_inline(tiny_run: Path) -> None:
    for name in PLOT_NAMES:
        data = (tiny_run / "plots" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, name
    inline = [o for o in _outputs(tiny_run / "reuse_check.ipynb") if "image/png" in o.get("data", {})]
    assert len(inline) == len(PLOT_NAMES), "each plot once: the headline figure at the top, the others below"
    assert base64.b64decode(inline[0]["data"]["image/png"]).startswith(PNG_MAGIC)


def test_html_reads_without_code_and_leads_with_its_verdict(tiny_run: Path) -> None:
    html = (tiny_run / "reuse_check.html").read_text()
    assert "steps.run_backends" not in html and "params_from_namespace" not in html
    assert html.count("data:image/png;base64") >= len(PLOT_NAMES)
    art = to_json(load_artifact(tiny_run / "rms_norm_gated_reuse_check.json"))
    body = html[html.index("<body") :]
    verdict = body.index(">Verdict<")
    first_png = body.index("data:image/png;base64")
    params = body.index("Parameters, environment and time")
    backend_line = body.index(BATCH_FAULT, verdict)
    # the first screen: the verdict heading, the run's identity, a line per backend, the headline figure; the
    # evidence and the parameters after
    assert verdict < backend_line < first_png < body.index("Backends, each in a process of its own") < params
    assert body.index(art["created_at"]) < first_png, "the run's identity is on the first screen"
    assert "appears here when the run has finished" not in body, "every placeholder was filled"


def test_the_notebook_itself_refuses_unknown_parameters(outputs_dir: Path) -> None:
    """Under plain papermill nothing validates before the kernel: the notebook's own cell must."""
    executed, failure = execute(
        "reuse_check", {"name": "bad", "device": "cpu", "bogus_param": 1, "sweep_n": "9"}, outputs_dir, title="bad",
        progress=False,
    )  # fmt: skip
    assert failure is not None and "'Start the run' failed: ParamsError" in failure
    assert "bogus_param: unknown parameter" in failure and "sweep_n: expected an int" in failure
    assert executed.exists()
