"""Split modes: the config, streamed row assignment, and predefined / time splits in prepare_data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.data.prepare import PrepareConfig, prepare_data, raw_split
from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.readers import TabularReader
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.splits import RowSplitter, SplitConfig, SplitMode, rows_by_split

SCHEMA_YAML = """name: shop
label: clicked
features:
  - name: user
  - name: tags
    kind: multi_categorical
  - name: price
    kind: dense
    transform: standardize
"""


def shop_frame(n: int, seed: int = 0) -> pd.DataFrame:
    """A small click log ordered by ``day`` (and ``ts``, ISO times)."""
    rng = np.random.default_rng(seed)
    day = np.sort(rng.integers(0, 10, n))
    ts = pd.Timestamp("2024-01-01") + pd.to_timedelta(day * 86400 + np.sort(rng.integers(0, 86400, n)) % 86400, unit="s")
    price = rng.gamma(2.0, 3.0, n).round(2).astype(str).astype(object)
    price[rng.random(n) < 0.05] = ""
    return pd.DataFrame(
        {
            "day": day, "ts": ts.strftime("%Y-%m-%dT%H:%M:%S"),
            "user": [f"u{int(u)}" for u in rng.zipf(1.5, n) % 50],
            "tags": rng.choice(np.array(["a", "a|b", "", "c|a", "b"], dtype=object), n),
            "price": price, "clicked": rng.integers(0, 2, n),
        }
    )


def write_shop(folder: Path, frame: pd.DataFrame, name: str = "shop.csv") -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    schema = folder / "shop.yaml"
    schema.write_text(SCHEMA_YAML)
    path = folder / name
    frame.to_csv(path, index=False)
    return path, schema


# -- config ----------------------------------------------------------------------------------
def test_split_config_modes_and_back_compat() -> None:
    old = SplitConfig(0.6, 0.2, 0.2, 3)  # positional, as existing configs build it
    assert old.kind is SplitMode.RANDOM and old.to_dict() == {"train": 0.6, "val": 0.2, "test": 0.2, "seed": 3}
    files = SplitConfig(files={"train": "a.csv", "valid": ["b1.csv", "b2.csv"]})
    assert files.kind is SplitMode.FILES and set(files.files or {}) == {"train", "val"}
    time = SplitConfig(time_column="day", time_cuts=[7, 9])
    assert time.kind is SplitMode.TIME and time.to_dict()["time_cuts"] == [7, 9]
    json.dumps(time.to_dict())
    for bad in (
        dict(files={"val": "b.csv"}), dict(files={"train": "a", "dev": "b"}), dict(mode="time"),
        dict(mode="random", files={"train": "a"}), dict(time_cuts=[1]), dict(time_column="d", time_cuts=[1, 2, 3]),
        dict(mode="weekly"),
    ):
        with pytest.raises(ValueError):
            SplitConfig(**bad)  # type: ignore[arg-type]


def _raw(frame: pd.DataFrame, source: str = "log.csv") -> RawData:
    frame = frame.copy()
    frame.index = pd.RangeIndex(2, len(frame) + 2, name="line")
    schema = Schema((FeatureSpec("user"),), label="clicked")
    return RawData(frame, schema, ReadReport(source=source))


def _assign(split: SplitConfig, frame: pd.DataFrame, size: int, total: int | None = None) -> np.ndarray:
    splitter = RowSplitter(split, total)
    raw = _raw(frame)
    return np.concatenate([splitter.assign(RawData(raw.frame.iloc[i : i + size], raw.schema, raw.report))
                           for i in range(0, len(frame), size)])


def test_random_assignment_does_not_depend_on_chunk_size() -> None:
    frame = shop_frame(5000)
    split = SplitConfig(0.7, 0.2, 0.1, seed=4)
    a, b = _assign(split, frame, 5000), _assign(split, frame, 17)
    np.testing.assert_array_equal(a, b)
    assert abs((a == 0).mean() - 0.7) < 0.03 and abs((a == 2).mean() - 0.1) < 0.02
    assert not np.array_equal(a, _assign(SplitConfig(0.7, 0.2, 0.1, seed=5), frame, 5000))
    assert set(np.unique(_assign(SplitConfig(0.9, 0.1, 0.0), frame, 999))) == {0, 1}


def test_time_split_by_cuts_and_by_position() -> None:
    frame = shop_frame(2000)
    codes = _assign(SplitConfig(time_column="day", time_cuts=[7, 9]), frame, 33)
    np.testing.assert_array_equal(codes, (frame["day"] >= 7).astype(int) + (frame["day"] >= 9))
    iso = _assign(SplitConfig(time_column="ts", time_cuts=["2024-01-08", "2024-01-10T00:00:00"]), frame, 100)
    np.testing.assert_array_equal(iso, codes)
    by_pos = _assign(SplitConfig(0.8, 0.1, 0.1, time_column="day"), frame, 64, total=2000)
    np.testing.assert_array_equal(by_pos, np.repeat([0, 1, 2], [1600, 200, 200]))
    with pytest.raises(ValueError, match="needs total_rows"):
        RowSplitter(SplitConfig(time_column="day"))


def test_time_split_refuses_disorder_and_missing_naming_the_line() -> None:
    frame = shop_frame(300)
    late = frame.copy()
    late.loc[150, "day"] = -1  # row 150 -> line 152 (the header is line 1)
    with pytest.raises(DataError, match=r"log\.csv:152: the time column 'day' goes back in time: -1 comes after .*log\.csv:151"):
        _assign(SplitConfig(time_column="day", time_cuts=[5]), late, 40)
    across = frame.copy()
    across.loc[160, "day"] = -1  # the first row of a chunk: compared with the last row of the chunk before
    with pytest.raises(DataError, match=r"log\.csv:162: .*goes back in time.*\(log\.csv:161\)"):
        _assign(SplitConfig(time_column="day", time_cuts=[5]), across, 160)
    gap = frame.astype({"ts": object})
    gap.loc[20, "ts"] = ""
    with pytest.raises(DataError, match=r"log\.csv:22: the time column 'ts' is missing"):
        _assign(SplitConfig(time_column="ts", time_cuts=["2024-01-05"]), gap, 50)
    gap.loc[20, "ts"] = "yesterday"
    with pytest.raises(DataError, match=r"log\.csv:22: the time column 'ts': 'yesterday' is not an ISO-8601 time"):
        _assign(SplitConfig(time_column="ts", time_cuts=["2024-01-05"]), gap, 50)
    with pytest.raises(DataError, match=r"holds numbers where times"):
        _assign(SplitConfig(time_column="day", time_cuts=["2024-01-05"]), frame, 50)


# -- prepare_data (in memory) ---------------------------------------------------------------
def test_prepare_data_time_split(tmp_path: Path) -> None:
    frame = shop_frame(1500, seed=1)
    path, schema = write_shop(tmp_path, frame)
    reader = TabularReader(str(path), str(schema))
    split = SplitConfig(time_column="day", time_cuts=[7, 9])
    prepared = prepare_data(reader, PrepareConfig(split))
    counts = prepared.summary["split"]
    assert counts["train_rows"] == int((frame["day"] < 7).sum()) and counts["mode"] == "time"
    assert counts["test_rows"] == int((frame["day"] >= 9).sum())
    train = frame[frame["day"] < 7]
    np.testing.assert_array_equal(prepared.splits["train"].labels, train["clicked"].to_numpy(np.float32))
    raw = reader.read_with_columns(["day"])
    assert len(raw_split(raw, split, "val")) == counts["val_rows"]
    by_position = prepare_data(reader, PrepareConfig(SplitConfig(0.5, 0.25, 0.25, time_column="day")))
    assert by_position.summary["split"]["train_rows"] == 750


def test_prepare_data_files_split(tmp_path: Path) -> None:
    frame = shop_frame(1200, seed=2)
    train, _ = write_shop(tmp_path, frame.iloc[:900], "train.csv")
    valid, schema = write_shop(tmp_path, frame.iloc[900:1050], "valid.csv")
    test, _ = write_shop(tmp_path, frame.iloc[1050:], "test.csv")
    reader = TabularReader(str(train), str(schema))
    split = SplitConfig(files={"train": str(train), "valid": str(valid), "test": str(test)})
    prepared = prepare_data(reader, PrepareConfig(split, cache_dir=tmp_path / "cache"))
    assert {k: len(v) for k, v in prepared.splits.items()} == {"train": 900, "val": 150, "test": 150}
    assert set(prepared.summary["read"]) == {"train", "val", "test"}
    again = prepare_data(reader, PrepareConfig(split, cache_dir=tmp_path / "cache"))
    assert again.summary == prepared.summary
    with pytest.raises(ValueError, match="files split"):
        raw_split(reader.read(), split)


def test_time_split_needs_the_column(tmp_path: Path) -> None:
    path, schema = write_shop(tmp_path, shop_frame(50))
    with pytest.raises(Exception, match=r"\['hour'\]"):
        prepare_data(TabularReader(str(path), str(schema)), PrepareConfig(SplitConfig(time_column="hour", time_cuts=[1])))


def test_rows_by_split() -> None:
    got = rows_by_split(np.array([0, 2, 0, 1], dtype=np.int8))
    assert {k: list(v) for k, v in got.items()} == {"train": [0, 2], "val": [3], "test": [1]}
    assert FeatureKind.DENSE.value == "dense"


def test_split_modes_from_a_cli_config() -> None:
    """A config merged onto the default SplitConfig (as LightningCLI does) picks the mode from its keys."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--split", type=SplitConfig, default=SplitConfig())
    for arg, kind in [
        ("{time_column: day, time_cuts: [3, 5]}", SplitMode.TIME),
        ("{files: {train: a.csv, valid: [b.csv, c.csv]}}", SplitMode.FILES),
        ('{mode: time, time_column: ts, time_cuts: ["2024-01-01"]}', SplitMode.TIME),
        ("{train: 0.7, val: 0.2, test: 0.1, seed: 3}", SplitMode.RANDOM),
    ]:
        split = parser.instantiate(parser.parse_args(["--split", arg])).split
        assert split.kind is kind
    assert split.to_dict() == {"train": 0.7, "val": 0.2, "test": 0.1, "seed": 3}
