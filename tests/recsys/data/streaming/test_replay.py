"""ChunkReplay: later passes read the first pass's parsed copy, equal to the origin, or the origin again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.data.raw import RawData, ReadReport
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.streaming.replay import ChunkReplay


def _origin(frames: list[pd.DataFrame], reads: list[int]) -> Callable[[], Iterator[RawData]]:
    schema = Schema((FeatureSpec("c", FeatureKind.CATEGORICAL), FeatureSpec("x", FeatureKind.DENSE)), label="label")

    def chunks() -> Iterator[RawData]:
        reads.append(1)
        report = ReadReport(source="d.tsv", bytes_total=100 * len(frames))
        for i, f in enumerate(frames):
            report.bytes_read = 100 * (i + 1)
            report.rows_read += len(f)
            yield RawData(f, schema, report)

    return chunks


def _frames(n: int = 3) -> list[pd.DataFrame]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        f = pd.DataFrame({
            "c": pd.array(rng.choice(np.array(["a", "b", "", None], dtype=object), 50).tolist(), dtype="str"),
            "x": np.where(rng.random(50) < 0.2, np.nan, rng.normal(size=50)),
            "label": rng.integers(0, 2, 50).astype(np.int8),
        })
        f.index = pd.Index(np.arange(50) + 2 + 50 * i, name="line")  # the readers' source line numbers
        out.append(f)
    return out


def test_later_passes_read_the_copy_equal_to_the_origin(tmp_path: Path) -> None:
    frames, reads = _frames(), list[int]()
    with ChunkReplay(_origin(frames, reads), folder=tmp_path) as replay:
        first = [(c.frame, c.report.bytes_read) for c in replay()]
        assert replay.folder is not None and len(list(replay.folder.iterdir())) == 3
        for _ in range(2):
            again = [(c.frame, c.report.bytes_read, c.report.bytes_total) for c in replay()]
            for (a, pos), (b, pos_b, total) in zip(first, again, strict=True):
                pd.testing.assert_frame_equal(a, b)  # values, dtypes and index
                assert pos == pos_b and total == 300
        assert reads == [1] and replay.replayed == 2 and replay.summary()["dropped"] is None
    assert not list(tmp_path.iterdir())  # the copy is deleted on leaving


def test_an_unfinished_first_pass_reads_the_origin_again(tmp_path: Path) -> None:
    reads: list[int] = []
    replay = ChunkReplay(_origin(_frames(), reads), folder=tmp_path)
    for _ in replay():
        break  # the caller left the loop: the copy holds one chunk of three
    assert sum(1 for _ in replay()) == 3 and reads == [1, 1] and replay.replayed == 0
    replay.close()


def test_the_budget_and_frames_arrow_cannot_carry_drop_the_copy(tmp_path: Path) -> None:
    reads: list[int] = []
    with ChunkReplay(_origin(_frames(), reads), max_bytes=1, folder=tmp_path) as replay:
        assert sum(1 for _ in replay()) == 3
        assert "passed 1 bytes" in str(replay.reason) and not list(tmp_path.iterdir())
        assert sum(1 for _ in replay()) == 3 and reads == [1, 1]
    with ChunkReplay(_origin(_frames(), reads), folder=tmp_path) as whole:
        sum(1 for _ in whole())
    reads = []
    # room for two of the three chunks: the first chunk's bytes, 1/3 of the file, project three
    with ChunkReplay(_origin(_frames(), reads), max_bytes=whole.bytes * 2 // 3, folder=tmp_path) as replay:
        assert sum(1 for _ in replay()) == 3
        assert "would pass" in str(replay.reason) and "projected from the part of d.tsv" in str(replay.reason)
        assert replay.bytes < whole.bytes // 2 and not list(tmp_path.iterdir())  # stopped after the first chunk
        assert sum(1 for _ in replay()) == 3 and reads == [1, 1]
    mixed = _frames(2)
    mixed[1] = mixed[1].astype({"c": object})
    mixed[1].loc[mixed[1].index[0], "c"] = 7  # ints among strings: Arrow refuses the column
    reads.clear()
    with ChunkReplay(_origin(mixed, reads), folder=tmp_path) as replay:
        assert [len(c.frame) for c in replay()] == [50, 50]  # the origin's chunks still flow
        assert replay.reason is not None and not list(tmp_path.iterdir())
        assert [c.frame["c"].iloc[0] for c in replay()][1] == 7 and reads == [1, 1]
    with ChunkReplay(_origin(_frames(), reads), max_bytes=0) as replay:
        assert replay.reason == "turned off (max_bytes=0)" and replay.folder is None
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        ChunkReplay(_origin(_frames(), reads), max_bytes=-1)
