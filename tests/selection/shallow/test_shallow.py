"""The shallow selectors (Lasso, GBDT, random forest, LightGBM) and the table they read.

Planted truth on hand-built encoded rows: two informative fields (a sparse one whose ids set the
click rate, a dense one), an ID-like field (a distinct id in nearly every row) and pure noise.
The contract over every registered method runs them on the synthetic recipe
(tests/selection/test_contract.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from recsys.data.encoders import EncodedData
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from selection.shallow.gbdt import GBDTImportance
from selection.shallow.lasso import LassoImportance
from selection.shallow.lightgbm_importance import LightGBMImportance
from selection.shallow.random_forest import RandomForestImportance
from selection.shallow.tabular import FieldTable, ShallowMethod, field_table

CAT, MULTI, DENSE = FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL, FeatureKind.DENSE
SHALLOW: list[type[ShallowMethod]] = [LassoImportance, GBDTImportance, RandomForestImportance, LightGBMImportance]


def _schema(cards: dict[str, int]) -> Schema:
    return Schema((
        FeatureSpec("signal_id", CAT, embedding_dim=8, num_embeddings=cards["signal_id"]),
        FeatureSpec("row_id", CAT, embedding_dim=8, num_embeddings=cards["row_id"]),
        FeatureSpec("noise_id", CAT, embedding_dim=8, num_embeddings=cards["noise_id"]),
        FeatureSpec("tags", MULTI, embedding_dim=4, num_embeddings=cards["tags"]),
        FeatureSpec("signal_x", DENSE),
        FeatureSpec("noise_x", DENSE),
    ))


def _planted(n: int, seed: int) -> tuple[EncodedData, Schema]:
    """Click logit = effect of signal_id + 1.5 * signal_x; row_id, noise_id, tags, noise_x are noise."""
    rng = np.random.default_rng(seed)
    signal = rng.integers(1, 21, n)
    effect = np.linspace(-2.0, 2.0, 21)[signal]
    x = rng.standard_normal(n)
    noise_x = rng.standard_normal(n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-(effect + 1.5 * x)))).astype(np.float32)
    row_id = rng.permutation(n) + 1  # ID-like: one id per row
    noise = rng.integers(1, 51, n)
    tag_lengths = rng.integers(0, 4, n).astype(np.int32)
    tags = rng.integers(1, 11, int(tag_lengths.sum()))
    ones = np.ones(n, dtype=np.int32)
    data = EncodedData(
        sparse_names=["signal_id", "row_id", "noise_id", "tags"],
        dense_names=["signal_x", "noise_x"],
        values={"signal_id": signal, "row_id": row_id, "noise_id": noise, "tags": tags},
        lengths={"signal_id": ones, "row_id": ones, "noise_id": ones, "tags": tag_lengths},
        dense=np.stack([x, noise_x], axis=1).astype(np.float32),
        labels=labels,
    )
    return data, _schema({"signal_id": 21, "row_id": n + 1, "noise_id": 51, "tags": 11})


def test_field_table_codes_and_one_hot() -> None:
    data, schema = _planted(50, 0)
    table = field_table(data, schema)
    assert table.names == schema.names and table.sparse == [True, True, True, True, False, False]
    np.testing.assert_array_equal(table.codes[:, 0], data.values["signal_id"])
    starts = np.cumsum(data.lengths["tags"]) - data.lengths["tags"]
    first = np.where(data.lengths["tags"] > 0, data.values["tags"][np.minimum(starts, len(data.values["tags"]) - 1)], 0)
    np.testing.assert_array_equal(table.codes[:, 3], first)  # a bag's first id; an empty bag 0
    np.testing.assert_allclose(table.codes[:, 4], data.dense[:, 0])
    x, owner = table.one_hot(max_ids=30)
    assert x.shape == (50, 21 + 30 + 30 + 11 + 2) and owner.tolist().count(1) == 30
    dense = x[:, -2:].toarray()
    np.testing.assert_allclose(dense.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(dense.std(axis=0), 1, atol=1e-5)
    rows = x[:, owner == 1]
    assert rows[:, 0].sum() == (data.values["row_id"] >= 30).sum()  # ids past max_ids share the OOV column
    tag_block = x[:, owner == 3].toarray()
    for i in range(50):  # every distinct id of the bag once
        lo = starts[i]
        want = np.zeros(11)
        want[np.unique(data.values["tags"][lo:lo + data.lengths["tags"][i]])] = 1
        np.testing.assert_array_equal(tag_block[i], want)


def test_lasso_scores_are_the_spread_of_each_fields_logit_contribution() -> None:
    """Plain reference: refit the same logistic regression and recompute std(x_f . w_f)."""
    from sklearn.linear_model import LogisticRegression

    data, schema = _planted(4000, 1)
    table = field_table(data, schema)
    method = LassoImportance(C=0.05, max_ids=100)
    scores, _ = method.fit_scores(table, None)
    x, owner = table.one_hot(100)
    ref = LogisticRegression(l1_ratio=1.0, C=0.05, solver="liblinear", random_state=0, max_iter=200).fit(x, table.labels)
    w = ref.coef_.ravel()
    dense = x.toarray()
    for j, name in enumerate(table.names):
        assert scores[name] == pytest.approx(float(np.std(dense[:, owner == j] @ w[owner == j])), rel=1e-9, abs=1e-12)
    assert scores["noise_x"] == pytest.approx(0.0, abs=0.02)  # the L1 penalty (nearly) zeroes noise
    assert min(scores["signal_id"], scores["signal_x"]) > 5 * max(scores["noise_id"], scores["noise_x"], scores["tags"])


@pytest.mark.parametrize("cls", SHALLOW, ids=lambda c: c.name)
def test_planted_fields_rank_first_and_the_id_like_field_below_them(cls: type[ShallowMethod]) -> None:
    train, schema = _planted(6000, 2)
    val, _ = _planted(2000, 3)
    method = cls(seed=0)
    scores, model = method.fit_scores(field_table(train, schema), field_table(val, schema))
    assert set(scores) == set(schema.names)
    top2 = sorted(scores, key=lambda f: -scores[f])[:2]
    assert set(top2) == {"signal_id", "signal_x"}, scores
    assert scores["row_id"] < min(scores["signal_id"], scores["signal_x"])
    again, _ = cls(seed=0).fit_scores(field_table(train, schema), field_table(val, schema))
    assert again == scores  # deterministic for a seed
    from recsys.metrics import binary_auc

    assert binary_auc(method.predict(model, field_table(val, schema)), val.labels) > 0.7


@pytest.mark.parametrize("cls", SHALLOW, ids=lambda c: c.name)
def test_bad_options_are_refused(cls: type[ShallowMethod]) -> None:
    with pytest.raises(ValueError, match="max_rows"):
        cls(max_rows=0)


def test_lasso_refuses_a_non_positive_c() -> None:
    with pytest.raises(ValueError, match="C > 0"):
        LassoImportance(C=0.0)


def test_table_length_and_dense_stats() -> None:
    data, schema = _planted(100, 4)
    table = field_table(data, schema)
    assert isinstance(table, FieldTable) and len(table) == 100
    stats = table.dense_stats()
    assert set(stats) == {"signal_x", "noise_x"}
    assert stats["signal_x"][0] == pytest.approx(float(data.dense[:, 0].mean()), rel=1e-5)
