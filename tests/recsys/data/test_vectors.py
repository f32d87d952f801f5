"""The ``vector`` feature kind through the data path: schema, readers (CSV prefix columns, Parquet
list or prefix columns), encoders, the streamed encoders and shard views.

A vector feature of width D is one feature: D columns of the dense block, in schema order among
the dense scalars; what it holds is checked value by value against the raw numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys.data.encoders import Preprocessor
from recsys.data.raw import DataError
from recsys.data.readers import TabularReader
from recsys.data.schema import FeatureSpec, Schema, SchemaError
from recsys.data.streaming.batching import select_columns
from recsys.data.streaming.encoders import ChunkEncoder, StreamingFit


def _schema() -> Schema:
    return Schema(
        (
            FeatureSpec("user", embedding_dim=4),
            FeatureSpec("price", kind="dense", transform="log1p"),
            FeatureSpec("emb", kind="vector", dim=3),
            FeatureSpec("ctx", kind="vector", dim=2, prefix="c", transform="standardize", fill_value=-1.0),
            FeatureSpec("age", kind="dense"),
        ),
        label="click",
    )


def _frame(n: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    cols = {"user": [f"u{i}" for i in rng.integers(0, 5, n)], "price": rng.gamma(2.0, 3.0, n)}
    emb = rng.normal(size=(n, 3))
    ctx = rng.normal(3.0, 2.0, size=(n, 2))
    ctx[1, 0] = np.nan  # one missing value of a vector
    cols.update({f"emb_{i}": emb[:, i] for i in range(3)})
    cols.update({f"c{i}": ctx[:, i] for i in range(2)})
    cols["age"] = rng.normal(40, 9, n)
    cols["click"] = rng.integers(0, 2, n)
    return pd.DataFrame(cols)


def test_a_vector_is_one_feature_of_width_d() -> None:
    schema = _schema()
    assert schema.dense_names == ["price", "emb", "ctx", "age"]
    assert schema.dense_widths == [1, 3, 2, 1] and schema.dense_width == 7
    assert schema.dense_columns == ["price", "emb_0", "emb_1", "emb_2", "c0", "c1", "age"]
    assert schema["emb"].width == 3 and schema["user"].width == 4 and schema.dimensions == 4 + 7
    assert not schema["emb"].is_sparse and schema["emb"].is_vector
    again = Schema.from_dict(schema.to_dict())
    assert again == schema and "dim" not in again.to_dict()["features"][0]  # only vectors write their options


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "v", "kind": "vector"}, "needs its width, dim >= 1"),
        ({"name": "v", "kind": "vector", "dim": 0}, "needs its width"),
        ({"name": "v", "kind": "vector", "dim": 2, "transform": "log1p"}, "transform must be 'none' or 'standardize'"),
        ({"name": "x", "kind": "dense", "dim": 2}, "dim is for vector features only"),
        ({"name": "x", "prefix": "p"}, "prefix is for vector features only"),
    ],
)
def test_vector_options_are_checked(spec: dict, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Schema.from_dict({"features": [spec]})


def test_prefix_columns_may_not_clash_with_another_feature() -> None:
    with pytest.raises(SchemaError, match=r"raw columns \['emb_0'\] are named by more than one feature"):
        Schema((FeatureSpec("emb", kind="vector", dim=2), FeatureSpec("emb_0", kind="dense")))


def test_encoders_lay_vectors_out_in_the_dense_block() -> None:
    schema, frame = _schema(), _frame()
    pre = Preprocessor(schema).fit(frame)
    data = pre.transform(frame)
    assert data.dense.shape == (len(frame), 7) and data.widths == [1, 3, 2, 1]
    cols = data.dense_slices()
    np.testing.assert_allclose(data.dense[:, cols["emb"]], frame[["emb_0", "emb_1", "emb_2"]].to_numpy(), rtol=1e-6)
    np.testing.assert_allclose(data.dense[:, cols["price"]][:, 0], np.log1p(frame["price"]), rtol=1e-6)
    # one mean and std over all of a vector's finite values; the missing value filled first
    raw = frame[["c0", "c1"]].to_numpy()
    mean, std = np.nanmean(raw), np.nanstd(raw)
    assert pre.dense_stats["ctx"] == pytest.approx((mean, std))
    want = (np.where(np.isnan(raw), -1.0, raw) - mean) / std
    np.testing.assert_allclose(data.dense[:, cols["ctx"]], want, rtol=1e-5)
    assert data.stats.dense_filled["ctx"] == 1 and data.stats.dense_filled["emb"] == 0


def test_streamed_encoders_equal_the_in_memory_ones() -> None:
    schema, frame = _schema(), _frame(120)
    fit = StreamingFit(schema)
    for start in range(0, len(frame), 50):
        fit.update(frame.iloc[start : start + 50])
    pre = Preprocessor(schema).fit(frame)
    streamed = fit.result()
    assert streamed.dense_stats["ctx"] == pytest.approx(pre.dense_stats["ctx"], rel=1e-12)
    a, b = ChunkEncoder(streamed).transform(frame), pre.transform(frame)
    np.testing.assert_allclose(a.dense, b.dense, rtol=1e-6)
    assert a.widths == b.widths


def test_a_view_keeps_a_vectors_columns(tmp_path: Path) -> None:
    schema, frame = _schema(), _frame()
    data = Preprocessor(schema).fit(frame).transform(frame)
    view = select_columns(data, ["user", "ctx", "age"])
    assert view.dense_names == ["ctx", "age"] and view.widths == [2, 1]
    np.testing.assert_array_equal(view.dense, data.dense[:, [4, 5, 6]])
    data.save(tmp_path / "d.npz")
    again = type(data).load(tmp_path / "d.npz")
    assert again.widths == [1, 3, 2, 1]
    np.testing.assert_array_equal(again.dense, data.dense)


def _schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "schema.yaml"
    _schema().save(path)
    return path


def test_csv_reads_a_vector_from_its_prefix_columns(tmp_path: Path) -> None:
    frame = _frame()
    frame.to_csv(tmp_path / "d.csv", index=False)
    raw = TabularReader(str(tmp_path / "d.csv"), str(_schema_file(tmp_path))).read()
    np.testing.assert_allclose(raw.column("emb").to_numpy(), frame[["emb_0", "emb_1", "emb_2"]].to_numpy())
    assert raw.frame.index[0] == 2  # line numbers, the header is line 1
    frame.drop(columns=["emb_1"]).to_csv(tmp_path / "e.csv", index=False)
    with pytest.raises(SchemaError, match=r"vector 'emb' needs columns 'emb_0'..'emb_2'"):
        TabularReader(str(tmp_path / "e.csv"), str(_schema_file(tmp_path))).read()


@pytest.mark.parametrize("layout", ["list", "fixed_size_list", "prefix"])
def test_parquet_reads_a_vector_as_a_list_column_or_its_prefix_columns(tmp_path: Path, layout: str) -> None:
    frame = _frame()
    emb = frame[["emb_0", "emb_1", "emb_2"]].to_numpy()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if layout != "prefix":
        kind = pa.list_(pa.float32(), 3) if layout == "fixed_size_list" else pa.list_(pa.float64())
        table = table.drop(["emb_0", "emb_1", "emb_2"]).append_column("emb", pa.array(list(emb), type=kind))
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=16)
    reader = TabularReader(str(tmp_path / "d.parquet"), str(_schema_file(tmp_path)))
    raw = reader.read()
    np.testing.assert_allclose(raw.column("emb").to_numpy(), emb, rtol=1e-6)
    chunks = list(reader.iter_chunks(16))
    assert [len(c) for c in chunks] == [16, 16, 8]
    np.testing.assert_allclose(pd.concat([c.column("emb") for c in chunks]).to_numpy(), emb, rtol=1e-6)


def test_parquet_vector_cells_of_another_width_are_named_by_row(tmp_path: Path) -> None:
    frame = _frame(6).drop(columns=["emb_0", "emb_1", "emb_2"])
    cells = [[0.1, 0.2, 0.3]] * 6
    cells[4] = [0.1, 0.2]
    cells[2] = None  # a null cell: three missing values
    table = pa.Table.from_pandas(frame, preserve_index=False).append_column("emb", pa.array(cells, pa.list_(pa.float64())))
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"row 5: column 'emb' holds 2 values; the vector feature has dim 3"):
        TabularReader(str(tmp_path / "d.parquet"), str(_schema_file(tmp_path))).read()
    cells[4] = [0.4, 0.5, 0.6]
    table = table.set_column(table.schema.get_field_index("emb"), "emb", pa.array(cells, pa.list_(pa.float64())))
    pq.write_table(table, tmp_path / "d.parquet")
    raw = TabularReader(str(tmp_path / "d.parquet"), str(_schema_file(tmp_path))).read()
    got = raw.column("emb").to_numpy()
    assert np.isnan(got[2]).all() and got[4].tolist() == [0.4, 0.5, 0.6]
    data = Preprocessor(raw.schema).fit(raw.frame).transform(raw.frame)
    assert data.stats.dense_filled["emb"] == 3
