"""``torchrun --nproc_per_node 2 -m experiments.cli fit`` with the sharded strategy, end to end.

The sharded run walks the same global batches as a single-process run of the same config
(each process takes half of each), so their test metrics agree to float rounding (1e-5); its
checkpoint holds full tables that load into a single-process model, export through the normal
path and resume on another sharding plan.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from recsys.train.cli import SalienceCLI

CONFIG = Path(__file__).resolve().parents[3] / "experiments" / "configs" / "synthetic_dcnv2_sharded.yaml"


def _args(root: Path, epochs: int, *extra: str) -> list[str]:
    return [
        "fit", "--config", str(CONFIG),
        "--data.reader.init_args.n_rows", "4000", "--data.reader.init_args.embedding_dim", "8",
        "--data.batch_size", "256", "--data.cache_dir", str(root.parent / "cache"),
        "--model.backbone.init_args", "{cross_layers: 1, deep_mlp: [32]}", "--model.early_stopping_patience", "0",
        "--trainer.max_epochs", str(epochs), "--trainer.default_root_dir", str(root / "run"),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        *extra,
    ]  # fmt: skip


def _torchrun(root: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "experiments.cli", *args]
    done = subprocess.run(cmd, check=False, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def _metrics(root: Path) -> tuple[MlflowClient, object]:
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, "one MLflow run per job, not one per process"
    return client, runs[0]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> SalienceCLI:
    root = tmp_path_factory.mktemp("single")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        return SalienceCLI(args=_args(root, 2, "--trainer.strategy", "auto", "--tracking.enabled", "false", "--after_fit.export", "false"))
    finally:
        mp.undo()


def test_torchrun_fit_matches_single_process_and_exports(tmp_path: Path, single: SalienceCLI) -> None:
    from recsys.train.checkpoint import load_checkpoint

    root = tmp_path / "sharded"
    done = _torchrun(root, _args(root, 2))
    assert "exported model:" in done.stdout
    client, run = _metrics(root)
    assert run.info.status == "FINISHED"
    assert run.data.params["sharding.world_size"] == "2"
    assert run.data.params["sharding.types"] == "table_wise"
    assert "sharding_plan.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    for key in ("test_auc", "test_logloss"):
        assert run.data.metrics[key] == pytest.approx(float(single.trainer.callback_metrics[key]), abs=1e-5)
    assert run.data.metrics["export_parity_max_abs_diff"] <= 1e-6
    # the sharded checkpoint loads into a single-process model equal to the single-process one
    best = Path(client.get_run(run.info.run_id).data.tags["salience.best_checkpoint"])
    loaded = load_checkpoint(best if best.is_absolute() else root / best).model
    reference = single.model.model
    batch = next(iter(single.datamodule.test_dataloader()))
    with torch.no_grad():
        reference.eval()
        torch.testing.assert_close(
            loaded(batch.dense_features, batch.sparse_features), reference(batch.dense_features, batch.sparse_features), atol=1e-5, rtol=1e-5
        )


def test_sharded_checkpoint_resumes_on_another_plan(tmp_path: Path, single: SalienceCLI) -> None:
    """One epoch table-wise, then the second epoch row-wise from its last checkpoint (tables
    and the fused optimizer state re-sliced): the same model as two uninterrupted epochs."""
    root = tmp_path / "resumed"
    _torchrun(root, _args(root, 1, "--after_fit.export", "false", "--tracking.enabled", "false"))
    last = root / "run" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    done = _torchrun(
        root,
        _args(
            root, 2, "--ckpt_path", str(last), "--trainer.strategy.init_args.sharding", "row_wise",
            "--after_fit.export", "false",
        ),
    )  # fmt: skip
    assert "Restoring states from the checkpoint" in done.stdout + done.stderr
    _, run = _metrics(root)
    assert run.data.params["sharding.types"] == "row_wise"
    for key in ("test_auc", "test_logloss"):
        assert run.data.metrics[key] == pytest.approx(float(single.trainer.callback_metrics[key]), abs=1e-5)


def test_cuda_config_on_a_machine_without_cuda_is_a_clear_error(tmp_cwd: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match=r"trainer.accelerator='cuda' but no CUDA device is visible.*--trainer.accelerator cpu"):
        SalienceCLI(args=_args(tmp_cwd, 1, "--trainer.accelerator", "cuda"))


def test_predict_with_several_processes_is_refused_with_the_way_out(tmp_cwd: Path) -> None:
    args = _args(tmp_cwd, 1, "--trainer.devices", "2")
    with pytest.raises(ValueError, match=r"run it without the sharded strategy \(--trainer.strategy auto\)"):
        SalienceCLI(args=["predict", *args[1:]])


@pytest.mark.slow  # torchrun through the CLI: test_torchrun_fit_matches_single_process_and_exports (synthetic)
def test_torchrun_trains_dcnv2_on_frappe(data_dir: Path, tmp_path: Path) -> None:
    """The committed Frappe sharded config, one short epoch over 2 gloo processes."""
    from tests.conftest import require_dataset

    require_dataset(data_dir, "frappe")
    config = CONFIG.parent / "frappe_dcnv2_sharded.yaml"
    root = tmp_path / "frappe"
    args = [
        "fit", "--config", str(config), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "60",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root / "run"),
        "--data.cache_dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    done = _torchrun(root, args)
    assert "exported model:" in done.stdout
    _, run = _metrics(root)
    assert run.info.status == "FINISHED"
    assert run.data.params["sharding.types"] == "row_wise"
    assert run.data.metrics["test_auc"] > 0.85
    assert run.data.metrics["export_parity_max_abs_diff"] <= 1e-6
