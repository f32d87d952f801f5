"""The demo's feature-selection stage runs end to end (tiny size) and writes what it prints."""

from __future__ import annotations

from pathlib import Path

from experiments.demo import SELECTION_KS, _selection_lines, run_selection_stage


def test_selection_stage(tmp_cwd: Path) -> None:
    s = run_selection_stage(rows=8000, epochs=1, output=str(tmp_cwd / "demo"))
    out = Path(s["output"])
    for name in ("outrank.json", "leap.json", "curve.json", "curve.png", "reduced_config.yaml"):
        assert (out / name).exists(), name
    assert set(s["rankings"]) == {"outrank", "leap"} and all(len(v) == 8 for v in s["rankings"].values())
    assert [k for k, _ in s["curve_points"]] == list(SELECTION_KS)
    text = "\n".join(_selection_lines(s))
    assert "AUKC" in text and "reduced_config.yaml" in text


def test_dims_stage(tmp_cwd: Path) -> None:
    from experiments.demo import _dims_lines, run_dims_stage

    s = run_dims_stage(rows=8000, epochs=1, output=str(tmp_cwd / "demo"))
    names = [m["model"] for m in s["models"]]
    assert names == ["uniform-16", "mde", "dnis"]
    ref = s["models"][0]["parameters"]
    for m in s["models"][1:]:
        assert m["parameters"] <= s["budget"] <= ref // 2 + 1
    assert (Path(s["output"]) / "dnis_plan.json").exists()
    assert "half of uniform-16" in "\n".join(_dims_lines(s))


def test_generative_stage(tmp_cwd: Path) -> None:
    from experiments.demo import _generative_lines, run_generative_stage

    s = run_generative_stage(epochs=1, output=str(tmp_cwd / "demo"))
    assert [m["model"] for m in s["models"]] == ["sid-multi", "sasrec"]
    assert all(m["test_recall_10"] > 0.1 for m in s["models"])  # planted transitions; most-popular ~0.14 at 3 epochs
    assert s["export"]["items_equal"] and s["export"]["max_abs_score_diff"] <= 1e-5
    text = "\n".join(_generative_lines(s))
    assert "sid-multi" in text and "export" in text


def test_tuning_stage(tmp_cwd: Path) -> None:
    import math

    import yaml
    from mlflow import MlflowClient

    from experiments.demo import _tuning_lines, run_tuning_stage
    from experiments.hpo.space import OPTIMIZERS
    from recsys.tracking import tracking_uri

    s = run_tuning_stage(rows=3000, n_trials=8, output=str(tmp_cwd / "demo"), limit_train_batches=2, race_budget=20)
    assert sum(s["states"].values()) == sum(s["phases"].values()) == 8
    sched = s["schedule"]
    assert sched is not None and sched["groups"] and all(sched["budgets"])
    assert s["phases"]["warmup"] == sched["n_warmup"]
    assert s["phases"].get("group", 0) == sum(sched["budgets"])
    assert {p for g in sched["groups"] for p in g} <= set(sched["importance"])

    # the best config: the synthetic config with the best trial's hyperparameters, at the stage's data size
    path = Path(s["best_config"])
    assert path == tmp_cwd / "demo" / "tuning" / "best_config.yaml"
    best, params = yaml.safe_load(path.read_text()), s["best_params"]
    assert best["model"]["optimizer"]["class_path"] == OPTIMIZERS[params["optimizer"]]
    assert math.isclose(best["model"]["optimizer"]["init_args"]["lr"], params["learning_rate"], rel_tol=1e-9)
    assert best["model"]["backbone"]["init_args"]["cross_layers"] == params["cross_layers"]
    assert best["data"]["embedding_dim"] == params["embedding_dim"]
    assert best["data"]["reader"]["init_args"]["n_rows"] == 3000
    assert 0.0 < s["best_val_auc"] <= 1.0

    # one MLflow parent run for the study, every trial's fit nested under it
    client = MlflowClient(tracking_uri())
    parent = client.get_run(s["mlflow_run_id"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 8

    assert set(s["race"]["regret"]) == {"gif", "tpe", "random"}
    assert all(math.isfinite(v) and v >= 0.0 for v in s["race"]["regret"].values())
    text = "\n".join(_tuning_lines(s))
    assert "GIF schedule" in text and "best_config.yaml" in text and "GIF vs TPE" in text


def test_demo_runs_the_pipeline_on_the_synthetic_config(monkeypatch) -> None:
    import experiments.pipeline.cli as pipeline_cli
    from experiments.demo import PIPELINE_CONFIG, main

    calls = []
    monkeypatch.setattr(pipeline_cli, "pipeline_main", lambda argv: calls.append(list(argv)) or 0)
    assert main(["--restart"]) == 0
    assert calls == [["--config", str(PIPELINE_CONFIG), "--restart"]]
    assert PIPELINE_CONFIG.is_file() and "synthetic_dcnv2.yaml" in PIPELINE_CONFIG.read_text()
