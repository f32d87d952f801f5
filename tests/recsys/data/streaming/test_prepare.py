"""prepare_shards: equal to prepare_data, cached, and each bad input of the streaming path."""

from __future__ import annotations

import errno
import gzip
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from recsys.data.encoders import EncodedData
from recsys.data.prepare import PrepareConfig, PreparedData, prepare_data
from recsys.data.raw import DataError, RawData
from recsys.data.readers import CriteoReader, TabularReader, blocks
from recsys.data.splits import SplitConfig
from recsys.data.streaming.prepare import prefetch, prepare_shards, shard_cache_folder
from recsys.data.streaming.shards import ShardError, ShardSet
from tests.conftest import require_dataset
from tests.recsys.data.test_readers_stream import criteo_lines
from tests.recsys.data.test_splits import shop_frame, write_shop

SPLITS = ("train", "val", "test")


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks, "MIN_BLOCK", 1)


def assert_same_as_memory(shards: ShardSet, prepared: PreparedData, standardized: tuple[str, ...] = ()) -> None:
    """Same preprocessor (dense statistics to float rounding) and the same encoded rows per split."""
    got, want = shards.preprocessor.state_dict(), prepared.preprocessor.state_dict()
    assert got["vocabularies"] == want["vocabularies"] and got["schema"] == want["schema"]
    for k, v in want["dense_stats"].items():
        np.testing.assert_allclose(got["dense_stats"][k], v, rtol=1e-12)
    assert set(shards.splits) == set(prepared.splits)
    for name, data in prepared.splits.items():
        enc = shards.split(name).to_encoded()
        for f in data.sparse_names:
            np.testing.assert_array_equal(enc.values[f], data.values[f])
            np.testing.assert_array_equal(enc.lengths[f], data.lengths[f])
        cols = [i for i, f in enumerate(data.dense_names) if f not in standardized]
        np.testing.assert_array_equal(enc.dense[:, cols], data.dense[:, cols])
        np.testing.assert_allclose(enc.dense, data.dense, rtol=1e-6)
        np.testing.assert_array_equal(enc.labels, data.labels)
        assert enc.stats.to_dict() == data.stats.to_dict()  # OOV and filled counts of the split
    for key in ("split", "encode", "features"):
        assert shards.summary[key] == prepared.summary[key], key
    assert shards.summary["ctr"] == pytest.approx(prepared.summary["ctr"])


def _shop(tmp_path: Path, n: int = 1500) -> tuple[TabularReader, dict[str, Path]]:
    frame = shop_frame(n, seed=3)
    train, schema = write_shop(tmp_path, frame.iloc[: int(n * 0.7)], "train.csv")
    valid, _ = write_shop(tmp_path, frame.iloc[int(n * 0.7) : int(n * 0.85)], "valid.csv")
    test, _ = write_shop(tmp_path, frame.iloc[int(n * 0.85) :], "test.csv")
    whole, _ = write_shop(tmp_path, frame, "all.csv")
    return TabularReader(str(whole), str(schema)), {"train": train, "valid": valid, "test": test}


def test_files_split_equals_prepare_data(tmp_path: Path) -> None:
    reader, files = _shop(tmp_path)
    split = SplitConfig(files={k: str(v) for k, v in files.items()})
    shards = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "c", rows_per_shard=100, chunk_rows=37, progress=False))
    assert_same_as_memory(shards, prepare_data(reader, PrepareConfig(split)), standardized=("price",))
    assert all(s.rows <= 100 for s in shards.split("train").shards) and len(shards.split("train").shards) == 11
    assert set(shards.summary["read"]) == {"train", "val", "test"}


@pytest.mark.parametrize("cuts", [[7, 9], None])
def test_time_split_equals_prepare_data(tmp_path: Path, cuts: list[int] | None) -> None:
    reader, _ = _shop(tmp_path)
    split = SplitConfig(0.6, 0.25, 0.15, time_column="day", time_cuts=cuts)  # type: ignore[arg-type]
    shards = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "c", rows_per_shard=256, chunk_rows=50, progress=False))
    assert_same_as_memory(shards, prepare_data(reader, PrepareConfig(split)), standardized=("price",))


def test_criteo_files_split_equals_prepare_data(tmp_path: Path) -> None:
    lines = criteo_lines(2000, seed=4, cardinality=3000)
    paths = {}
    for name, (a, b) in {"train": (0, 1400), "val": (1400, 1700), "test": (1700, 2000)}.items():
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text("\n".join(lines[a:b]) + "\n")
    reader = CriteoReader(str(paths["train"]), min_count=2)
    split = SplitConfig(files={k: str(v) for k, v in paths.items()})
    shards = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "c", rows_per_shard=300, chunk_rows=64, progress=False))
    assert_same_as_memory(shards, prepare_data(reader, PrepareConfig(split)))
    assert sum(shards.summary["encode"]["val"]["oov"].values()) > 0  # min_count 2 leaves unseen ids


@pytest.mark.data
def test_criteo_head_equals_prepare_data(tmp_path: Path, data_dir: Path) -> None:
    """The real Criteo head, cut into predefined files: same preprocessor and arrays as in memory."""
    src = require_dataset(data_dir, "criteo-kaggle-head10k") / "train_head10k.txt.gz"
    lines = gzip.decompress(src.read_bytes()).decode().splitlines()
    paths = {"train": tmp_path / "train.txt.gz", "val": tmp_path / "val.txt", "test": tmp_path / "test.txt"}
    paths["train"].write_bytes(gzip.compress(("\n".join(lines[:8000]) + "\n").encode()))  # gzip and plain mixed
    paths["val"].write_text("\n".join(lines[8000:9000]) + "\n")
    paths["test"].write_text("\n".join(lines[9000:]) + "\n")
    reader = CriteoReader(str(paths["train"]))
    split = SplitConfig(files={k: str(v) for k, v in paths.items()})
    shards = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "c", rows_per_shard=4096, chunk_rows=1500, progress=False))
    assert_same_as_memory(shards, prepare_data(reader, PrepareConfig(split)))


def test_random_split_and_chunking(tmp_path: Path) -> None:
    """Many small chunks (bounded memory) give the same shards as one chunk; the fractions are close."""
    path = tmp_path / "t.txt"
    path.write_text("\n".join(criteo_lines(3000, seed=5)) + "\n")
    reader = CriteoReader(str(path))
    split = SplitConfig(0.7, 0.2, 0.1, seed=1)
    small = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "a", rows_per_shard=200, chunk_rows=64, progress=False))
    big = prepare_shards(reader, PrepareConfig(split, cache_dir=tmp_path / "b", rows_per_shard=200, chunk_rows=5000, progress=False))
    assert small.preprocessor.vocabularies == big.preprocessor.vocabularies
    for k, v in big.preprocessor.dense_stats.items():
        np.testing.assert_allclose(small.preprocessor.dense_stats[k], v, rtol=1e-12)
    for name in SPLITS:
        a, b = small.split(name).to_encoded(), big.split(name).to_encoded()
        np.testing.assert_array_equal(a.values["C3"], b.values["C3"])
        np.testing.assert_array_equal(a.dense, b.dense)
        assert a.stats.to_dict() == b.stats.to_dict()
    counts = small.summary["split"]
    assert abs(counts["train_rows"] / 3000 - 0.7) < 0.04 and sum(counts[f"{k}_rows"] for k in SPLITS) == 3000
    assert small.summary["read"]["rows_read"] == 3000


def test_mixed_gzip_and_plain_and_skipped_lines(tmp_path: Path) -> None:
    lines = criteo_lines(1200, seed=6)
    lines[1000] = "junk"  # line 201 of the second file
    a, b = tmp_path / "a.gz", tmp_path / "b.txt"
    a.write_bytes(gzip.compress(("\n".join(lines[:800]) + "\n").encode()))
    b.write_text("\n".join(lines[800:]) + "\n")
    reader = CriteoReader([str(a), str(b)], skip_bad_rows=True)
    shards = prepare_shards(reader, PrepareConfig(SplitConfig(seed=2), cache_dir=tmp_path / "c", chunk_rows=50, progress=False))
    read = shards.summary["read"]
    assert read["rows_read"] == 1199 and read["rows_skipped"] == 1 and read["skipped_lines"] == [1001]
    assert [(f["file"], f["skipped_lines"]) for f in read["files"]] == [(str(a), []), (str(b), [201])]
    with pytest.raises(DataError, match=r"b\.txt:201: expected 40"):
        prepare_shards(CriteoReader([str(a), str(b)]), PrepareConfig(SplitConfig(), cache_dir=tmp_path / "d", chunk_rows=50, progress=False))


def _count_chunks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = CriteoReader.iter_chunks

    def counted(self: CriteoReader, *args: object, **kw: object) -> Iterator[RawData]:
        calls.append(1)
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(CriteoReader, "iter_chunks", counted)
    return calls


def _criteo(tmp_path: Path, n: int = 800) -> CriteoReader:
    path = tmp_path / "t.txt"
    path.write_text("\n".join(criteo_lines(n, seed=7)) + "\n")
    return CriteoReader(str(path))


def test_cache_and_damaged_shards_are_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, cache = _criteo(tmp_path), tmp_path / "c"
    calls = _count_chunks(monkeypatch)
    first = prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=128, progress=False))
    assert len(calls) == 1  # pass 1 reads the raw file; pass 2 reads pass 1's compact copy
    again = prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=128, progress=False))
    assert len(calls) == 1 and again.folder == first.folder  # from the cache
    shard = first.folder / first.split("train").shards[1].file
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # truncated between runs
    rebuilt = prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=128, progress=False))
    assert len(calls) == 2 and shard.read_bytes() == data
    shard.unlink()  # deleted between runs
    prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=128, progress=False))
    assert len(calls) == 3 and shard.read_bytes() == data
    garbage = bytes(len(data))  # same size, other content: only the checksum sees it
    shard.write_bytes(garbage)
    with pytest.raises(ShardError, match="unreadable shard|rows"):
        ShardSet.open(rebuilt.folder).split("train").load(1)  # never read as garbage
    prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=128, checksum=True, progress=False))
    assert len(calls) == 4 and shard.read_bytes() == data
    (rebuilt.folder / "manifest.json").unlink()  # an unfinished set is never trusted
    prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=128, progress=False))
    assert len(calls) == 5
    encoders = rebuilt.folder / "preprocessor.arrow"
    good = encoders.read_bytes()
    encoders.write_bytes(good[: len(good) // 2])  # damaged encoders: rebuilt, never half-read
    prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=128, progress=False))
    assert len(calls) == 6 and encoders.read_bytes() == good


def test_a_shard_set_written_with_json_encoders_still_opens(tmp_path: Path) -> None:
    """Sets written before ``preprocessor.arrow`` hold ``preprocessor.json``: the same encoders."""
    built = prepare_shards(_criteo(tmp_path), PrepareConfig(cache_dir=tmp_path / "c", rows_per_shard=128, progress=False))
    built.preprocessor.save(built.folder / "preprocessor.json")
    (built.folder / "preprocessor.arrow").unlink()
    legacy = ShardSet.open(built.folder)
    assert legacy.preprocessor.state_dict() == built.preprocessor.state_dict()
    (built.folder / "preprocessor.json").unlink()
    with pytest.raises(ShardError, match="no preprocessor.arrow"):
        ShardSet.open(built.folder)


def test_raw_file_changing_between_passes_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, cache = _criteo(tmp_path), tmp_path / "c"
    path = reader.source_file()
    real = CriteoReader.iter_chunks
    passes: list[int] = []

    def appending(self: CriteoReader, *args: object, **kw: object) -> Iterator[RawData]:
        passes.append(1)
        yield from real(self, *args, **kw)  # type: ignore[arg-type]
        if len(passes) == 1:  # pass 1 read the file to its end; then a writer appends to it
            with open(path, "a") as fh:
                fh.write(criteo_lines(1, seed=9)[0] + "\n")

    monkeypatch.setattr(CriteoReader, "iter_chunks", appending)
    with pytest.raises(DataError, match=rf"{path}: the raw file changed .* between the two passes.*Nothing was cached"):
        prepare_shards(reader, PrepareConfig(cache_dir=cache, progress=False))
    assert not cache.exists() or not any(cache.iterdir())  # no shard set, no temporary folder


def test_disk_full_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, cache = _criteo(tmp_path), tmp_path / "c"
    real = EncodedData.save
    saved: list[int] = []

    def filling(self: EncodedData, path: str | Path) -> None:
        saved.append(1)
        if len(saved) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, path)

    monkeypatch.setattr(EncodedData, "save", filling)
    with pytest.raises(OSError, match=r"disk full while preparing shards .*nothing was cached") as info:
        prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=100, progress=False))
    assert info.value.errno == errno.ENOSPC
    assert not any(cache.iterdir())
    monkeypatch.setattr(EncodedData, "save", real)
    shards = prepare_shards(reader, PrepareConfig(cache_dir=cache, rows_per_shard=100, progress=False))
    assert sum(s.rows for s in shards.splits.values()) == 800


def test_time_split_out_of_order_or_missing(tmp_path: Path) -> None:
    frame = shop_frame(600, seed=8)
    frame.loc[450, "day"] = 0  # line 452 (header on line 1) goes back in time
    path, schema = write_shop(tmp_path, frame)
    reader = TabularReader(str(path), str(schema))
    with pytest.raises(DataError, match=r"shop\.csv:452: the time column 'day' goes back in time: '0' comes after '\d'"):
        prepare_shards(reader, PrepareConfig(SplitConfig(time_column="day", time_cuts=[9]), cache_dir=tmp_path / "c",
                       chunk_rows=40, progress=False))
    frame = shop_frame(600, seed=8).astype({"day": object})
    frame.loc[30, "day"] = ""
    write_shop(tmp_path, frame)
    with pytest.raises(DataError, match=r"shop\.csv:32: the time column 'day' is missing"):
        prepare_shards(TabularReader(str(path), str(schema)), PrepareConfig(SplitConfig(0.8, 0.1, 0.1, time_column="day"),
                       cache_dir=tmp_path / "c", chunk_rows=40, progress=False))
    assert not any((tmp_path / "c").iterdir())  # no shards, no spill, no temporary folder


def test_one_class_split_and_progress_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = criteo_lines(400, seed=10)
    lines = ["0" + x[1:] for x in lines[:300]] + lines[300:]
    path = tmp_path / "t.txt"
    path.write_text("\n".join(lines) + "\n")
    split = SplitConfig(files={"train": str(path)})
    head = tmp_path / "h.txt"
    head.write_text("\n".join(lines[:300]) + "\n")
    with pytest.raises(DataError, match=r"the train split has only one class \(label=0, 300 rows\)"):
        prepare_shards(CriteoReader(str(head)), PrepareConfig(SplitConfig(files={"train": str(head)}), cache_dir=tmp_path / "c",
                       progress=False))
    caplog.set_level(logging.INFO)
    shards = prepare_shards(CriteoReader(str(path)), PrepareConfig(split, cache_dir=tmp_path / "c", progress=True))
    assert set(shards.splits) == {"train"}
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("pass 1/2: reading, counting vocabularies: 400 rows in") for m in messages)
    assert any(m.startswith("pass 2/2: encoding shards: 400 rows in") for m in messages)
    assert shard_cache_folder(CriteoReader(str(path)), PrepareConfig(split, cache_dir=tmp_path / "c")) == shards.folder
    with pytest.raises(ValueError, match="cache_dir"):
        prepare_shards(CriteoReader(str(path)))


def test_prefetch_keeps_order_errors_and_stops_early() -> None:
    assert list(prefetch(iter(range(50)), depth=2)) == list(range(50))

    def failing() -> Iterator[int]:
        yield 1
        raise DataError("x.txt:2: boom")

    items = prefetch(failing())
    assert next(items) == 1
    with pytest.raises(DataError, match="x.txt:2: boom"):
        next(items)
    produced: list[int] = []

    def counted() -> Iterator[int]:
        for i in range(1000):
            produced.append(i)
            yield i

    for i in prefetch(counted()):
        if i == 3:
            break
    assert len(produced) < 10  # the producer stopped soon after the consumer did


def test_shards_written_in_the_background_keep_their_order_and_errors(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer saves each shard on its thread while the caller goes on: the manifest lists the
    shards in row order with their sizes and hashes, and a failed write is raised to the caller
    and leaves no folder behind."""
    from tests.recsys.data.shardsets import numbered, write_shards

    data, pre = numbered(1000)
    splits = {"train": data.take(np.arange(700)), "val": data.take(np.arange(700, 1000))}
    got = write_shards(tmp_path / "ok", splits, pre, rows_per_shard=64, chunk=45)
    got.verify(checksum=True)
    assert [s.rows for s in got.split("train").shards] == [64] * 10 + [60]
    assert [s.file for s in got.split("val").shards] == [f"val/{i:05d}.npz" for i in range(5)]
    labels = np.concatenate([EncodedData.load(got.folder / s.file).labels for s in got.split("train").shards])
    np.testing.assert_array_equal(labels, np.arange(700, dtype=np.float32))

    saved = EncodedData.save
    calls = []

    def fails_on_the_third(self: EncodedData, path: Path) -> None:
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        saved(self, path)

    monkeypatch.setattr(EncodedData, "save", fails_on_the_third)
    with pytest.raises(OSError, match="No space left"):
        write_shards(tmp_path / "full", splits, pre, rows_per_shard=64, chunk=45)
    assert not (tmp_path / "full").exists() and not list(tmp_path.glob(".full.tmp*"))
