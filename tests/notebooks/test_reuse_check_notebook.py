"""notebooks/reuse_check.py executed end to end by papermill (through the CLI) on tiny parameters:
the artifact is schema-valid, every backend is present with its status, a planted fault is caught,
and the plots exist both as PNG files and inline in the notebook and its HTML."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import nbformat
import pytest
import yaml
from conftest import TINY_SIZES

from rlnorm import cli
from rlnorm.cli.runs import EXIT_BACKEND
from rlnorm.kit.artifact import load_artifact
from rlnorm.kit.params import load_params
from rlnorm.kit.results import to_json

pytestmark = pytest.mark.slow

FAULT = "tests.faults:BatchSizeDependentOutput"
PLOTS = ["agreement", "differing_rows", "error_distributions", "latency", "verdict", "vs_reference_report"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_artifact(path: Path) -> dict:
    """The artifact as its JSON, validated against the schema as it is read."""
    return to_json(load_artifact(path))


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CLI run shared by the assertions below (a notebook run costs tens of seconds on a CPU)."""
    tmp = tmp_path_factory.mktemp("e2e")
    params = {
        "name": "tiny",
        "device": "cpu",
        "progress": False,
        "backends": ["reference"],  # the kit's own tests run every backend: here, one that runs and two faults
        "custom_backends": [FAULT, "no_such_package.anywhere:fn"],
        **TINY_SIZES,
    }
    f = tmp / "tiny.yaml"
    f.write_text(yaml.safe_dump(params))
    load_params(f)  # the fixture itself is valid
    rc = cli.main(["run", str(f), "--outputs", str(tmp / "outputs")])
    run_dir = tmp / "outputs" / "tiny"
    # 4: complete, but a custom backend could not be loaded (a script must hear about it)
    assert rc == EXIT_BACKEND, (run_dir / "reuse_check.ipynb").exists() and _errors(run_dir / "reuse_check.ipynb")
    return run_dir


def _errors(executed: Path) -> list[str]:
    nb = nbformat.read(executed, as_version=4)
    return [
        f"{o.ename}: {o.evalue}"
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]


def test_run_folder_holds_every_file_and_the_notebook_ran_without_errors(cli_run: Path) -> None:
    assert _errors(cli_run / "reuse_check.ipynb") == []
    names = {str(p.relative_to(cli_run)) for p in cli_run.rglob("*") if p.is_file()}
    assert {"reuse_check.ipynb", "reuse_check.html", "rms_norm_gated_reuse_check.json", "records.csv"} <= names
    assert {f"plots/{p}.png" for p in PLOTS} <= names
    assert not [n for n in names if n.endswith(".tmp") or n.startswith(".")], "no temp files left"


def test_artifact_is_schema_valid_with_every_backend_and_its_status(cli_run: Path) -> None:
    art = read_artifact(cli_run / "rms_norm_gated_reuse_check.json")  # validates against the schema
    assert art["quick"] is True and art["params"]["name"] == "tiny" and art["param_set"] == "tiny"
    assert art["environment"]["gpu"] == "cpu" and art["environment"]["libraries"]["torch"]
    results = art["results"]
    assert set(results) == {"reference", FAULT, "no_such_package.anywhere:fn"}
    for key, r in results.items():
        assert r["status"] in ("ran", "skipped", "failed", "crashed", "timed_out"), key
        if r["status"] != "ran":
            assert r["skip_reason"], f"{key} was not run and says why"
    assert results["no_such_package.anywhere:fn"]["status"] == "failed"
    assert "no_such_package" in results["no_such_package.anywhere:fn"]["skip_reason"]

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

    fault = results[FAULT]
    assert fault["status"] == "ran"
    assert fault["batch_invariance"]["batch_invariant"] is False, "the planted batch-size fault is caught"

    agreement = art["agreement"]
    ran = [k for k, r in results.items() if r["status"] == "ran"]
    assert agreement["backends"] == ran
    assert agreement["equal_fraction"][0][0] == 1.0

    assert art["records"] == "records.csv"
    assert sorted(art["plots"]) == PLOTS and all((cli_run / p).is_file() for p in art["plots"].values())


def test_records_name_the_faults_rows(cli_run: Path) -> None:
    from rlnorm.kit.records import read_records

    df = read_records(cli_run / "records.csv")
    assert not df.empty and set(df["backend"]) == {FAULT}, "only the planted fault has differing rows"
    assert {"all_rows", "full_vs_sub_batches", "batch_size_sweep"} & set(df["check"])
    assert all(json.loads(s) for s in df["rebuild"])


def test_plots_are_pngs_and_inline(cli_run: Path) -> None:
    for name in PLOTS:
        data = (cli_run / "plots" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, name
    nb = nbformat.read(cli_run / "reuse_check.ipynb", as_version=4)
    inline = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(inline) == len(PLOTS), "each plot once: the headline figure at the top, the others below"
    assert base64.b64decode(inline[0]["data"]["image/png"]).startswith(PNG_MAGIC)


def test_html_reads_without_code_and_leads_with_its_verdict(cli_run: Path) -> None:
    html = (cli_run / "reuse_check.html").read_text()
    assert "steps.run_backends" not in html and "params_from_namespace" not in html
    assert html.count("data:image/png;base64") >= len(PLOTS)
    art = read_artifact(cli_run / "rms_norm_gated_reuse_check.json")
    body = html[html.index("<body") :]
    verdict = body.index(">Verdict<")
    first_png = body.index("data:image/png;base64")
    params = body.index("Parameters, environment and time")
    backend_line = body.index(FAULT, verdict)
    # the first screen: the verdict heading, the run's identity, a line per backend, the headline figure; the
    # evidence and the parameters after
    assert verdict < backend_line < first_png < body.index("Backends, each in a process of its own") < params
    assert body.index(art["created_at"]) < first_png, "the run's identity is on the first screen"
    assert "appears here when the run has finished" not in body, "every placeholder was filled"
    assert "Reading the gradient gate" in body


def test_the_notebook_itself_refuses_unknown_parameters(outputs_dir: Path) -> None:
    """Under plain papermill nothing validates before the kernel: the notebook's own cell must."""
    from rlnorm.cli.notebook import execute

    executed, failure = execute(
        "reuse_check", {"name": "bad", "device": "cpu", "bogus_param": 1, "sweep_n": "9"}, outputs_dir, title="bad",
        progress=False,
    )  # fmt: skip
    assert failure is not None and "'Start the run' failed: ParamsError" in failure
    assert "bogus_param: unknown parameter" in failure and "sweep_n: expected an int" in failure
    assert executed.exists()
