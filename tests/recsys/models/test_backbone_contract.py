"""One contract every backbone passes, generated from the classes (a backbone is one
``RankingModel`` subclass; nothing lists them): it builds on a fitted schema with sparse, dense
and vector features, scores a batch as ``[B]`` finite logits, sends gradients to every parameter
(embedding tables included), is deterministic for a seed, and turns every point of its tuning
space into constructor arguments that build."""

from __future__ import annotations

import inspect

import numpy as np
import optuna
import pandas as pd
import pytest
import torch

import recsys.models  # noqa: F401 - imports every built-in backbone
from recsys.data.batching import random_batch
from recsys.data.encoders import Preprocessor
from recsys.data.schema import FeatureSpec, Schema
from recsys.models.base import RankingModel


def _backbones() -> list[type[RankingModel]]:
    """Every concrete RankingModel subclass of the package (plug-in test toys excluded)."""
    found, todo = [], list(RankingModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if not inspect.isabstract(cls) and not cls.__name__.startswith("_") and cls.__module__.startswith("recsys."):
            found.append(cls)
    return sorted(set(found), key=lambda c: c.__name__)


BACKBONES = _backbones()


def _schema() -> Schema:
    rng = np.random.default_rng(0)
    n = 200
    frame = pd.DataFrame({
        "user": [f"u{i}" for i in rng.integers(0, 12, n)], "item": [f"i{i}" for i in rng.integers(0, 30, n)],
        "price": rng.gamma(2.0, 2.0, n), **{f"emb_{i}": rng.normal(size=n) for i in range(3)},
        "click": rng.integers(0, 2, n),
    })
    spec = Schema((FeatureSpec("user", embedding_dim=8), FeatureSpec("item", embedding_dim=8),
                   FeatureSpec("price", kind="dense", transform="log1p"), FeatureSpec("emb", kind="vector", dim=3)),
                  label="click")
    return Preprocessor(spec).fit(frame).fitted_schema


def test_the_backbones_are_found() -> None:
    assert {"DCNv2", "DeepFM", "DLRM"} <= {c.__name__ for c in BACKBONES}


@pytest.mark.parametrize("backbone", BACKBONES, ids=lambda c: c.__name__)
def test_every_backbone_scores_trains_and_is_seeded(backbone: type[RankingModel]) -> None:
    schema = _schema()
    torch.manual_seed(0)
    model = backbone(schema)
    batch = random_batch(schema, 32, seed=1)
    logits = model(batch.dense_features, batch.sparse_features)
    assert logits.shape == (32,) and torch.isfinite(logits).all()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels.float())
    loss.backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum())]
    assert not missing, f"{backbone.__name__}: no gradient reaches {missing}"
    torch.manual_seed(0)
    again = backbone(schema)
    torch.testing.assert_close(again(batch.dense_features, batch.sparse_features), logits.detach())


@pytest.mark.parametrize("backbone", BACKBONES, ids=lambda c: c.__name__)
def test_every_point_of_a_backbones_tuning_space_builds(backbone: type[RankingModel]) -> None:
    schema = _schema()
    space = backbone.search_space()
    assert space, f"{backbone.__name__} offers nothing to tune"
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = optuna.create_study(sampler=sampler)
    for _ in range(6):
        trial = study.ask(space)
        model = backbone(schema, **backbone.tuned_args(trial.params))
        model.eval()
        batch = random_batch(schema, 4, seed=2)
        assert model(batch.dense_features, batch.sparse_features).shape == (4,)
        study.tell(trial, 0.0)
