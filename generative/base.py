"""The one interface every next-item model implements, and the conventions they share.

Conventions (every module of :mod:`generative` follows them):

* **Item indices** are ``1..num_items``; ``0`` is padding. Readers remap raw ids to this range
  and keep the raw ids/labels for display.
* **Histories** are int64 tensors ``[B, T]``, *left*-padded with ``0`` (the most recent item is
  the last column); ``T`` is at most ``max_history`` (20 by default).
* **Semantic IDs**: ``codes`` is an int64 array ``[num_items + 1, L]``; row ``i`` holds item
  ``i``'s code per level (the last level is the collision/disambiguation token when the codebook
  was disambiguated); row 0 is ``-1``. Level ``l`` has ``level_sizes[l]`` codes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["NextItemModel"]


class NextItemModel(nn.Module, ABC):
    """A model that learns ``history -> next item`` and recommends the top-k next items."""

    num_items: int

    @abstractmethod
    def training_loss(self, history: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Loss of predicting ``target`` ``[B]`` from ``history`` ``[B, T]``, plus scalars to log."""

    @abstractmethod
    def recommend(self, history: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Top-``k`` items ``[B, k]`` (int64 item indices, best first) and their scores ``[B, k]``."""

    @torch.no_grad()
    def recommend_batched(self, history: Tensor, k: int, batch_size: int = 256, **options: Any) -> tuple[Tensor, Tensor]:
        """:meth:`recommend` (with ``options``, e.g. ``beam_size``) over a large ``history`` in chunks, in eval mode."""
        was_training = self.training
        self.eval()
        try:
            parts = [self.recommend(history[i : i + batch_size], k, **options) for i in range(0, len(history), batch_size)]
        finally:
            self.train(was_training)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
