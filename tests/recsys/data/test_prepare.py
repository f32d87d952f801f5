"""prepare_data: seeded splits, train-only fitting, feature options, the on-disk cache and its summary."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys.data.encoders import EncodedData, Preprocessor
from recsys.data.prepare import PrepareConfig, PreparedData, SplitConfig, prepare_data, split_indices
from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.readers.base import Reader
from recsys.data.schema import FeatureKind, FeatureSpec, Schema, SchemaError
from recsys.data.synthetic import SyntheticReader
from tests.recsys.data.assertions import assert_same_encoding

SPLITS = ("train", "val", "test")


def _reader(**kw: object) -> SyntheticReader:
    return SyntheticReader(**{"n_rows": 2000, "cardinality_scale": 0.01, "n_noise": 2, "n_noise_dense": 1, **kw})


class FrameReader(Reader):
    """A reader over an in-memory frame (private attributes stay out of the fingerprint)."""

    name = "frame"

    def __init__(self, frame: pd.DataFrame, schema: Schema, tag: str = "a") -> None:
        self._frame = frame
        self._schema = schema
        self.tag = tag

    def read(self) -> RawData:
        return RawData(self._frame.copy(), self._schema, ReadReport(source="frame.csv", rows_read=len(self._frame)))


def _frame_reader(labels: np.ndarray) -> FrameReader:
    n = len(labels)
    frame = pd.DataFrame(
        {"c": [f"v{i % 5}" for i in range(n)], "x": np.arange(n, dtype=float), "label": labels.astype(np.int8)},
        index=pd.RangeIndex(1, n + 1),
    )
    return FrameReader(frame, Schema((FeatureSpec("c"), FeatureSpec("x", FeatureKind.DENSE))))


@pytest.fixture
def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count SyntheticReader.read calls (patched on the class: an instance attribute would change the
    reader's options and so its cache key)."""
    calls: list[int] = []
    real = SyntheticReader.read

    def counted(self: SyntheticReader) -> RawData:
        calls.append(1)
        return real(self)

    monkeypatch.setattr(SyntheticReader, "read", counted)
    return calls


def _assert_same(a: PreparedData, b: PreparedData) -> None:
    assert set(a.splits) == set(b.splits)
    for name in a.splits:
        assert_same_encoding(a.splits[name], b.splits[name])
    assert a.preprocessor.state_dict() == b.preprocessor.state_dict()
    assert a.schema == b.schema and a.summary == b.summary


# -- split_indices / SplitConfig ------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 400),
    train=st.floats(0.05, 1.0),
    val_share=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31),
)
def test_split_indices_partition(n: int, train: float, val_share: float, seed: int) -> None:
    val = (1.0 - train) * val_share
    cfg = SplitConfig(train=train, val=val, test=1.0 - train - val, seed=seed)
    rows = split_indices(n, cfg)
    assert set(rows) == set(SPLITS)
    allrows = np.concatenate([rows[k] for k in SPLITS])
    assert sorted(allrows.tolist()) == list(range(n))  # disjoint and covering
    for k in SPLITS:
        assert rows[k].tolist() == sorted(rows[k].tolist())
        assert rows[k].dtype.kind == "i"
    assert abs(len(rows["train"]) - train * n) <= 0.5 + 1e-9
    assert len(rows["val"]) <= round(val * n)
    assert abs(len(rows["val"]) + len(rows["test"]) - (1 - train) * n) <= 0.5 + 1e-9
    again = split_indices(n, cfg)
    assert all(np.array_equal(rows[k], again[k]) for k in SPLITS)


def test_split_indices_seeded() -> None:
    a = split_indices(1000, SplitConfig(seed=1))
    b = split_indices(1000, SplitConfig(seed=1))
    c = split_indices(1000, SplitConfig(seed=2))
    assert all(np.array_equal(a[k], b[k]) for k in SPLITS)
    assert not np.array_equal(a["val"], c["val"])
    assert [len(a[k]) for k in SPLITS] == [800, 100, 100]
    # the split is random, not a head/tail cut
    assert a["test"].min() < 500 < a["test"].max()


@pytest.mark.parametrize(
    "parts",
    [(0.5, 0.5, 0.5), (0.8, 0.1, 0.0), (-0.1, 0.6, 0.5), (0.0, 0.5, 0.5), (math.nan, 0.1, 0.1),
     (0.8, math.nan, 0.1), (0.8, 0.1, math.inf)],
)
def test_split_config_validation(parts: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="split fractions"):
        SplitConfig(*parts)


def test_split_config_valid() -> None:
    assert (SplitConfig(1.0, 0.0, 0.0).train, SplitConfig(1.0, 0.0, 0.0).test) == (1.0, 0.0)
    cfg = SplitConfig(0.7, 0.2, 0.1)  # float rounding is tolerated (0.7 + 0.2 + 0.1 != 1.0 in floats)
    assert (cfg.train, cfg.val, cfg.test) == (0.7, 0.2, 0.1)


# -- splits and fitting ---------------------------------------------------------------------------
def test_prepare_fits_on_train_only() -> None:
    reader = _reader()
    cfg = SplitConfig(seed=7)
    prepared = prepare_data(reader, PrepareConfig(split=cfg))
    raw = reader.read()
    rows = split_indices(len(raw), cfg)
    pre = Preprocessor(raw.schema).fit(raw.frame.iloc[rows["train"]])
    assert prepared.preprocessor.state_dict() == pre.state_dict()
    assert prepared.schema.is_fitted and prepared.schema == pre.fitted_schema
    for name in SPLITS:
        enc = pre.transform(raw.frame.iloc[rows[name]])
        got = prepared.splits[name]
        np.testing.assert_array_equal(got.labels, raw.labels[rows[name]])
        np.testing.assert_array_equal(got.dense, enc.dense)
        for f in enc.sparse_names:
            np.testing.assert_array_equal(got.values[f], enc.values[f])
    # fitting on all rows would give another vocabulary: the comparison above is sensitive
    assert Preprocessor(raw.schema).fit(raw.frame).state_dict() != pre.state_dict()


def test_prepare_summary() -> None:
    prepared = prepare_data(_reader())
    s = prepared.summary
    assert s["dataset"] == "synthetic" and s["read"]["rows_read"] == 2000
    assert s["split"]["train_rows"] + s["split"]["val_rows"] + s["split"]["test_rows"] == 2000
    assert s["features"] == {"sparse": len(prepared.schema.sparse), "dense": len(prepared.schema.dense)}
    for name, data in prepared.splits.items():
        enc = s["encode"][name]
        assert enc["rows"] == len(data) == s["split"][f"{name}_rows"]
        assert enc["oov"] == {f: int((data.values[f] == 0).sum()) for f in data.sparse_names}
        assert set(enc["dense_filled"]) == set(data.dense_names)
        assert all(isinstance(v, int) and v >= 0 for v in enc["dense_filled"].values())
        assert s["ctr"][name] == pytest.approx(float(data.labels.mean()))
    assert sum(s["encode"]["train"]["dense_filled"].values()) > 0  # the synthetic data has NaNs
    assert sum(s["encode"]["val"]["oov"].values()) > 0  # and rare ids unseen in train
    assert sum(s["encode"]["train"]["oov"].values()) == 0
    json.dumps(s)  # JSON-able


def test_prepare_without_test_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SplitConfig(0.9, 0.1, 0.0)
    first = prepare_data(_reader(), PrepareConfig(split=cfg, cache_dir=tmp_path))
    assert set(first.splits) == {"train", "val"} and first.summary["split"]["test_rows"] == 0
    monkeypatch.setattr(SyntheticReader, "read", lambda self: pytest.fail("read although cached"))
    _assert_same(prepare_data(_reader(), PrepareConfig(split=cfg, cache_dir=tmp_path)), first)


def test_one_class_split_is_a_data_error() -> None:
    with pytest.raises(DataError, match=r"frame\.csv: the train split has only one class \(label=0"):
        prepare_data(_frame_reader(np.zeros(50)))
    cfg = SplitConfig(0.6, 0.2, 0.2, seed=3)
    labels = np.arange(50) % 2
    labels[split_indices(50, cfg)["val"]] = 1
    with pytest.raises(DataError, match="val split has only one class.*both clicks and non-clicks"):
        prepare_data(_frame_reader(labels), PrepareConfig(split=cfg))
    with pytest.raises(DataError, match="train split is empty"):
        prepare_data(_frame_reader(np.array([1])), PrepareConfig(split=SplitConfig(0.4, 0.6, 0.0)))
    prepare_data(_frame_reader(np.arange(50) % 2), PrepareConfig(split=cfg))  # both classes everywhere: fine


# -- feature options ------------------------------------------------------------------------------
def test_features_select_and_missing_feature_lists_columns() -> None:
    prepared = prepare_data(_reader(), PrepareConfig(features=["price", "user_id", "tags"]))
    assert prepared.schema.names == ["user_id", "tags", "price"]  # the schema's own order
    assert prepared.splits["train"].sparse_names == ["user_id", "tags"]
    assert prepared.splits["train"].dense_names == ["price"]
    available = _reader().read().schema.names
    with pytest.raises(SchemaError) as err:
        prepare_data(_reader(), PrepareConfig(features=["user_id", "no_such_feature"]))
    assert "no_such_feature" in str(err.value) and "available columns" in str(err.value)
    assert all(name in str(err.value) for name in available)


def test_drop_features() -> None:
    prepared = prepare_data(_reader(), PrepareConfig(drop_features=["user_id", "noise_dense"]))
    names = prepared.schema.names
    assert "user_id" not in names and "noise_dense" not in names and "item_id" in names
    assert prepared.splits["val"].sparse_names == prepared.schema.sparse_names
    with pytest.raises(SchemaError, match=r"drop_features \['nope'\].*available columns"):
        prepare_data(_reader(), PrepareConfig(drop_features=["nope"]))
    both = prepare_data(_reader(), PrepareConfig(features=["user_id", "item_id", "price"], drop_features=["item_id"]))
    assert both.schema.names == ["user_id", "price"]


def test_embedding_dim_override() -> None:
    assert {f.embedding_dim for f in prepare_data(_reader()).schema.sparse} == {16}
    prepared = prepare_data(_reader(), PrepareConfig(embedding_dim=8))
    assert {f.embedding_dim for f in prepared.schema.sparse} == {8}
    assert all(f.num_embeddings and f.num_embeddings > 1 for f in prepared.schema.sparse)


# -- cache ----------------------------------------------------------------------------------------
def test_cache_hit_is_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = prepare_data(_reader(), PrepareConfig(split=SplitConfig(seed=5), cache_dir=tmp_path))
    (folder,) = list(tmp_path.iterdir())
    assert folder.name.startswith("synthetic-")
    assert sorted(p.name for p in folder.iterdir()) == [
        "preprocessor.json", "summary.json", "test.npz", "train.npz", "val.npz"
    ]

    def boom(self: SyntheticReader) -> RawData:
        raise AssertionError("read() called although the data is cached")

    monkeypatch.setattr(SyntheticReader, "read", boom)
    second = prepare_data(_reader(), PrepareConfig(split=SplitConfig(seed=5), cache_dir=tmp_path))  # a new, equal reader
    _assert_same(second, first)
    assert len(list(tmp_path.iterdir())) == 1


def test_changed_options_use_another_cache_entry(tmp_path: Path, count_reads: list[int]) -> None:
    configs = [
        ({}, {}),
        ({}, {"split": SplitConfig(seed=1)}),
        ({}, {"features": ["user_id", "price"]}),
        ({}, {"drop_features": ["price"]}),
        ({}, {"embedding_dim": 4}),
        ({"seed": 1}, {}),  # another dataset
        ({"n_rows": 1500}, {}),
    ]
    results = []
    for i, (reader_kw, kw) in enumerate(configs):
        results.append(prepare_data(_reader(**reader_kw), PrepareConfig(cache_dir=tmp_path, **kw)))
        assert len(count_reads) == i + 1, f"config {i} was served from another config's cache"
        assert len(list(tmp_path.iterdir())) == i + 1
    for (reader_kw, kw), expected in zip(configs, results):  # each is now served from its own entry
        _assert_same(prepare_data(_reader(**reader_kw), PrepareConfig(cache_dir=tmp_path, **kw)), expected)
    assert len(count_reads) == len(configs)
    assert results[1].summary["split"]["seed"] == 1
    assert results[2].schema.names == ["user_id", "price"]
    assert {f.embedding_dim for f in results[4].schema.sparse} == {4}


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _inconsistent(folder: Path) -> None:
    data = EncodedData.load(folder / "val.npz")
    name = data.sparse_names[0]
    data.lengths[name] = data.lengths[name] + 1  # lengths no longer sum to the values
    data.save(folder / "val.npz")


DAMAGE = {
    "truncated npz": lambda f: _truncate(f / "train.npz"),
    "empty npz": lambda f: (f / "val.npz").write_bytes(b""),
    "garbage npz": lambda f: (f / "test.npz").write_bytes(b"not a zip file at all"),
    "missing split": lambda f: (f / "val.npz").unlink(),
    "swapped splits": lambda f: (f / "val.npz").write_bytes((f / "test.npz").read_bytes() + b""),
    "inconsistent arrays": _inconsistent,
    "bad preprocessor json": lambda f: (f / "preprocessor.json").write_text("{"),
    "empty preprocessor state": lambda f: (f / "preprocessor.json").write_text("{}"),
    "missing preprocessor": lambda f: (f / "preprocessor.json").unlink(),
    "bad summary": lambda f: (f / "summary.json").write_text("[1, 2"),
    "missing summary": lambda f: (f / "summary.json").unlink(),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_cache_is_rebuilt(
    damage: str, tmp_path: Path, count_reads: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = SplitConfig(0.6, 0.25, 0.15, seed=9)  # val and test of different sizes
    first = prepare_data(_reader(), PrepareConfig(split=cfg, cache_dir=tmp_path))
    (folder,) = list(tmp_path.iterdir())
    DAMAGE[damage](folder)
    with caplog.at_level(logging.WARNING, logger="recsys.data.prepare"):
        again = prepare_data(_reader(), PrepareConfig(split=cfg, cache_dir=tmp_path))
    assert len(count_reads) == 2, "a damaged cache was trusted"
    _assert_same(again, first)
    if damage != "missing summary":  # without a summary there is no cache entry to warn about
        assert "ignoring unreadable cache" in caplog.text
    # the rebuilt entry is whole again and served from now on
    _assert_same(prepare_data(_reader(), PrepareConfig(split=cfg, cache_dir=tmp_path)), first)
    assert len(count_reads) == 2
    assert len(list(tmp_path.iterdir())) == 1  # no leftover temporary folder


def test_no_cache_dir_writes_nothing(tmp_cwd: Path) -> None:
    before = sorted(tmp_cwd.iterdir())  # (tmp_cwd holds an empty MLflow store)
    prepare_data(_reader())
    assert sorted(tmp_cwd.iterdir()) == before
