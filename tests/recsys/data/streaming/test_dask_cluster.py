"""prepare_shards_distributed on a local 2-process Dask cluster: the shards of prepare_shards."""

from __future__ import annotations

import gzip
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

from recsys.data.prepare import PrepareConfig
from recsys.data.raw import DataError, RawData
from recsys.data.readers import CriteoReader, TabularReader
from recsys.data.splits import SplitConfig
from recsys.data.streaming.dask_cluster import _Job, _run, partitions, prepare_shards_distributed
from recsys.data.streaming.prepare import prepare_shards
from recsys.data.streaming.shards import ShardSet
from tests.recsys.data.test_readers_stream import criteo_lines
from tests.recsys.data.test_splits import shop_frame, write_shop

SPLITS = ("train", "val", "test")


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """Two single-threaded worker processes (tasks are pickled to other processes, as on a cluster)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture()
def threads() -> Iterator[Client]:
    """One in-process worker thread (so a test can patch what the task runs)."""
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield c


def assert_same_shards(got: ShardSet, want: ShardSet) -> None:
    """Same vocabularies (dense statistics to float rounding) and the same rows of every split."""
    a, b = got.preprocessor.state_dict(), want.preprocessor.state_dict()
    assert a["vocabularies"] == b["vocabularies"] and a["schema"] == b["schema"]
    for k, v in b["dense_stats"].items():
        np.testing.assert_allclose(a["dense_stats"][k], v, rtol=1e-12)
    assert set(got.splits) == set(want.splits)
    for name in want.splits:
        x, y = got.split(name).to_encoded(), want.split(name).to_encoded()
        for f in y.sparse_names:
            np.testing.assert_array_equal(x.values[f], y.values[f])
            np.testing.assert_array_equal(x.lengths[f], y.lengths[f])
        np.testing.assert_allclose(x.dense, y.dense, rtol=1e-6)
        np.testing.assert_array_equal(x.labels, y.labels)
        assert x.stats.to_dict() == y.stats.to_dict()
    for key in ("split", "encode", "features"):
        assert got.summary[key] == want.summary[key], key


def _criteo_files(tmp_path: Path, sizes: list[int], seed: int = 4) -> list[Path]:
    lines = criteo_lines(sum(sizes), seed=seed, cardinality=3000)
    paths, start = [], 0
    for i, n in enumerate(sizes):
        path = tmp_path / f"day_{i}.txt{'.gz' if i == 1 else ''}"  # gzip and plain mixed
        data = ("\n".join(lines[start : start + n]) + "\n").encode()
        path.write_bytes(gzip.compress(data) if i == 1 else data)
        paths.append(path)
        start += n
    return paths


def test_files_split_equals_prepare_shards(tmp_path: Path, client: Client) -> None:
    days = _criteo_files(tmp_path, [700, 600, 500, 400, 300])
    reader = CriteoReader([str(p) for p in days[:3]], min_count=2)
    split = SplitConfig(files={"train": [str(p) for p in days[:3]], "val": str(days[3]), "test": str(days[4])})
    assert len(partitions(reader, split)) == 5
    got = prepare_shards_distributed(reader, PrepareConfig(split, cache_dir=tmp_path / "d", rows_per_shard=256, chunk_rows=128,
                                     progress=False), client=client)
    want = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "s", rows_per_shard=256, chunk_rows=128, progress=False))
    assert_same_shards(got, want)
    files = [s.file for part in got.splits.values() for s in part.shards]
    assert len(set(files)) == len(files) and "train/p00002-00000.npz" in files  # one name per partition's shard
    assert [s.rows for s in got.split("train").shards] == [256, 256, 188, 256, 256, 88, 256, 244]
    assert got.summary["engine"] == {"name": "dask", "partitions": 5}
    ShardSet.open(got.folder, checksum=True)  # sizes and SHA-256 in the manifest
    assert [p.name for p in (tmp_path / "d").iterdir()] == [got.folder.name]  # no build or spill folder left
    assert prepare_shards_distributed(reader, PrepareConfig(split, cache_dir=tmp_path / "d", rows_per_shard=256, progress=False), client="no scheduler needed: cached").folder == got.folder


@pytest.mark.parametrize("cuts", [[7, 9], None])
def test_time_split_over_files_equals_prepare_shards(tmp_path: Path, client: Client, cuts: list[int] | None) -> None:
    frame = shop_frame(1500, seed=3)
    paths = [write_shop(tmp_path, frame.iloc[a:b], f"part{i}.csv")[0] for i, (a, b) in
             enumerate([(0, 500), (500, 1100), (1100, 1500)])]
    schema = tmp_path / "shop.yaml"
    reader = TabularReader([str(p) for p in paths], str(schema))
    split = SplitConfig(0.6, 0.25, 0.15, time_column="day", time_cuts=cuts)  # type: ignore[arg-type]
    got = prepare_shards_distributed(reader, PrepareConfig(split, cache_dir=tmp_path / "d", rows_per_shard=200, chunk_rows=64,
                                     progress=False), client=client)
    want = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "s", rows_per_shard=200, chunk_rows=64, progress=False))
    assert_same_shards(got, want)


def test_random_split_depends_on_seed_file_and_row_only(tmp_path: Path, client: Client, threads: Client) -> None:
    days = _criteo_files(tmp_path, [900, 700, 400], seed=5)
    split = SplitConfig(0.7, 0.2, 0.1, seed=1)
    one = CriteoReader(str(days[0]))  # one file: the draws of the single-machine path
    assert_same_shards(
        prepare_shards_distributed(one, PrepareConfig(split, cache_dir=tmp_path / "d", rows_per_shard=128, progress=False), client=client),
        prepare_shards(one, PrepareConfig(split, cache_dir=tmp_path / "s", rows_per_shard=128, progress=False)),
    )
    many = CriteoReader([str(p) for p in days])
    two = prepare_shards_distributed(many, PrepareConfig(split, cache_dir=tmp_path / "a", rows_per_shard=128, progress=False), client=client)
    single = prepare_shards_distributed(many, PrepareConfig(split, cache_dir=tmp_path / "b", rows_per_shard=128, chunk_rows=50,
                                        progress=False), client=threads)
    assert_same_shards(two, single)  # another number of workers and chunk size: the same shards
    expected = {name: 0 for name in SPLITS}
    for i, n in enumerate([900, 700, 400]):  # file i's draws: default_rng([seed, i]), in row order
        u = np.random.default_rng([1, i]).random(n)
        codes = (u >= 0.7).astype(int) + (u >= 0.9)
        for k, name in enumerate(SPLITS):
            expected[name] += int((codes == k).sum())
    assert {k: two.summary["split"][f"{k}_rows"] for k in SPLITS} == expected


def test_bad_input(tmp_path: Path, client: Client, threads: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed row names its file and line; time order is checked across files; a file that
    changes while it is prepared is refused; nothing is left in the cache."""
    days = _criteo_files(tmp_path, [500, 400, 300], seed=6)
    lines = days[2].read_text().splitlines()
    lines[200] = "junk"
    days[2].write_text("\n".join(lines) + "\n")
    reader = CriteoReader([str(p) for p in days])
    with pytest.raises(DataError, match=r"day_2\.txt:201: expected 40"):
        prepare_shards_distributed(reader, PrepareConfig(cache_dir=tmp_path / "c", progress=False), client=client)
    skipped = prepare_shards_distributed(CriteoReader([str(p) for p in days], skip_bad_rows=True), PrepareConfig(cache_dir=tmp_path / "c", progress=False), client=client)
    assert skipped.summary["read"]["rows_skipped"] == 1 and skipped.summary["read"]["rows_read"] == 1199

    frame = shop_frame(600, seed=8)
    late, _ = write_shop(tmp_path, frame.iloc[300:], "late.csv")
    early, schema = write_shop(tmp_path, frame.iloc[:300], "early.csv")
    shop = TabularReader([str(late), str(early)], str(schema))  # the files in the wrong order
    with pytest.raises(DataError, match=r"early\.csv:2: the time column 'day' goes back in time: .*\(.*late\.csv:301\)"):
        prepare_shards_distributed(shop, PrepareConfig(SplitConfig(time_column="day", time_cuts=[7]), cache_dir=tmp_path / "t",
                                   progress=False), client=client)
    assert not any((tmp_path / "t").iterdir())

    good = CriteoReader([str(p) for p in days[:2]])
    real = CriteoReader.iter_chunks

    def appending(self: CriteoReader, *args: object, **kw: object) -> Iterator[RawData]:
        yield from real(self, *args, **kw)  # type: ignore[arg-type]
        path = self.source_file()
        if path.suffix != ".gz":  # a writer appends to the file once it was read
            with open(path, "a") as fh:
                fh.write(criteo_lines(1, seed=9)[0] + "\n")

    monkeypatch.setattr(CriteoReader, "iter_chunks", appending)
    with pytest.raises(DataError, match=r"day_0\.txt: the raw file changed .* while it was read.*Nothing was cached"):
        prepare_shards_distributed(good, PrepareConfig(cache_dir=tmp_path / "m", progress=False), client=threads)
    assert not any((tmp_path / "m").iterdir())


def test_data_module_engine_dask(tmp_path: Path, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.engine: dask`` with ``data.scheduler``: the module streams the shards the cluster wrote."""
    from recsys.train.datamodule import CTRDataModule

    days = _criteo_files(tmp_path, [300, 200], seed=11)
    reader = CriteoReader([str(p) for p in days])
    dm = CTRDataModule(reader, batch_size=64, streaming=True, cache_dir=str(tmp_path / "c"), rows_per_shard=128,
                       engine="dask", scheduler=client.scheduler.address)
    shards = dm.shard_set
    assert "-dask-shards-" in shards.folder.name and shards.summary["engine"]["partitions"] == 2
    assert sum(part.rows for part in shards.splits.values()) == 500
    with pytest.raises(ValueError, match="data.engine"):
        CTRDataModule(reader, engine="spark")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data.span_mb"):
        CTRDataModule(reader, span_mb=0)
    # data.span_mb reaches the engine as bytes (null: one task per file)
    import recsys.data.streaming.dask_cluster as engine

    seen: list[int | None] = []
    monkeypatch.setattr(engine, "prepare_shards_distributed",
                        lambda reader, config, client=None, span_bytes=None: seen.append(span_bytes))
    for span_mb in (3, None):
        _ = CTRDataModule(reader, streaming=True, cache_dir=str(tmp_path / "c"), engine="dask", span_mb=span_mb).shard_set
    assert seen == [3 << 20, None]


def test_a_large_file_cut_into_spans_equals_the_whole_file(tmp_path: Path, client: Client) -> None:
    """One plain file cut into byte spans of whole lines (one partition each, read by both
    workers): the rows, split draws, vocabularies and read report of the uncut file."""
    path = _criteo_files(tmp_path, [1500], seed=6)[0]
    split = SplitConfig(0.7, 0.2, 0.1, seed=2)
    reader = CriteoReader(str(path), min_count=2)
    span = path.stat().st_size // 5 + 7  # cuts fall inside lines: moved to the next line start
    assert len(partitions(reader, split, span_bytes=span)) == 5
    cut = prepare_shards_distributed(reader, PrepareConfig(split, cache_dir=tmp_path / "d", rows_per_shard=256, chunk_rows=100,
                                     progress=False), client=client, span_bytes=span)
    whole = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "s", rows_per_shard=256, progress=False))
    assert_same_shards(cut, whole)
    assert cut.summary["engine"] == {"name": "dask", "partitions": 5, "spans": 5}
    assert cut.summary["read"]["rows_read"] == 1500 and cut.summary["read"]["source"] == str(path)
    assert "-s" in cut.folder.name  # the span size is part of the key


def test_spans_name_bad_rows_by_their_line_in_the_file(tmp_path: Path, client: Client) -> None:
    lines = criteo_lines(1200, seed=7)
    lines[1000] = "1\tnot\tenough"  # line 1001, in the last span
    lines[150] = "0\ttoo\tshort"  # line 151, in the first
    path = tmp_path / "day.txt"
    path.write_text("\n".join(lines) + "\n")
    split = SplitConfig(0.8, 0.1, 0.1, seed=0)
    config = PrepareConfig(split, cache_dir=tmp_path / "d", rows_per_shard=256, chunk_rows=64, progress=False)
    span = path.stat().st_size // 4
    with pytest.raises(DataError, match=rf"{path.name}:151: expected 40"):
        prepare_shards_distributed(CriteoReader(str(path)), config, client=client, span_bytes=span)
    skipping = CriteoReader(str(path), skip_bad_rows=True)
    got = prepare_shards_distributed(skipping, config, client=client, span_bytes=span)
    assert got.summary["read"]["skipped_lines"] == [151, 1001] and got.summary["read"]["rows_read"] == 1198
    assert got.summary["engine"]["spans"] == 4


@dataclass
class _Done:
    index: int
    end: float
    rows: int = 0


def _sleep_then_time(index: int, seconds: float) -> _Done:
    time.sleep(seconds)
    return _Done(index, time.time())


def test_run_hands_results_over_in_call_order_while_later_calls_run(tmp_path: Path, client: Client) -> None:
    """Pass 1's counts are merged in partition order (the float moments' order) as they come in:
    a result waits for those before it, and does not wait for those after it."""
    job = _Job(str(tmp_path), SplitConfig(), (None, None, None), chunk_rows=10, rows_per_shard=10)
    seen: list[tuple[int, float]] = []
    calls = [(0, 0.8), (1, 0.0), (2, 0.0), (3, 3.0)]  # 1 and 2 end before 0; 3 ends last
    results = _run(client, _sleep_then_time, calls, job, "test", False,
                   in_order=lambda r: seen.append((r.index, time.time())))
    assert [r.index for r in results] == [0, 1, 2, 3]
    assert [i for i, _ in seen] == [0, 1, 2, 3]
    assert seen[0][1] >= results[0].end and seen[1][1] >= results[0].end  # 1 waited for 0
    assert seen[2][1] < results[3].end  # 0-2 were handed over while 3 still ran
