"""Chunks and shards sized in bytes: narrow data keeps the old row counts, wide data gets fewer
rows per chunk so that a chunk's memory stays near the budget at any width."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from recsys.data.readers import CriteoReader, TabularReader
from recsys.data.schema import FeatureSpec, Schema
from recsys.data.streaming.chunking import (
    CHUNK_BYTES,
    MAX_CHUNK_ROWS,
    MIN_ROWS,
    chunk_rows,
    encoded_row_bytes,
    parsed_row_bytes,
    rows_within,
    shard_rows,
)


def _schema(ids: int, scalars: int, vectors: int = 0, dim: int = 32) -> Schema:
    return Schema((*(FeatureSpec(f"id{i}") for i in range(ids)),
                   *(FeatureSpec(f"s{i}", kind="dense") for i in range(scalars)),
                   *(FeatureSpec(f"v{i}", kind="vector", dim=dim) for i in range(vectors))))


def test_narrow_data_keeps_the_row_caps_and_wide_data_gets_fewer_rows() -> None:
    assert chunk_rows(CriteoReader("x").build_schema()) == MAX_CHUNK_ROWS
    assert shard_rows(CriteoReader("x").build_schema()) == MAX_CHUNK_ROWS
    wide = _schema(1500, 3250, 250)
    assert parsed_row_bytes(wide) == 1500 * 24 + 3250 * 8 + 250 * 32 * 8 + 8
    assert encoded_row_bytes(wide) == 1500 * 8 + 4 * (3250 + 250 * 32) + 4
    rows = chunk_rows(wide)
    assert rows * parsed_row_bytes(wide) <= CHUNK_BYTES < (rows + 1) * parsed_row_bytes(wide)
    assert rows_within(CHUNK_BYTES, CHUNK_BYTES * 4, MAX_CHUNK_ROWS) == MIN_ROWS  # a row wider than the budget still gets read


def test_a_wide_file_is_read_in_byte_sized_chunks(tmp_path: Path, monkeypatch) -> None:
    schema = _schema(3, 400, 2, dim=64)
    n = 3000
    rng = np.random.default_rng(0)
    cols = {c: rng.standard_normal(n) for c in schema.dense_columns}
    frame = pd.DataFrame({**{f"id{i}": rng.integers(0, 9, n) for i in range(3)}, **cols, "label": rng.integers(0, 2, n)})
    frame.to_parquet(tmp_path / "w.parquet")
    schema.save(tmp_path / "s.yaml")
    reader = TabularReader(str(tmp_path / "w.parquet"), str(tmp_path / "s.yaml"))
    assert reader.default_chunk_rows() == CHUNK_BYTES // parsed_row_bytes(schema)
    from recsys.data import chunking

    monkeypatch.setattr(chunking, "CHUNK_BYTES", 300 * parsed_row_bytes(schema))  # a budget of 300 rows
    assert reader.default_chunk_rows() == 300
    assert [len(c) for c in reader.iter_chunks()] == [300] * 10
