"""``salience dims`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from embeddings import DimensionPlan, DimensionPlanError
from embeddings.dims.cli import parse_budget
from experiments.cli import main
from tests.embeddings.dims.test_baselines import make_schema
from tests.selection.conftest import tiny_config

FILES = ("plan.json", "dims.png", "comparison.png", "summary.json", "config_with_plan.yaml")


def _config(tmp_cwd: Path) -> Path:
    path = tmp_cwd / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(n_rows=6000, epochs=1)))
    return path


def _child_runs(experiment: str, parent: str) -> list:  # noqa: ANN401
    from mlflow import MlflowClient

    from recsys.tracking import tracking_uri

    client = MlflowClient(tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")


def test_parse_budget() -> None:
    schema = make_schema()  # 1144 rows
    assert parse_budget(None, schema) is None and parse_budget("", schema) is None
    assert parse_budget("120000", schema) == 120_000
    assert parse_budget("120_000", schema) == 120_000
    assert parse_budget("1.2e5", schema) == 120_000
    assert parse_budget(5000, schema) == 5000
    assert parse_budget("0.5x16", schema) == 8 * 1144
    assert parse_budget("0.25X32", schema) == 8 * 1144
    assert parse_budget("1x8", schema) == 8 * 1144
    for bad in ("half", "12.5", "-3", "0", "0x16", "0.5x", "inf"):
        with pytest.raises(ValueError, match="--budget"):
            parse_budget(bad, schema)


def test_mde_end_to_end_tracked(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import tracking_uri

    cfg = _config(tmp_cwd)
    assert main(["dims", "--config", str(cfg), "--method", "mde", "--option", "alpha=0.5", "--output", "out"]) == 0
    out = capsys.readouterr().out
    assert "mde dimension plan on synthetic" in out
    assert "uniform-16 (reference)" in out and "test AUC" in out and "vs ref" in out
    for name in FILES:
        assert (tmp_cwd / "out" / name).is_file(), name
    plan = DimensionPlan.load(tmp_cwd / "out" / "plan.json")
    assert plan.method == "mde" and plan.config["alpha"] == 0.5
    summary = json.loads((tmp_cwd / "out" / "summary.json").read_text())
    searched, reference = summary["points"]
    # the retrained model has exactly the plan's embedding parameters, at most half of uniform-16's
    assert searched["embedding_parameters"] == summary["summary"]["embedding_parameters"] == plan.num_parameters()
    assert searched["dims"] == plan.dims and set(reference["dims"].values()) == {16}
    assert 2 * searched["embedding_parameters"] <= reference["embedding_parameters"]
    assert summary["summary"]["parameter_ratio"] <= 0.5 and 0.5 < searched["test_auc"] <= 1.0
    config = yaml.safe_load((tmp_cwd / "out" / "config_with_plan.yaml").read_text())
    assert config["data"]["embedding_dims"] == plan.dims and config["model"]["backbone"]["class_path"] == "recsys.models.DCNv2"
    # one parent run with the plan, the comparison and both fits nested
    run_id = out.split("MLflow run: ")[1].split()[0]
    client = MlflowClient(tracking_uri())
    parent = client.get_run(run_id)
    assert parent.data.tags["salience.stage"] == "dims" and parent.info.status == "FINISHED"
    assert parent.data.metrics["embedding_parameters"] == plan.num_parameters()
    assert parent.data.metrics["reference.embedding_parameters"] == reference["embedding_parameters"]
    artifacts = {a.path for a in client.list_artifacts(run_id, "dims")}
    artifacts |= {a.path for a in client.list_artifacts(run_id, "dims/mde")}
    assert {"dims/mde/plan.json", "dims/mde/dims.png", "dims/summary.json", "dims/params_vs_auc.png",
            "dims/config_with_plan.yaml"} <= artifacts
    children = _child_runs("synthetic", run_id)
    assert sorted(r.info.run_name for r in children) == ["dims-mde", "dims-reference-uniform-16"]
    assert {r.info.run_id for r in children} == {searched["run_id"], reference["run_id"]}


def test_uniform_under_a_budget_untracked_reuses_an_identical_reference(
    tmp_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_cwd)  # the tiny config's own dims are 8
    (tmp_cwd / "mlflow.db").unlink()  # --no-tracking must not make a store
    argv = ["dims", "--config", str(cfg), "--method", "uniform", "--budget", "0.5x16", "--reference", "config",
            "--no-tracking", "--", "--trainer.max_epochs=1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "config dims (reference)" in out and "MLflow run" not in out
    folder = tmp_cwd / "runs" / "dims" / "synthetic-uniform"  # the default output folder
    for name in FILES:
        assert (folder / name).is_file(), name
    summary = json.loads((folder / "summary.json").read_text())
    searched, reference = summary["points"]
    assert set(searched["dims"].values()) == {8} and searched["dims"] == reference["dims"]
    assert searched["test_auc"] == reference["test_auc"] and summary["summary"]["parameter_ratio"] == 1.0  # one fit
    assert not (tmp_cwd / "mlflow.db").exists()  # no store made: the test removed tmp_cwd's empty one


def test_bad_method_budget_and_options(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(_config(tmp_cwd))
    with pytest.raises(SystemExit, match=r"unknown --method 'dnisx'; available: .*mde.*uniform"):
        main(["dims", "--config", cfg, "--method", "dnisx"])
    with pytest.raises(SystemExit, match="unexpected keyword argument 'bogus'"):
        main(["dims", "--config", cfg, "--method", "mde", "--option", "bogus=1"])
    with pytest.raises(SystemExit, match=r"--budget 'lots'.*0\.5x16"):
        main(["dims", "--config", cfg, "--method", "mde", "--budget", "lots", "--no-tracking"])
    with pytest.raises(SystemExit, match="--reference expects"):
        main(["dims", "--config", cfg, "--method", "mde", "--reference", "big", "--no-tracking"])
    capsys.readouterr()
    assert main(["dims", "--config", cfg, "--method", "mde", "--budget", "100", "--no-tracking"]) == 2
    assert "salience dims: error: " in (err := capsys.readouterr().err) and "raise the budget to at least" in err
    with pytest.raises(DimensionPlanError, match="raise the budget to at least"):  # the whole error on request
        main(["dims", "--config", cfg, "--method", "mde", "--budget", "100", "--no-tracking", "--traceback"])


def test_a_failed_search_marks_the_parent_run_failed(tmp_cwd: Path) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import tracking_uri

    cfg = str(_config(tmp_cwd))
    assert main(["dims", "--config", cfg, "--method", "uniform", "--budget", "100"]) == 2  # an input error: one line
    client = MlflowClient(tracking_uri())
    runs = client.search_runs([client.get_experiment_by_name("synthetic").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_dims_on_frappe(tmp_cwd: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's acceptance path: `salience dims` works on Frappe (a few training steps per
    fit: this checks the path, the benchmark checks the AUC)."""
    from tests.conftest import require_dataset

    require_dataset(data_dir, "frappe")
    config = Path(__file__).resolve().parents[3] / "experiments" / "configs" / "frappe_dcnv2.yaml"
    argv = ["dims", "--config", str(config), "--method", "mde", "--budget", "0.5x16", "--output", "frappe",
            "--", "--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--data.batch_size=4096"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mde dimension plan on frappe" in out and "uniform-16 (reference)" in out
    for name in FILES:
        assert (tmp_cwd / "frappe" / name).is_file(), name
    summary = json.loads((tmp_cwd / "frappe" / "summary.json").read_text())
    searched, reference = summary["points"]
    assert len(searched["dims"]) == 10
    assert searched["embedding_parameters"] == DimensionPlan.load(tmp_cwd / "frappe" / "plan.json").num_parameters()
    assert 2 * searched["embedding_parameters"] <= reference["embedding_parameters"]
    assert 0.0 < searched["test_auc"] < 1.0 and 0.0 < reference["test_auc"] < 1.0  # a few steps: no quality claim
    with_plan = yaml.safe_load((tmp_cwd / "frappe" / "config_with_plan.yaml").read_text())
    assert with_plan["data"]["embedding_dims"] == searched["dims"]


def test_ihas_routes_exports_and_logs_the_routed_model(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--method ihas`: search, one model per cluster behind the router, evaluated on the test
    split, counted as the sum of its cluster models' tables, exported, logged as a nested run."""
    from mlflow import MlflowClient

    from recsys.export.serving import read_export_schema
    from recsys.tracking import tracking_uri

    cfg = _config(tmp_cwd)
    argv = ["dims", "--config", str(cfg), "--method", "ihas", "--output", "out",
            "--option", "width=8", "--option", "search_epochs=2", "--option", "num_clusters=2",
            "--option", "retrain_epochs=1", "--", "--trainer.max_epochs=1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ihas (routed, 2 clusters)" in out and "uniform-16 (reference)" in out
    assert "export/ (the routed model for serving)" in out
    for name in FILES:
        assert (tmp_cwd / "out" / name).is_file(), name
    plan = DimensionPlan.load(tmp_cwd / "out" / "plan.json")
    assert plan.method == "ihas" and sorted(plan.clusters) == [0, 1]
    summary = json.loads((tmp_cwd / "out" / "summary.json").read_text())
    searched, reference = summary["points"]
    # every cluster model's tables count: the plan's count
    assert searched["embedding_parameters"] == plan.num_parameters() == summary["summary"]["embedding_parameters"]
    assert 0.5 < searched["test_auc"] <= 1.0 and searched["test_logloss"] > 0 and 0.5 < searched["best_val_auc"]
    assert set(reference["dims"].values()) == {16}
    # the routed model's export, with its run id, plan and metrics
    info = read_export_schema(tmp_cwd / "out" / "export")
    assert info["model_class"] == "IHASRoutedModel"
    assert info["metadata"]["run_id"] == searched["run_id"] and info["metadata"]["plan"]["method"] == "ihas"
    assert info["metadata"]["metrics"]["test_auc"] == searched["test_auc"]
    # nested runs: the routed model and the reference
    run_id = out.split("MLflow run: ")[1].split()[0]
    children = _child_runs("synthetic", run_id)
    assert sorted(r.info.run_name for r in children) == ["dims-ihas", "dims-reference-uniform-16"]
    routed_run = next(r for r in children if r.info.run_name == "dims-ihas")
    assert routed_run.info.run_id == searched["run_id"] and routed_run.info.status == "FINISHED"
    assert routed_run.data.metrics["embedding_parameters"] == plan.num_parameters()
    assert routed_run.data.metrics["export_max_abs_diff"] <= 1e-6
    client = MlflowClient(tracking_uri())
    assert {"export/model.pt", "export/schema.json", "export/loader.py"} <= {
        a.path for a in client.list_artifacts(routed_run.info.run_id, "export")}


def test_dnis_curve_retrains_the_masks_at_other_budgets(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from tests.selection.conftest import tiny_config

    cfg = tmp_cwd / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(n_rows=4000, epochs=1)))
    argv = ["dims", "--config", str(cfg), "--method", "dnis", "--budget", "0.75x8", "--curve", "0.55x8,1x8",
            "--option", "warm_start_epochs=1", "--option", "search_epochs=1", "--no-tracking", "--output", "out"]
    assert main(argv) == 0
    summary = json.loads((tmp_cwd / "out" / "summary.json").read_text())
    labels = [p["label"] for p in summary["points"]]
    assert labels[:3] == ["dnis", "dnis @ 0.55x8", "dnis @ 1x8"] and "reference" in labels[-1]
    params = {p["label"]: p["embedding_parameters"] for p in summary["points"]}
    assert params["dnis @ 0.55x8"] <= params["dnis"] <= params["dnis @ 1x8"]
    with pytest.raises(SystemExit, match="needs --method dnis"):
        main(["dims", "--config", str(cfg), "--method", "mde", "--curve", "0.55x8"])
