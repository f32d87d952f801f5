"""CTRDataModule over a shard set (``data.shards``): the schema, encoders and evaluation batches of
the in-memory path, whole splits never loaded by a fit, a ``salience fit`` to the same AUC, and a
mid-epoch checkpoint that resumes to exactly the batches of an uninterrupted fit."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from recsys.data.batching import BatchDataset
from recsys.data.prepare import PrepareConfig, PreparedData, SplitConfig, prepare_data
from recsys.data.streaming.batching import ResumableLoader
from recsys.data.synthetic import SyntheticReader
from recsys.models import DCNv2
from recsys.train.cli import SalienceCLI
from recsys.train.datamodule import CTRDataModule
from recsys.train.module import RankingTask
from tests.recsys.data.shardsets import same_batch, write_prepared
from tests.recsys.train.test_cli import fit_args

ROWS = 4000
SPLIT = SplitConfig(train=0.8, val=0.1, test=0.1, seed=42)  # the split of experiments/configs/synthetic_dcnv2.yaml


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """One intra-op thread: on a busy 2-core machine more spin and run several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reader(seed: int = 0) -> SyntheticReader:
    return SyntheticReader(n_rows=ROWS, seed=seed, embedding_dim=8)


@pytest.fixture(scope="module")
def prepared() -> PreparedData:
    return prepare_data(reader(), PrepareConfig(SPLIT))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, prepared: PreparedData) -> Path:
    """The in-memory preparation written as shards of 300 rows (11 train shards, the last partial)."""
    out = tmp_path_factory.mktemp("streaming") / "shards"
    write_prepared(out, prepared, 300)
    return out


def pair(folder: Path, **options: Any) -> tuple[CTRDataModule, CTRDataModule]:
    memory = CTRDataModule(reader(), batch_size=256, cache_dir=None, **options)
    streaming = CTRDataModule(reader(), batch_size=256, cache_dir=None, shards=str(folder), buffer_shards=2, **options)
    return memory, streaming


def test_streaming_module_matches_the_in_memory_one_without_loading_whole_splits(folder: Path) -> None:
    memory, streaming = pair(folder)
    assert streaming.schema_dict == memory.schema_dict
    assert streaming.state_dict() == memory.state_dict()
    memory.load_state_dict(streaming.state_dict())  # the encoder check holds across modes
    streaming.load_state_dict(memory.state_dict())
    for name, loader in (("val", "val_dataloader"), ("test", "test_dataloader")):
        a, b = list(getattr(streaming, loader)()), list(getattr(memory, loader)())
        assert len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b, strict=True)), name
    train = streaming.train_dataloader()
    assert isinstance(train, ResumableLoader) and len(train) == len(memory.train_dataloader())
    labels = torch.cat([b.labels for b in train])
    whole = memory.prepared.splits["train"].labels
    assert len(labels) == len(whole) and labels.sum() == whole.sum()
    assert streaming.has_split("test") and not streaming.has_split("predict")
    np.testing.assert_array_equal(streaming.split_labels("test"), memory.prepared.splits["test"].labels)
    sample = streaming.split_sample("test", 50)  # (the export's parity rows): from the first shard
    assert len(sample) == 50 and set(sample.labels.tolist()) <= {0.0, 1.0}
    first = streaming.shard_set.split("test").load(0)
    assert all(any(np.array_equal(first.dense[i], row) for i in range(len(first))) for row in sample.dense[:5])
    assert streaming._prepared is None  # nothing above loaded a whole split
    other = CTRDataModule(SyntheticReader(n_rows=ROWS, seed=1, embedding_dim=8), batch_size=256, cache_dir=None)
    with pytest.raises(ValueError, match="data changed since the checkpoint"):
        streaming.load_state_dict(other.state_dict())


def test_a_feature_view_of_the_shards_equals_preparing_those_features(folder: Path) -> None:
    names = reader().read().schema.names
    memory, streaming = pair(folder, features=names[1:4] + names[-2:], embedding_dim=4, embedding_dims={names[1]: 12})
    assert streaming.schema_dict == memory.schema_dict
    assert streaming.preprocessor.state_dict() == memory.preprocessor.state_dict()
    a, b = list(streaming.val_dataloader()), list(memory.val_dataloader())
    assert all(same_batch(x, y) for x, y in zip(a, b, strict=True))
    dropped = pair(folder, drop_features=[names[0]])
    assert dropped[1].schema_dict == dropped[0].schema_dict
    # the whole splits, for the commands that still need them: the same arrays
    whole = [next(iter(BatchDataset(dm.prepared.splits["val"], 64))) for dm in (streaming, memory)]
    assert same_batch(*whole)


def test_salience_fit_on_shards_reaches_the_in_memory_auc(tmp_cwd: Path, folder: Path) -> None:
    def fit(root: Path, *extra: str) -> SalienceCLI:
        # (the export's parity check runs a fresh process: tested on the in-memory path in test_cli)
        return SalienceCLI(args=fit_args(root, "--tracking.enabled", "false", "--model.early_stopping_patience", "0",
                                         "--after_fit.export", "false", *extra, rows=ROWS, epochs=2))

    memory = fit(tmp_cwd / "memory")
    streamed = fit(tmp_cwd / "streamed", "--data.shards", str(folder), "--data.buffer_shards", "3")
    assert streamed.datamodule.streaming and streamed.datamodule._prepared is None  # fit and test streamed
    a = float(memory.trainer.checkpoint_callback.best_model_score)
    b = float(streamed.trainer.checkpoint_callback.best_model_score)
    assert b > 0.65 and abs(a - b) < 0.03, (a, b)  # (0.715 and 0.718 when written)
    assert "test_auc" in streamed.trainer.callback_metrics


def test_data_streaming_prepares_shards_from_the_raw_data_and_fits_on_them(tmp_cwd: Path) -> None:
    """``--data.streaming true``: the reader's rows go through the two-pass preparation into a
    cached shard set, the fit streams it, and a second fit reuses the cache."""
    def fit(root: str) -> SalienceCLI:
        return SalienceCLI(args=fit_args(tmp_cwd / root, "--tracking.enabled", "false", "--model.early_stopping_patience",
                                         "0", "--after_fit.export", "false", "--data.streaming", "true",
                                         "--data.rows_per_shard", "700", "--data.cache_dir", str(tmp_cwd / "cache"),
                                         rows=ROWS, epochs=1))

    first = fit("a")
    dm = first.datamodule
    assert dm.streaming and dm._prepared is None
    shards = dm.shard_set
    assert shards.folder.parent == tmp_cwd / "cache" and len(shards.split("train").shards) >= 4
    assert sum(p.rows for p in shards.splits.values()) == ROWS
    assert "test_auc" in first.trainer.callback_metrics
    second = fit("b")
    assert second.datamodule.shard_set.folder == shards.folder  # the cache, not a second preparation
    with pytest.raises(ValueError, match="data.cache_dir"):
        CTRDataModule(reader(), streaming=True, cache_dir=None)


class Record(Callback):
    """Each training batch (epoch, index, batch) and, at global step ``save_at``, a checkpoint."""

    def __init__(self, save_at: int | None = None, path: Path | None = None) -> None:
        self.batches: list[tuple[int, int, Any]] = []
        self.save_at, self.path = save_at, path

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, idx: int) -> None:
        self.batches.append((trainer.current_epoch, idx, batch))

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.save_at:
            trainer.save_checkpoint(self.path)


def train(root: Path, folder: Path, callback: Record, ckpt: Path | None = None) -> pl.Trainer:
    dm = CTRDataModule(reader(), batch_size=128, cache_dir=None, shards=str(folder), buffer_shards=2, shuffle_seed=3)
    task = RankingTask(backbone=functools.partial(DCNv2, cross_layers=1, deep_mlp=[16]), schema=dm.schema_dict,
                       early_stopping_patience=0)
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, deterministic=True, default_root_dir=root, callbacks=[callback])
    trainer.fit(task, datamodule=dm, ckpt_path=ckpt)
    return trainer


@pytest.mark.parametrize("save_at", [7, 31])  # mid-epoch 0 and mid-epoch 1 (25 batches an epoch)
def test_a_mid_epoch_checkpoint_resumes_with_the_batches_of_an_uninterrupted_fit(tmp_path: Path, folder: Path,
                                                                                 save_at: int) -> None:
    ckpt = tmp_path / "mid.ckpt"
    straight = Record(save_at, ckpt)
    pl.seed_everything(0)
    first = train(tmp_path / "a", folder, straight)
    assert len(straight.batches) == 2 * 25 and ckpt.is_file()
    loops = torch.load(ckpt, map_location="cpu", weights_only=False)["loops"]
    state = loops["fit_loop"]["state_dict"]["combined_loader"]
    assert state[0]["batches"] == save_at % 25 and state[0]["epoch"] == save_at // 25
    resumed = Record()
    pl.seed_everything(0)
    second = train(tmp_path / "b", folder, resumed, ckpt)
    rest = straight.batches[save_at:]
    assert [(e, i) for e, i, _ in resumed.batches] == [(e, i) for e, i, _ in rest]
    assert all(same_batch(x, y) for (_, _, x), (_, _, y) in zip(resumed.batches, rest, strict=True))
    auc = float(first.callback_metrics["val_auc"])
    assert float(second.callback_metrics["val_auc"]) == pytest.approx(auc, abs=1e-4)
