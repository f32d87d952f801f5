"""Jagged gathers, EncodedData.take and make_batch against a naive per-row reference; BatchDataset."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from recsys.data.batching import Batch, BatchDataset, make_batch, random_batch
from recsys.data.encoders import EncodedData, EncodeStats, Preprocessor, gather_jagged
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema

Bags = dict[str, list[list[int]]]


# -- reference ----------------------------------------------------------------------------------
def _encoded(bags: Bags, dense: np.ndarray) -> EncodedData:
    """EncodedData from per-row python lists; labels are the row numbers (so rows are traceable)."""
    n = dense.shape[0]
    names = list(bags)
    values = {k: np.array([v for bag in b for v in bag], dtype=np.int64) for k, b in bags.items()}
    lengths = {k: np.array([len(bag) for bag in b], dtype=np.int32) for k, b in bags.items()}
    return EncodedData(
        names, [f"d{j}" for j in range(dense.shape[1])], values, lengths, dense.astype(np.float32),
        np.arange(n, dtype=np.float32), EncodeStats(rows=n, oov={k: 0 for k in names}),
    )


def _ref(bag: list[list[int]], rows: list[int]) -> tuple[list[int], list[int]]:
    """Naive row-by-row gather."""
    values: list[int] = []
    lengths: list[int] = []
    for r in rows:
        values.extend(bag[r])
        lengths.append(len(bag[r]))
    return values, lengths


@st.composite
def jagged(draw: st.DrawFn) -> tuple[Bags, np.ndarray, list[int]]:
    n = draw(st.integers(0, 12))
    bags: Bags = {}
    for f in range(draw(st.integers(1, 3))):
        mode = draw(st.sampled_from(["single", "jagged", "balanced", "empty"]))
        ids = st.integers(0, 10**6)
        if mode == "single":  # categorical: the fast path
            bag = [[draw(ids)] for _ in range(n)]
        elif mode == "empty":
            bag = [[] for _ in range(n)]
        elif mode == "balanced":  # lengths 0/1/2 that sum to n: as many ids as rows, yet jagged
            lens = [1] * n
            for a, b in draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, max(n - 1, 0))),
                                      max_size=n)):
                if a != b and lens[a] == 1 and lens[b] == 1:
                    lens[a], lens[b] = 0, 2
            bag = [[draw(ids) for _ in range(k)] for k in lens]
        else:
            bag = draw(st.lists(st.lists(ids, max_size=4), min_size=n, max_size=n))
        bags[f"f{f}"] = bag
    n_dense = draw(st.integers(0, 2))
    dense = np.arange(n * n_dense, dtype=np.float32).reshape(n, n_dense) * 0.5
    rows = draw(st.lists(st.integers(0, n - 1), max_size=15)) if n else []
    # sometimes pick only rows where one feature has exactly one id (fast path on jagged data)
    ones = [i for i, b in enumerate(bags[draw(st.sampled_from(sorted(bags)))]) if len(b) == 1]
    if ones and draw(st.booleans()):
        rows = draw(st.lists(st.sampled_from(ones), min_size=1, max_size=10))
    return bags, dense, rows


# -- gather_jagged / take ---------------------------------------------------------------------------
def test_gather_jagged_single_ids_on_jagged_data() -> None:
    """Rows that each hold one id, in a column whose other rows do not: not ``values[rows]``."""
    values, lengths = np.array([10, 20, 30], np.int64), np.array([0, 1, 2], np.int32)
    offsets = np.array([0, 0, 1, 3], np.int64)
    v, ln = gather_jagged(values, offsets, lengths, np.array([1]))
    assert v.tolist() == [10] and ln.tolist() == [1]
    v, ln = gather_jagged(values, offsets, lengths, np.array([2, 1, 0, 1]))
    assert v.tolist() == [20, 30, 10, 10] and ln.tolist() == [2, 1, 0, 1]


@settings(max_examples=30, deadline=None)
@given(jagged())
def test_gather_jagged_matches_reference(case: tuple[Bags, np.ndarray, list[int]]) -> None:
    bags, dense, rows = case
    data = _encoded(bags, dense)
    idx = np.array(rows, dtype=np.int64)
    for name, bag in bags.items():
        v, ln = gather_jagged(data.values[name], data.offsets(name), data.lengths[name], idx)
        ref_v, ref_l = _ref(bag, rows)
        assert v.tolist() == ref_v and ln.tolist() == ref_l
        assert v.dtype == np.int64 and ln.dtype == np.int32


@settings(max_examples=30, deadline=None)
@given(jagged())
def test_take_matches_reference(case: tuple[Bags, np.ndarray, list[int]]) -> None:
    bags, dense, rows = case
    data = _encoded(bags, dense)
    sub = data.take(np.array(rows, dtype=np.int64))
    assert len(sub) == len(rows) and sub.stats.rows == len(rows)
    assert sub.sparse_names == data.sparse_names and sub.dense_names == data.dense_names
    for name, bag in bags.items():
        ref_v, ref_l = _ref(bag, rows)
        assert sub.values[name].tolist() == ref_v and sub.lengths[name].tolist() == ref_l
        assert sub.offsets(name).tolist() == np.concatenate([[0], np.cumsum(ref_l, dtype=np.int64)]).tolist()
    np.testing.assert_array_equal(sub.dense, dense[np.array(rows, dtype=np.int64)])
    assert sub.labels.tolist() == [float(r) for r in rows]


@settings(max_examples=30, deadline=None)
@given(jagged())
def test_make_batch_matches_reference(case: tuple[Bags, np.ndarray, list[int]]) -> None:
    bags, dense, rows = case
    data = _encoded(bags, dense)
    idx = np.array(rows, dtype=np.int64)
    offsets = {k: data.offsets(k) for k in data.sparse_names}
    for batch in (make_batch(data, idx), make_batch(data, idx, offsets)):
        kjt = batch.sparse_features
        assert kjt.keys() == list(bags)
        assert kjt.values().dtype == torch.int64 and kjt.lengths().dtype == torch.int32
        # feature-major layout: all rows of feature 0, then feature 1, ...
        ref = [_ref(bag, rows) for bag in bags.values()]
        assert kjt.values().tolist() == [v for r in ref for v in r[0]]
        assert kjt.lengths().tolist() == [n for r in ref for n in r[1]]
        if rows:
            assert kjt.stride() == len(rows)
            for name, jt in kjt.to_dict().items():
                assert [t.tolist() for t in jt.to_dense()] == [bags[name][r] for r in rows]
        assert batch.dense_features.dtype == torch.float32 and batch.labels.dtype == torch.float32
        assert tuple(batch.dense_features.shape) == (len(rows), dense.shape[1])
        np.testing.assert_array_equal(batch.dense_features.numpy(), dense[idx])
        assert batch.labels.tolist() == [float(r) for r in rows]


def test_make_batch_keys_follow_schema_order() -> None:
    schema = Schema(
        (
            FeatureSpec("price", FeatureKind.DENSE, transform=DenseTransform.LOG1P),
            FeatureSpec("zeta"),
            FeatureSpec("tags", FeatureKind.MULTI_CATEGORICAL),
            FeatureSpec("alpha", hash_size=5),
            FeatureSpec("age", FeatureKind.DENSE),
        )
    )
    frame = pd.DataFrame(
        {"price": [1.0, 2.0, 3.0], "zeta": ["a", "b", "a"], "tags": ["x|y", "", "y"], "alpha": ["p", "q", "r"],
         "age": [10.0, 20.0, np.nan], "label": [1, 0, 1]}
    )
    enc = Preprocessor(schema).fit(frame).transform(frame)
    batch = make_batch(enc, np.array([2, 0]))
    assert batch.sparse_features.keys() == ["zeta", "tags", "alpha"]
    per_key = batch.sparse_features.to_dict()
    assert [t.tolist() for t in per_key["zeta"].to_dense()] == [[1], [1]]  # "a" is the most frequent
    assert [t.tolist() for t in per_key["tags"].to_dense()] == [[1], [2, 1]]  # y (2x) = 1, x = 2; order kept
    np.testing.assert_allclose(batch.dense_features.numpy(), [[np.log1p(3.0), 0.0], [np.log1p(1.0), 10.0]], rtol=1e-6)
    assert batch.labels.tolist() == [1.0, 1.0]
    assert per_key["alpha"].values().tolist() == enc.values["alpha"][[2, 0]].tolist()
    assert make_batch(enc, np.array([1])).labels.tolist() == [0.0]


# -- BatchDataset ---------------------------------------------------------------------------------
def _traceable(n: int) -> EncodedData:
    """Row r: feature "row" = [r], feature "bag" = [r] * (r % 3), dense = [r, -r]."""
    bags = {"row": [[r] for r in range(n)], "bag": [[r] * (r % 3) for r in range(n)]}
    return _encoded(bags, np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32))


def _rows_of(batch: Batch) -> list[int]:
    rows = [int(x) for x in batch.labels.tolist()]
    per_key = batch.sparse_features.to_dict()
    assert per_key["row"].values().tolist() == rows  # every part of the batch is the same rows
    assert [t.tolist() for t in per_key["bag"].to_dense()] == [[r] * (r % 3) for r in rows]
    assert batch.dense_features[:, 0].tolist() == [float(r) for r in rows]
    return rows


def _epoch(ds: BatchDataset) -> list[list[int]]:
    return [_rows_of(b) for b in ds]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("n", "bs"), [(103, 10), (100, 10), (7, 10), (1, 1)])
def test_batch_dataset_covers_each_row_once(n: int, bs: int, shuffle: bool) -> None:
    ds = BatchDataset(_traceable(n), batch_size=bs, shuffle=shuffle, seed=3)
    batches = _epoch(ds)
    assert len(batches) == len(ds) == -(-n // bs)
    assert all(len(b) == bs for b in batches[:-1]) and 1 <= len(batches[-1]) <= bs
    flat = [r for b in batches for r in b]
    assert sorted(flat) == list(range(n))
    if not shuffle:
        assert flat == list(range(n))

    dl = BatchDataset(_traceable(n), batch_size=bs, shuffle=shuffle, seed=3, drop_last=True)
    batches = _epoch(dl)
    assert len(batches) == len(dl) == n // bs
    assert all(len(b) == bs for b in batches)
    flat = [r for b in batches for r in b]
    assert len(set(flat)) == len(flat) == (n // bs) * bs


def test_batch_dataset_shuffle_is_seeded_per_epoch() -> None:
    data = _traceable(50)
    a = BatchDataset(data, batch_size=8, shuffle=True, seed=11)
    e0 = _epoch(a)
    assert _epoch(a) == e0  # same epoch, same order
    assert e0 != _epoch(BatchDataset(data, batch_size=8, shuffle=False))
    a.set_epoch(1)
    e1 = _epoch(a)
    assert e1 != e0 and sorted(r for b in e1 for r in b) == list(range(50))
    a.set_epoch(0)
    assert _epoch(a) == e0
    # a fresh dataset told the epoch (a resumed run) sees the same order
    b = BatchDataset(data, batch_size=8, shuffle=True, seed=11)
    b.set_epoch(1)
    assert _epoch(b) == e1
    assert _epoch(BatchDataset(data, batch_size=8, shuffle=True, seed=12)) != e0


def test_batch_dataset_through_dataloader() -> None:
    ds = BatchDataset(_traceable(23), batch_size=5, shuffle=True, seed=0)
    direct = _epoch(ds)
    loader = DataLoader(ds, batch_size=None)
    assert [_rows_of(b) for b in loader] == direct


@pytest.mark.parametrize(("n", "bs", "world"), [(103, 10, 2), (100, 10, 2), (21, 10, 2), (7, 9, 3), (23, 8, 4)])
def test_distributed_slices_split_each_global_batch(n: int, bs: int, world: int) -> None:
    """Every rank walks the same global batches and keeps its contiguous, equal slice: padded
    (label -1) for evaluation, so every row is seen exactly once; unpadded for training, which
    drops the remainder that does not split (fewer than ``world`` rows)."""
    data = _traceable(n)
    global_batches = _epoch(BatchDataset(data, bs, shuffle=True, seed=3))

    evaluation = [list(BatchDataset(data, bs, shuffle=True, seed=3, rank=r, world_size=world, pad=True)) for r in range(world)]
    assert {len(e) for e in evaluation} == {len(global_batches)}
    for i, rows in enumerate(global_batches):
        parts = [evaluation[r][i].labels.tolist() for r in range(world)]
        assert len({len(p) for p in parts}) == 1  # equal slices (sharded lookups need them)
        assert [int(x) for p in parts for x in p if x >= 0] == rows
        assert all(x == -1 for p in parts for x in p[: len(p)] if x < 0)

    training = [BatchDataset(data, bs, shuffle=True, seed=3, rank=r, world_size=world) for r in range(world)]
    epochs = [_epoch(t) for t in training]
    assert {len(e) for e in epochs} == {len(training[0])}
    used = 0
    for i, parts in enumerate(zip(*epochs)):
        assert len({len(p) for p in parts}) == 1 and len(parts[0]) >= 1
        flat = [r for p in parts for r in p]
        assert flat == global_batches[i][: len(flat)]
        assert len(global_batches[i]) - len(flat) < world
        used += len(flat)
    assert n - used < world


def test_batch_dataset_rejects_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        BatchDataset(_traceable(3), batch_size=0)


# -- random_batch ---------------------------------------------------------------------------------
def _fitted_schema() -> Schema:
    return Schema(
        (
            FeatureSpec("u", num_embeddings=7),
            FeatureSpec("d1", FeatureKind.DENSE),
            FeatureSpec("g", FeatureKind.MULTI_CATEGORICAL, num_embeddings=3),
            FeatureSpec("one", num_embeddings=1),
            FeatureSpec("d2", FeatureKind.DENSE),
        )
    )


def test_random_batch_ids_in_range() -> None:
    schema = _fitted_schema()
    batch = random_batch(schema, batch_size=64, seed=5, max_bag=4)
    kjt = batch.sparse_features
    assert kjt.keys() == ["u", "g", "one"] and kjt.stride() == 64
    assert kjt.values().dtype == torch.int64 and kjt.lengths().dtype == torch.int32
    per_key = kjt.to_dict()
    for f in schema.sparse:
        jt = per_key[f.name]
        assert ((jt.values() >= 0) & (jt.values() < f.num_embeddings)).all()
        if f.kind is FeatureKind.CATEGORICAL:
            assert (jt.lengths() == 1).all()
        else:
            assert ((jt.lengths() >= 0) & (jt.lengths() <= 4)).all()
    assert per_key["u"].values().unique().numel() > 1
    assert tuple(batch.dense_features.shape) == (64, 2) and batch.dense_features.dtype == torch.float32
    assert set(batch.labels.tolist()) <= {0.0, 1.0} and batch.labels.dtype == torch.float32
    again = random_batch(schema, batch_size=64, seed=5, max_bag=4)
    assert torch.equal(again.sparse_features.values(), kjt.values())
    assert torch.equal(again.dense_features, batch.dense_features)
    other = random_batch(schema, batch_size=64, seed=6, max_bag=4)
    assert not torch.equal(other.dense_features, batch.dense_features)
