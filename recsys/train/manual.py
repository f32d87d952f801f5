"""Manually optimised training over one encoded split: the Lightning path of the dimension
searches (DNIS, iHAS), beside :meth:`recsys.train.recipe.Recipe.fit`'s ``salience fit`` path.

A search trains a model that no config describes (masked tables, a gate at the seam, one
model per cluster) with hand-stepped, sometimes bi-level updates (a weight step on a training
batch, then a mask step on a validation batch), which ``Recipe.fit`` cannot express. Such a
phase is a :class:`ManualTask` (``automatic_optimization = False``; subclasses override
``training_step``) run by :func:`fit_split`: a CPU ``lightning.Trainer`` without logger or
checkpoints over a seeded, shuffled :class:`~recsys.data.batching.BatchDataset`, or streamed
from shards for a :class:`~recsys.data.streaming.split_view.SplitView` (a streaming data module's
``split_data``; memory bounded by a few shards)::

    task = ManualTask(model, [torch.optim.Adam(model.parameters(), lr=1e-3)])
    fit_split(task, train, batch_size=256, epochs=2, seed=0, max_batches=100)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader

from recsys.data.streaming.split_view import SplitData, batch_dataset
from recsys.train.cli import TRAINER_DEFAULTS
from recsys.train.recipe import quiet_lightning

__all__ = ["ManualTask", "bce_loss", "fit_split"]


def bce_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Mean BCE of ``model(dense, kjt) -> logits`` on a :class:`~torchrec.datasets.utils.Batch`."""
    logits = model(batch.dense_features, batch.sparse_features)
    return nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)


class ManualTask(pl.LightningModule):
    """A ranking model trained by hand-stepped optimizers (manual optimisation).

    The default ``training_step`` is ordinary training: one BCE step of the first optimizer
    per batch. Subclasses override it for other updates (e.g. bi-level ones), stepping with
    :meth:`take_step`.

    Args:
        model: a ``forward(dense, kjt) -> logits`` module (B x D_dense, KJT -> B).
        optimizers: its optimizers, in the order ``self.optimizers()`` returns them.
    """

    def __init__(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model = model
        self._given_optimizers = list(optimizers)
        if not self._given_optimizers:
            raise ValueError("a ManualTask needs at least one optimizer")

    def forward(self, batch: Any) -> torch.Tensor:
        return self.model(batch.dense_features, batch.sparse_features)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self._given_optimizers)

    def step_optimizers(self) -> list[Any]:
        """The optimizers (Lightning's wrappers) as a list, also when there is only one."""
        opts = self.optimizers()
        return list(opts) if isinstance(opts, list) else [opts]

    def take_step(self, optimizer: Any, loss: torch.Tensor) -> None:
        """``zero_grad`` (to None), backward of ``loss``, ``step`` of one optimizer."""
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        optimizer.step()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.take_step(self.step_optimizers()[0], bce_loss(self.model, batch))


class _SplitEpochs(Callback):
    """Sets the shuffled dataset's epoch to ``offset + trainer.current_epoch`` (the batch order
    of epoch ``offset + e``) and stops the fit after ``max_batches`` training batches."""

    def __init__(self, dataset: Any, offset: int, max_batches: int | None) -> None:
        self.dataset = dataset
        self.offset = int(offset)
        self.max_batches = max_batches
        self.batches = 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.dataset.set_epoch(self.offset + trainer.current_epoch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.batches += 1
        if self.max_batches is not None and self.batches >= self.max_batches:
            trainer.should_stop = True


def fit_split(
    task: pl.LightningModule,
    data: SplitData,
    *,
    batch_size: int,
    epochs: int,
    seed: int,
    max_batches: int | None = None,
    epoch_offset: int = 0,
    quiet: bool = True,
    root_dir: str | Path | None = None,
) -> int:
    """Train ``task`` for ``epochs`` passes over ``data`` with a CPU ``lightning.Trainer``.

    Epoch ``e`` walks ``BatchDataset(data, batch_size, shuffle=True, seed=seed)`` at epoch
    ``epoch_offset + e`` (rows permuted by ``seed + epoch_offset + e``), so a phase that follows
    another continues its epoch numbering. A :class:`~recsys.data.streaming.split_view.SplitView` is
    streamed in the seeded training order of
    :func:`~recsys.data.streaming.split_view.batch_dataset` (shards permuted per epoch, rows shuffled
    within a buffer of shards) at the same epoch numbers. The trainer takes the ``salience fit`` defaults
    (no logger, deterministic algorithms), no checkpoints and no validation; the loader draws
    its worker seed from a private generator, so the global torch RNG (dropout, gate
    sampling) advances only through the model.

    Args:
        task: a manually optimised module (e.g. a :class:`ManualTask`).
        data: the encoded split to train on, in memory or a view of its shards.
        batch_size: rows per batch.
        epochs: passes over ``data``.
        seed: base seed of the shuffle.
        max_batches: stop after this many training batches in all (None: no cap); whatever
            the number of optimizer steps per batch (Lightning's ``max_steps`` counts those).
        epoch_offset: epoch number of the first pass.
        quiet: progress bar, model summary and Lightning's INFO lines off (as a quiet recipe).
        root_dir: the trainer's ``default_root_dir`` (nothing is written there).

    Returns:
        the number of training batches run.
    """
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    if epochs == 0 or (max_batches is not None and max_batches <= 0) or len(data) == 0:
        return 0
    dataset = batch_dataset(data, batch_size, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=None, generator=torch.Generator())
    counter = _SplitEpochs(dataset, epoch_offset, max_batches)
    settings: dict[str, Any] = {
        **TRAINER_DEFAULTS,
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": int(epochs),
        "callbacks": [counter],
        "enable_checkpointing": False,
        "enable_progress_bar": not quiet,
        "enable_model_summary": not quiet,
        "limit_val_batches": 0,
    }
    if root_dir is not None:
        settings["default_root_dir"] = str(root_dir)
    with quiet_lightning(quiet):
        trainer = pl.Trainer(**settings)
        trainer.fit(task, train_dataloaders=loader)
    return counter.batches
