"""Test/validation metrics of a model on encoded data, outside a Lightning trainer."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.nn.functional import binary_cross_entropy_with_logits

from recsys.data.streaming.split_view import SplitData, batch_dataset
from recsys.metrics import binary_auc

__all__ = ["evaluate", "evaluate_with_scores"]


def evaluate(model: Any, data: SplitData, batch_size: int = 4096, train_mode: bool = False) -> dict[str, float]:
    """``auc`` (:func:`recsys.metrics.binary_auc`, the same AUC the trainer's streaming
    ``BinaryAUROC`` logs) and ``logloss`` (mean BCE on the logits) of a ``forward(dense, kjt) -> logits`` module on ``data``.

    ``data`` in memory or a streamed view of its shards (read shard by shard; the logits and
    labels, 8 bytes per row, are what grows with the rows).
    Runs without gradients in eval mode (``train_mode=True``: training mode, e.g. sampled
    gates); the module's mode is restored afterwards.
    """
    z, y = _logits(model, data, batch_size, train_mode)
    return _metrics(z, y)


def evaluate_with_scores(
    model: Any, data: SplitData, batch_size: int = 4096, train_mode: bool = False
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """:func:`evaluate`'s metrics plus the rows' labels (N,) and probabilities (N,), float32 in
    ``data``'s order: the input of a paired comparison with another model on the same rows
    (:func:`recsys.stats.delong`)."""
    z, y = _logits(model, data, batch_size, train_mode)
    return _metrics(z, y), y.numpy().astype(np.float32), torch.sigmoid(z).numpy().astype(np.float32)


def _logits(model: Any, data: SplitData, batch_size: int, train_mode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    was_training = model.training
    model.train(train_mode)
    logits, labels = [], []
    try:
        with torch.no_grad():
            for batch in batch_dataset(data, batch_size):
                logits.append(model(batch.dense_features, batch.sparse_features))
                labels.append(batch.labels)
    finally:
        model.train(was_training)
    return torch.cat(logits).float(), torch.cat(labels).float()


def _metrics(z: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {"auc": binary_auc(z, y), "logloss": float(binary_cross_entropy_with_logits(z, y))}
