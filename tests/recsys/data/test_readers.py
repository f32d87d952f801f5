"""Dataset readers: real-data statistics (from each folder's PROVENANCE.md) and bad-input messages."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.data.encoders import Preprocessor
from recsys.data.raw import DataError, RawData
from recsys.data.readers import CriteoReader, FrappeReader, MovieLensReader, Reader, TabularReader
from recsys.data.readers.frappe import FRAPPE_FIELDS, locate
from recsys.data.schema import FeatureKind, SchemaError
from tests.conftest import require_dataset

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TINY_CRITEO = FIXTURES / "tiny_criteo.tsv"
TINY_CSV = FIXTURES / "tiny_tabular.csv"
TINY_SCHEMA = FIXTURES / "tiny_tabular_schema.yaml"


def _criteo_lines() -> list[str]:
    return TINY_CRITEO.read_text().splitlines()


def _write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_text("".join(line + end for line in lines))
    return path


def _assert_encodes(raw: RawData) -> None:
    """Fit on the frame, transform it: no error, no OOV id on the fit split."""
    pre = Preprocessor(raw.schema).fit(raw.frame)
    enc = pre.transform(raw.frame)
    assert len(enc) == len(raw)
    assert sum(enc.stats.oov.values()) == 0
    assert pre.fitted_schema.is_fitted


# -- real data ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def criteo(data_dir: Path) -> RawData:
    require_dataset(data_dir, "criteo-kaggle-head10k")
    return CriteoReader().read()


@pytest.fixture(scope="module")
def frappe(data_dir: Path) -> RawData:
    require_dataset(data_dir, "frappe")
    return FrappeReader().read()


@pytest.fixture(scope="module")
def movielens(data_dir: Path) -> RawData:
    require_dataset(data_dir, "ml-100k")
    return MovieLensReader().read()


@pytest.mark.data
def test_criteo_head10k(criteo: RawData) -> None:
    f, schema = criteo.frame, criteo.schema
    assert len(f) == 10_000 and list(f.index[:3]) == [1, 2, 3] and f.index[-1] == 10_000
    assert len(schema.dense) == 13 and len(schema.sparse) == 26 and schema.name == "criteo"
    assert all(s.transform.value == "log1p" for s in schema.dense)
    assert f["label"].sum() == 2182 and f["label"].dtype == np.int8
    assert f["I1"].isna().mean() == pytest.approx(0.448, abs=5e-4)
    assert f["I12"].isna().mean() == pytest.approx(0.773, abs=5e-4)
    assert f["I2"].min() == -2 and f["I5"].max() == 1_618_112
    assert f["C19"].eq("").mean() == pytest.approx(0.450, abs=5e-4)
    assert f["C3"].nunique() == 5521 and f["C9"].nunique() == 3  # distinct incl. empty (PROVENANCE)
    lens = f["C1"].str.len()
    assert lens.isin([0, 8]).all()
    assert f.loc[1, "C1"] == "68fd1e64" and f.loc[1, "I5"] == 1382.0  # the well-known first line
    assert criteo.report.rows_read == 10_000 and criteo.report.rows_skipped == 0


@pytest.mark.data
def test_criteo_nrows_and_folder(data_dir: Path) -> None:
    folder = require_dataset(data_dir, "criteo-kaggle-head10k")
    raw = CriteoReader(path=str(folder), nrows=100).read()
    assert len(raw) == 100 and raw.frame.index[-1] == 100
    assert raw.frame.loc[1, "C1"] == "68fd1e64"


@pytest.mark.data
def test_frappe(frappe: RawData) -> None:
    f, schema = frappe.frame, frappe.schema
    assert len(f) == 86_582 and f.index.is_unique
    assert schema.names == [n for n, _ in FRAPPE_FIELDS] and schema.name == "frappe"
    assert int(f["label"].sum()) == 28_599
    for name, card in FRAPPE_FIELDS:
        ids = f[name].astype(int)
        assert ids.min() >= 0 and ids.max() < card, name
        assert f[name].nunique() <= card
    assert f["item"].nunique() == 4082 and f["daytime"].nunique() == 7 and f["weather"].nunique() == 9
    files = frappe.report.notes["files"]
    assert [x["rows"] for x in files] == [57_722, 28_860]
    assert Path(locate(frappe.report, 57_723)[0]).name == "frappe.test.libfm.gz"
    assert locate(frappe.report, 57_723)[1] == 1
    # test line 1: "-1 204:1 4798:1 5041:1 5046:1 5053:1 5055:1 5058:1 5060:1 5073:1 5183:1"
    row = f.loc[57_723]
    assert row["label"] == 0 and row["user"] == "204" and row["item"] == str(4798 - 957)
    assert row["daytime"] == "2" and row["city"] == str(5183 - 5149)


@pytest.mark.data
def test_frappe_single_file(data_dir: Path) -> None:
    folder = require_dataset(data_dir, "frappe")
    raw = FrappeReader(path=str(folder / "frappe.test.libfm.gz")).read()
    assert len(raw) == 28_860 and int(raw.frame["label"].sum()) == 9_536
    raw = FrappeReader(filenames=["frappe.test.libfm.gz"]).read()
    assert len(raw) == 28_860 and raw.frame.index[-1] == 28_860


@pytest.mark.data
def test_movielens(movielens: RawData) -> None:
    f, schema = movielens.frame, movielens.schema
    assert len(f) == 100_000 and f.index[0] == 1 and f.index[-1] == 100_000
    assert f["label"].mean() == pytest.approx((34_174 + 21_201) / 100_000)
    assert f["user_id"].nunique() == 943 and f["item_id"].nunique() == 1682
    assert schema["genres"].kind is FeatureKind.MULTI_CATEGORICAL
    lengths = f["genres"].str.split("|").str.len()
    assert lengths.min() >= 1 and lengths.max() <= 19
    assert set(f["age"]) == {"<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+"}
    assert set(f["gender"]) == {"M", "F"} and f["occupation"].nunique() == 21
    assert f["hour"].nunique() == 24 and set(f["weekday"]) == {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
    # line 1 of u.data: 196 242 3 881250949 (1997-12-04 15:55:49 UTC, a Thursday); movie 242 = Kolya (1996)
    row = f.loc[1]
    assert (row["user_id"], row["item_id"], row["label"]) == ("196", "242", 0)
    assert (row["hour"], row["weekday"], row["timestamp"]) == ("15", "Thu", 881250949)
    assert row["genres"] == "Comedy" and row["release_year"] == "1997"
    assert row["age"] == "45-49" and row["zip_prefix"] == "551"
    assert set(f.loc[f["item_id"] == "267", "release_year"]) == {""}  # movie 267 has no date


@pytest.mark.data
def test_movielens_split_file(data_dir: Path) -> None:
    require_dataset(data_dir, "ml-100k")
    raw = MovieLensReader(ratings_file="u1.base.gz", click_threshold=5).read()
    assert len(raw) == 80_000 and raw.frame.index[-1] == 80_000
    assert raw.report.notes["click_threshold"] == 5


@pytest.mark.data
@pytest.mark.parametrize("which", ["criteo", "frappe", "movielens"])
def test_real_readers_encode(which: str, request: pytest.FixtureRequest) -> None:
    _assert_encodes(request.getfixturevalue(which))


# -- construction -------------------------------------------------------------------------
def test_readers_build_from_class_path() -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_subclass_arguments(Reader, "reader")
    for class_path, init_args in [
        ("recsys.data.readers.CriteoReader", {"nrows": 5, "hash_size": 1000}),
        ("recsys.data.readers.FrappeReader", {"filenames": ["a.gz"], "skip_bad_rows": True}),
        ("recsys.data.readers.MovieLensReader", {"ratings_file": "u1.base.gz"}),
        ("recsys.data.readers.TabularReader", {"path": "x.csv", "schema": "s.yaml", "sep": ";"}),
    ]:
        cfg = parser.parse_object({"reader": {"class_path": class_path, "init_args": init_args}})
        reader = parser.instantiate_classes(cfg).reader
        assert type(reader).__name__ == class_path.rsplit(".", 1)[1]
        for key, value in init_args.items():
            assert getattr(reader, key) == value
        assert set(init_args) <= set(reader.options())


def test_fingerprint_follows_options(tmp_path: Path) -> None:
    path = tmp_path / "c.tsv"
    path.write_bytes(TINY_CRITEO.read_bytes())
    a, b = CriteoReader(str(path)), CriteoReader(str(path), min_count=2)
    assert a.fingerprint() == CriteoReader(str(path)).fingerprint() != b.fingerprint()
    reader = TabularReader(str(TINY_CSV), str(TINY_SCHEMA))
    assert len(reader.fingerprint()) == 16 and reader.name == "tiny_shop"


# -- Criteo bad input ---------------------------------------------------------------------
def test_criteo_tiny_fixture() -> None:
    raw = CriteoReader(str(TINY_CRITEO), embedding_dim=4, min_count=1, hash_size=None).read()
    assert len(raw) == 5 and list(raw.frame.index) == [1, 2, 3, 4, 5]
    assert raw.frame.loc[2, "I2"] == -2.0 and math.isnan(raw.frame.loc[2, "I1"])
    assert raw.frame.loc[1, "C3"] == "" and raw.schema["C1"].embedding_dim == 4
    _assert_encodes(raw)


def test_criteo_gzip_detected_by_content(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"  # no .gz suffix, gzip content
    path.write_bytes(gzip.compress(TINY_CRITEO.read_bytes()))
    assert len(CriteoReader(str(path)).read()) == 5
    assert len(CriteoReader(str(tmp_path)).read()) == 5  # folder holding train.txt


def test_criteo_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "train.txt"
    with pytest.raises(FileNotFoundError, match="nope"):
        CriteoReader(str(missing)).read()
    with pytest.raises(FileNotFoundError, match=r"no Criteo file in folder .*looked for"):
        CriteoReader(str(tmp_path)).read()


def test_criteo_wrong_field_count(tmp_path: Path) -> None:
    lines = _criteo_lines()
    lines[2] = lines[2].rsplit("\t", 1)[0]  # line 3 loses its last field
    path = _write(tmp_path / "train.txt", lines)
    with pytest.raises(DataError, match=r"train\.txt:3: expected 40 tab-separated fields, found 39"):
        CriteoReader(str(path)).read()
    raw = CriteoReader(str(path), skip_bad_rows=True).read()
    assert list(raw.frame.index) == [1, 2, 4, 5]
    assert raw.report.rows_skipped == 1 and raw.report.skipped_lines == [3] and raw.report.rows_read == 4


def test_criteo_blank_line_and_crlf(tmp_path: Path) -> None:
    lines = _criteo_lines()
    path = _write(tmp_path / "t.txt", [*lines[:2], "", *lines[2:]], end="\r\n")
    with pytest.raises(DataError, match=r"t\.txt:3: empty line"):
        CriteoReader(str(path)).read()
    raw = CriteoReader(str(path), skip_bad_rows=True).read()
    assert list(raw.frame.index) == [1, 2, 4, 5, 6] and raw.frame.loc[6, "C26"] == "cccc2222"


def test_criteo_non_integer_dense(tmp_path: Path) -> None:
    lines = [line.split("\t") for line in _criteo_lines()]
    lines[3][5] = "1.5"  # line 4, I5
    lines[1][2] = "abc"  # line 2, I2
    path = _write(tmp_path / "t.txt", ["\t".join(x) for x in lines])
    with pytest.raises(DataError, match=r"t\.txt:2: column 'I2': 'abc' is not an integer \(2 bad line"):
        CriteoReader(str(path)).read()
    raw = CriteoReader(str(path), skip_bad_rows=True).read()
    assert list(raw.frame.index) == [1, 3, 5] and sorted(raw.report.skipped_lines) == [2, 4]


def test_criteo_bad_label_names_line(tmp_path: Path) -> None:
    lines = _criteo_lines()
    lines[3] = "2" + lines[3][1:]
    path = _write(tmp_path / "t.txt", lines)
    with pytest.raises(DataError, match=r"t\.txt:4: label '2' is outside \{0, 1\}"):
        CriteoReader(str(path), skip_bad_rows=True).read()


def test_criteo_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("")
    with pytest.raises(DataError, match=r"empty\.txt: the file is empty"):
        CriteoReader(str(path)).read()
    path.write_text("\n\n")
    with pytest.raises(DataError, match="empty"):
        CriteoReader(str(path)).read()
    lines = _criteo_lines()
    path = _write(tmp_path / "bad.txt", [lines[0][:20]])
    with pytest.raises(DataError, match=r"bad\.txt: no data rows \(1 bad row"):
        CriteoReader(str(path), skip_bad_rows=True).read()


def test_criteo_nrows_stops_early(tmp_path: Path) -> None:
    lines = _criteo_lines()
    lines[4] = "junk"  # beyond nrows: never read
    path = _write(tmp_path / "t.txt", lines)
    assert list(CriteoReader(str(path), nrows=3).read().frame.index) == [1, 2, 3]


# -- Frappe bad input ---------------------------------------------------------------------
_FRAPPE_OK = "1 42:1 1572:1 5042:1 5047:1 5053:1 5055:1 5058:1 5060:1 5070:1 5150:1"
_FRAPPE_NEG = "-1 204:1 4798:1 5041:1 5046:1 5053:1 5055:1 5058:1 5060:1 5073:1 5183:1"


def _frappe_dir(tmp_path: Path, files: dict[str, list[str]]) -> Path:
    for name, lines in files.items():
        (tmp_path / name).write_bytes(gzip.compress("".join(x + "\r\n" for x in lines).encode()))
    return tmp_path


def test_frappe_pooled_index_and_skips(tmp_path: Path) -> None:
    bad_pairs = _FRAPPE_OK.rsplit(" ", 1)[0]
    out_of_block = _FRAPPE_OK.replace("5042:1", "5046:1")  # weekday index in the daytime slot
    folder = _frappe_dir(
        tmp_path,
        {"a.gz": [_FRAPPE_OK, bad_pairs, _FRAPPE_NEG], "b.gz": [_FRAPPE_NEG, out_of_block, _FRAPPE_OK]},
    )
    with pytest.raises(DataError, match=r"a\.gz:2: expected 10 'index:value' pairs after the label, found 9"):
        FrappeReader(str(folder), filenames=["a.gz", "b.gz"]).read()
    match = r"b\.gz:2: expected one pair per field; missing \['daytime'\], repeated \['weekday'\]"
    with pytest.raises(DataError, match=match):
        FrappeReader(str(folder), filenames=["b.gz"]).read()
    raw = FrappeReader(str(folder), filenames=["a.gz", "b.gz"], skip_bad_rows=True).read()
    assert list(raw.frame.index) == [1, 3, 4, 6]  # b.gz line j -> 3 + j
    assert raw.report.rows_skipped == 2 and raw.report.skipped_lines == [2, 5]
    assert [locate(raw.report, i) for i in (3, 4, 6)] == [
        (str(folder / "a.gz"), 3), (str(folder / "b.gz"), 1), (str(folder / "b.gz"), 3)
    ]
    assert [x["skipped_lines"] for x in raw.report.notes["files"]] == [[2], [2]]
    assert list(raw.frame["label"]) == [1, 0, 0, 1]
    assert raw.frame.loc[1, "item"] == str(1572 - 957) and raw.frame.loc[1, "city"] == "1"


def test_frappe_bad_label_and_pair(tmp_path: Path) -> None:
    folder = _frappe_dir(
        tmp_path, {"l.gz": [_FRAPPE_OK, "0" + _FRAPPE_OK[1:]], "p.gz": [_FRAPPE_OK.replace("42:1", "42:0")]}
    )
    with pytest.raises(DataError, match=r"l\.gz:2: label '0' is not 1 or -1"):
        FrappeReader(str(folder), filenames=["l.gz"]).read()
    with pytest.raises(DataError, match=r"p\.gz:1: pair 1 '42:0' is not 'index:1'"):
        FrappeReader(str(folder), filenames=["p.gz"]).read()
    (folder / "r.gz").write_bytes(gzip.compress((_FRAPPE_OK.replace("5150:1", "5382:1") + "\r\n").encode()))
    with pytest.raises(DataError, match=r"r\.gz:1: pair 10 '5382:1' is not 'index:1' with 0 <= index < 5382"):
        FrappeReader(str(folder), filenames=["r.gz"]).read()


def test_frappe_pair_order_does_not_matter(tmp_path: Path) -> None:
    label, *pairs = _FRAPPE_NEG.split(" ")
    folder = _frappe_dir(tmp_path, {"a.gz": [_FRAPPE_NEG], "b.gz": [" ".join([label, *reversed(pairs)])]})
    a = FrappeReader(str(folder), filenames=["a.gz"]).read().frame
    b = FrappeReader(str(folder), filenames=["b.gz"]).read().frame
    pd.testing.assert_frame_equal(a, b)
    assert a.loc[1, "user"] == "204" and a.loc[1, "country"] == str(5073 - 5069)


def test_frappe_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.gz"):
        FrappeReader(str(tmp_path), filenames=["nope.gz"]).read()


# -- MovieLens bad input ------------------------------------------------------------------
def _ml_dir(tmp_path: Path, ratings: list[str]) -> Path:
    (tmp_path / "u.user").write_text("1|24|M|technician|85711\n2|53|F|other|T8H1N\n")
    flags = ["0"] * 19
    g1, g2 = flags.copy(), flags.copy()
    g1[5], g2[1], g2[2] = "1", "1", "1"
    (tmp_path / "u.item").write_bytes(
        (f"1|Caf\xe9 (1995)|01-Jan-1995||http://x|{'|'.join(g1)}\n" f"2|B (1996)|||http://y|{'|'.join(g2)}\n").encode(
            "latin-1"
        )
    )
    (tmp_path / "u.data").write_text("".join(x + "\n" for x in ratings))
    return tmp_path


def test_movielens_tiny(tmp_path: Path) -> None:
    folder = _ml_dir(tmp_path, ["1\t1\t5\t0", "2\t2\t3\t86399"])
    raw = MovieLensReader(str(folder)).read()
    f = raw.frame
    assert list(f["label"]) == [1, 0] and list(f["genres"]) == ["Comedy", "Action|Adventure"]
    assert list(f["release_year"]) == ["1995", ""] and list(f["zip_prefix"]) == ["857", "T8H"]
    assert list(f["age"]) == ["18-24", "50-55"] and list(f["hour"]) == ["0", "23"]
    assert list(f["weekday"]) == ["Thu", "Thu"]  # 1970-01-01 was a Thursday
    _assert_encodes(raw)


def test_movielens_malformed_lines(tmp_path: Path) -> None:
    folder = _ml_dir(tmp_path, ["1\t1\t5\t0", "2\t2\t3"])
    with pytest.raises(DataError, match=r"u\.data:2: expected 4 tab-separated fields, found 3"):
        MovieLensReader(str(folder)).read()
    (folder / "u.data").write_text("1\t1\t5\t0\n2\tx\t3\t5\n")
    with pytest.raises(DataError, match=r"u\.data:2: column 'item_id': 'x' is not an integer"):
        MovieLensReader(str(folder)).read()
    (folder / "u.data").write_text("1\t1\t5\t0\n3\t1\t3\t5\n")
    with pytest.raises(DataError, match=r"u\.data:2: user_id 3 is not in .*u\.user"):
        MovieLensReader(str(folder)).read()


def test_movielens_missing_folder_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-ml"):
        MovieLensReader(str(tmp_path / "no-ml")).read()
    with pytest.raises(FileNotFoundError, match=r"u\.user"):
        MovieLensReader(str(tmp_path)).read()


# -- Tabular ------------------------------------------------------------------------------
def test_tabular_csv_fixture() -> None:
    raw = TabularReader(str(TINY_CSV), str(TINY_SCHEMA)).read()
    f = raw.frame
    assert raw.schema.name == "tiny_shop" and list(f.index) == [2, 3, 4, 5, 6]  # line 1 is the header
    assert list(f["clicked"]) == [1, 0, 0, 1, 0]
    assert f.loc[2, "tags"] == "a|b" and f.loc[4, "tags"] == ""
    assert math.isnan(f.loc[3, "price"]) and f.loc[5, "price"] == np.inf and math.isnan(f.loc[4, "score"])
    assert "comment" not in f.columns  # columns outside the schema are not kept
    _assert_encodes(raw)


def test_tabular_nan_inf_pass_through_and_encoder_fills(tmp_path: Path) -> None:
    raw = TabularReader(str(TINY_CSV), str(TINY_SCHEMA)).read()
    pre = Preprocessor(raw.schema).fit(raw.frame)
    enc = pre.transform(raw.frame)
    assert enc.stats.dense_filled == {"price": 2, "score": 1}  # price: "" and inf; score: nan
    assert np.isfinite(enc.dense).all()


def test_tabular_missing_column_lists_available(tmp_path: Path) -> None:
    schema = tmp_path / "s.yaml"
    schema.write_text("name: x\nlabel: clicked\nfeatures: [user, country]\n")
    with pytest.raises(SchemaError, match=r"\['country'\].*available columns: \['user', 'item', 'tags'"):
        TabularReader(str(TINY_CSV), str(schema)).read()


def test_tabular_wrong_field_count_and_bad_dense(tmp_path: Path) -> None:
    lines = TINY_CSV.read_text().splitlines()
    lines[2] = "u2,i2,b,,0.4,0"  # line 3: 6 fields (the quoted comment is gone)
    lines[4] = "u3,i1,a|c,cheap,-1,1,y"  # line 5: price is text
    path = _write(tmp_path / "d.csv", lines)
    with pytest.raises(DataError, match=r"d\.csv:3: expected 7 comma-separated fields, found 6"):
        TabularReader(str(path), str(TINY_SCHEMA)).read()
    lines[2] = "u2,i2,b,,0.4,0,ok"
    path = _write(tmp_path / "d.csv", lines)
    with pytest.raises(DataError, match=r"d\.csv:5: column 'price': 'cheap' is not a number"):
        TabularReader(str(path), str(TINY_SCHEMA)).read()
    lines[2] = "u2,i2,b,,0.4,0"
    path = _write(tmp_path / "d.csv", lines)
    raw = TabularReader(str(path), str(TINY_SCHEMA), skip_bad_rows=True).read()
    assert list(raw.frame.index) == [2, 4, 6] and raw.report.rows_skipped == 2
    assert sorted(raw.report.skipped_lines) == [3, 5]


def test_tabular_tsv_and_quoted_newlines(tmp_path: Path) -> None:
    df = pd.read_csv(TINY_CSV, dtype=str, keep_default_na=False)
    tsv = tmp_path / "d.tsv"
    df.to_csv(tsv, sep="\t", index=False)
    raw = TabularReader(str(tsv), str(TINY_SCHEMA)).read()
    assert raw.report.notes["format"] == "tsv" and list(raw.frame.index) == [2, 3, 4, 5, 6]
    quoted = tmp_path / "q.txt"
    quoted.write_text('user;item;tags;price;score;clicked\n"u;1";i1;a;1;2;1\n"u\n2";i2;b;;3;0\nu3;i3;c;4;5;1\n')
    raw = TabularReader(str(quoted), str(TINY_SCHEMA), sep=";").read()
    assert list(raw.frame.index) == [2, 3, 5]  # the record starting at line 3 spans lines 3-4
    assert list(raw.frame["user"]) == ["u;1", "u\n2", "u3"]


def test_tabular_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "user": pa.array([1, 2, None]),
            "item": pa.array([10.0, None, 30.0]),  # integer ids stored as float because of a null
            "tags": pa.array([["a", "b"], None, ["c"]]),
            "price": [1.0, None, float("inf")],
            "score": ["0.5", "x", "1"],
            "clicked": [0, 1, 1],
        }
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    with pytest.raises(DataError, match=r"d\.parquet: row 2: column 'score': 'x' is not a number"):
        TabularReader(str(path), str(TINY_SCHEMA)).read()
    raw = TabularReader(str(path), str(TINY_SCHEMA), skip_bad_rows=True).read()
    f = raw.frame
    assert list(f.index) == [1, 3] and raw.report.skipped_lines == [2]
    assert list(f["user"]) == ["1", ""] and list(f["item"]) == ["10", "30"] and list(f["tags"]) == ["a|b", "c"]
    assert f.loc[3, "price"] == np.inf
    _assert_encodes(raw)


def test_tabular_empty_and_missing(tmp_path: Path) -> None:
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=r"e\.csv: the file is empty"):
        TabularReader(str(empty), str(TINY_SCHEMA)).read()
    empty.write_text("user,item,tags,price,score,clicked\n")
    with pytest.raises(DataError, match=r"e\.csv: no data rows"):
        TabularReader(str(empty), str(TINY_SCHEMA)).read()
    with pytest.raises(FileNotFoundError, match=r"absent\.csv"):
        TabularReader(str(tmp_path / "absent.csv"), str(TINY_SCHEMA)).read()
    with pytest.raises(FileNotFoundError, match=r"absent\.yaml"):
        TabularReader(str(TINY_CSV), str(tmp_path / "absent.yaml")).read()


def test_tabular_bad_label_names_line(tmp_path: Path) -> None:
    lines = TINY_CSV.read_text().splitlines()
    lines[3] = "u1,i3,,3.0,nan,yes,x"
    path = _write(tmp_path / "d.csv", lines)
    with pytest.raises(DataError, match=r"d\.csv:4: label 'yes' is outside \{0, 1\}"):
        TabularReader(str(path), str(TINY_SCHEMA)).read()


def test_relative_data_dir_is_resolved_once_to_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative ``$SALIENCE_DATA_DIR`` still names the same folder after the process changes directory."""
    from recsys.data.raw import data_dir, resolve_data_path

    (tmp_path / "data" / "frappe").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SALIENCE_DATA_DIR", "data")
    found = resolve_data_path(None, "frappe")
    assert found.is_absolute() and found == (tmp_path / "data" / "frappe").absolute()
    assert data_dir() == (tmp_path / "data").absolute()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert found.is_dir()
    monkeypatch.delenv("SALIENCE_DATA_DIR")
    assert data_dir() is None
