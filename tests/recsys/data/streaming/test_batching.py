"""ShardBatchDataset: streamed batches cover every row once per epoch on every layout, follow
BatchDataset in evaluation, resume mid-epoch exactly, hold at most ``buffer_shards`` shards and
refuse a damaged shard by name."""

from __future__ import annotations

import tracemalloc
import weakref

import numpy as np
import pytest

from recsys.data.batching import BatchDataset, make_batch
from recsys.data.encoders import EncodedData
from recsys.data.streaming.batching import ResumableLoader, ShardBatchDataset, select_columns
from recsys.data.streaming.shards import ShardError, ShardSet, SplitShards
from tests.recsys.data.shardsets import numbered, rows_of, same_batch, write_shards

N = 1003  # not a multiple of any shard size or batch below: partial last shards and batches


@pytest.fixture(scope="module")
def data() -> EncodedData:
    return numbered(N)[0]


def split(tmp_path_factory: pytest.TempPathFactory, data: EncodedData, rows_per_shard: int) -> SplitShards:
    folder = tmp_path_factory.mktemp("shards") / "set"
    pre = numbered(20)[1]
    return write_shards(folder, {"train": data}, pre, rows_per_shard).split("train")


@pytest.fixture(scope="module", params=[64, 250, 1003, 4096])
def shards(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, data: EncodedData) -> SplitShards:
    return split(tmp_path_factory, data, request.param)


def epoch(ds: ShardBatchDataset, e: int = 0) -> list:
    ds.set_epoch(e)
    return list(ds)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("buffer_shards", [1, 3])
def test_training_covers_every_row_once_with_equal_steps(
    shards: SplitShards, data: EncodedData, world: int, buffer_shards: int
) -> None:
    batch = 96  # 96 / 3 = 32 rows per process
    ranks = [
        ShardBatchDataset(shards, batch, train=True, seed=7, buffer_shards=buffer_shards, rank=r, world_size=world)
        for r in range(world)
    ]
    batches = [epoch(ds, 1) for ds in ranks]
    # equal steps and equal batch sizes on every rank (sharded embeddings need both)
    assert len({len(b) for b in batches}) == 1 and all(len(b) == len(ds) for b, ds in zip(batches, ranks, strict=True))
    assert len({tuple(len(x.labels) for x in b) for b in batches}) == 1
    assert all(len(x.labels) == batch // world for x in batches[0][:-1])
    seen = [r for b in batches for x in b for r in rows_of(x)]
    assert len(seen) == len(set(seen)) == world * (N // world)  # each row at most once, < world rows left out
    # each batch holds exactly the encoded rows it names
    for x in batches[-1][:3] + batches[0][-2:]:
        assert same_batch(x, make_batch(data, np.array(rows_of(x))))


def test_training_order_is_seeded_shuffled_and_new_each_epoch(shards: SplitShards) -> None:
    def order(seed: int, e: int) -> list[int]:
        ds = ShardBatchDataset(shards, 64, train=True, seed=seed, buffer_shards=2)
        return [r for x in epoch(ds, e) for r in rows_of(x)]

    first = order(3, 0)
    assert first == order(3, 0)  # deterministic
    assert sorted(first) == list(range(N))
    assert first != order(3, 1) and first != order(4, 0) and first != list(range(N))
    if len(shards.shards) > 2:  # rows of several shards are mixed within a batch
        first_batch = first[:64]
        assert len({r // shards.shards[0].rows for r in first_batch}) > 1


@pytest.mark.parametrize(("world", "pad"), [(1, True), (2, True), (3, True), (3, False)])
def test_evaluation_batches_equal_batch_dataset(shards: SplitShards, data: EncodedData, world: int, pad: bool) -> None:
    for rank in range(world):
        streamed = ShardBatchDataset(shards, 100, rank=rank, world_size=world, pad=pad)
        memory = BatchDataset(data, 100, rank=rank, world_size=world, pad=pad)
        a, b = list(streamed), list(memory)
        assert len(streamed) == len(memory) == len(a) == len(b)
        assert all(same_batch(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("world", [1, 2])
def test_resume_mid_epoch_yields_the_rest_of_the_uninterrupted_epoch(tmp_path_factory: pytest.TempPathFactory,
                                                                     data: EncodedData, world: int) -> None:
    shards = split(tmp_path_factory, data, 90)

    def make(rank: int) -> ShardBatchDataset:
        return ShardBatchDataset(shards, 64, train=True, seed=5, buffer_shards=3, rank=rank, world_size=world)

    for rank in range(world):
        straight = epoch(make(rank), 2)
        # buffers of 270 rows: batch 4 (rows 256..319) spans two
        for k in sorted({0, 1, 4, len(straight) // 2, len(straight) - 1, len(straight)}):
            ds = make(rank)
            ds.set_epoch(2)
            it = iter(ds)
            for _ in range(k):
                next(it)
            state = ds.state_dict()
            assert state["epoch"] == 2 and state["batches"] == k
            resumed = make(rank)
            resumed.load_state_dict(state)
            resumed.set_epoch(2)  # what the task does at the epoch start
            rest = list(resumed)
            assert len(rest) == len(straight) - k
            assert all(same_batch(x, y) for x, y in zip(rest, straight[k:], strict=True)), k
            assert rows_of(epoch(resumed, 3)[0]) == rows_of(epoch(make(rank), 3)[0])  # then whole epochs again


def test_resume_is_refused_mid_epoch_on_another_layout_only(shards: SplitShards) -> None:
    ds = ShardBatchDataset(shards, 64, train=True, seed=5)
    it = iter(ds)
    next(it)
    mid = ds.state_dict()
    with pytest.raises(ValueError, match=r"layout changed \(world_size 1 -> 2"):
        ShardBatchDataset(shards, 64, train=True, seed=5, world_size=2).load_state_dict(mid)
    list(it)
    end = ds.state_dict()  # the epoch is over: nothing of it is left to reproduce
    other = ShardBatchDataset(shards, 64, train=True, seed=5, world_size=2)
    other.load_state_dict(end)
    other.set_epoch(1)
    assert len(list(other)) == len(other)


def test_resumable_loader_carries_the_dataset_state(shards: SplitShards) -> None:
    loader = ResumableLoader(ShardBatchDataset(shards, 64, train=True))
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["batches"] == 2
    again = ResumableLoader(ShardBatchDataset(shards, 64, train=True))
    again.load_state_dict(loader.state_dict())
    assert same_batch(next(iter(again)), next(it))
    with pytest.raises(ValueError, match="num_workers=0"):
        ResumableLoader(ShardBatchDataset(shards, 64, train=True), num_workers=2)


def test_at_most_buffer_shards_are_loaded_at_once(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path_factory: pytest.TempPathFactory, data: EncodedData) -> None:
    shards = split(tmp_path_factory, data, 50)  # 21 shards
    alive, peak, loads = [0], [0], [0]
    load = SplitShards.load

    def counted(self: SplitShards, index: int) -> EncodedData:
        out = load(self, index)
        alive[0] += 1
        loads[0] += 1
        peak[0] = max(peak[0], alive[0])
        weakref.finalize(out, lambda: alive.__setitem__(0, alive[0] - 1))
        return out

    monkeypatch.setattr(SplitShards, "load", counted)
    for buffer_shards in (1, 3):
        peak[0] = loads[0] = 0
        list(ShardBatchDataset(shards, 64, train=True, buffer_shards=buffer_shards))
        assert peak[0] <= buffer_shards and loads[0] == len(shards.shards)
    peak[0] = 0
    list(ShardBatchDataset(shards, 100))
    assert peak[0] == 1


def test_memory_does_not_grow_with_the_number_of_shards(tmp_path_factory: pytest.TempPathFactory) -> None:
    big, _ = numbered(4000)

    def peak_bytes(rows: int) -> int:
        shards = split(tmp_path_factory, big.take(np.arange(rows)), 250)
        ds = ShardBatchDataset(shards, 50, train=True, buffer_shards=2)
        tracemalloc.start()
        try:
            for _ in ds:
                pass
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    arrays = (*big.values.values(), *big.lengths.values(), big.dense, big.labels)
    shard_bytes = sum(a.nbytes for a in arrays) * 250 // 4000
    small, large = peak_bytes(1000), peak_bytes(4000)  # 4 and 16 shards
    assert large < 1.3 * small
    assert large < 8 * shard_bytes  # a buffer of 2 shards, its copy while assembled, a batch


def test_a_truncated_shard_is_a_shard_error_naming_the_file(
    tmp_path_factory: pytest.TempPathFactory, data: EncodedData
) -> None:
    shards = split(tmp_path_factory, data, 200)
    victim = shards.folder / shards.shards[2].file
    whole = victim.read_bytes()
    victim.write_bytes(whole[: len(whole) // 2])
    for ds in (ShardBatchDataset(shards, 64, train=True), ShardBatchDataset(shards, 64)):
        with pytest.raises(ShardError, match=str(victim)):
            list(ds)
    with pytest.raises(ShardError, match=str(victim)):
        ShardSet.open(shards.folder)
    # same size, unreadable content: still named, never read as rows
    victim.write_bytes(b"\0" * len(whole))
    with pytest.raises(ShardError, match=rf"{victim}: unreadable shard"):
        list(ShardBatchDataset(shards, 64))


def test_a_column_view_streams_only_the_chosen_features(shards: SplitShards, data: EncodedData) -> None:
    keep = [data.sparse_names[1], data.dense_names[0], data.sparse_names[0]]
    view = select_columns(data, keep)
    assert view.sparse_names == data.sparse_names[:2] and view.dense_names == data.dense_names[:1]
    streamed = list(ShardBatchDataset(shards, 128, columns=keep))
    assert all(same_batch(x, y) for x, y in zip(streamed, BatchDataset(view, 128), strict=True))
    with pytest.raises(ValueError, match=r"features \['nope'\] are not in the shards"):
        list(ShardBatchDataset(shards, 128, columns=["nope"]))


def test_invalid_arguments_are_refused(shards: SplitShards) -> None:
    with pytest.raises(ValueError, match="must split evenly over 3"):
        ShardBatchDataset(shards, 64, train=True, world_size=3)
    with pytest.raises(ValueError, match="buffer_shards"):
        ShardBatchDataset(shards, 64, buffer_shards=0)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        ShardBatchDataset(shards, 64, rank=2, world_size=2)
