"""Schema files, vocabularies, the Preprocessor (fit on train only) and the encoded-array cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys.data.batching import make_batch
from recsys.data.encoders import (
    OOV_ID,
    Counts,
    EncodedData,
    EncodeStats,
    Preprocessor,
    Tokens,
    Vocabulary,
    hash_ids,
    split_multi,
)
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema, SchemaError
from tests.recsys.data.assertions import assert_same_encoding

CAT, MULTI, DENSE = FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL, FeatureKind.DENSE


# -- fixtures ---------------------------------------------------------------------------------
def _schema() -> Schema:
    """Dense and sparse features interleaved, every encoder option in use."""
    return Schema(
        features=(
            FeatureSpec("price", DENSE, transform=DenseTransform.LOG1P, fill_value=-3.0),
            FeatureSpec("user", CAT, missing_value="NA"),
            FeatureSpec("item", CAT, min_count=2, embedding_dim=8),
            FeatureSpec("score", DENSE, transform=DenseTransform.STANDARDIZE, fill_value=0.5),
            FeatureSpec("tags", MULTI, separator="|"),
            FeatureSpec("site", CAT, hash_size=7),
            FeatureSpec("raw", DENSE, missing_value=-999.0, fill_value=7.0),
        ),
        label="click",
        name="toy",
    )


def _train() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "price": [1.0, -5.0, np.nan, 10.0, 0.0, np.inf],
            "user": ["u1", "u2", "NA", "u1", None, "u3"],
            "item": ["i1", "i1", "i2", "i3", "i3", "i3"],
            "score": [1.0, 2.0, 3.0, np.nan, 6.0, -np.inf],
            "tags": ["a|b", "", "a|a|c", "b", "|c|", "a"],
            "site": ["s1", "s2", "s3", "s1", "s2", "s3"],
            "raw": [1.5, -999.0, np.nan, 2.5, np.inf, -np.inf],
            "click": [1, 0, 0, 1, 0, 1],
        },
        index=pd.RangeIndex(1, 7),
    )


def _test() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "price": [3.0, np.nan, -1.0],
            "user": ["u9", "u1", "NA"],  # u9 is only in this split
            "item": ["i2", "i3", "i7"],  # i2 was seen once in train (< min_count): OOV
            "score": [100.0, -100.0, np.nan],
            "tags": ["z|a", "zz|zz", ""],  # z, zz only here
            "site": ["s9", "s1", "s1"],
            "raw": [-999.0, 4.0, np.nan],
            "click": [0, 1, 1],
        },
        index=pd.RangeIndex(7, 10),
    )


@pytest.fixture
def pre() -> Preprocessor:
    return Preprocessor(_schema()).fit(_train())


# -- Vocabulary -------------------------------------------------------------------------------
def test_vocabulary_order_and_oov() -> None:
    v = Vocabulary.fit(np.array(["b", "a", "c", "a", "b", "d", "c", "c"], dtype=object))
    assert v.tokens == ["c", "a", "b", "d"]  # by count desc, ties (a, b) by token
    assert v.counts == [3, 2, 2, 1]
    assert v.num_embeddings == 5 and len(v) == 4
    ids = v.encode(np.array(["c", "a", "b", "d", "zz", ""], dtype=object))
    assert ids.tolist() == [1, 2, 3, 4, OOV_ID, OOV_ID]
    assert ids.dtype == np.int64 and OOV_ID == 0


def test_vocabulary_min_count_sends_rare_to_oov() -> None:
    v = Vocabulary.fit(np.array(["x", "x", "x", "y", "y", "z"], dtype=object), min_count=2)
    assert v.tokens == ["x", "y"] and v.num_embeddings == 3
    assert v.encode(np.array(["z", "y", "x"], dtype=object)).tolist() == [0, 2, 1]
    assert Vocabulary.fit(np.array(["a", "b"], dtype=object), min_count=5).encode(np.array(["a"])).tolist() == [0]


def test_vocabulary_empty() -> None:
    v = Vocabulary.fit(np.array([], dtype=object))
    assert v.tokens == [] and v.num_embeddings == 1
    assert v.encode(np.array(["a", "b"], dtype=object)).tolist() == [0, 0]


#: tokens whose order trips byte-wise or NUL-dropping comparisons
ODD = ["a", "a\x00", "a\x00b", "", "\x00", "ä", "aa", "Z", "日本", "a\x01"]


def test_vocabulary_holds_its_tokens_in_arrow_and_reads_like_a_list() -> None:
    import pyarrow as pa

    rng = np.random.default_rng(0)
    cells = np.array([ODD[i] for i in rng.integers(0, len(ODD), 500)], dtype=object)
    v = Vocabulary.fit(cells)
    counts = Counter(cells.tolist())
    expected = sorted(counts, key=lambda t: (-counts[t], t))  # Python's str order on ties
    assert isinstance(v.tokens, Tokens) and isinstance(v.tokens.arrow, pa.StringArray)  # 32-bit offsets while they fit
    assert isinstance(v.counts, Counts) and v.counts.array.dtype == np.int64 and v.counts == [counts[t] for t in expected]
    assert v.tokens == expected and list(v.tokens) == expected and v.tokens.to_list() == expected
    assert [v.tokens[i] for i in range(len(expected))] == expected and v.tokens[-1] == expected[-1]
    assert v.tokens[1:4] == expected[1:4] and v.tokens[::2] == expected[::2]
    assert all(t in v.tokens for t in ODD) and "zz" not in v.tokens and 3 not in v.tokens
    assert [v.tokens.index(t) for t in ODD] == [expected.index(t) for t in ODD]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        v.tokens.index("zz")
    with pytest.raises(IndexError):
        v.tokens[len(expected)]
    assert v.encode(np.array(ODD + ["zz"], dtype=object)).tolist() == [expected.index(t) + 1 for t in ODD] + [OOV_ID]
    assert Vocabulary(list(expected), v.counts) == v and Vocabulary(tuple(expected), v.counts).tokens == v.tokens
    assert v.tokens != expected[:-1] and v.tokens != list(reversed(expected))


def test_preprocessor_bytes_round_trip_every_vocabulary_and_statistic(pre: Preprocessor) -> None:
    pre.vocabularies[next(iter(pre.vocabularies))] = Vocabulary([], [])  # an empty one too
    back = Preprocessor.from_bytes(pre.to_bytes())
    assert back.state_dict() == pre.state_dict() and back.fitted_schema == pre.fitted_schema
    assert list(back.vocabularies) == list(pre.vocabularies)
    frame = _train()
    assert_same_encoding(back.transform(frame), pre.transform(frame))
    with pytest.raises(ValueError, match="damaged encoder state"):
        import pyarrow as pa

        data = pre.to_bytes()
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, reader.schema) as w:
            w.write_batch(next(iter(reader)))  # one vocabulary of several
        Preprocessor.from_bytes(sink.getvalue().to_pybytes())


def test_same_encoders_compares_array_to_array(pre: Preprocessor) -> None:
    """``same_encoders`` agrees with comparing the state dicts, without building them."""
    back = Preprocessor.from_bytes(pre.to_bytes())
    assert back.same_encoders(pre) and pre.same_encoders(back)
    name = next(iter(pre.vocabularies))
    v = pre.vocabularies[name]
    for changed in (Vocabulary(list(reversed(v.tokens)), v.counts),  # the same tokens, other ids
                    Vocabulary(v.tokens, [c + 1 for c in v.counts]),
                    Vocabulary(list(v.tokens)[:-1], list(v.counts)[:-1])):
        other = Preprocessor.from_bytes(pre.to_bytes())
        other.vocabularies[name] = changed
        assert not other.same_encoders(pre) and other.state_dict() != pre.state_dict()
    other = Preprocessor.from_bytes(pre.to_bytes())
    key = next(iter(other.dense_stats))
    other.dense_stats[key] = (other.dense_stats[key][0] + 1.0, other.dense_stats[key][1])
    assert not other.same_encoders(pre) and not Preprocessor(pre.schema).same_encoders(pre)
    # other embedding dims: the model differs, the encoding does not (dims=False)
    wider = Preprocessor.from_bytes(pre.to_bytes())
    wider.schema = wider.schema.with_dims({f.name: int(f.embedding_dim) + 4 for f in wider.schema.sparse})
    assert not wider.same_encoders(pre) and wider.same_encoders(pre, dims=False)
    assert not other.same_encoders(pre, dims=False)


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.lists(st.sampled_from(["a", "b", "c", "dd", "e1", "", "Z", "ü"]), max_size=60),
    min_count=st.integers(1, 4),
    probe=st.lists(st.sampled_from(["a", "b", "c", "dd", "e1", "", "Z", "ü", "unseen"]), max_size=20),
)
def test_vocabulary_matches_reference(tokens: list[str], min_count: int, probe: list[str]) -> None:
    counts = Counter(tokens)
    expected = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
    v = Vocabulary.fit(np.array(tokens, dtype=object), min_count=min_count)
    assert v.tokens == expected
    assert v.counts == [counts[t] for t in expected]
    ids = v.encode(np.array(probe, dtype=object))
    assert ids.tolist() == [expected.index(t) + 1 if t in expected else 0 for t in probe]


# -- hashing ----------------------------------------------------------------------------------
_HASH_TOKENS = ["", "a", "b", "user_123", "ünïcode", "1.0", "x|y", "a" * 200]


def test_hash_ids_stable_across_processes() -> None:
    parent = hash_ids(np.array(_HASH_TOKENS, dtype=object), 1000).tolist()
    code = (
        "import json, numpy as np; from recsys.data.encoders import hash_ids; "
        f"print(json.dumps(hash_ids(np.array({_HASH_TOKENS!r}, dtype=object), 1000).tolist()))"
    )
    root = Path(__file__).resolve().parents[3]
    for seed in ("0", "12345"):  # python's own str hash differs per PYTHONHASHSEED; ours must not
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                             timeout=120, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == parent


@settings(max_examples=30, deadline=None)
@given(tokens=st.lists(st.text(max_size=12), max_size=40), hash_size=st.integers(1, 50))
def test_hash_ids_in_range_and_deterministic(tokens: list[str], hash_size: int) -> None:
    arr = np.array(tokens, dtype=object)
    ids = hash_ids(arr, hash_size)
    assert ids.dtype == np.int64 and ids.shape == (len(tokens),)
    assert ((ids >= 1) & (ids <= hash_size)).all()
    np.testing.assert_array_equal(ids, hash_ids(arr, hash_size))
    # a token's id does not depend on its neighbours
    assert ids.tolist() == [int(hash_ids(np.array([t], dtype=object), hash_size)[0]) for t in tokens]


def test_hashed_feature_in_preprocessor(pre: Preprocessor) -> None:
    assert "site" not in pre.vocabularies
    assert pre.fitted_schema["site"].num_embeddings == 8  # hash_size + 1
    enc = pre.transform(_test())
    np.testing.assert_array_equal(enc.values["site"], hash_ids(np.array(["s9", "s1", "s1"], dtype=object), 7))
    assert ((enc.values["site"] >= 1) & (enc.values["site"] <= 7)).all()
    assert enc.stats.oov["site"] == 0  # an unseen value still gets a bucket


# -- split_multi ------------------------------------------------------------------------------
def test_split_multi() -> None:
    flat, lens = split_multi(np.array(["", "a|b", "a|a|b", "|c|", "x"], dtype=object), "|")
    assert flat.tolist() == ["a", "b", "a", "a", "b", "c", "x"]  # duplicates kept, empty tokens dropped
    assert lens.tolist() == [0, 2, 3, 1, 1] and lens.dtype == np.int32
    flat, lens = split_multi(np.array(["a|b,c", "", "d,,d"], dtype=object), ",")
    assert flat.tolist() == ["a|b", "c", "d", "d"] and lens.tolist() == [2, 0, 2]
    flat, lens = split_multi(np.array(["a.b", "c"], dtype=object), ".")  # not a regex
    assert flat.tolist() == ["a", "b", "c"] and lens.tolist() == [2, 1]
    flat, lens = split_multi(np.array([], dtype=object), "|")
    assert len(flat) == 0 and lens.tolist() == []
    flat, lens = split_multi(np.array(["", ""], dtype=object), "|")
    assert len(flat) == 0 and lens.tolist() == [0, 0]


@settings(max_examples=30, deadline=None)
@given(bags=st.lists(st.lists(st.sampled_from(["a", "b", "c1", "x y"]), max_size=5), max_size=20))
def test_split_multi_reference(bags: list[list[str]]) -> None:
    flat, lens = split_multi(np.array([";".join(b) for b in bags], dtype=object), ";")
    assert flat.tolist() == [t for b in bags for t in b]
    assert lens.tolist() == [len(b) for b in bags]


def test_multi_categorical_encoding(pre: Preprocessor) -> None:
    voc = pre.vocabularies["tags"]
    assert voc.tokens == ["a", "b", "c"] and voc.counts == [4, 2, 2]  # "a|a|c" counts a twice
    enc = pre.transform(_train())
    assert enc.lengths["tags"].tolist() == [2, 0, 3, 1, 1, 1]
    assert enc.values["tags"].tolist() == [1, 2, 1, 1, 3, 2, 3, 1]  # order within a row kept
    test = pre.transform(_test())
    assert test.lengths["tags"].tolist() == [2, 2, 0]
    assert test.values["tags"].tolist() == [0, 1, 0, 0]
    assert test.stats.oov["tags"] == 3  # counted per id, not per row


# -- Preprocessor: fit on train only ------------------------------------------------------------
def test_fit_uses_training_split_only(pre: Preprocessor) -> None:
    state = json.dumps(pre.state_dict(), sort_keys=True)
    enc = pre.transform(_test())
    assert json.dumps(pre.state_dict(), sort_keys=True) == state  # transforming changes nothing
    assert "u9" not in pre.vocabularies["user"].tokens
    assert enc.values["user"][0] == OOV_ID
    assert enc.values["item"].tolist()[0] == OOV_ID and enc.values["item"].tolist()[2] == OOV_ID

    # standardisation uses the training mean/std of the finite values only
    finite = np.array([1.0, 2.0, 3.0, 6.0])
    mean, std = pre.dense_stats["score"]
    assert mean == pytest.approx(finite.mean()) and std == pytest.approx(finite.std())
    col = enc.dense_names.index("score")
    expected = (np.array([100.0, -100.0, 0.5]) - finite.mean()) / finite.std()  # NaN -> fill 0.5 first
    np.testing.assert_allclose(enc.dense[:, col], expected, rtol=1e-6)

    # fitting on train + test would differ: the check above is sensitive to leakage
    both = Preprocessor(_schema()).fit(pd.concat([_train(), _test()]))
    assert both.dense_stats["score"] != pre.dense_stats["score"]
    assert "u9" in both.vocabularies["user"].tokens


def test_standardize_constant_column_has_unit_std() -> None:
    schema = Schema((FeatureSpec("x", DENSE, transform="standardize"),))
    p = Preprocessor(schema).fit(pd.DataFrame({"x": [2.0, 2.0, 2.0], "label": [0, 1, 0]}))
    assert p.dense_stats["x"] == (2.0, 1.0)
    p = Preprocessor(schema).fit(pd.DataFrame({"x": [np.nan, np.inf], "label": [0, 1]}))
    assert p.dense_stats["x"] == (0.0, 1.0)
    enc = p.transform(pd.DataFrame({"x": [3.0], "label": [1]}))
    assert np.isfinite(enc.dense).all() and enc.dense[0, 0] == 3.0


def test_oov_counted_per_feature(pre: Preprocessor) -> None:
    stats = pre.transform(_test()).stats
    assert stats.rows == 3
    # user: u9 -> OOV ("NA" is the missing category seen in train); item: i2 (rare), i7 (unseen)
    assert stats.oov == {"user": 1, "item": 2, "tags": 3, "site": 0}
    train_stats = pre.transform(_train()).stats
    assert train_stats.oov == {"user": 0, "item": 1, "tags": 0, "site": 0}  # i2 seen once < min_count 2


def test_dense_fill_and_count(pre: Preprocessor) -> None:
    enc = pre.transform(_train())
    assert enc.dense_names == ["price", "score", "raw"]  # schema order of dense features
    assert enc.dense.dtype == np.float32 and enc.dense.shape == (6, 3)
    assert np.isfinite(enc.dense).all()
    # raw: missing_value -999, NaN, inf, -inf -> fill 7.0 (no transform)
    np.testing.assert_array_equal(enc.dense[:, 2], np.array([1.5, 7.0, 7.0, 2.5, 7.0, 7.0], np.float32))
    assert enc.stats.dense_filled == {"price": 2, "score": 2, "raw": 4}


def test_dense_missing_column_values_of_any_type() -> None:
    schema = Schema((FeatureSpec("x", DENSE, fill_value=-1.0),))
    p = Preprocessor(schema).fit(pd.DataFrame({"x": [1.0, 2.0], "label": [0, 1]}))
    frame = pd.DataFrame({"x": pd.Series([None, "abc", "3.5", np.inf, 2], dtype=object), "label": [0] * 5})
    enc = p.transform(frame)
    assert enc.dense[:, 0].tolist() == [-1.0, -1.0, 3.5, -1.0, 2.0]
    assert enc.stats.dense_filled == {"x": 3}


def test_log1p_clips_negatives(pre: Preprocessor) -> None:
    enc = pre.transform(_train())
    raw = np.array([1.0, -5.0, -3.0, 10.0, 0.0, -3.0])  # NaN/inf -> fill -3 before the transform
    np.testing.assert_allclose(enc.dense[:, 0], np.log1p(np.clip(raw, 0, None)), rtol=1e-6)
    assert enc.dense[1, 0] == 0.0 and enc.dense[2, 0] == 0.0


def test_missing_value_is_the_empty_category(pre: Preprocessor) -> None:
    voc = pre.vocabularies["user"]
    assert voc.tokens[0] == "" and voc.counts[0] == 2  # "NA" and None, the most frequent
    assert "NA" not in voc.tokens
    enc = pre.transform(pd.DataFrame({"user": ["NA", None, "", "u1", np.nan]}).assign(
        price=1.0, item="i3", score=1.0, tags="", site="s", raw=1.0, click=0))
    missing_id = voc.encode(np.array([""], dtype=object))[0]
    assert missing_id == 1
    assert enc.values["user"].tolist() == [1, 1, 1, voc.tokens.index("u1") + 1, 1]


def test_missing_multi_categorical_is_an_empty_bag() -> None:
    schema = Schema((FeatureSpec("g", MULTI, missing_value="-", separator=","),))
    p = Preprocessor(schema).fit(pd.DataFrame({"g": ["a,b", "-", None], "label": [0, 1, 0]}))
    assert p.vocabularies["g"].tokens == ["a", "b"]
    enc = p.transform(pd.DataFrame({"g": ["-", "b,a,b", None, ""], "label": [0, 0, 1, 1]}))
    assert enc.lengths["g"].tolist() == [0, 3, 0, 0] and enc.values["g"].tolist() == [2, 1, 2]


def test_transform_output_layout(pre: Preprocessor) -> None:
    enc = pre.transform(_train())
    assert enc.sparse_names == ["user", "item", "tags", "site"]  # schema order of sparse features
    for name in enc.sparse_names:
        assert enc.values[name].dtype == np.int64 and enc.lengths[name].dtype == np.int32
        assert int(enc.lengths[name].sum()) == len(enc.values[name])
    assert enc.labels.dtype == np.float32 and enc.labels.tolist() == [1, 0, 0, 1, 0, 1]
    assert len(enc) == 6 and enc.offsets("tags").tolist() == [0, 2, 2, 5, 6, 7, 8]
    # without a label column the labels are zeros (serving)
    no_label = pre.transform(_test().drop(columns="click"))
    assert no_label.labels.tolist() == [0.0, 0.0, 0.0]


def test_fitted_schema(pre: Preprocessor) -> None:
    fitted = pre.fitted_schema
    assert fitted.is_fitted and not pre.schema.is_fitted  # the input schema is left alone
    assert fitted["user"].num_embeddings == len(pre.vocabularies["user"]) + 1 == 5  # "", u1, u2, u3
    assert fitted["item"].num_embeddings == 3  # i3, i1; i2 (seen once) is below min_count 2
    assert fitted["tags"].num_embeddings == 4
    assert fitted["site"].num_embeddings == 8
    assert fitted["price"].num_embeddings is None
    assert fitted.names == pre.schema.names and fitted["item"].embedding_dim == 8
    # every id produced fits its table
    enc = pre.transform(_test())
    for name in enc.sparse_names:
        assert (enc.values[name] < fitted[name].num_embeddings).all()


def test_state_round_trip(pre: Preprocessor, tmp_path: Path) -> None:
    expected = pre.transform(_test())
    state = json.loads(json.dumps(pre.state_dict()))  # JSON-able
    again = Preprocessor.from_state_dict(state)
    assert_same_encoding(again.transform(_test()), expected)
    assert again.fitted_schema == pre.fitted_schema
    assert again.schema == pre.schema  # num_embeddings recomputed, not frozen into the input schema
    pre.save(tmp_path / "pre.json")
    loaded = Preprocessor.load(tmp_path / "pre.json")
    assert_same_encoding(loaded.transform(_test()), expected)
    assert_same_encoding(loaded.transform(_train()), pre.transform(_train()))
    assert loaded.state_dict() == pre.state_dict()


def test_not_fitted_raises_clearly() -> None:
    p = Preprocessor(_schema())
    for call in (lambda: p.transform(_train()), lambda: p.fitted_schema, p.state_dict):
        with pytest.raises(RuntimeError, match="not fitted"):
            call()


# -- EncodedData cache ------------------------------------------------------------------------
def test_encoded_data_save_load_round_trip(pre: Preprocessor, tmp_path: Path) -> None:
    enc = pre.transform(_train())
    enc.save(tmp_path / "train.npz")
    back = EncodedData.load(tmp_path / "train.npz")
    assert_same_encoding(back, enc)
    assert isinstance(back.stats, EncodeStats) and back.stats.oov == enc.stats.oov


def test_loaded_ids_stay_int32_when_they_fit_and_batches_widen_them(tmp_path: Path) -> None:
    n = 6
    small = np.arange(n, dtype=np.int64)
    large = small + 2**31  # does not fit int32: stored and loaded as int64
    enc = EncodedData(["s", "l"], [], {"s": small, "l": large}, {"s": np.ones(n, np.int32), "l": np.ones(n, np.int32)},
                      np.zeros((n, 0), np.float32), np.zeros(n, np.float32))
    enc.save(tmp_path / "ids.npz")
    back = EncodedData.load(tmp_path / "ids.npz")
    assert back.values["s"].dtype == np.int32 and back.values["l"].dtype == np.int64
    np.testing.assert_array_equal(back.values["s"], small)
    np.testing.assert_array_equal(back.values["l"], large)
    back.save(tmp_path / "again.npz")  # an int32 column saves as int32 again
    assert EncodedData.load(tmp_path / "again.npz").values["s"].dtype == np.int32
    kjt = make_batch(back, np.array([5, 0, 2])).sparse_features
    assert kjt.values().dtype == torch.int64
    assert kjt.values().tolist() == [5, 0, 2, 5 + 2**31, 2**31, 2 + 2**31]


def test_encoded_data_round_trip_without_sparse_or_dense(tmp_path: Path) -> None:
    only_dense = Preprocessor(Schema((FeatureSpec("x", DENSE),))).fit(pd.DataFrame({"x": [1.0, 2.0], "label": [0, 1]}))
    enc = only_dense.transform(pd.DataFrame({"x": [1.0, np.nan], "label": [0, 1]}))
    enc.save(tmp_path / "a.npz")
    assert_same_encoding(EncodedData.load(tmp_path / "a.npz"), enc)
    only_sparse = Preprocessor(Schema((FeatureSpec("c"),))).fit(pd.DataFrame({"c": ["a", "b"], "label": [0, 1]}))
    enc = only_sparse.transform(pd.DataFrame({"c": ["a", "z"], "label": [0, 1]}))
    assert enc.dense.shape == (2, 0)
    enc.save(tmp_path / "b.npz")
    assert_same_encoding(EncodedData.load(tmp_path / "b.npz"), enc)


def test_encoded_data_load_refuses_pickles(pre: Preprocessor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = pre.transform(_train())
    enc.save(tmp_path / "train.npz")
    seen: list[object] = []
    real_load = np.load

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("allow_pickle"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    EncodedData.load(tmp_path / "train.npz")
    assert seen == [False]
    monkeypatch.undo()

    # an object array in the file (which needs pickle) is refused
    meta = np.frombuffer(json.dumps({"sparse": [], "dense": [], "stats": EncodeStats().to_dict()}).encode(), np.uint8)
    with open(tmp_path / "evil.npz", "wb") as fh:
        np.savez(fh, dense=np.zeros((1, 0), np.float32), labels=np.array([object()], dtype=object), meta=meta)
    with pytest.raises(ValueError, match="pickle"):
        EncodedData.load(tmp_path / "evil.npz")


def test_encoded_data_load_rejects_inconsistent_arrays(pre: Preprocessor, tmp_path: Path) -> None:
    enc = pre.transform(_train())
    enc.values["tags"] = enc.values["tags"][:-1]  # lengths no longer sum to the values
    enc.save(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="inconsistent"):
        EncodedData.load(tmp_path / "bad.npz")


# -- Schema -----------------------------------------------------------------------------------
def _rich_schema() -> Schema:
    return Schema(
        features=(
            FeatureSpec("u", CAT, embedding_dim=4, missing_value="?", min_count=3),
            FeatureSpec("g", MULTI, separator=";", hash_size=100),
            FeatureSpec("p", DENSE, transform=DenseTransform.LOG1P, fill_value=-1.5, missing_value=-1.0),
            FeatureSpec("s", DENSE, transform="standardize"),
        ),
        label="clicked",
        name="rich",
        extras={"note": "hello", "nested": {"a": [1, 2]}},
    )


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_schema_file_round_trip(tmp_path: Path, suffix: str) -> None:
    schema = _rich_schema()
    schema.save(tmp_path / f"schema{suffix}")
    back = Schema.load(tmp_path / f"schema{suffix}")
    assert back == schema and back.extras == schema.extras and back.to_dict() == schema.to_dict()
    assert back["s"].transform is DenseTransform.STANDARDIZE and back["g"].kind is MULTI
    wider = schema.with_dims({"u": 32})
    assert wider["u"].embedding_dim == 32 and wider["g"].embedding_dim == 16 and schema["u"].embedding_dim == 4


def test_schema_from_dict_shorthand_and_defaults() -> None:
    s = Schema.from_dict({"features": ["a", {"name": "b", "kind": "dense"}]})
    assert s.names == ["a", "b"] and s.label == "label" and s.name == "dataset"
    assert s["a"].kind is CAT and s.sparse_names == ["a"] and s.dense_names == ["b"]


def test_schema_duplicate_names() -> None:
    with pytest.raises(SchemaError, match=r"duplicate feature names: \['a'\]"):
        Schema((FeatureSpec("a"), FeatureSpec("b"), FeatureSpec("a", DENSE)))
    with pytest.raises(SchemaError, match="label column 'a'"):
        Schema((FeatureSpec("a"),), label="a")
    with pytest.raises(SchemaError, match="at least one feature"):
        Schema(())


def test_schema_unknown_keys_named(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="embeding_dim"):
        Schema.from_dict({"features": [{"name": "a", "embeding_dim": 8}]})
    (tmp_path / "s.yaml").write_text("features:\n  - name: a\n    sepparator: ','\n")
    with pytest.raises(SchemaError, match=r"s\.yaml.*features\[0\].*sepparator"):
        Schema.load(tmp_path / "s.yaml")
    with pytest.raises(SchemaError, match="lable"):  # top level: a typo must not fall back to 'label'
        Schema.from_dict({"features": ["a"], "lable": "clicked"})
    with pytest.raises(SchemaError, match="missing key 'features'"):
        Schema.from_dict({"label": "y"})
    with pytest.raises(SchemaError, match="features\\[1\\]"):
        Schema.from_dict({"features": ["a", {"name": "b", "kind": "sparse-ish"}]})
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(SchemaError, match="mapping"):
        Schema.load(tmp_path / "list.json")
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        Schema.load(tmp_path / "nope.yaml")


def test_feature_spec_validation() -> None:
    with pytest.raises(SchemaError, match="embedding_dim"):
        FeatureSpec("a", embedding_dim=0)
    with pytest.raises(SchemaError, match="min_count"):
        FeatureSpec("a", min_count=0)
    with pytest.raises(SchemaError, match="hash_size"):
        FeatureSpec("a", hash_size=0)
    with pytest.raises(SchemaError, match="non-empty"):
        FeatureSpec("")
    FeatureSpec("d", DENSE, embedding_dim=0)  # dense features have no embedding


@pytest.mark.parametrize(
    "call", [lambda s: s.select(["u", "zz"]), lambda s: s.drop(["zz"]), lambda s: s.with_dims({"zz": 4}),
             lambda s: s["zz"]]
)
def test_schema_errors_list_available_columns(call: object) -> None:
    schema = _rich_schema()
    with pytest.raises(SchemaError) as err:
        call(schema)  # type: ignore[operator]
    msg = str(err.value)
    assert "zz" in msg and all(n in msg for n in schema.names)


def test_schema_select_drop_keep_order() -> None:
    schema = _rich_schema()
    assert schema.select(["s", "u"]).names == ["u", "s"]
    assert schema.drop(["g"]).names == ["u", "p", "s"]
    assert schema.with_uniform_dim(5).sparse[1].embedding_dim == 5
    assert schema.select(["s"]).label == "clicked"
