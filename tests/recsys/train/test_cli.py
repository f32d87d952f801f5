"""End-to-end tests of ``salience fit|test|predict|export`` on small synthetic data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from experiments.cli import main as salience
from recsys.data.raw import DataError
from recsys.data.schema import SchemaError
from recsys.tracking import tracking_uri
from recsys.train.checkpoint import load_checkpoint
from recsys.train.cli import SalienceCLI

ROOT = Path(__file__).resolve().parents[3]
CONFIG = Path(__file__).resolve().parents[3] / "experiments" / "configs" / "synthetic_dcnv2.yaml"


def fit_args(root: Path, *extra: str, rows: int = 4000, epochs: int = 2) -> list[str]:
    return [
        "fit",
        "--config",
        str(CONFIG),
        "--data.reader.init_args.n_rows",
        str(rows),
        "--data.reader.init_args.embedding_dim",
        "8",
        "--data.batch_size",
        "256",
        "--data.cache_dir",
        str(root / "cache"),
        "--model.backbone.init_args.cross_layers",
        "1",
        "--model.backbone.init_args.deep_mlp",
        "[32]",
        "--trainer.max_epochs",
        str(epochs),
        "--trainer.default_root_dir",
        str(root / "run"),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        *extra,
    ]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[SalienceCLI, Path]:
    root = tmp_path_factory.mktemp("fit")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        cli = SalienceCLI(args=fit_args(root))
    finally:
        mp.undo()
    return cli, root


def _run(cli: SalienceCLI, root: Path):
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    return client, client.get_run(cli.tracking.tracker.run_id)


def test_fit_logs_a_complete_mlflow_run(fitted: tuple[SalienceCLI, Path]) -> None:
    cli, root = fitted
    client, run = _run(cli, root)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "synthetic"  # one experiment per dataset
    metrics = run.data.metrics
    for key in ("val_auc", "val_logloss", "train_loss_epoch", "test_auc", "test_logloss", "best_val_auc", "embedding_parameters"):
        assert key in metrics, key
    assert 0.5 < metrics["test_auc"] <= 1.0
    assert metrics["export_parity_max_abs_diff"] <= 1e-6
    assert len(client.get_metric_history(run.info.run_id, "val_auc")) == 2  # one point per epoch
    assert run.data.params["model.backbone.class_path"] == "recsys.models.DCNv2"
    assert run.data.params["model.backbone.init_args.deep_mlp"] == "[32]"
    assert run.data.params["model.optimizer.class_path"] == "torch.optim.Adam"
    assert float(run.data.params["model.optimizer.init_args.lr"]) == 0.001
    assert run.data.tags["salience.arch"] == "dcnv2" and run.info.run_name.startswith("dcnv2")
    assert int(run.data.params["data.rows_read"]) == 4000
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "data_summary.json", "schema.json", "training_curve.png", "model"} <= artifacts
    model_files = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model.pt", "schema.json", "loader.py"} <= model_files
    config = client.download_artifacts(run.info.run_id, "config.yaml", str(root / "dl"))
    assert "SyntheticReader" in Path(config).read_text()


def test_checkpoint_loads_without_pickle_and_matches_trained_model(fitted: tuple[SalienceCLI, Path]) -> None:
    cli, _ = fitted
    best = cli.trainer.checkpoint_callback.best_model_path
    loaded = load_checkpoint(best)  # weights_only=True inside
    batch = next(iter(cli.datamodule.test_dataloader()))
    cli.model.eval()
    with torch.no_grad():
        expected = cli.model(batch)
        got = loaded.model(batch.dense_features, batch.sparse_features)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert loaded.preprocessor.fitted_schema == cli.datamodule.preprocessor.fitted_schema


def test_export_command_writes_a_serving_folder_that_matches_eager(fitted: tuple[SalienceCLI, Path], tmp_path: Path, capsys) -> None:
    cli, _ = fitted
    out = tmp_path / "export"
    assert salience(["export", "--checkpoint", cli.trainer.checkpoint_callback.best_model_path, "--output", str(out)]) == 0
    assert {"model.pt", "schema.json", "loader.py"} <= {p.name for p in out.iterdir()}
    # same kernels, but the fresh process may run another thread count: float32 rounding only
    match = re.search(r"max \|eager - exported\| = (\S+)", capsys.readouterr().out)
    assert match is not None and float(match.group(1)) <= 1e-6


def test_int8_export_matches_the_eager_int8_model_and_reports_the_test_auc_change(
    fitted: tuple[SalienceCLI, Path], tmp_path: Path, capsys
) -> None:
    cli, root = fitted
    out = tmp_path / "int8"
    assert salience(["export", "--checkpoint", cli.trainer.checkpoint_callback.best_model_path, "--output", str(out),
                     "--precision", "int8", "--config", str(_data_config(root, tmp_path))]) == 0
    printed = capsys.readouterr().out
    # the fresh process runs the same FBGEMM int8 kernel as the eager quantized model
    assert float(re.search(r"max \|eager - exported\| = (\S+)", printed).group(1)) <= 1e-6
    ratio = float(re.search(r"\(([\d.]+)x of fp32\)", printed).group(1))
    assert 0.25 < ratio < 0.5  # dim 8: 8 bytes of values + 4 of scale and bias per row, vs 32
    change = float(re.search(r"\(change ([-+][\d.]+)\)", printed).group(1))
    assert abs(change) < 0.01  # 8-bit rows barely move a trained model's ranking
    schema = __import__("json").loads((out / "schema.json").read_text())
    assert set(schema["embedding_precision"]["tables"].values()) == {"int8"}


def _data_config(root: Path, tmp_path: Path) -> Path:
    """The fitted fixture's config with its data overrides written in (what --config reads)."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    config["data"]["reader"]["init_args"].update(n_rows=4000, embedding_dim=8)
    config["data"].update(batch_size=256, cache_dir=str(root / "cache"))
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_compress_fits_the_budget_exports_the_plan_and_refuses_an_impossible_one(
    fitted: tuple[SalienceCLI, Path], tmp_path: Path, capsys
) -> None:
    import json

    cli, root = fitted
    ckpt, config = cli.trainer.checkpoint_callback.best_model_path, str(_data_config(root, tmp_path))
    out = tmp_path / "c"
    # dim 8: fp32 32 bytes a row, fp16 16, int8 12, int4 8; uniform-16 fp32 is 64 bytes a row
    assert salience(["compress", "--checkpoint", ckpt, "--config", config, "--budget", "0.2x", "--output", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["bytes"] <= plan["budget_bytes"] == int(0.2 * plan["uniform16_fp32_bytes"])
    assert {"int8", "int4"} & set(plan["tables"].values()) and plan["trace"]  # small tables may stay wide
    assert abs(plan["test"]["auc_change"]) < 0.05 and plan["parity_max_abs_diff"] <= 1e-6
    exported = json.loads((out / "export" / "schema.json").read_text())["embedding_precision"]
    assert exported["tables"] == plan["tables"] and exported["bytes"] == plan["bytes"]
    assert "test AUC" in capsys.readouterr().out
    # the frontier: every uniform precision and the plan, each model's test split read once
    frontier = {p["technique"]: p for p in plan["frontier"]}
    assert list(frontier) == ["fp32", "fp16", "int8", "int4", "search"] and (out / "frontier.png").is_file()
    assert frontier["search"]["bytes"] == plan["bytes"] and frontier["search"]["test_auc"] == plan["test"]["plan"]["auc"]
    assert frontier["int4"]["bytes"] < frontier["int8"]["bytes"] < frontier["fp16"]["bytes"] < frontier["fp32"]["bytes"]
    with pytest.raises(SystemExit):
        salience(["compress", "--checkpoint", ckpt, "--config", config, "--budget", "0.01x", "--output", str(tmp_path / "x")])
    assert "below the smallest model these tables allow" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        salience(["compress", "--checkpoint", ckpt, "--config", config, "--output", str(tmp_path / "x")])
    assert "--tolerance" in capsys.readouterr().err
    # the data must be the checkpoint's: other rows are refused; the fit's own overrides are accepted
    with pytest.raises(SystemExit):
        salience(["compress", "--checkpoint", ckpt, "--config", str(CONFIG), "--budget", "0.2x", "--output", str(tmp_path / "x"),
                  "--data.reader.init_args.n_rows=3000", f"--data.cache_dir={root / 'cache'}"])
    assert "encodes its data otherwise than --config" in capsys.readouterr().err
    over = tmp_path / "over"
    assert salience(["compress", "--checkpoint", ckpt, "--config", str(CONFIG), "--budget", "0.2x", "--output", str(over),
                     "--no-parity", "--", "--data.reader.init_args.n_rows=4000", "--data.reader.init_args.embedding_dim=8",
                     "--data.batch_size=256", f"--data.cache_dir={root / 'cache'}"]) == 0
    assert json.loads((over / "plan.json").read_text())["tables"] == plan["tables"]
    # a tolerance alone: as small as it allows, never below fp32's validation AUC by more
    tol = tmp_path / "t"
    assert salience(["compress", "--checkpoint", ckpt, "--config", config, "--tolerance", "0.0", "--output", str(tol)]) == 0
    by_tol = json.loads((tol / "plan.json").read_text())
    assert by_tol["val"]["plan_auc"] >= by_tol["val"]["fp32_auc"] and by_tol["budget_bytes"] is None


def test_same_seed_same_metrics(fitted: tuple[SalienceCLI, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli, _ = fitted
    monkeypatch.chdir(tmp_path)
    again = SalienceCLI(args=fit_args(tmp_path, "--after_fit.export", "false", "--tracking.enabled", "false"))
    assert float(again.trainer.callback_metrics["test_auc"]) == float(cli.trainer.callback_metrics["test_auc"])


def test_resume_from_checkpoint_equals_uninterrupted_run(tmp_cwd: Path) -> None:
    common = ("--after_fit.export", "false", "--tracking.enabled", "false", "--model.early_stopping_patience", "0")
    straight = SalienceCLI(args=fit_args(tmp_cwd / "a", *common, epochs=2))
    SalienceCLI(args=fit_args(tmp_cwd / "b", *common, epochs=1))
    last = tmp_cwd / "b" / "run" / "checkpoints" / "last.ckpt"
    resumed = SalienceCLI(args=fit_args(tmp_cwd / "b", *common, "--ckpt_path", str(last), epochs=2))
    assert resumed.trainer.global_step == straight.trainer.global_step
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_crash_marks_the_mlflow_run_failed(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recsys.train.module import RankingTask

    def boom(self, batch, batch_idx):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(RankingTask, "training_step", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        SalienceCLI(args=fit_args(tmp_cwd))
    client = MlflowClient(tracking_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "simulated crash" in runs[0].data.tags["salience.error"]


def test_mlflow_tracking_uri_env_overrides_default(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_cwd}/elsewhere.db"
    (tmp_cwd / "mlflow.db").unlink()  # (tmp_cwd's empty default store) must not be made again
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    SalienceCLI(args=fit_args(tmp_cwd, "--after_fit.export", "false", epochs=1))
    assert (tmp_cwd / "elsewhere.db").exists() and not (tmp_cwd / "mlflow.db").exists()
    assert MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("synthetic").experiment_id])


def test_config_naming_a_missing_feature_lists_available_columns(tmp_cwd: Path) -> None:
    with pytest.raises(SchemaError, match=r"\['no_such_feature'\].*available columns: \[.*item_id"):
        SalienceCLI(args=fit_args(tmp_cwd, "--data.features", "[item_id, no_such_feature]"))


def test_unknown_backbone_arg_names_the_config_key(tmp_cwd: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        SalienceCLI(args=fit_args(tmp_cwd, "--model.backbone.init_args.cross_layerz", "2"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert 'Parser key "model.backbone"' in err and "'cross_layerz' is not accepted" in err


def test_split_with_one_class_is_a_clear_error(tmp_cwd: Path) -> None:
    # 40 rows at a CTR of 0.25: the 4-row test split is single-class for some split seeds
    import numpy as np

    from recsys.data.prepare import SplitConfig, split_indices
    from recsys.data.synthetic import SyntheticReader

    labels = SyntheticReader(n_rows=40, embedding_dim=8).read().labels
    seed = next(s for s in range(1000) if len(np.unique(labels[split_indices(40, SplitConfig(seed=s))["test"]])) == 1)
    with pytest.raises(DataError, match=r"the (val|test) split has only one class \(label=\d, 4 rows\)"):
        SalienceCLI(args=fit_args(tmp_cwd, "--data.split", f"{{train: 0.8, val: 0.1, test: 0.1, seed: {seed}}}", rows=40))


def test_every_architecture_trains_through_the_cli(tmp_cwd: Path) -> None:
    backbones = {  # the two command-line forms: one JSON value, or the class and then its arguments
        "dlrm": ["--model.backbone", '{"class_path": "recsys.models.DLRM", "init_args": {"bottom_mlp": [8], "top_mlp": [16]}}'],
        "deepfm": ["--model.backbone=DeepFM", "--model.backbone.init_args.deep_mlp=[16]"],
    }
    for arch, backbone in backbones.items():
        cli = SalienceCLI(args=fit_args(tmp_cwd / arch, *backbone, "--tracking.enabled", "false", epochs=1))
        assert cli.model.backbone_name == arch
        assert 0.0 <= float(cli.trainer.callback_metrics["test_auc"]) <= 1.0  # quality: experiments/benchmarks/quality.py
        assert cli.export_report["parity_max_abs_diff"] <= 1e-6


def test_fused_kernel_trains_and_resumes_its_optimizer_state(tmp_cwd: Path) -> None:
    common = ("--model.embedding_kernel", "fused", "--tracking.enabled", "false", "--after_fit.export", "false")
    cli = SalienceCLI(args=fit_args(tmp_cwd, *common, epochs=1))
    ckpt = torch.load(tmp_cwd / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert "fused_optimizer" in ckpt
    assert float(cli.trainer.callback_metrics["test_auc"]) > 0.5


def test_grouped_kernel_trains_through_the_cli_and_its_checkpoint_restores_the_accumulators(tmp_cwd: Path) -> None:
    from recsys.models.grouped import GroupedEmbeddingBags
    from recsys.train.module import RankingTask

    common = ("--model.embedding_kernel", "grouped", "--model.embedding_init_std", "1e-4", "--model.dense_init", "xavier_normal",
              "--tracking.enabled", "false", "--after_fit.export", "false")
    cli = SalienceCLI(args=fit_args(tmp_cwd, *common, epochs=1))
    assert float(cli.trainer.callback_metrics["test_auc"]) > 0.5
    path = tmp_cwd / "run" / "checkpoints" / "last.ckpt"
    saved = torch.load(path, weights_only=True)["grouped_optimizer"]
    assert saved["optimizer"] == "adagrad" and all(float(a.sum()) > 0 for a in saved["accumulators"])
    restored = RankingTask.load_from_checkpoint(path, weights_only=True)
    ebc = restored.model.sparse_arch.embedding_bag_collection
    assert isinstance(ebc, GroupedEmbeddingBags)
    for g, value in enumerate(saved["accumulators"]):
        assert torch.equal(ebc.accumulator(g), value)


def test_console_script_help() -> None:
    out = subprocess.run([sys.executable, "-m", "experiments.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("fit", "test", "predict", "export", "demo", "bench"):
        assert command in out
    # the choices come from the registries: every registered method, search, sampler and benchmark
    # (read in a fresh process too: plug-in tests register toys in this one)
    code = ("import json, embeddings, selection; from experiments.benchmarks import BENCHMARKS; "
            "from experiments.hpo import SamplerChoice; print(json.dumps([selection.method_names(), "
            "embeddings.search_names(), SamplerChoice.registered_names(), list(BENCHMARKS)]))")
    methods, searches, samplers, benchmarks = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert {"leap", "outrank", "permutation"} <= set(methods) and {"gif", "tpe"} <= set(samplers)
    lines = {line.split()[1]: line for line in out.splitlines() if line.strip().startswith("salience ")}
    assert lines["rank"].split("--method ")[1].split()[0].split("|") == methods
    assert lines["dims"].split("--method ")[1].split()[0].split("|") == searches
    assert lines["tune"].split("--sampler ")[1].split()[0].split("|") == samplers
    assert lines["bench"].split()[2].split("|") == benchmarks


def test_predict_writes_scores(fitted: tuple[SalienceCLI, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    cli, root = fitted
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scores.csv"
    args = fit_args(root, "--tracking.enabled", "false")[1:]  # same config, `predict` instead of `fit`
    SalienceCLI(args=["predict", *args, "--ckpt_path", cli.trainer.checkpoint_callback.best_model_path, "--predictions", str(out)])
    frame = pd.read_csv(out)
    assert len(frame) == len(cli.datamodule.prepared.splits["test"])
    assert frame["score"].between(0, 1).all()


def _write_user_csv(folder: Path, bad_line: bool) -> tuple[Path, Path]:
    """A user's own CSV (400 rows) + schema file; optionally one row with a missing field."""
    import numpy as np

    g = np.random.default_rng(0)
    lines = ["user,item,price,clicked"]
    for _ in range(400):
        user, item = g.integers(0, 20), g.integers(0, 30)
        lines.append(f"u{user},i{item},{g.random() * 10:.2f},{int((user + item) % 3 == 0)}")
    if bad_line:
        lines.insert(101, "u1,i2,3.5")  # file line 102 (after the header): 3 fields instead of 4
    csv = folder / "clicks.csv"
    csv.write_text("\n".join(lines) + "\n")
    schema = folder / "schema.yaml"
    schema.write_text(
        "name: shop\nlabel: clicked\nfeatures:\n  - {name: user, embedding_dim: 8}\n  - {name: item, embedding_dim: 8}\n"
        "  - {name: price, kind: dense, transform: log1p}\n"
    )
    return csv, schema


def _user_data_args(csv: Path, schema: Path, root: Path, skip: bool) -> list[str]:
    reader = f"{{class_path: recsys.data.readers.TabularReader, init_args: {{path: '{csv}', schema: '{schema}', skip_bad_rows: {str(skip).lower()}}}}}"
    args = fit_args(root, "--data.reader", reader, "--after_fit.export", "false", epochs=1)
    i = args.index("--data.reader.init_args.n_rows")
    del args[i : i + 4]  # drop the synthetic reader's options
    return args


def test_users_own_csv_bad_row_is_an_error_naming_file_and_line(tmp_cwd: Path) -> None:
    csv, schema = _write_user_csv(tmp_cwd, bad_line=True)
    with pytest.raises(DataError, match=r"clicks\.csv:102: expected 4 comma-separated fields, found 3"):
        SalienceCLI(args=_user_data_args(csv, schema, tmp_cwd, skip=False))
    # through the `salience` command: the message alone, exit code 2 (no traceback)
    out = subprocess.run([sys.executable, "-m", "experiments.cli", *_user_data_args(csv, schema, tmp_cwd, skip=False)],
                         capture_output=True, text=True, cwd=tmp_cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "salience fit: error: " in out.stderr and "clicks.csv:102: expected 4 comma-separated fields" in out.stderr
    assert "Traceback" not in out.stderr


def test_users_own_csv_skipped_rows_are_counted_in_the_run(tmp_cwd: Path) -> None:
    csv, schema = _write_user_csv(tmp_cwd, bad_line=True)
    cli = SalienceCLI(args=_user_data_args(csv, schema, tmp_cwd, skip=True))
    run = MlflowClient(tracking_uri()).get_run(cli.tracking.tracker.run_id)
    assert run.data.params["data.rows_skipped"] == "1"
    assert run.data.params["data.rows_read"] == "400"
    assert MlflowClient(tracking_uri()).get_experiment(run.info.experiment_id).name == "shop"


@pytest.mark.parametrize("config", sorted(CONFIG.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_committed_configs_parse(config: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        SalienceCLI(args=["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "class_path: recsys.data" in capsys.readouterr().out


# frappe_dcnv2.yaml also trains through the CLI in tests/experiments/hpo/test_tune.py::test_tune_on_frappe_through_the_cli
# (and the embeddings/selection CLI tests); a real-data fit logged to MLflow: the criteo and movielens cases
@pytest.mark.parametrize("dataset", [pytest.param("frappe", marks=pytest.mark.slow), "criteo", "movielens"])
def test_fit_on_real_data_logs_a_run(dataset: str, data_dir: Path, tmp_cwd: Path) -> None:
    """One epoch of each committed real-data config, through the CLI, visible in MLflow."""
    from tests.conftest import require_dataset

    require_dataset(data_dir, {"frappe": "frappe", "criteo": "criteo-kaggle-head10k", "movielens": "ml-100k"}[dataset])
    config = CONFIG.parent / f"{dataset}_dcnv2.yaml"
    cli = SalienceCLI(
        args=[
            "fit", "--config", str(config), "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_cwd / "run"), "--data.cache_dir", str(tmp_cwd / "cache"),
        ]
    )  # fmt: skip
    client = MlflowClient(tracking_uri())
    run = client.get_run(cli.tracking.tracker.run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == dataset
    assert run.data.metrics["test_auc"] > 0.6
    assert run.data.metrics["export_parity_max_abs_diff"] <= 1e-6


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_validate_and_test_reproduce_the_fit_metrics(
    subcommand: str, fitted: tuple[SalienceCLI, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli, root = fitted
    monkeypatch.chdir(tmp_path)
    best = cli.trainer.checkpoint_callback.best_model_path
    args = fit_args(root, "--tracking.enabled", "false")[1:]
    again = SalienceCLI(args=[subcommand, *args, "--ckpt_path", best])
    key = "val_auc" if subcommand == "validate" else "test_auc"
    expected = float(cli.trainer.checkpoint_callback.best_model_score) if subcommand == "validate" else float(
        cli.trainer.callback_metrics["test_auc"]
    )
    assert float(again.trainer.callback_metrics[key]) == pytest.approx(expected, abs=1e-6)


def test_checkpoints_are_written_straight_to_a_file(fitted: tuple[SalienceCLI, Path], tmp_path: Path) -> None:
    """Lightning's default writer serialises a checkpoint into memory first (the fit's peak with
    large tables); the CLI's trainer writes it to a temporary file renamed into place."""
    from recsys.train.cli import FileCheckpointIO

    cli, root = fitted
    assert isinstance(cli.trainer.strategy.checkpoint_io, FileCheckpointIO)
    assert list(root.rglob("*.ckpt")) and not list(root.rglob(".*.tmp"))  # whole checkpoints, no leftovers
    path = tmp_path / "sub" / "x.ckpt"
    FileCheckpointIO().save_checkpoint({"w": torch.arange(6.0), "note": "n"}, path)
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["w"], torch.arange(6.0)) and loaded["note"] == "n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.ckpt"]


def test_local_checkpoints_are_loaded_memory_mapped(tmp_path: Path) -> None:
    """A restore reads the tables from the mapped file instead of holding a second copy of them."""
    import sys

    from recsys.train.cli import FileCheckpointIO

    path = tmp_path / "x.ckpt"
    FileCheckpointIO().save_checkpoint({"state_dict": {"w": torch.arange(4096.0)}, "epoch": 2}, path)
    loaded = FileCheckpointIO().load_checkpoint(path, weights_only=True)
    assert torch.equal(loaded["state_dict"]["w"], torch.arange(4096.0)) and loaded["epoch"] == 2
    if sys.platform.startswith("linux"):
        assert str(path) in Path("/proc/self/maps").read_text()  # mapped while its tensors live
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        FileCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")


def test_the_test_after_fit_reloads_the_best_checkpoint_only_when_the_model_moved_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit whose last validation wrote the best checkpoint tests the model in memory (the same
    metrics as reloading it, without mapping the checkpoint); after more training it reloads."""
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from recsys.train.cli import FileCheckpointIO, FitState

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    loads: list[str] = []
    answers: list[bool] = []
    load, decide = FileCheckpointIO.load_checkpoint, FitState.best_is_in_memory

    def counted(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(str(path))
        return load(self, path, *args, **kwargs)

    def recorded(self, trainer):  # type: ignore[no-untyped-def]
        answers.append(decide(self, trainer))
        return answers[-1]

    monkeypatch.setattr(FileCheckpointIO, "load_checkpoint", counted)
    monkeypatch.setattr(FitState, "best_is_in_memory", recorded)
    cli = SalienceCLI(args=fit_args(tmp_path, "--tracking.enabled", "false", "--after_fit.export", "false",
                                    rows=2000, epochs=1))
    (best,) = cli.fit_state.best_steps
    assert answers == [True] and not loads
    in_memory = float(cli.trainer.callback_metrics["test_auc"])
    cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path=best, weights_only=True, verbose=False)
    assert loads == [best]
    assert float(cli.trainer.callback_metrics["test_auc"]) == pytest.approx(in_memory, abs=1e-7)

    callback = ModelCheckpoint(monitor="val_auc")
    callback.best_model_path = best
    state = FitState(tmp_path, "sha")
    state.best_steps = dict(cli.fit_state.best_steps)
    step = state.best_steps[best]
    assert decide(state, SimpleNamespace(checkpoint_callback=callback, global_step=step))
    assert not decide(state, SimpleNamespace(checkpoint_callback=callback, global_step=step + 5))  # trained on
    callback.best_model_path = str(tmp_path / "resumed-best.ckpt")  # written by an earlier process
    assert not decide(state, SimpleNamespace(checkpoint_callback=callback, global_step=step))
