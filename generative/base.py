"""The one interface every next-item model implements, and the conventions they share.

Conventions (every module of :mod:`generative` follows them):

* **Item indices** are ``1..num_items``; ``0`` is padding. Readers remap raw ids to this range
  and keep the raw ids/labels for display.
* **Histories** are int64 tensors ``[B, T]``, *left*-padded with ``0`` (the most recent item is
  the last column); ``T`` is at most ``max_history`` (20 by default).
* **Semantic IDs**: ``codes`` is an int64 array ``[num_items + 1, L]``; row ``i`` holds item
  ``i``'s code per level (the last level is the collision/disambiguation token when the codebook
  was disambiguated); row 0 is ``-1``. Level ``l`` has ``level_sizes[l]`` codes.

A model class is registered by its ``name``, which is ``model.arch`` of
:class:`~generative.train.GenerativeTask`; the task builds it from the data's :class:`Catalog`
with :meth:`NextItemModel.from_catalog`, so adding an architecture is one new class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from recsys.registry import Registered

__all__ = ["Catalog", "NextItemModel"]


@dataclass
class Catalog:
    """What a model needs from the data (and what its checkpoint stores to be rebuilt)."""

    dataset: str
    num_items: int
    train_targets: np.ndarray  # [n_train] item index of every training target
    tail: np.ndarray  # bool [num_items + 1]
    codes: np.ndarray | None = None  # [num_items + 1, L]
    level_sizes: list[int] | None = None
    item_vectors: np.ndarray | None = None  # [num_items + 1, d]
    codebook_stats: dict[str, Any] = field(default_factory=dict)

    def to_state(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "num_items": self.num_items,
            "train_targets": torch.tensor(np.asarray(self.train_targets, dtype=np.int64)),
            "tail": torch.tensor(np.asarray(self.tail, dtype=bool)),
            "codes": None if self.codes is None else torch.tensor(np.asarray(self.codes, dtype=np.int64)),
            "level_sizes": self.level_sizes,
            "item_vectors": None if self.item_vectors is None else torch.tensor(np.asarray(self.item_vectors, dtype=np.float32)),
            "codebook_stats": self.codebook_stats,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Catalog:
        def arr(key: str) -> np.ndarray | None:
            value = state.get(key)
            return None if value is None else value.numpy()

        return cls(
            dataset=state["dataset"],
            num_items=int(state["num_items"]),
            train_targets=arr("train_targets"),  # type: ignore[arg-type]
            tail=arr("tail"),  # type: ignore[arg-type]
            codes=arr("codes"),
            level_sizes=state.get("level_sizes"),
            item_vectors=arr("item_vectors"),
            codebook_stats=dict(state.get("codebook_stats") or {}),
        )


class NextItemModel(Registered, nn.Module, ABC):
    """A model that learns ``history -> next item`` and recommends the top-k next items.

    Subclasses that set ``name`` are registered (``model.arch``) and built by :meth:`from_catalog`.
    """

    kind: ClassVar[str] = "next-item model"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    #: built on semantic IDs: the data module builds the codebook, the task fits a token
    #: weighting (``loss`` of :meth:`from_catalog`) and evaluates with ``beam_size`` beams
    uses_semantic_ids: ClassVar[bool] = False

    num_items: int

    @classmethod
    def from_catalog(cls, catalog: Catalog, loss: nn.Module | None = None, **options: Any) -> NextItemModel:
        """The model for ``catalog`` with ``options`` (``model.arch``'s ``init_args``); ``loss`` is the
        fitted token weighting of a model that :attr:`uses_semantic_ids` (None otherwise)."""
        raise NotImplementedError(f"{cls.__name__} does not implement from_catalog, so GenerativeTask cannot build it")

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
