"""A split in memory and the same split as a view of its shards (:mod:`recsys.data.streaming.split_view`):
the same samples, evaluation batches and metrics, row subsets streamed, a manual fit over a
view, and the bounded raw sample of one split (:mod:`recsys.data.streaming.raw_sample`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recsys.data.batching import BatchDataset
from recsys.data.prepare import PrepareConfig, PreparedData, SplitConfig, prepare_data
from recsys.data.streaming.raw_sample import sample_raw_split
from recsys.data.streaming.shards import ShardSet
from recsys.data.streaming.split_view import SplitView, SubsetBatches, batch_dataset, iter_chunks, sample_rows
from recsys.data.synthetic import SyntheticReader
from recsys.models import DCNv2
from recsys.models.base import SparseArchConfig
from recsys.train.evaluation import evaluate
from recsys.train.manual import ManualTask, fit_split
from tests.recsys.data.shardsets import numbered, rows_of, same_batch, write_prepared, write_shards

ROWS = 3000
SPLIT = SplitConfig(train=0.8, val=0.1, test=0.1, seed=42)


from tests.recsys.train.test_streaming import one_thread  # noqa: E402,F401 - autouse: one intra-op thread


@pytest.fixture(scope="module")
def prepared() -> PreparedData:
    return prepare_data(SyntheticReader(n_rows=ROWS, seed=0, embedding_dim=8), PrepareConfig(SPLIT))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, prepared: PreparedData) -> ShardSet:
    return write_prepared(tmp_path_factory.mktemp("split_stream") / "shards", prepared, 500)


def model(prepared: PreparedData) -> DCNv2:
    torch.manual_seed(0)
    return DCNv2(prepared.schema, SparseArchConfig(), cross_layers=1, deep_mlp=[8])


def test_samples_are_the_same_rows_in_memory_and_streamed(prepared: PreparedData, shards: ShardSet) -> None:
    data, view = prepared.splits["train"], SplitView(shards.split("train"), buffer_shards=2)
    assert len(view) == len(data) and len(shards.split("train").shards) >= 4
    whole = sample_rows(view, 10**9)  # every row, in order
    assert same_batch(next(iter(BatchDataset(whole, len(data)))), next(iter(BatchDataset(data, len(data)))))
    for rows, seed in ((1, 0), (700, 3), (len(data) - 1, 1)):
        a, b = sample_rows(view, rows, seed), sample_rows(data, rows, seed)
        assert len(a) == rows and same_batch(next(iter(BatchDataset(a, rows))), next(iter(BatchDataset(b, rows))))
    assert not same_batch(*(next(iter(BatchDataset(sample_rows(view, 700, s), 700))) for s in (0, 1)))
    assert sum(len(c) for c in iter_chunks(view)) == len(data)
    with pytest.raises(ValueError, match=">= 1"):
        sample_rows(view, 0)


def test_evaluation_of_a_view_equals_the_in_memory_one(prepared: PreparedData, shards: ShardSet) -> None:
    data, view = prepared.splits["val"], SplitView(shards.split("val"))
    a, b = list(batch_dataset(view, 64)), list(BatchDataset(data, 64))
    assert len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b, strict=True))
    m = model(prepared)
    assert evaluate(m, view, 64) == evaluate(m, data, 64)  # exactly: the same logits and labels


def test_a_row_subset_streams_its_rows_once_per_epoch_in_a_seeded_order(tmp_path: Path) -> None:
    data, pre = numbered(2000)  # label = row number
    part = write_shards(tmp_path / "numbered", {"train": data}, pre, 300).split("train")
    rng = np.random.default_rng(0)
    keep = [np.flatnonzero(rng.random(s.rows) < 0.3) for s in part.shards]
    starts = np.cumsum([0] + [s.rows for s in part.shards])
    wanted = [int(s + k) for s, ks in zip(starts, keep, strict=False) for k in ks]
    sub = SplitView(part, buffer_shards=2).subset(keep)
    assert len(sub) == len(wanted)
    order = {}
    for shuffle in (False, True):
        ds = batch_dataset(sub, 50, shuffle=shuffle, seed=1)
        assert isinstance(ds, SubsetBatches)
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            batches = list(ds)
            assert len(batches) == len(ds) and all(len(b.labels) == 50 for b in batches[:-1])
            order[(shuffle, epoch)] = [r for b in batches for r in rows_of(b)]
            assert sorted(order[(shuffle, epoch)]) == wanted  # every row of the subset once
    assert order[(False, 0)] == order[(False, 1)] == wanted  # evaluation order: in order
    assert order[(True, 0)] != order[(True, 1)] and order[(True, 0)] != wanted
    again = batch_dataset(sub, 50, shuffle=True, seed=1)
    assert [r for b in again for r in rows_of(b)] == order[(True, 0)]  # seeded
    half = sub.subset([np.arange(len(k) // 2) for k in keep])  # a subset of a subset
    assert [r for b in batch_dataset(half, 64) for r in rows_of(b)] == [
        int(s + k) for s, ks in zip(starts, keep, strict=False) for k in ks[: len(ks) // 2]]


def test_fit_split_trains_on_a_view_of_the_shards(prepared: PreparedData, shards: ShardSet) -> None:
    m = model(prepared)
    before = evaluate(m, prepared.splits["val"], 256)["logloss"]
    task = ManualTask(m, [torch.optim.Adam(m.parameters(), lr=0.01)])
    view = SplitView(shards.split("train"), buffer_shards=2)
    assert fit_split(task, view, batch_size=128, epochs=2, seed=0) == 2 * -(-len(view) // 128)
    assert evaluate(m, view, 256)["logloss"] < before


def test_the_raw_sample_of_a_split_is_the_streamed_splits_rows(tmp_path: Path) -> None:
    from recsys.data.streaming.prepare import prepare_shards

    reader = SyntheticReader(n_rows=ROWS, seed=0, embedding_dim=8)
    built = prepare_shards(reader, PrepareConfig(SPLIT, cache_dir=tmp_path, rows_per_shard=500))
    for name in ("train", "test"):
        every = sample_raw_split(reader, SPLIT, name, rows=10**9)
        encoded = built.split(name).to_encoded()
        assert len(every) == len(encoded)
        np.testing.assert_array_equal(every.labels, encoded.labels)
    train = sample_raw_split(reader, SPLIT, "train", rows=10**9)
    some = sample_raw_split(reader, SPLIT, "train", rows=400, seed=5, drop_features=["user_id"])
    assert len(some) == 400 and "user_id" not in some.schema.names
    assert some.frame.index.is_monotonic_increasing and set(some.frame.index) <= set(train.frame.index)
    assert not sample_raw_split(reader, SPLIT, "train", rows=400, seed=6).frame.index.equals(some.frame.index)


def test_the_raw_sample_is_the_same_rows_whatever_the_chunk_size_and_is_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bottom-k over many small chunks (compacted as it goes) keeps the rows one chunk keeps, and
    a second ask for the same sample (other features) reads nothing."""
    reader = SyntheticReader(n_rows=ROWS, seed=0, embedding_dim=8)
    whole = sample_raw_split(reader, SPLIT, "train", rows=300, seed=3, chunk_rows=ROWS)
    small = sample_raw_split(reader, SPLIT, "train", rows=300, seed=3, chunk_rows=64)
    assert len(small) == 300 and small.frame.index.equals(whole.frame.index)
    calls = []
    original = SyntheticReader.iter_chunks

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(SyntheticReader, "iter_chunks", counted)
    again = sample_raw_split(reader, SPLIT, "train", rows=300, seed=3, chunk_rows=64, drop_features=["user_id"])
    assert not calls and again.frame.index.equals(small.frame.index) and "user_id" not in again.frame
    again.frame[again.schema.label] = 0  # the caller's frame is its own: the kept sample is unchanged
    assert sample_raw_split(reader, SPLIT, "train", rows=300, seed=3, chunk_rows=64).frame.equals(small.frame)
    sample_raw_split(reader, SPLIT, "train", rows=301, seed=3, chunk_rows=64)
    assert calls  # another sample size is another read


def test_a_raw_file_rewritten_between_samples_is_read_again(tmp_path: Path) -> None:
    from recsys.data.readers import TabularReader
    from tests.recsys.data.test_splits import shop_frame, write_shop

    path, schema = write_shop(tmp_path, shop_frame(200, seed=1))
    reader = TabularReader(str(path), str(schema))
    first = sample_raw_split(reader, SPLIT, "train", rows=10**6)
    write_shop(tmp_path, shop_frame(400, seed=2))  # the same path, other rows
    second = sample_raw_split(reader, SPLIT, "train", rows=10**6)
    assert len(first) < 200 < len(second)


def test_the_kept_sample_is_on_disk_and_comes_back_the_same(tmp_path: Path) -> None:
    """The sample kept between requests is an Arrow file, not memory; it reads back equal (dtypes,
    index, values); the next sample replaces its file; object columns stay in memory."""
    import pandas as pd

    from recsys.data import raw_sample

    reader = SyntheticReader(n_rows=ROWS, seed=0, embedding_dim=8)
    first = sample_raw_split(reader, SPLIT, "train", rows=500, seed=1)
    (kept,) = raw_sample._LAST.values()
    assert kept.frame is None and kept.path is not None and kept.path.is_file()
    again = sample_raw_split(reader, SPLIT, "train", rows=500, seed=1)
    pd.testing.assert_frame_equal(again.frame, first.frame, check_exact=True)
    old_path = kept.path
    sample_raw_split(reader, SPLIT, "train", rows=501, seed=1)
    assert not old_path.exists()

    frame = first.frame.copy()
    frame["tags"] = frame["tags"].map(lambda t: t.split("|")).astype(object)  # lists: Python objects
    held = raw_sample._keep(type(first)(frame, first.schema, first.report))
    assert held.path is None and held.rows() is frame

