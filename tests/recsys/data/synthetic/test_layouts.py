"""Configurable synthetic layouts: the default stays bit-identical, the 40-field selection benchmark, dims."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from recsys.data.encoders import Preprocessor
from recsys.data.raw import RawData
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.synthetic import (
    BY_CARDINALITY,
    FeatureRole,
    GroundTruth,
    SyntheticConfig,
    SyntheticReader,
    dim_for_cardinality,
    generate,
    heterogeneous_dims,
    oracle_auc,
    roc_auc,
    selection_benchmark_config,
)

SIGNAL = (FeatureRole.INFORMATIVE, FeatureRole.SPARSE_INFORMATIVE)


def frame_hash(frame: pd.DataFrame) -> str:
    return hashlib.sha256(frame.to_csv().encode()).hexdigest()


@pytest.fixture(scope="module")
def bench() -> tuple[RawData, GroundTruth]:
    return generate(selection_benchmark_config(n_rows=100_000, seed=0))


# -- the default layout is unchanged -----------------------------------------------------------------
def test_default_data_unchanged() -> None:
    # sha256 of ``frame.to_csv()``, computed with the generator as it was before the layout
    # options were added (git HEAD 8de21f4 of recsys/data/synthetic/planted.py): same columns, values, labels
    raw, truth = generate(SyntheticConfig(n_rows=2000))
    assert frame_hash(raw.frame) == "21d6656186b289fd98cd7e43a5ea35b1e7800e8a82ca5d21a05a647eaf18526d"
    assert truth.bias == pytest.approx(-1.6588815240642814, abs=1e-12)
    raw, _ = generate(SyntheticConfig(n_rows=2000, cardinality_scale=0.1, n_noise=8))
    assert frame_hash(raw.frame) == "cf3fdfce7f0b1455e310f957f471db1854747ab4f0dafc8f48c8c76183306295"


def test_layout_options_leave_other_columns_unchanged() -> None:
    base, _ = generate(SyntheticConfig(n_rows=3000, seed=5))
    more, truth = generate(SyntheticConfig(n_rows=3000, seed=5, n_rare_flags=3, n_tag_fields=3))
    features = [c for c in base.frame.columns if c != "label"]
    pd.testing.assert_frame_equal(base.frame[features], more.frame[features])
    assert {"tags_2", "tags_3", "promo_flag_2", "promo_flag_3"} <= set(truth.names(*SIGNAL))
    tokens = more.frame["tags_3"].str.split("|", regex=False).explode()
    assert tokens[tokens != ""].str.startswith("t3_").all()  # its own vocabulary
    fewer, truth = generate(SyntheticConfig(n_rows=3000, seed=5, n_rare_flags=0, n_tag_fields=0,
                                            n_dense_informative=0, interaction=False, near_copy=False))
    gone = {"promo_flag", "tags", "price", "relevance_score", "engagement_score", "price_cents", "ad_slot",
            "daypart", "item_near_copy"}
    assert not gone & set(fewer.frame.columns)
    kept = [c for c in features if c not in gone]
    pd.testing.assert_frame_equal(base.frame[kept], fewer.frame[kept])
    assert "ad_slot*daypart" not in truth.contributions(fewer.frame)
    assert truth.signal == ["user_id", "item_id", "site_category", "device_type"]
    assert oracle_auc(fewer) == pytest.approx(truth.oracle_auc)
    # price_cents only with price; dense informative features in order
    one, truth = generate(SyntheticConfig(n_rows=500, n_dense_informative=1))
    assert [f.name for f in one.schema.dense] == ["price", "price_cents", "noise_dense", "noise_dense_2"]


def test_config_validation() -> None:
    for bad in (dict(n_dense_informative=4), dict(n_rare_flags=-1), dict(n_tag_fields=-1),
                dict(embedding_dim="wide"), dict(embedding_dim=0)):
        with pytest.raises(ValueError):
            SyntheticConfig(**bad)
    with pytest.raises(TypeError, match="n_noisy"):
        selection_benchmark_config(n_noisy=3)


# -- the 40-field selection benchmark -------------------------------------------------------------
def test_selection_layout(bench: tuple[RawData, GroundTruth]) -> None:
    raw, truth = bench
    assert len(raw.schema.features) == 40 and list(raw.frame.columns) == [*raw.schema.names, "label"]
    informative = truth.names(*SIGNAL)
    assert informative == ["user_id", "item_id", "site_category", "device_type", "tags", "tags_2", "promo_flag",
                           "promo_flag_2", "price", "relevance_score"]
    kinds = {n: raw.schema[n].kind for n in informative}
    assert truth.names(FeatureRole.SPARSE_INFORMATIVE) == ["promo_flag", "promo_flag_2"]
    assert [n for n in informative if kinds[n] is FeatureKind.MULTI_CATEGORICAL] == ["tags", "tags_2"]
    assert [n for n in informative if kinds[n] is FeatureKind.DENSE] == ["price", "relevance_score"]
    assert truth.names(FeatureRole.REDUNDANT) == ["user_id_copy", "price_cents"]
    noise = truth.names(FeatureRole.NOISE)
    assert len(noise) == 28 and not truth.names(FeatureRole.INTERACTION, FeatureRole.NEAR_REDUNDANT)
    assert {"noise_id", "noise_id_2", "noise_id_3", "noise_c10000", "noise_tags", "noise_dense_7"} <= set(noise)
    assert truth["noise_id_3"].cardinality == truth["user_id"].cardinality == 5000
    # every informative field is learnable from this sample and realises its planted strength
    for name in informative:
        t = truth[name]
        assert t.learnable_share > 0.95, name
        assert t.contribution_std == pytest.approx(t.strength, rel=0.1), name
    strengths = [truth[n].strength for n in truth.importance_order()]
    assert len(set(strengths)) == len(strengths) == 10  # no ties: a well-defined ranking


def test_selection_redundant_copies_are_bijections(bench: tuple[RawData, GroundTruth]) -> None:
    frame = bench[0].frame
    assert (frame.groupby("user_id")["user_id_copy"].nunique() == 1).all()
    assert (frame.groupby("user_id_copy")["user_id"].nunique() == 1).all()
    assert not set(frame["user_id"]).intersection(frame["user_id_copy"])
    price, cents = frame["price"], frame["price_cents"]
    assert price.isna().equals(cents.isna())
    np.testing.assert_array_equal(np.round(price * 100).dropna(), cents.dropna())


def test_selection_rare_flags(bench: tuple[RawData, GroundTruth]) -> None:
    raw, truth = bench
    frame = raw.frame
    for name, default in (("promo_flag", "0"), ("promo_flag_2", "none")):
        t = truth[name]
        assert t.default == default and t.default_rate == 0.99
        at_default = frame[name] == default
        assert 0.985 <= at_default.mean() <= 0.995, name
        assert frame.loc[~at_default, "label"].mean() > frame.loc[at_default, "label"].mean() + 0.4, name
    # promo_flag_2: a small vocabulary of codes with their own effects, not just a binary flag
    codes = frame.loc[frame["promo_flag_2"] != "none", "promo_flag_2"]
    assert codes.nunique() == 20 == truth["promo_flag_2"].cardinality - 1 and codes.value_counts().min() >= 10
    effects = pd.Series(truth.contributions(frame)["promo_flag_2"]).groupby(frame["promo_flag_2"].to_numpy()).first()
    assert effects["none"] == 0 and effects.drop("none").nunique() == 20 and effects.drop("none").mean() > 2


def test_selection_truth_recovers_the_logit(bench: tuple[RawData, GroundTruth]) -> None:
    raw, truth = bench
    auc = oracle_auc(raw)
    assert auc == pytest.approx(truth.oracle_auc) and 0.8 < auc < 0.9
    p, y = truth.true_probability(raw.frame), raw.labels
    assert abs(p.mean() - y.mean()) < 0.01
    decile = pd.qcut(p, 10, labels=False)
    for k in range(10):
        assert abs(p[decile == k].mean() - y[decile == k].mean()) < 0.02
    # no single informative term is negligible: dropping it from the true logit costs AUC
    contrib, full = truth.contributions(raw.frame), truth.true_logit(raw.frame)
    for name in truth.names(*SIGNAL):
        assert auc - roc_auc(full - contrib[name], y) > 0.004, name


def test_selection_round_trip(bench: tuple[RawData, GroundTruth]) -> None:
    raw, truth = bench
    config = truth.config
    assert SyntheticConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    d = truth.to_dict()
    back = GroundTruth.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.config == config
    rows = raw.frame.iloc[::101]
    np.testing.assert_allclose(back.true_logit(rows), truth.true_logit(raw.frame)[::101])
    assert GroundTruth.from_raw(raw).to_dict() == d
    # a truth stored before the layout options existed reads back as the default layout
    old = {k: v for k, v in SyntheticConfig(n_rows=10).to_dict().items()
           if k not in ("n_rare_flags", "n_tag_fields", "n_dense_informative", "interaction", "near_copy")}
    assert SyntheticConfig.from_dict(old) == SyntheticConfig(n_rows=10)


def test_reader_with_layout_options() -> None:
    options = dict(n_noise=20, n_noise_dense=7, cardinality_scale=0.05, n_rare_flags=2, n_tag_fields=2,
                   n_dense_informative=2, interaction=False, near_copy=False)
    reader = SyntheticReader(n_rows=2000, seed=1, **options)
    assert reader.config == selection_benchmark_config(n_rows=2000, seed=1)
    raw = reader.read()
    pd.testing.assert_frame_equal(raw.frame, generate(reader.config)[0].frame)
    assert len(raw.schema.features) == 40
    assert reader.fingerprint() != SyntheticReader(n_rows=2000, seed=1, **{**options, "near_copy": True}).fingerprint()
    assert SyntheticReader(n_rows=2000).fingerprint() != reader.fingerprint()
    with pytest.raises(ValueError, match="n_dense_informative"):
        SyntheticReader(n_dense_informative=5)


# -- heterogeneous embedding widths ----------------------------------------------------------------
def test_dims_by_cardinality() -> None:
    assert [dim_for_cardinality(c) for c in (2, 10, 11, 1000, 1001, 20_000, 20_001)] == [4, 4, 8, 8, 16, 16, 32]
    raw, truth = generate(selection_benchmark_config(n_rows=3000, embedding_dim=BY_CARDINALITY))
    dims = {f.name: f.embedding_dim for f in raw.schema.sparse}
    assert dims["device_type"] == 4 and dims["site_category"] == 8 and dims["user_id"] == 16
    assert all(d % 4 == 0 for d in dims.values()) and len(set(dims.values())) == 3
    assert dims == heterogeneous_dims(raw.schema)
    assert {f.name: truth[f.name].cardinality for f in raw.schema.sparse}["tags_2"] == 300
    # any schema: from a uniform synthetic schema, or from a fitted one (the sample's vocabulary)
    uniform, _ = generate(SyntheticConfig(n_rows=3000))
    assert uniform.schema.with_dims(heterogeneous_dims(uniform.schema))["user_id"].embedding_dim == 32
    fitted = Preprocessor(uniform.schema).fit(uniform.frame).fitted_schema
    fitted_dims = heterogeneous_dims(fitted)
    assert fitted_dims["device_type"] == 4 and fitted_dims["user_id"] == 16  # ~2.5k ids seen in 3k rows
    with pytest.raises(ValueError, match="cardinality"):
        heterogeneous_dims(Schema((FeatureSpec("a"),)))
