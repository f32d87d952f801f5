"""LightningDataModule over :func:`recsys.data.prepare.prepare_data` (splits in memory) or over
an encoded shard set streamed with bounded memory (:mod:`recsys.data.streaming.batching`)."""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
from torch.utils.data import DataLoader

from recsys.data.batching import BatchDataset
from recsys.data.encoders import EncodedData, Preprocessor
from recsys.data.prepare import PrepareConfig, PreparedData, SplitConfig, prepare_data
from recsys.data.readers.base import Reader
from recsys.data.readers.spans import SPAN_BYTES
from recsys.data.schema import Schema
from recsys.data.streaming.batching import ResumableLoader, ShardBatchDataset, select_columns
from recsys.data.streaming.shards import ShardSet
from recsys.data.streaming.split_view import SplitData, SplitView, sample_rows

__all__ = ["CTRDataModule", "encoder_changes", "restrict_preprocessor", "saved_preprocessor", "saved_preprocessor_state"]

log = logging.getLogger(__name__)


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
        shards: stream the splits from this encoded shard-set folder (:mod:`recsys.data.streaming.shards`)
            instead of preparing them in memory: at most ``buffer_shards`` shards are loaded at a
            time, the training order is shuffled by shard and within a buffer, and a mid-epoch
            checkpoint resumes at the next batch (:mod:`recsys.data.streaming.batching`). The split,
            vocabularies and dense statistics are the shard set's (``split`` does not apply);
            ``features``, ``drop_features`` and ``embedding_dim`` select and size a view of it.
        buffer_shards: shards loaded and shuffled together in streamed training.
        streaming: stream the data without ever holding it in memory: the reader's files are
            encoded into a shard set under ``cache_dir`` in two streaming passes
            (:func:`recsys.data.streaming.prepare.prepare_shards`: vocabularies and statistics
            from the training rows, then every split into shards; cached like ``prepare_data``)
            and read as with ``shards``. ``split`` applies (random, predefined files or a time
            column, :class:`~recsys.data.splits.SplitConfig`).
        rows_per_shard: rows per shard file that ``streaming`` writes (None: sized by bytes, about
            256 MB of encoded rows and at most 262,144 rows, :func:`~recsys.data.streaming.chunking.shard_rows`;
            the buffer of ``buffer_shards`` shards is then bounded at any width).
        engine: how ``streaming`` prepares the shards: ``local`` (one process,
            :func:`~recsys.data.streaming.prepare.prepare_shards`) or ``dask`` (one task per input
            file on a Dask cluster, :func:`~recsys.data.streaming.dask_cluster.prepare_shards_distributed`;
            the ``distributed`` extra). See ``docs/multi-node.md``.
        scheduler: the Dask scheduler address (``tcp://host:8786``) of ``engine: dask``; null
            starts a local cluster of one worker process per core.
        span_mb: ``engine: dask`` cuts a plain text file larger than this many MiB into spans of
            whole lines, one task each (null: one task per file; part of the cache key).
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
        shards: str | None = None,
        buffer_shards: int = 4,
        streaming: bool = False,
        rows_per_shard: int | None = None,
        engine: Literal["local", "dask"] = "local",
        scheduler: str | None = None,
        span_mb: int | None = SPAN_BYTES >> 20,
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
        self.shards = shards
        if buffer_shards < 1:
            raise ValueError(f"data.buffer_shards must be >= 1, got {buffer_shards}")
        self.buffer_shards = buffer_shards
        if streaming and cache_dir is None:
            raise ValueError("data.streaming writes its shards under data.cache_dir: set a cache folder")
        self._stream_raw = streaming
        self.rows_per_shard = rows_per_shard
        if engine not in ("local", "dask"):
            raise ValueError(f"data.engine must be 'local' or 'dask', got {engine!r}")
        self.engine = engine
        self.scheduler = scheduler
        if span_mb is not None and span_mb < 1:
            raise ValueError(f"data.span_mb must be >= 1 (MiB) or null (one task per file), got {span_mb}")
        self.span_mb = span_mb
        self._prepared: PreparedData | None = None
        self._shard_set: ShardSet | None = None
        self._view: Preprocessor | None = None

    @property
    def streaming(self) -> bool:
        """Whether the splits are streamed from shards (``shards`` or ``streaming`` set) rather
        than held in memory."""
        return self.shards is not None or self._stream_raw

    @property
    def prepared(self) -> PreparedData:
        """Encoded splits (read, split and encoded on first access; cached on disk).

        When streaming, the whole splits are loaded from the shards into memory (for the
        commands that still need them whole); fitting, validating and testing never do that.
        """
        if self._prepared is None:
            if self.streaming:
                log.warning("loading the whole splits of the shard set %s into memory", self.shards)
                columns = self._columns
                splits = {
                    name: select_columns(part.to_encoded(), columns) if columns is not None else part.to_encoded()
                    for name, part in self.shard_set.splits.items()
                    if part.rows
                }
                self._prepared = PreparedData(splits, self.preprocessor, self.shard_set.summary)
            else:
                self._prepared = prepare_data(self.reader, PrepareConfig(
                    self.split, self.features, self.drop_features, self.embedding_dim, self.cache_dir))
        return self._prepared

    # -- streaming -------------------------------------------------------------------------
    def _open_shards(self) -> ShardSet:
        """The shard set a streaming module reads: the folder ``shards`` names, else the reader's
        data prepared into shards under ``cache_dir`` (every feature: ``features`` and
        ``drop_features`` select a view, so a feature selection reuses one shard set)."""
        if self.shards is not None:
            return ShardSet.open(self.shards)
        from recsys.data.streaming.prepare import prepare_shards

        assert self.cache_dir is not None
        config = PrepareConfig(self.split, cache_dir=self.cache_dir, rows_per_shard=self.rows_per_shard)
        if self.engine == "dask":
            from recsys.data.streaming.dask_cluster import prepare_shards_distributed

            span_bytes = None if self.span_mb is None else int(self.span_mb) << 20
            return prepare_shards_distributed(self.reader, config, client=self.scheduler, span_bytes=span_bytes)
        return prepare_shards(self.reader, config)

    @property
    def shard_set(self) -> ShardSet:
        """The opened shard set (streaming only; every shard's size is checked on opening)."""
        if not self.streaming:
            raise ValueError("this data module prepares its splits in memory: set data.streaming (or data.shards) to stream them")
        if self._shard_set is None:
            self._shard_set = self._open_shards()
        return self._shard_set

    @property
    def _columns(self) -> list[str] | None:
        """The features of the view, when it is narrower than the shards."""
        names = self.preprocessor.schema.names
        return names if names != self.shard_set.preprocessor.schema.names else None

    def has_split(self, split: str) -> bool:
        """Whether ``split`` has rows (without loading it when streaming)."""
        if self.streaming:
            part = self.shard_set.splits.get(split)
            return part is not None and part.rows > 0
        return self.prepared.splits.get(split) is not None

    def split_sample(self, split: str, rows: int, seed: int = 0) -> EncodedData:
        """Up to ``rows`` seeded random rows of ``split`` (of its first shard when streaming)."""
        if self.streaming:
            data = self.shard_set.split(split).load(0)
            columns = self._columns
            data = select_columns(data, columns) if columns is not None else data
        else:
            data = self.prepared.splits[split]
        return data.take(np.random.default_rng(seed).permutation(len(data))[:rows])

    def split_data(self, split: str) -> SplitData | None:
        """``split``'s rows: in memory (``EncodedData``), or when streaming a
        :class:`~recsys.data.streaming.split_view.SplitView` of its shards that loads nothing until read
        (:mod:`recsys.data.streaming.split_view` reads both alike). None when the split is empty."""
        if not self.has_split(split):
            return None
        if self.streaming:
            columns = self._columns
            return SplitView(self.shard_set.split(split), tuple(columns) if columns is not None else None,
                             self.buffer_shards)
        return self.prepared.splits[split]

    def sample_rows(self, split: str, rows: int, seed: int = 0) -> EncodedData:
        """A seeded uniform sample of at most ``rows`` rows of ``split`` in row order (every row
        when it has no more), read shard by shard when streaming
        (:func:`~recsys.data.streaming.split_view.sample_rows`)."""
        data = self.split_data(split)
        if data is None:
            raise ValueError(f"the {split!r} split is empty")
        return sample_rows(data, rows, seed)

    def split_labels(self, split: str) -> np.ndarray:
        """The labels of ``split`` in row order (float32, N; shard by shard when streaming)."""
        if self.streaming:
            return np.concatenate([d.labels for d in self.shard_set.split(split).iter_shards()])
        return self.prepared.splits[split].labels

    # -- schema ----------------------------------------------------------------------------
    @property
    def schema(self) -> Schema:
        """The fitted schema of the features trained on (``num_embeddings`` set, without
        ``embedding_dims``); when streaming, read from the shard set without loading rows."""
        return self.preprocessor.fitted_schema

    @property
    def schema_dict(self) -> dict[str, Any]:
        """The fitted schema as a dict (linked to the model's ``schema`` argument by the CLI),
        with ``embedding_dims`` applied."""
        schema = self.preprocessor.fitted_schema if self.streaming else self.prepared.schema
        if self.embedding_dims:
            schema = schema.with_dims(self.embedding_dims)
        return schema.to_dict()

    @property
    def preprocessor(self) -> Preprocessor:
        if not self.streaming:
            return self.prepared.preprocessor
        if self._view is None:
            self._view = restrict_preprocessor(
                self.shard_set.preprocessor, self.features, self.drop_features, self.embedding_dim
            )
        return self._view

    @property
    def summary(self) -> dict[str, Any]:
        """What preparation recorded (rows read and skipped, split sizes, OOV counts, CTR)."""
        return self.shard_set.summary if self.streaming else self.prepared.summary

    @property
    def dataset_name(self) -> str:
        return self.reader.name

    def prepare_data(self) -> None:
        """Lightning calls this in one process per machine before ``setup``: ``streaming`` builds
        its shard set here, so the processes of a distributed run never write the same cache at
        once (they open it in ``setup``)."""
        if self._stream_raw and self.shards is None:
            _ = self.shard_set

    def setup(self, stage: str) -> None:
        _ = self.shard_set if self.streaming else self.prepared

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if train and self.batch_size % world:
            raise ValueError(
                f"data.batch_size={self.batch_size} is the global batch and must split evenly over the "
                f"{world} processes of this run (a multiple of {world})"
            )
        if not self.has_split(split):
            where = f"the shard set {self.shards}" if self.streaming else "data.split"
            raise ValueError(f"the {split!r} split is empty: give it a non-zero fraction in {where}")
        batch_size = self.batch_size if train else self.eval_batch_size
        # pinned host memory makes the host-to-device copy of each batch asynchronous
        pin = trainer is not None and trainer.strategy.root_device.type == "cuda"
        if self.streaming:
            stream = ShardBatchDataset(
                self.shard_set.split(split),
                batch_size,
                train=train,
                seed=self.shuffle_seed,
                buffer_shards=self.buffer_shards,
                rank=rank,
                world_size=world,
                columns=self._columns,
            )
            # the training position travels with checkpoints (a mid-epoch resume continues it)
            if train:
                return ResumableLoader(stream, pin_memory=pin)
            return DataLoader(stream, batch_size=None, pin_memory=pin)
        ds = BatchDataset(
            self.prepared.splits[split],
            batch_size,
            shuffle=train,
            seed=self.shuffle_seed,
            rank=rank,
            world_size=world,
            pad=not train,
        )
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
        """Saved in checkpoints: the fitted encoders, so a checkpoint alone can be exported.

        The encoders go in as one Arrow IPC byte string (``preprocessor_arrow``,
        :meth:`Preprocessor.to_bytes`): pickled as lists, each of millions of vocabulary tokens
        and counts is a Python object that ``torch.save`` memoises, about 150 bytes of memory
        each while the checkpoint is written (2.8 GB for the 9.25M ids of the 45M-row scale
        benchmark); the byte string costs ~3 bytes per token and makes no object per token.
        """
        return {"preprocessor_arrow": self.preprocessor.to_bytes(), "summary": self.summary}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check a checkpoint's encoders against the ones rebuilt from the data (+ seed).

        The encoders are rebuilt, not restored: equal ones mean the checkpoint's embedding rows
        and dense statistics still mean what they meant. Different ones mean the data changed
        since the checkpoint was written, and resuming (or evaluating) from it would silently
        pair rows with other categories.

        Raises:
            ValueError: the encoders differ; the message names the checkpoint and what changed.
        """
        arrow = state_dict.get("preprocessor_arrow")
        if arrow is not None and Preprocessor.from_bytes(arrow).same_encoders(self.preprocessor):
            return  # compared array to array (a state dict holds a Python string per token: GBs at 45M rows)
        saved = saved_preprocessor_state(state_dict)
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


def restrict_preprocessor(
    pre: Preprocessor, features: list[str] | None, drop_features: list[str] | None, embedding_dim: int | None
) -> Preprocessor:
    """The fitted encoders of ``pre`` for a view of its features: the ``features`` only (schema
    order), without ``drop_features``, every sparse dim set to ``embedding_dim``; the encoders
    ``prepare_data`` fits with the same options (each feature's encoder depends on its own column
    only). Raises ``SchemaError`` naming an unknown feature."""
    schema = pre.schema.view(features, drop_features, embedding_dim)
    if schema == pre.schema:
        return pre
    names = set(schema.names)
    out = Preprocessor(schema)
    out.vocabularies = {k: v for k, v in pre.vocabularies.items() if k in names}
    out.dense_stats = {k: v for k, v in pre.dense_stats.items() if k in names}
    out.fitted = True
    return out


def saved_preprocessor(data_state: dict[str, Any]) -> Preprocessor | None:
    """The fitted :class:`Preprocessor` a checkpoint's data-module state holds (any of the forms
    of :func:`saved_preprocessor_state`); None when there is none."""
    if data_state.get("preprocessor_arrow") is not None:
        return Preprocessor.from_bytes(data_state["preprocessor_arrow"])
    state = saved_preprocessor_state(data_state)
    return Preprocessor.from_state_dict(state) if state is not None else None


def saved_preprocessor_state(data_state: dict[str, Any]) -> dict[str, Any] | None:
    """The :meth:`Preprocessor.state_dict` a checkpoint's data-module state holds: the Arrow bytes
    :meth:`CTRDataModule.state_dict` writes, or the JSON string or plain dict of checkpoints
    written before it; None when there is none."""
    if data_state.get("preprocessor_arrow") is not None:
        return Preprocessor.from_bytes(data_state["preprocessor_arrow"]).state_dict()
    if data_state.get("preprocessor_json") is not None:
        return dict(json.loads(data_state["preprocessor_json"]))
    saved = data_state.get("preprocessor")
    return dict(saved) if saved is not None else None


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
