"""LightningDataModule over :func:`recsys.data.prepare.prepare_data`."""

from __future__ import annotations

import json
import math
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from recsys.data.batching import BatchDataset
from recsys.data.encoders import Preprocessor
from recsys.data.prepare import PreparedData, SplitConfig, prepare_data
from recsys.data.readers.base import Reader

__all__ = ["CTRDataModule", "encoder_changes"]


class CTRDataModule(pl.LightningDataModule):
    """CTR data: a reader, a seeded split, encoders fitted on train, pre-built KJT batches.

    Args:
        reader: dataset reader (``class_path`` in YAML, e.g. ``recsys.data.readers.FrappeReader``).
        batch_size: training batch size (the global batch of a distributed run: each of its N
            processes trains on ``batch_size / N`` rows per step).
        eval_batch_size: batch size for validation/test/predict (default: ``4 * batch_size``).
        split: train/val/test fractions and the split seed.
        features: keep only these features.
        drop_features: drop these features.
        embedding_dim: override every sparse feature's embedding dim.
        embedding_dims: per-feature embedding dims (e.g. a ``DimensionPlan``'s dims), applied
            over the prepared schema after ``embedding_dim``; the encoded-data cache does not
            depend on them, so a sweep over dims encodes the data once.
        cache_dir: encoded-data cache folder (``null`` disables the cache).
        shuffle_seed: seed of the per-epoch training shuffle.
    """

    def __init__(
        self,
        reader: Reader,
        batch_size: int = 2048,
        eval_batch_size: int | None = None,
        split: SplitConfig = SplitConfig(),  # noqa: B008 - frozen dataclass, safe default
        features: list[str] | None = None,
        drop_features: list[str] | None = None,
        embedding_dim: int | None = None,
        embedding_dims: dict[str, int] | None = None,
        cache_dir: str | None = ".cache/salience",
        shuffle_seed: int = 0,
    ) -> None:
        super().__init__()
        self.reader = reader
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 4 * batch_size
        self.split = split
        self.features = features
        self.drop_features = drop_features
        self.embedding_dim = embedding_dim
        self.embedding_dims = embedding_dims
        self.cache_dir = cache_dir
        self.shuffle_seed = shuffle_seed
        self._prepared: PreparedData | None = None

    @property
    def prepared(self) -> PreparedData:
        """Encoded splits (read, split and encoded on first access; cached on disk)."""
        if self._prepared is None:
            self._prepared = prepare_data(
                self.reader, self.split, self.features, self.drop_features, self.embedding_dim, self.cache_dir
            )
        return self._prepared

    @property
    def schema_dict(self) -> dict[str, Any]:
        """The fitted schema as a dict (linked to the model's ``schema`` argument by the CLI),
        with ``embedding_dims`` applied."""
        schema = self.prepared.schema
        if self.embedding_dims:
            schema = schema.with_dims(self.embedding_dims)
        return schema.to_dict()

    @property
    def preprocessor(self) -> Preprocessor:
        return self.prepared.preprocessor

    @property
    def dataset_name(self) -> str:
        return self.reader.name

    def setup(self, stage: str) -> None:
        _ = self.prepared

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        data = self.prepared.splits.get(split)
        if data is None:
            raise ValueError(f"the {split!r} split is empty: give it a non-zero fraction in data.split")
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if train and self.batch_size % world:
            raise ValueError(
                f"data.batch_size={self.batch_size} is the global batch and must split evenly over the "
                f"{world} processes of this run (a multiple of {world})"
            )
        ds = BatchDataset(
            data,
            self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            seed=self.shuffle_seed,
            rank=rank,
            world_size=world,
            pad=not train,
        )
        # pinned host memory makes the host-to-device copy of each batch asynchronous
        pin = trainer is not None and trainer.strategy.root_device.type == "cuda"
        return DataLoader(ds, batch_size=None, pin_memory=pin)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test")

    def state_dict(self) -> dict[str, Any]:
        """Saved in checkpoints: the fitted encoders, so a checkpoint alone can be exported."""
        return {"preprocessor": self.preprocessor.state_dict(), "summary": self.prepared.summary}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check a checkpoint's encoders against the ones rebuilt from the data (+ seed).

        The encoders are rebuilt, not restored: equal ones mean the checkpoint's embedding rows
        and dense statistics still mean what they meant. Different ones mean the data changed
        since the checkpoint was written, and resuming (or evaluating) from it would silently
        pair rows with other categories.

        Raises:
            ValueError: the encoders differ; the message names the checkpoint and what changed.
        """
        saved = state_dict.get("preprocessor")
        if saved is None:  # a checkpoint without encoders: nothing to compare
            return
        changes = encoder_changes(saved, self.preprocessor.state_dict())
        if changes:
            path = getattr(self.trainer, "ckpt_path", None) if self.trainer is not None else None
            shown = "; ".join(changes[:8]) + (f"; and {len(changes) - 8} more" if len(changes) > 8 else "")
            raise ValueError(
                f"the data changed since the checkpoint{f' {path}' if path else ''} was written: the encoders "
                f"rebuilt from it differ in {shown}. Resume from the data the checkpoint was trained on (the same "
                "data.reader files, data.split and data.features), or start a new fit without --ckpt_path."
            )


def encoder_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two :meth:`Preprocessor.state_dict` states, one phrase per difference."""
    saved, now = json.loads(json.dumps(saved)), json.loads(json.dumps(now))  # tuples vs lists, numpy scalars
    changes: list[str] = []
    s_features = {f["name"]: f for f in (saved.get("schema") or {}).get("features", [])}
    n_features = {f["name"]: f for f in (now.get("schema") or {}).get("features", [])}
    if list(s_features) != list(n_features):
        changes.append(f"the features ({list(s_features)} in the checkpoint, {list(n_features)} now)")
    changes += [f"the settings of {name!r}" for name in s_features
                if name in n_features and s_features[name] != n_features[name]]
    s_vocab, n_vocab = saved.get("vocabularies", {}), now.get("vocabularies", {})
    for name in s_vocab:
        if name not in n_vocab:
            continue
        a, b = s_vocab[name], n_vocab[name]
        if a["tokens"] != b["tokens"]:
            how = ("the same tokens in another id order" if sorted(a["tokens"]) == sorted(b["tokens"])
                   else f"{len(a['tokens'])} tokens in the checkpoint, {len(b['tokens'])} now, "
                   f"{len(set(a['tokens']) ^ set(b['tokens']))} not in both")
            changes.append(f"the vocabulary of {name!r} ({how})")
        elif a["counts"] != b["counts"]:
            changes.append(f"the token counts of {name!r}")
    s_dense, n_dense = saved.get("dense_stats", {}), now.get("dense_stats", {})
    for name in s_dense:
        if name in n_dense and not all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
                                       for x, y in zip(s_dense[name], n_dense[name], strict=True)):
            changes.append(f"the statistics of the dense feature {name!r}")
    return changes
