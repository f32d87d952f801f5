"""The synthetic dataset: determinism, schema, planted structure, and that the truth is recoverable."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from recsys.data.batching import BatchDataset
from recsys.data.encoders import Preprocessor
from recsys.data.raw import RawData
from recsys.data.schema import DenseTransform, FeatureKind, Schema
from recsys.data.synthetic import (
    FeatureRole,
    GroundTruth,
    SyntheticConfig,
    SyntheticReader,
    generate,
    oracle_auc,
    roc_auc,
)
from recsys.models.archs import DCNv2


@pytest.fixture(scope="module")
def data() -> tuple[RawData, GroundTruth]:
    return generate(SyntheticConfig(n_rows=100_000, seed=0))


def heldout_gain(cells: pd.Series, kind: FeatureKind, y: np.ndarray, m: float = 20.0, bins: int = 16) -> float:
    """Model-free, bias-free mutual-information estimate (nats/row) of one feature with the label.

    2-fold cross-fitted log-loss gain over the prior of a smoothed target encoding (naive Bayes
    over the tokens of a multi-hot cell; dense values in quantile bins, NaN its own bin). Plug-in
    MI is biased upward by the number of categories; this is ~0 (or slightly negative) for noise.
    """
    n = len(y)
    if kind is FeatureKind.DENSE:
        x = cells.to_numpy(dtype=np.float64)
        edges = np.nanquantile(x, np.linspace(0, 1, bins + 1)[1:-1])
        rows, toks = np.arange(n), np.where(np.isnan(x), 0, np.searchsorted(edges, x) + 1)
    elif kind is FeatureKind.MULTI_CATEGORICAL:
        parts = cells.reset_index(drop=True).str.split("|", regex=False).explode()
        parts = parts[parts != ""]
        rows, toks = parts.index.to_numpy(dtype=np.int64), pd.factorize(parts.to_numpy(dtype=object))[0]
    else:
        rows, toks = np.arange(n), pd.factorize(cells.to_numpy(dtype=object))[0]
    fold = np.arange(n) % 2
    gain = 0.0
    for k in range(2):
        fit = fold[rows] != k
        prior = y[fold != k].mean()
        prior_logit = np.log(prior / (1 - prior))
        count = np.bincount(toks[fit], minlength=toks.max() + 1)
        pos = np.bincount(toks[fit], weights=y[rows[fit]], minlength=toks.max() + 1)
        te = (pos + m * prior) / (count + m)
        score = np.full(n, prior_logit)
        np.add.at(score, rows[~fit], (np.log(te / (1 - te)) - prior_logit)[toks[~fit]])
        p, yk = 1 / (1 + np.exp(-score[fold == k])), y[fold == k]
        loss = -(yk * np.log(p) + (1 - yk) * np.log(1 - p)).mean()
        loss0 = -(yk * np.log(prior) + (1 - yk) * np.log(1 - prior)).mean()
        gain += (loss0 - loss) / 2
    return float(gain)


# -- determinism, schema ------------------------------------------------------------------------
def test_same_seed_same_data_other_seed_other_data() -> None:
    a, ta = generate(SyntheticConfig(n_rows=3000, seed=7))
    b, tb = generate(SyntheticConfig(n_rows=3000, seed=7))
    pd.testing.assert_frame_equal(a.frame, b.frame)
    assert ta.to_dict() == tb.to_dict()
    c, tc = generate(SyntheticConfig(n_rows=3000, seed=8))
    assert (a.frame["user_id"] != c.frame["user_id"]).mean() > 0.9
    assert not np.array_equal(a.labels, c.labels)
    assert ta.bias != tc.bias
    # features draw from their own streams: extra noise features leave the others unchanged
    d, _ = generate(SyntheticConfig(n_rows=3000, seed=7, n_noise=8, n_noise_dense=3))
    pd.testing.assert_frame_equal(a.frame, d.frame[a.frame.columns])


def test_schema_matches_frame(data: tuple[RawData, GroundTruth]) -> None:
    raw, truth = data
    frame, schema = raw.frame, raw.schema
    assert schema.name == "synthetic" and schema.label == "label"
    assert list(frame.columns) == [*schema.names, "label"]
    assert truth.names() == schema.names
    assert frame.index[0] == 1 and frame.index[-1] == len(frame) and frame.index.is_monotonic_increasing
    assert set(np.unique(frame["label"])) == {0, 1} and pd.api.types.is_integer_dtype(frame["label"])
    assert 0.2 <= truth.ctr <= 0.3
    assert schema["tags"].kind is FeatureKind.MULTI_CATEGORICAL
    assert schema["noise_tags"].kind is FeatureKind.MULTI_CATEGORICAL
    assert all(f.embedding_dim == 16 for f in schema.sparse)
    for f in schema.dense:
        assert f.transform in (DenseTransform.STANDARDIZE, DenseTransform.NONE)
        assert frame[f.name].dtype == np.float64
    for f in schema.sparse:
        assert frame[f.name].map(type).eq(str).all(), f.name
    # roles come from the truth, and every role is present
    assert {f.role for f in truth.features} == set(FeatureRole)
    assert truth["user_id_copy"].source == "user_id" and truth["item_near_copy"].source == "item_id"
    assert truth["ad_slot"].partner == "daypart" and truth["daypart"].partner == "ad_slot"


def test_reader() -> None:
    reader = SyntheticReader(n_rows=2000, seed=3, embedding_dim=8, n_noise=2)
    assert reader.name == "synthetic"
    raw = reader.read()
    pd.testing.assert_frame_equal(raw.frame, generate(reader.config)[0].frame)
    assert all(f.embedding_dim == 8 for f in raw.schema.sparse)
    assert raw.schema.names.count("noise_c2") == 1 and "noise_c1000" not in raw.schema.names
    assert reader.fingerprint() != SyntheticReader(n_rows=2000, seed=4).fingerprint()
    assert reader.fingerprint() == SyntheticReader(n_rows=2000, seed=3, embedding_dim=8, n_noise=2).fingerprint()
    with pytest.raises(ValueError, match="base_ctr"):
        SyntheticReader(base_ctr=1.5)


def test_many_noise_features_and_small_scale() -> None:
    raw, truth = generate(SyntheticConfig(n_rows=2000, n_noise=10, n_noise_dense=3, cardinality_scale=0.01))
    noise = truth.names(FeatureRole.NOISE)
    assert len(noise) == 10 + 3 + 1  # + noise_tags
    assert "noise_c2_2" in noise and "noise_dense_3" in noise
    assert truth["user_id"].cardinality == 1000
    assert 0.15 <= truth.ctr <= 0.35


# -- planted structure ---------------------------------------------------------------------------
def test_cardinalities_span_2_to_1e5(data: tuple[RawData, GroundTruth]) -> None:
    raw, truth = data
    distinct = {f.name: raw.frame[f.name].nunique() for f in raw.schema.sparse if f.kind is FeatureKind.CATEGORICAL}
    assert min(distinct.values()) == 2
    assert distinct["user_id"] >= 50_000 and truth["user_id"].cardinality == 100_000
    # Zipf-like: a few values take a large share of the rows
    counts = raw.frame["item_id"].value_counts().to_numpy()
    assert counts[: len(counts) // 100].sum() > 0.3 * len(raw)
    counts = raw.frame["user_id"].value_counts().to_numpy()
    assert counts[:1000].sum() > 0.15 * len(raw) and (counts == 1).sum() > 30_000


def test_rare_feature_is_default_in_99_percent(data: tuple[RawData, GroundTruth]) -> None:
    raw, truth = data
    t = truth["promo_flag"]
    assert t.role is FeatureRole.SPARSE_INFORMATIVE and t.default == "0" and t.default_rate == 0.99
    at_default = (raw.frame["promo_flag"] == t.default).mean()
    assert 0.985 <= at_default <= 0.995
    ctr = raw.frame.groupby("promo_flag")["label"].mean()
    assert ctr["1"] > ctr["0"] + 0.4  # rare but strong


def test_redundant_copies_are_bijections(data: tuple[RawData, GroundTruth]) -> None:
    frame = data[0].frame
    src, copy = frame["user_id"], frame["user_id_copy"]
    assert (frame.groupby("user_id")["user_id_copy"].nunique() == 1).all()
    assert (frame.groupby("user_id_copy")["user_id"].nunique() == 1).all()
    assert not set(src).intersection(copy)  # same information, different strings
    price, cents = frame["price"], frame["price_cents"]
    assert price.isna().equals(cents.isna())
    np.testing.assert_array_equal(np.round(price * 100).dropna(), cents.dropna())


def test_near_copy_agrees_on_90_percent(data: tuple[RawData, GroundTruth]) -> None:
    raw, truth = data
    agree = (raw.frame["item_id"] == raw.frame["item_near_copy"]).mean()
    assert truth["item_near_copy"].copy_rate == pytest.approx(0.9)
    assert 0.88 <= agree <= 0.93


def test_dense_nans_and_multi_hot_bags(data: tuple[RawData, GroundTruth]) -> None:
    frame = data[0].frame
    assert 0.015 <= frame["price"].isna().mean() <= 0.025
    assert 0.005 <= frame["noise_dense"].isna().mean() <= 0.015
    bags = frame["tags"].str.split("|", regex=False).map(lambda p: [t for t in p if t])
    lengths = bags.map(len)
    assert lengths.min() == 0 and lengths.max() == 5
    assert 0.1 <= (lengths == 0).mean() <= 0.25
    assert (bags.map(lambda b: len(set(b))) == lengths).all()  # no repeated tag in a bag


def test_interaction_has_no_marginal_signal(data: tuple[RawData, GroundTruth]) -> None:
    raw, truth = data
    contrib = truth.contributions(raw.frame)["ad_slot*daypart"]
    table = pd.DataFrame({"a": raw.frame["ad_slot"], "b": raw.frame["daypart"], "c": contrib})
    # Latin square: every slot sees the same multiset of effects over the dayparts, and vice versa
    cells = table.groupby(["a", "b"])["c"].first().unstack()
    reference = np.sort(cells.to_numpy()[0])
    for values in [*cells.to_numpy(), *cells.to_numpy().T]:
        np.testing.assert_allclose(np.sort(values), reference)


# -- ground truth ----------------------------------------------------------------------------------
def test_ground_truth_round_trip(data: tuple[RawData, GroundTruth], tmp_path) -> None:
    raw, truth = data
    d = truth.to_dict()
    json.dumps(d)
    yaml.safe_dump(d)
    assert raw.schema.extras["ground_truth"] == d == raw.report.notes["ground_truth"]
    back = GroundTruth.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.features == truth.features
    assert GroundTruth.from_raw(raw).to_dict() == d
    raw.schema.save(tmp_path / "schema.yaml")
    assert GroundTruth.from_dict(Schema.load(tmp_path / "schema.yaml").extras["ground_truth"]).to_dict() == d
    # the effect tables are rebuilt from the seed: the copy gives the same logit, row by row
    rows = raw.frame.iloc[::97]
    np.testing.assert_allclose(back.true_logit(rows), truth.true_logit(raw.frame)[::97])
    with pytest.raises(KeyError, match="price"):
        truth.true_logit(raw.frame.drop(columns="price"))


def test_planted_importance(data: tuple[RawData, GroundTruth]) -> None:
    truth = data[1]
    order = truth.importance_order()
    assert order[:3] == ["item_id", "site_category", "tags"]
    assert set(order) == set(truth.signal)
    strengths = [truth[n].strength for n in order]
    assert strengths == sorted(strengths, reverse=True)
    for f in truth.features:
        if f.role in (FeatureRole.NOISE, FeatureRole.REDUNDANT, FeatureRole.NEAR_REDUNDANT):
            assert f.strength == 0 and f.contribution_std == 0
        else:
            assert f.contribution_std == pytest.approx(f.strength, rel=0.1)
    assert truth["user_id"].learnable_share < 0.3 < truth["item_id"].learnable_share
    assert truth.importance_order(effective=True)[-1] == "user_id"


def test_true_logit_is_calibrated_and_oracle_auc_high(data: tuple[RawData, GroundTruth]) -> None:
    raw, truth = data
    p = truth.true_probability(raw.frame)
    y = raw.labels
    decile = pd.qcut(p, 10, labels=False)
    for k in range(10):
        assert abs(p[decile == k].mean() - y[decile == k].mean()) < 0.02
    auc = oracle_auc(raw)
    assert auc == pytest.approx(truth.oracle_auc) and auc > 0.8
    assert roc_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)


def test_truth_recoverable_from_data_alone(data: tuple[RawData, GroundTruth]) -> None:
    raw, truth = data
    frame = raw.frame.iloc[:50_000]
    y = frame["label"].to_numpy(dtype=np.float64)
    gain = {f.name: heldout_gain(frame[f.name], f.kind, y) for f in raw.schema.features}
    pair = heldout_gain(frame["ad_slot"] + "*" + frame["daypart"], FeatureKind.CATEGORICAL, y)
    informative = truth.names(FeatureRole.INFORMATIVE, FeatureRole.SPARSE_INFORMATIVE)
    noise = truth.names(FeatureRole.NOISE)
    assert min(gain[n] for n in informative) > max(gain[n] for n in noise)
    assert min(gain[n] for n in informative) > 0.0005
    assert all(abs(gain[n]) < 0.005 for n in noise)  # ~0 nats
    # the interaction: nothing alone, clear signal as a pair
    assert abs(gain["ad_slot"]) < 0.001 and abs(gain["daypart"]) < 0.001 and pair > 0.005
    # exact copies carry exactly the source's information; the near-copy most of it
    assert gain["user_id_copy"] == pytest.approx(gain["user_id"])
    assert gain["price_cents"] == pytest.approx(gain["price"])
    assert 0.5 * gain["item_id"] < gain["item_near_copy"] < gain["item_id"]
    # measured order follows the planted (sample-effective) order
    measured = {n: gain[n] for n in informative} | {"ad_slot": pair}
    planted = {n: truth[n].effective_strength for n in measured}
    rho = pd.Series(measured).rank().corr(pd.Series(planted).rank())
    assert rho > 0.8


# -- end to end --------------------------------------------------------------------------------------
@pytest.fixture
def one_thread():
    """One intra-op thread: tiny batches on a shared 2-core machine are faster without sync."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_dcnv2_learns_the_signal(one_thread: None) -> None:
    torch.manual_seed(0)
    raw, truth = generate(SyntheticConfig(n_rows=20_000, seed=0, embedding_dim=8))
    train, test = raw.frame.iloc[:16_000], raw.frame.iloc[16_000:]
    pre = Preprocessor(raw.schema).fit(train)
    train_data, test_data = pre.transform(train), pre.transform(test)
    model = DCNv2(pre.fitted_schema, cross_layers=2, deep_mlp=[64, 32])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for batch in BatchDataset(train_data, 256, shuffle=True, seed=0):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(batch.dense_features, batch.sparse_features), batch.labels
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        batch = next(iter(BatchDataset(test_data, len(test_data))))
        scores = model(batch.dense_features, batch.sparse_features).numpy()
    auc = roc_auc(scores, test_data.labels)
    ceiling = roc_auc(truth.true_logit(test), test_data.labels)
    assert 0.65 < auc < ceiling + 0.01
