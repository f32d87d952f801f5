"""Adding a token weighting, an item content type or a model architecture is one new class with a
``name``: nothing else names it, and it is used by that name through the same path as the
built-in ones (``model.weighting``, ``data.content``, ``model.arch`` of ``salience gen fit``).

The toy classes are defined inside fixtures, which take them out of the (process-wide)
registries again, so other tests see only the built-in names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from generative.base import Catalog, NextItemModel
from generative.content import ConcatContent, ItemContent
from generative.data import LeaveOneOut, SequenceData
from generative.model import SIDRecommender
from generative.train import GenerativeTask, SequenceDataModule
from generative.weighting import TokenWeighting, token_cross_entropy
from recsys.registry import Registered

SMALL = {"d_model": 16, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ff_dim": 32, "dropout": 0.0,
         "history_tokens": "item"}


def _unregister(base: type[Registered], cls: type) -> None:
    assert base._registry.pop(cls.name) is cls


@pytest.fixture
def first_level_weighting() -> Iterator[type[TokenWeighting]]:
    class FirstLevelOnly(TokenWeighting):
        """Toy weighting: only the first SID position counts."""

        name = "first-level-only"

        def weighted(self, ce: Tensor, labels: Tensor) -> Tensor:
            return ce[:, 0].mean()

        def weights_table(self) -> dict[str, Any]:
            levels = self.num_levels or 0
            return {"name": self.name, "position_weights": [1.0] + [0.0] * (levels - 1)}

    yield FirstLevelOnly
    _unregister(TokenWeighting, FirstLevelOnly)


@pytest.fixture
def random_content() -> Iterator[type[ItemContent]]:
    @dataclass
    class RandomContent(ItemContent):
        """Toy content: a seeded random unit vector per item."""

        name: ClassVar[str] = "toy-random"
        dim: int = 8
        seed: int = 0

        def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
            rows = np.random.default_rng(self.seed).normal(size=(data.num_items, self.dim))
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            self._report = {"dim": self.dim}
            return np.vstack([np.zeros((1, self.dim)), rows]).astype(np.float32)

    yield RandomContent
    _unregister(ItemContent, RandomContent)


@pytest.fixture
def popularity_arch() -> Iterator[type[NextItemModel]]:
    class MostPopular(NextItemModel):
        """Toy architecture: the most frequent training targets, whatever the history."""

        name = "toy-most-popular"

        def __init__(self, counts: np.ndarray) -> None:
            super().__init__()
            self.num_items = len(counts) - 1
            self.register_buffer("counts", torch.as_tensor(counts, dtype=torch.float32))
            self.bias = nn.Parameter(torch.zeros(()))  # something for the optimiser

        @classmethod
        def from_catalog(cls, catalog: Catalog, loss: nn.Module | None = None, **options: Any) -> MostPopular:
            return cls(np.bincount(catalog.train_targets, minlength=catalog.num_items + 1))

        def training_loss(self, history: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
            loss = self.bias**2
            return loss, {"loss": float(loss)}

        def recommend(self, history: Tensor, k: int) -> tuple[Tensor, Tensor]:
            scores, items = self.counts[1:].topk(k)
            return (items + 1).expand(len(history), k), scores.expand(len(history), k)

    yield MostPopular
    _unregister(NextItemModel, MostPopular)


def _catalog() -> Catalog:
    """12 items with unique 2-level codes (3 x 4), item 5 the most frequent training target."""
    codes = np.array([[-1, -1], *[[i // 4, i % 4] for i in range(12)]], dtype=np.int64)
    targets = np.array([5, 5, 5, 1, 2, 3, 5, 7, 7, 12], dtype=np.int64)
    return Catalog(dataset="toy", num_items=12, train_targets=targets, tail=np.zeros(13, dtype=bool),
                   codes=codes, level_sizes=[3, 4], item_vectors=None)


def test_a_new_token_weighting_is_one_class(first_level_weighting: type[TokenWeighting]) -> None:
    assert "first-level-only" in TokenWeighting.registered_names()
    model = GenerativeTask(arch={"class_path": "sid", "init_args": SMALL}, weighting="first-level-only").build(_catalog())
    assert isinstance(model, SIDRecommender) and isinstance(model.loss_fn, first_level_weighting)
    assert model.loss_fn.num_levels == 2 and model.loss_fn.weights_table()["position_weights"] == [1.0, 0.0]
    history = torch.tensor([[0, 1, 2], [3, 4, 5]])
    target = torch.tensor([6, 7])
    loss, _ = model.training_loss(history, target)
    labels = model.codes[target]
    expected = token_cross_entropy(model.transformer(history, labels), labels)[:, 0].mean()
    assert torch.allclose(loss, expected)
    loss.backward()  # the loss trains the model like a built-in weighting's
    assert model.transformer.decoder_position.weight.grad is not None


def test_a_new_item_content_is_one_class(random_content: type[ItemContent]) -> None:
    assert "toy-random" in ItemContent.registered_names()
    dm = SequenceDataModule(dataset="synthetic", content={"class_path": "toy-random", "init_args": {"dim": 6}},
                            codebook={"class_path": "rq-kmeans", "init_args": {"levels": 2, "codebook_size": 16}})
    vectors = dm.item_vectors
    assert vectors.shape == (dm.data.num_items + 1, 6) and not vectors[0].any()
    assert np.allclose(np.linalg.norm(vectors[1:], axis=1), 1.0, atol=1e-5)
    assert dm.catalog().codes.shape[0] == dm.data.num_items + 1  # the codebook is built on it
    # and ``concat`` finds it by name too, passing on the settings it has
    both = ConcatContent(parts=("attributes", "toy-random"), dim=4, seed=1)
    joined = both.vectors(dm.data, dm.split)
    assert joined.shape[1] <= 4 + 4 and both.report["toy-random.dim"] == 4


def test_a_new_architecture_is_one_class(popularity_arch: type[NextItemModel]) -> None:
    assert {"sasrec", "sid", "toy-most-popular"} <= set(NextItemModel.registered_names())
    task = GenerativeTask(arch="toy-most-popular")
    model = task.build(_catalog())
    assert isinstance(model, popularity_arch) and not model.uses_semantic_ids
    items, _ = model.recommend(torch.zeros(2, 3, dtype=torch.long), 2)
    assert items.tolist() == [[5, 7], [5, 7]]
    with pytest.raises(ValueError, match=r"model.arch: unknown next-item model 'gpt'; available: \['sasrec', 'sid', 'toy-most-popular'\]"):
        GenerativeTask(arch="gpt")
