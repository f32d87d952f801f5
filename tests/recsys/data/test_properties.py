"""Property-based tests (hypothesis) of the readers and encoders on bad input.

The contract (see ``docs/bad-input.md``): a bad input is either a clear error (``DataError``,
``SchemaError`` or ``ValueError`` whose message names the file and the line, or the config
key) or a documented, counted handling: skipped rows are reported with their line numbers and
``rows_read + rows_skipped`` equals the number of data lines; unseen categories get the OOV
id and are counted; NaN/inf dense values are filled and counted. Every kept row reaches the
encoded output. Files are written to a ``tempfile.TemporaryDirectory`` inside each example
(a function-scoped ``tmp_path`` would be shared by all examples of a test).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from recsys.data.encoders import OOV_ID, EncodedData, Preprocessor, Vocabulary, hash_ids, split_multi
from recsys.data.prepare import PrepareConfig, SplitConfig, prepare_data
from recsys.data.raw import DataError, RawData
from recsys.data.readers import CriteoReader, FrappeReader, MovieLensReader, TabularReader
from recsys.data.readers.criteo import CRITEO_DENSE, CRITEO_SPARSE
from recsys.data.readers.frappe import FRAPPE_FIELDS
from recsys.data.schema import FLOAT32_MAX, DenseTransform, FeatureKind, FeatureSpec, Schema, SchemaError

MULTI, DENSE = FeatureKind.MULTI_CATEGORICAL, FeatureKind.DENSE
#: a few examples per test keep the file well under 40 s on two slow cores (every example writes
#: and parses files, so no per-example deadline); no health check needs suppressing
PROPS = settings(max_examples=50, deadline=None)

# -- strategies -----------------------------------------------------------------------------------
#: characters no text cell may hold unquoted: separators, the quote, line breaks, NUL
_STRUCTURAL = ",\t;|\"\r\n\x00"
#: unicode beyond ASCII on purpose: emoji, RTL text and marks, combining marks, C0/C1 controls
#: (NUL excluded), BOM, line/paragraph separators (line breaks to str.splitlines, not to us)
_SPICE = ["😀", "👩‍👩‍👧", "שלום", "مرحبا", "\u200f", "\u202e", "e\u0301", "\u0301", "\x0b", "\x1c", "\x85",
          "\u2028", "\ufeff", "\x7f", " ", "　", "ß", "İ", "𝔘"]  # fmt: skip
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters=_STRUCTURAL)
text_cell = st.one_of(
    st.text(_chars, max_size=8), st.lists(st.sampled_from(_SPICE), min_size=1, max_size=3).map("".join)
)
token = st.one_of(st.text(_chars, min_size=1, max_size=5), st.sampled_from(_SPICE))


def _name_key(name: str) -> str:
    """How TabularReader matches a header field to a schema name when they differ."""
    return unicodedata.normalize("NFC", name.lstrip("\ufeff").strip())


column_name = st.one_of(st.text(_chars, min_size=1, max_size=6), st.sampled_from(_SPICE)).filter(
    lambda s: _name_key(s) != ""
)

#: dense cells as text: missing, infinite (or too big for a float32) and not-a-number tokens
_MISSING = ["", "nan", "NaN", "NA", "null", "None", " "]
_INFINITE = ["inf", "-inf", "Infinity", "-INF", "1e39", "-1e400"]  # 1e39 is inf as a float32
_BAD_NUMBER = ["abc", "1.2.3", "--1", "e5", "0x10", "1_0", "١٢", "½"]
dense_cell = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(_MISSING + _INFINITE),
)


def _filled(cell: str) -> bool:
    """Whether the encoder fills (and counts) this dense cell: missing, NaN, inf, too big for float32."""
    if cell.strip().lower() in {"", "nan", "na", "null", "none"}:
        return True
    return not abs(float(cell)) <= FLOAT32_MAX


@contextmanager
def _folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _error_line(err: Exception, path: Path) -> int | None:
    """The line an error names (``path:LINE: ...``), None for a file-level message; fails the test
    when the message does not name the file."""
    msg = str(err)
    assert str(path) in msg, f"the error does not name the file {path}: {msg}"
    m = re.search(re.escape(str(path)) + r":(\d+):", msg)
    return int(m.group(1)) if m else None


# -- tabular files --------------------------------------------------------------------------------
MUTATIONS = ("fields-", "fields+", "blank", "number", "cr", "utf8", "label")


@dataclass
class Table:
    """A generated CSV/TSV: the schema, the cells of each data line and which lines are bad."""

    names: dict[str, str]  # role -> column name (cat, multi, dense, label, extra)
    order: list[str]  # roles in file column order
    rows: list[dict[str, str]]  # role -> cell, per data line
    mutations: dict[int, str] = field(default_factory=dict)  # data line index -> mutation
    transform: DenseTransform = DenseTransform.NONE

    def line(self, i: int) -> int:
        return i + 2  # line 1 is the header

    @property
    def structural(self) -> set[int]:
        return {self.line(i) for i, m in self.mutations.items() if m not in ("number", "label")}

    @property
    def skipped(self) -> set[int]:
        return {self.line(i) for i, m in self.mutations.items() if m != "label"}

    def schema(self) -> dict[str, object]:
        n = self.names
        return {
            "name": "props",
            "label": n["label"],
            "features": [
                {"name": n["cat"]},
                {"name": n["multi"], "kind": "multi_categorical", "separator": "|"},
                {"name": n["dense"], "kind": "dense", "transform": self.transform.value, "fill_value": -1.0},
            ],
        }

    def render(self, sep: str, newline: str, final_newline: bool) -> bytes:
        lines = [sep.join(self.names[r] for r in self.order).encode()]
        for i, row in enumerate(self.rows):
            cells = dict(row)
            m = self.mutations.get(i)
            if m == "number":
                cells["dense"] = "abc"
            elif m == "label":
                cells["label"] = "2"
            elif m == "cr":
                cells["cat"] = cells["cat"] + "\rz"
            raw = [cells[r].encode() for r in self.order]
            if m == "utf8":
                raw[self.order.index("cat")] += b"\xff\xfe"
            elif m == "fields-":
                raw = raw[:-1]
            elif m == "fields+":
                raw = [*raw, b"x"]
            lines.append(b"" if m == "blank" else sep.encode().join(raw))
        body = newline.encode().join(lines)
        # a blank last line exists only when a line break follows it
        return body + newline.encode() if final_newline or lines[-1] == b"" else body


@st.composite
def tables(draw: st.DrawFn, mutations: tuple[str, ...] = MUTATIONS, max_rows: int = 12) -> Table:
    roles = ["cat", "multi", "dense", "label", *(["extra"] if draw(st.booleans()) else [])]
    names = draw(st.lists(column_name, min_size=len(roles), max_size=len(roles), unique_by=_name_key))
    order = draw(st.permutations(roles))
    row = st.fixed_dictionaries(
        {
            "cat": text_cell,
            "multi": st.lists(token, max_size=4).map("|".join),
            "dense": dense_cell,
            "label": st.sampled_from(["0", "1"]),
            "extra": text_cell,
        }
    )
    rows = draw(st.lists(row, min_size=1, max_size=max_rows))
    muts = draw(st.dictionaries(st.integers(0, len(rows) - 1), st.sampled_from(mutations), max_size=3))
    transform = draw(st.sampled_from(list(DenseTransform)))
    return Table(dict(zip(roles, names)), list(order), rows, muts, transform)


def _write_table(
    folder: Path, table: Table, fmt: str, newline: str, final_newline: bool, schema_suffix: str
) -> tuple[Path, Path]:
    data = folder / f"data.{fmt}"
    data.write_bytes(table.render("\t" if fmt == "tsv" else ",", newline, final_newline))
    schema = folder / f"schema{schema_suffix}"
    Schema.from_dict(table.schema()).save(schema)  # (a hand-written YAML file would fold U+0085 into a space)
    return data, schema


def _check_encoded(raw: RawData) -> EncodedData:
    """Fit on the whole frame and encode it: every row arrives, ids decode to the cells, the
    multi-hot lengths add up, dense values are finite and the filled ones counted."""
    pre = Preprocessor(raw.schema).fit(raw.frame)
    enc = pre.transform(raw.frame)
    schema = pre.fitted_schema
    assert len(enc) == len(raw) == raw.report.rows_read
    for spec in schema.sparse:
        ids, lens = enc.values[spec.name], enc.lengths[spec.name]
        assert int(lens.sum()) == len(ids) and len(lens) == len(raw)
        assert ((ids >= 0) & (ids < spec.num_embeddings)).all()
        assert enc.stats.oov[spec.name] == 0  # fitted on these very rows
        vocab = pre.vocabularies[spec.name]
        cells = raw.frame[spec.name].tolist()
        if spec.kind is MULTI:
            expected = [t for c in cells for t in c.split(spec.separator) if t != ""]
        else:
            expected = cells
        assert [vocab.tokens[i - 1] for i in ids] == expected  # decode(encode(x)) == x
    assert enc.dense.dtype == np.float32 and np.isfinite(enc.dense).all()
    return enc


def _check_table_read(table: Table, data: Path, raw: RawData, skip: bool) -> None:
    n = len(table.rows)
    report = raw.report
    kept = [i for i in range(n) if table.line(i) not in table.skipped]
    assert list(raw.frame.index) == [table.line(i) for i in kept]
    assert report.rows_read + report.rows_skipped == n
    assert sorted(report.skipped_lines) == sorted(table.skipped) and report.rows_skipped == len(table.skipped)
    assert skip or not table.skipped
    names = table.names
    for i in kept:
        row, line = table.rows[i], table.line(i)
        assert raw.frame.loc[line, names["cat"]] == row["cat"]
        assert raw.frame.loc[line, names["multi"]] == row["multi"]
        assert raw.frame.loc[line, names["label"]] == int(row["label"])
    enc = _check_encoded(raw)
    filled = sum(_filled(table.rows[i]["dense"]) for i in kept)
    assert enc.stats.dense_filled == {names["dense"]: filled}
    # filled cells hold the transformed fill_value (-1.0; log1p clips it to log1p(0) = 0)
    fill = {DenseTransform.NONE: -1.0, DenseTransform.LOG1P: 0.0}.get(table.transform)
    if fill is not None:
        got = enc.dense[:, 0]
        assert all(got[k] == fill for k, i in enumerate(kept) if _filled(table.rows[i]["dense"]))


@PROPS
@given(
    table=tables(),
    fmt=st.sampled_from(["csv", "tsv"]),
    newline=st.sampled_from(["\n", "\r\n"]),
    final_newline=st.booleans(),
    skip=st.booleans(),
    schema_suffix=st.sampled_from([".json", ".yaml"]),
)
@example(  # regression: a lone \r split the line for pyarrow but not for the line scan
    table=Table({"cat": "c", "multi": "m", "dense": "d", "label": "y"}, ["cat", "multi", "dense", "label"],
                [{"cat": "a", "multi": "x", "dense": "1", "label": "0"}] * 3, {1: "cr"}),
    fmt="csv", newline="\n", final_newline=True, skip=True, schema_suffix=".json",
)
@example(  # regression: invalid UTF-8 was a bare UnicodeDecodeError or a line-less pyarrow error
    table=Table({"cat": "c", "multi": "m", "dense": "d", "label": "y"}, ["cat", "multi", "dense", "label"],
                [{"cat": "a", "multi": "x", "dense": "1", "label": "0"}] * 2, {0: "utf8"}),
    fmt="csv", newline="\n", final_newline=True, skip=False, schema_suffix=".json",
)
@example(  # regression: 1e39 fits a float64 but became inf in the float32 dense tensor
    table=Table({"cat": "c", "multi": "m", "dense": "d", "label": "y"}, ["cat", "multi", "dense", "label"],
                [{"cat": "a", "multi": "", "dense": "1e39", "label": "1"}]),
    fmt="tsv", newline="\n", final_newline=False, skip=False, schema_suffix=".yaml",
)
@example(  # regression: a header field typed with a combining accent or padded with spaces
    table=Table({"cat": "e\u0301", "multi": " m ", "dense": "d", "label": "y"}, ["cat", "multi", "dense", "label"],
                [{"cat": "\x00a", "multi": "x", "dense": "2", "label": "1"}]),
    fmt="csv", newline="\r\n", final_newline=True, skip=False, schema_suffix=".json",
)
def test_tabular_bad_lines_are_named_or_skipped_and_counted(
    table: Table, fmt: str, newline: str, final_newline: bool, skip: bool, schema_suffix: str
) -> None:
    with _folder() as folder:
        data, schema = _write_table(folder, table, fmt, newline, final_newline, schema_suffix)
        reader = TabularReader(str(data), str(schema), skip_bad_rows=skip)
        label_bad = {table.line(i) for i, m in table.mutations.items() if m == "label"}
        try:
            raw = reader.read()
        except DataError as e:
            line = _error_line(e, data)
            if line is None:  # file level: every data line was bad
                assert skip and "no data rows" in str(e) and len(table.skipped) == len(table.rows)
            elif skip:  # a bad label always raises
                assert line in label_bad
            else:
                assert line in table.structural | table.skipped | label_bad
                if table.structural:  # the line scan runs first
                    assert line == min(table.structural)
            return
        assert not label_bad
        _check_table_read(table, data, raw, skip)


@PROPS
@given(table=tables(mutations=("fields-", "fields+", "blank", "cr", "quote", "quote", "quote")), skip=st.booleans())
@example(  # regression: a stray quote swallowed the next line and that line was lost uncounted
    table=Table({"cat": "c", "multi": "m", "dense": "d", "label": "y"}, ["cat", "multi", "dense", "label"],
                [{"cat": "a", "multi": "x", "dense": "1", "label": "0"}] * 3, {1: "quote"}),
    skip=True,
)
def test_tabular_stray_quotes_never_lose_lines(table: Table, skip: bool) -> None:
    """A stray ``"`` may open a field that runs over later lines. Every data line is then a kept
    record's line (its first, or one inside its quoted field) or a skipped line. Quotes go into
    sparse cells only, so the line breaks of a kept record are all in its sparse cells."""
    quoted_rows = [dict(r) for r in table.rows]
    for i, m in table.mutations.items():
        if m == "quote":
            role = "cat" if i % 2 else "multi"
            cell = quoted_rows[i][role]
            quoted_rows[i][role] = '"' + cell if i % 3 else cell[:1] + '"' + cell[1:]
    table = Table(table.names, table.order, quoted_rows, {i: m for i, m in table.mutations.items() if m != "quote"},
                  table.transform)
    with _folder() as folder:
        data, schema = _write_table(folder, table, "csv", "\n", True, ".json")
        n = len(table.rows)
        try:
            raw = TabularReader(str(data), str(schema), skip_bad_rows=skip).read()
        except DataError as e:
            line = _error_line(e, data)
            assert (line is not None and 2 <= line <= n + 1) or (skip and "no data rows" in str(e))
            return
        report, frame = raw.report, raw.frame
        sparse = [table.names["cat"], table.names["multi"]]
        covered: list[int] = []
        for line, row in frame.iterrows():
            span = 1 + sum(str(row[c]).count("\n") for c in sparse)
            covered.extend(range(int(line), int(line) + span))
        assert sorted(covered + report.skipped_lines) == list(range(2, n + 2))
        assert report.rows_skipped == len(report.skipped_lines) and report.rows_read == len(frame)
        _check_encoded(raw)


@PROPS
@given(
    n=st.integers(1, 300),
    fmt=st.sampled_from(["csv", "tsv"]),
    unique=st.sampled_from(["cat", "multi"]),
)
def test_tabular_huge_cardinality(n: int, fmt: str, unique: str) -> None:
    """Every value unique: the vocabulary holds them all, ids are a permutation of 1..n."""
    sep = "\t" if fmt == "tsv" else ","
    values = [f"v{i}😀" for i in range(n)]
    lines = [sep.join(["cat", "multi", "dense", "y"])]
    for i, v in enumerate(values):
        lines.append(sep.join([v if unique == "cat" else "c", v if unique == "multi" else "", "1", str(i % 2)]))
    with _folder() as folder:
        data = folder / f"d.{fmt}"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        schema = folder / "s.json"
        schema.write_text(json.dumps({"label": "y", "features": [
            "cat", {"name": "multi", "kind": "multi_categorical"}, {"name": "dense", "kind": "dense"}]}))
        raw = TabularReader(str(data), str(schema)).read()
        enc = _check_encoded(raw)
        ids = enc.values[unique]
        assert sorted(ids.tolist()) == list(range(1, n + 1))


# -- Parquet -------------------------------------------------------------------------------------
@dataclass
class ParquetCase:
    table: pa.Table
    unsupported: set[str]  # columns of a type the reader refuses (SchemaError)
    bad_rows: set[int]  # rows with a cell that is not UTF-8 text (always raises)
    bad_labels: set[int]  # rows with a label other than 0/1 (raises unless the row was skipped)
    bad_numbers: set[int]  # rows with dense text that is not a number (skipped with skip_bad_rows)
    filled: list[bool]  # per row: the dense value is missing/NaN/inf/too big


@st.composite
def parquet_cases(draw: st.DrawFn) -> ParquetCase:
    n = draw(st.integers(1, 8))
    rows = range(n)
    unsupported: set[str] = set()
    bad_rows: set[int] = set()
    bad_numbers: set[int] = set()
    cat_kind = draw(st.sampled_from(["string", "int", "float", "dict", "binary", "bad-binary", "bool", "struct"]))
    maybe = lambda s: st.one_of(st.none(), s)  # noqa: E731
    if cat_kind in ("string", "dict"):
        cat = pa.array([draw(maybe(text_cell)) for _ in rows], pa.string())
        cat = cat.dictionary_encode() if cat_kind == "dict" else cat
    elif cat_kind == "int":
        cat = pa.array([draw(maybe(st.integers(-(2**62), 2**62))) for _ in rows], pa.int64())
    elif cat_kind == "float":
        cat = pa.array([draw(st.sampled_from([1.0, 2.0, float("nan"), None, -0.0])) for _ in rows], pa.float64())
    elif cat_kind in ("binary", "bad-binary"):
        cells = [draw(text_cell).encode() for _ in rows]
        if cat_kind == "bad-binary":
            k = draw(st.integers(0, n - 1))
            cells[k] += b"\xff"
            bad_rows.add(k + 1)
        cat = pa.array(cells, pa.binary())
    elif cat_kind == "bool":
        cat = pa.array([draw(maybe(st.booleans())) for _ in rows], pa.bool_())
    else:
        cat = pa.array([{"a": i} for i in rows])
        unsupported.add("cat")
    multi_kind = draw(st.sampled_from(["list", "string", "nested"]))
    if multi_kind == "list":
        multi = pa.array([draw(maybe(st.lists(maybe(token), max_size=3))) for _ in rows], pa.list_(pa.string()))
    elif multi_kind == "string":
        multi = pa.array([draw(st.lists(token, max_size=3).map("|".join)) for _ in rows], pa.string())
    else:
        multi = pa.array([[["a"]] for _ in rows])
        unsupported.add("multi")
    dense_kind = draw(st.sampled_from(["float", "int", "text", "decimal", "bool", "timestamp"]))
    filled = [False] * n
    if dense_kind == "float":
        values = [draw(maybe(st.one_of(st.floats(), st.sampled_from([1e39, -1e39])))) for _ in rows]
        filled = [v is None or not abs(v) <= FLOAT32_MAX for v in values]
        dense = pa.array(values, pa.float64())
    elif dense_kind == "int":
        values = [draw(maybe(st.integers(-(10**6), 10**6))) for _ in rows]
        filled = [v is None for v in values]
        dense = pa.array(values, pa.int64())
    elif dense_kind == "text":
        values = [draw(st.one_of(dense_cell, st.sampled_from(_BAD_NUMBER))) for _ in rows]
        bad_numbers = {i + 1 for i, v in enumerate(values) if v in _BAD_NUMBER}
        filled = [v not in _BAD_NUMBER and _filled(v) for v in values]
        dense = pa.array(values, pa.string())
    elif dense_kind == "decimal":
        values = [draw(maybe(st.decimals(-1000, 1000, places=2))) for _ in rows]
        filled = [v is None for v in values]
        dense = pa.array(values, pa.decimal128(8, 2))
    elif dense_kind == "bool":
        dense = pa.array([draw(st.booleans()) for _ in rows], pa.bool_())
    else:
        dense = pa.array([None] * n, pa.timestamp("us"))
        unsupported.add("dense")
    labels = [draw(st.sampled_from([0, 1])) for _ in rows]
    bad_labels: set[int] = set()
    if draw(st.booleans()) and draw(st.booleans()):
        k = draw(st.integers(0, n - 1))
        labels[k] = draw(st.sampled_from([2, None, -1]))
        bad_labels.add(k + 1)
    label_kind = draw(st.sampled_from(["int", "float", "string"]))
    cast = {"int": int, "float": float, "string": str}[label_kind]
    label = pa.array([None if v is None else cast(v) for v in labels])
    table = pa.table({"cat": cat, "multi": multi, "dense": dense, "y": label})
    return ParquetCase(table, unsupported, bad_rows, bad_labels, bad_numbers, filled)


@PROPS
@given(case=parquet_cases(), skip=st.booleans())
@example(  # regression: a struct column was a bare ArrowNotImplementedError, a timestamp a silent number
    case=ParquetCase(pa.table({"cat": [{"a": 1}], "multi": ["a"], "dense": [1.0], "y": [1]}), {"cat"}, set(), set(),
                     set(), [False]),
    skip=False,
)
def test_parquet_bad_columns_and_cells_are_named_or_counted(case: ParquetCase, skip: bool) -> None:
    with _folder() as folder:
        data, schema = folder / "d.parquet", folder / "s.json"
        pq.write_table(case.table, data)
        schema.write_text(json.dumps({"label": "y", "features": [
            "cat", {"name": "multi", "kind": "multi_categorical"}, {"name": "dense", "kind": "dense"}]}))
        n = case.table.num_rows
        try:
            raw = TabularReader(str(data), str(schema), skip_bad_rows=skip).read()
        except SchemaError as e:
            assert str(data) in str(e) and case.unsupported
            assert any(f"column {c!r}" in str(e) for c in case.unsupported)
            return
        except DataError as e:
            assert str(data) in str(e)
            m = re.search(r": row (\d+):", str(e))
            if m is None:
                assert skip and "no data rows" in str(e) and case.bad_numbers == set(range(1, n + 1))
            else:
                assert int(m.group(1)) in case.bad_rows | case.bad_labels | case.bad_numbers
            return
        assert not case.unsupported and not case.bad_rows and (skip or not case.bad_numbers)
        assert not case.bad_labels - case.bad_numbers  # a bad label raises unless its row was skipped
        kept = [r for r in range(1, n + 1) if r not in case.bad_numbers]
        assert list(raw.frame.index) == kept and sorted(raw.report.skipped_lines) == sorted(case.bad_numbers)
        assert raw.report.rows_read + raw.report.rows_skipped == n
        enc = _check_encoded(raw)
        assert enc.stats.dense_filled == {"dense": sum(case.filled[r - 1] for r in kept)}


@PROPS
@given(cut=st.integers(0, 400), reader=st.sampled_from(["criteo", "csv"]), nrows=st.one_of(st.none(), st.just(2)))
def test_truncated_gzip_is_a_data_error(cut: int, reader: str, nrows: int | None) -> None:
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    source = fixtures / ("tiny_criteo.tsv" if reader == "criteo" else "tiny_tabular.csv")
    full = gzip.compress(source.read_bytes())
    assume(cut < len(full))
    with _folder() as folder:
        path = folder / ("train.txt.gz" if reader == "criteo" else "d.csv.gz")
        path.write_bytes(full[:cut])
        make = (lambda: CriteoReader(str(path), nrows=nrows)) if reader == "criteo" else (
            lambda: TabularReader(str(path), str(fixtures / "tiny_tabular_schema.yaml")))
        with pytest.raises(DataError) as e:
            make().read()
        assert str(path) in str(e.value)


# -- empty files ----------------------------------------------------------------------------------
_EMPTY = {
    "nothing": b"",
    "whitespace": b" \n\t\r\n",
    "newlines": b"\n\n\n",
}


@PROPS
@given(
    kind=st.sampled_from(["nothing", "whitespace", "newlines", "header", "header+blank"]),
    reader=st.sampled_from(["csv", "tsv", "criteo", "frappe", "movielens"]),
    gz=st.booleans(),
    skip=st.booleans(),
)
def test_empty_files_are_a_clear_error(kind: str, reader: str, gz: bool, skip: bool) -> None:
    header = {"csv": b"a,y\n", "tsv": b"a\ty\n"}.get(reader)
    if kind.startswith("header"):
        assume(header is not None)
        content = header + (b"\n" if kind == "header+blank" else b"")
    else:
        content = _EMPTY[kind]
    with _folder() as folder:
        if reader == "movielens":
            (folder / "u.user").write_text("1|24|M|x|85711\n")
            (folder / "u.item").write_text("1|A (1995)|01-Jan-1995||u|" + "|".join(["1"] + ["0"] * 18) + "\n")
        path = folder / {"csv": "d.csv", "tsv": "d.tsv", "criteo": "train.txt", "frappe": "f.libfm",
                         "movielens": "u.data"}[reader]
        path.write_bytes(gzip.compress(content) if gz and reader != "movielens" else content)
        schema = folder / "s.json"
        schema.write_text(json.dumps({"label": "y", "features": ["a"]}))
        make = {
            "csv": lambda: TabularReader(str(path), str(schema), skip_bad_rows=skip),
            "tsv": lambda: TabularReader(str(path), str(schema), skip_bad_rows=skip),
            "criteo": lambda: CriteoReader(str(path), skip_bad_rows=skip),
            "frappe": lambda: FrappeReader(str(path), skip_bad_rows=skip),
            "movielens": lambda: MovieLensReader(str(folder)),
        }[reader]
        with pytest.raises(DataError) as e:
            make().read()
        line = _error_line(e.value, path)
        msg = str(e.value)
        assert "empty" in msg or "no data rows" in msg
        assert line is None or (kind == "header+blank" and not skip and line == 2)


# -- Criteo ---------------------------------------------------------------------------------------
@st.composite
def criteo_lines(draw: st.DrawFn) -> tuple[list[bytes], dict[int, str]]:
    n = draw(st.integers(1, 8))
    ints = st.one_of(st.integers(-5, 10**9).map(str), st.just(""))
    cats = st.one_of(st.text("0123456789abcdef", min_size=8, max_size=8), st.just(""), text_cell)
    lines = []
    for _ in range(n):
        label = draw(st.sampled_from(["0", "1"]))
        lines.append([label, *[draw(ints) for _ in CRITEO_DENSE], *[draw(cats) for _ in CRITEO_SPARSE]])
    muts = draw(st.dictionaries(st.integers(0, n - 1), st.sampled_from(["fields-", "fields+", "blank", "float", "text",
                                                                          "cr", "utf8"]), max_size=3))
    out = []
    for i, fields in enumerate(lines):
        m = muts.get(i)
        if m == "float":
            fields[1 + draw(st.integers(0, 12))] = draw(st.sampled_from(["1.5", "nan", "inf"]))
        elif m == "text":
            fields[1 + draw(st.integers(0, 12))] = draw(st.sampled_from(_BAD_NUMBER))
        elif m == "cr":
            fields[20] = "ab\rcd"
        raw = [f.encode() for f in fields]
        if m == "utf8":
            raw[30] += b"\xc3"
        elif m == "fields-":
            raw = raw[: draw(st.integers(0, 39))]
        elif m == "fields+":
            raw = [*raw, b""]
        out.append(b"" if m == "blank" or (m == "fields-" and not raw) else b"\t".join(raw))
        if m == "fields-" and not raw:
            muts[i] = "blank"
    return out, muts


def _criteo_line(i1: str = "1") -> bytes:
    return "\t".join(["0", i1, *["2"] * 12, *["68fd1e64"] * 26]).encode()


@PROPS
@given(case=criteo_lines(), skip=st.booleans(), nrows=st.one_of(st.none(), st.integers(1, 8)), gz=st.booleans())
@example(  # regression: pyarrow's integer cast read "0x10" as 16 when the rest of the column was clean
    case=([_criteo_line("0x10"), _criteo_line()], {0: "text"}), skip=True, nrows=None, gz=False
)
def test_criteo_bad_lines_are_named_or_skipped_and_counted(
    case: tuple[list[bytes], dict[int, str]], skip: bool, nrows: int | None, gz: bool
) -> None:
    lines, muts = case
    n = len(lines) if nrows is None else min(nrows, len(lines))
    bad = {i + 1 for i, m in muts.items() if i < n}
    structural = {i + 1 for i, m in muts.items() if i < n and m not in ("float", "text")}
    content = b"\n".join(lines) + b"\n"
    with _folder() as folder:
        path = folder / "train.txt"
        path.write_bytes(gzip.compress(content) if gz else content)
        try:
            raw = CriteoReader(str(path), nrows=nrows, skip_bad_rows=skip).read()
        except DataError as e:
            line = _error_line(e, path)
            if line is None:  # file level: no good line (all blank reads as an empty file)
                assert bad == set(range(1, n + 1)) and (skip or "the file is empty" in str(e))
            else:
                assert not skip and line == (min(structural) if structural else min(bad))
            return
        assert skip or not bad
        report = raw.report
        assert list(raw.frame.index) == [x for x in range(1, n + 1) if x not in bad]
        assert report.rows_read + report.rows_skipped == n and sorted(report.skipped_lines) == sorted(bad)
        _check_encoded(raw)


# -- Frappe ---------------------------------------------------------------------------------------
_STARTS = np.concatenate([[0], np.cumsum([c for _, c in FRAPPE_FIELDS])[:-1]]).tolist()


@st.composite
def frappe_files(draw: st.DrawFn) -> list[tuple[list[str], dict[int, str]]]:
    files = []
    for _ in range(draw(st.integers(1, 2))):
        lines, muts = [], {}
        for i in range(draw(st.integers(1, 6))):
            pairs = [f"{s + draw(st.integers(0, c - 1))}:1" for s, (_, c) in zip(_STARTS, FRAPPE_FIELDS)]
            pairs = draw(st.permutations(pairs))
            label = draw(st.sampled_from(["1", "-1"]))
            m = draw(st.sampled_from([None] * 6 + ["fields-", "fields+", "blank", "pair", "range", "repeat", "cr",
                                                   "label"]))
            if m == "fields-":
                pairs = pairs[:-1]
            elif m == "fields+":
                pairs = [*pairs, "1:1"]
            elif m == "pair":
                pairs[0] = draw(st.sampled_from(["42:0", "x:1", "42", ":1", "4.5:1", "😀:1"]))
            elif m == "range":
                pairs[0] = "5382:1"
            elif m == "repeat":  # the user field twice, another field missing
                pairs = [p for p in pairs if not 957 <= int(p.split(":")[0]) < 5039] + ["0:1"]
            elif m == "cr":
                pairs[3] = pairs[3] + "\r1"
            elif m == "label":
                label = draw(st.sampled_from(["0", "2", "+1", "١"]))
            lines.append("" if m == "blank" else " ".join([label, *pairs]))
            if m:
                muts[i] = m
        files.append((lines, muts))
    return files


@PROPS
@given(files=frappe_files(), skip=st.booleans(), crlf=st.booleans())
def test_frappe_pooled_files_name_or_count_every_bad_line(
    files: list[tuple[list[str], dict[int, str]]], skip: bool, crlf: bool
) -> None:
    end = "\r\n" if crlf else "\n"
    with _folder() as folder:
        names = []
        for k, (lines, _) in enumerate(files):
            names.append(f"f{k}.libfm.gz")
            (folder / names[-1]).write_bytes(gzip.compress("".join(x + end for x in lines).encode()))
        bad: list[tuple[str, int]] = []  # (file, line), in file order
        offset, kept_index, skipped_index = 0, [], []
        for name, (lines, muts) in zip(names, files):
            for i in range(len(lines)):
                if i in muts:
                    bad.append((name, i + 1))
                    skipped_index.append(offset + i + 1)
                else:
                    kept_index.append(offset + i + 1)
            offset += len(lines)
        label_bad = [(names[k], i + 1) for k, (_, m) in enumerate(files) for i, x in m.items() if x == "label"]
        try:
            raw = FrappeReader(str(folder), filenames=names, skip_bad_rows=skip).read()
        except DataError as e:
            msg = str(e)
            m = re.search(r"(f\d\.libfm\.gz):(\d+):", msg)
            if m is None:  # file level: one file has no good line left (all blank: an empty file)
                assert "the file is empty" in msg or (skip and "no data rows" in msg)
                return
            where = (m.group(1), int(m.group(2)))
            assert str(folder / where[0]) in msg
            assert where in (label_bad if skip else bad)
            return
        assert not label_bad and (skip or not bad)
        report = raw.report
        assert list(raw.frame.index) == kept_index
        assert report.rows_read + report.rows_skipped == offset and sorted(report.skipped_lines) == skipped_index
        assert [f["rows"] + f["rows_skipped"] for f in report.notes["files"]] == [len(x) for x, _ in files]
        _check_encoded(raw)


# -- MovieLens ------------------------------------------------------------------------------------
@PROPS
@given(
    ratings=st.lists(
        st.tuples(st.sampled_from(["1", "2"]), st.sampled_from(["1", "2"]), st.sampled_from(["1", "3", "5"]),
                  st.integers(0, 2**31).map(str)),
        min_size=1, max_size=6,
    ),
    muts=st.dictionaries(st.integers(0, 5), st.sampled_from(["fields-", "fields+", "blank", "text", "user", "cr",
                                                              "utf8"]), max_size=2),
    occupation=text_cell,
)
def test_movielens_bad_ratings_name_their_line(
    ratings: list[tuple[str, ...]], muts: dict[int, str], occupation: str
) -> None:
    muts = {i: m for i, m in muts.items() if i < len(ratings)}
    lines = []
    for i, r in enumerate(ratings):
        f = [x.encode() for x in r]
        m = muts.get(i)
        if m == "fields-":
            f = f[:3]
        elif m == "fields+":
            f = [*f, b"9"]
        elif m == "text":
            f[1] = "٣".encode()
        elif m == "user":
            f[0] = b"7"
        elif m == "cr":
            f[3] = b"1\r2"
        elif m == "utf8":
            f[2] += b"\xff"
        lines.append(b"" if m == "blank" else b"\t".join(f))
    with _folder() as folder:
        (folder / "u.user").write_text(f"1|24|M|{occupation}|85711\n2|53|F|other|T8H1N\n", encoding="utf-8")
        flags = "|".join(["1"] + ["0"] * 18)
        (folder / "u.item").write_bytes(f"1|Café (1995)|01-Jan-1995||u|{flags}\n2|B|||u|{flags}\n".encode("latin-1"))
        path = folder / "u.data"
        path.write_bytes(b"\n".join(lines) + b"\n")
        try:
            raw = MovieLensReader(str(folder)).read()
        except DataError as e:
            line = _error_line(e, path)
            if line is None:  # every line blank: an empty file
                assert set(muts.values()) == {"blank"} and len(muts) == len(ratings) and "empty" in str(e)
            else:
                assert line in {i + 1 for i in muts}
            return
        assert not muts and list(raw.frame.index) == list(range(1, len(ratings) + 1))
        assert raw.frame["occupation"].tolist() == [occupation if r[0] == "1" else "other" for r in ratings]
        _check_encoded(raw)


# -- encoders -------------------------------------------------------------------------------------
@PROPS
@given(
    tokens=st.lists(st.one_of(token, st.just(""), st.text(max_size=4)), max_size=40),
    probe=st.lists(st.one_of(token, st.text(max_size=4)), max_size=20),
    min_count=st.integers(1, 3),
)
@example(tokens=["a\x00", "a", "a\x00"], probe=["a\x00", "a"], min_count=1)  # regression: NUL was dropped
def test_vocabulary_round_trip_and_oov(tokens: list[str], probe: list[str], min_count: int) -> None:
    vocab = Vocabulary.fit(np.array(tokens, dtype=object), min_count)
    counts = Counter(tokens)
    assert set(vocab.tokens) == {t for t, c in counts.items() if c >= min_count}
    assert len(set(vocab.tokens)) == len(vocab.tokens) and vocab.counts == sorted(vocab.counts, reverse=True)
    # decode(encode(token)) == token for every vocabulary entry; the ids are 1..V
    ids = vocab.encode(np.array(vocab.tokens, dtype=object))
    assert ids.tolist() == list(range(1, len(vocab) + 1))
    got = vocab.encode(np.array(probe, dtype=object))
    assert ((got >= 0) & (got < vocab.num_embeddings)).all()
    assert [vocab.tokens[i - 1] if i else None for i in got] == [t if t in vocab.tokens else None for t in probe]
    # the state round-trips through JSON
    again = Vocabulary(**json.loads(json.dumps({"tokens": vocab.tokens.to_list(), "counts": vocab.counts.to_list()})))
    np.testing.assert_array_equal(again.encode(np.array(probe, dtype=object)), got)


@PROPS
@given(
    train=st.lists(st.lists(token, max_size=4), min_size=1, max_size=20),
    test=st.lists(st.lists(token, max_size=4), max_size=20),
    separator=st.sampled_from(["|", ";", "::", "😀"]),
    hash_size=st.one_of(st.none(), st.integers(1, 20)),
)
def test_multi_hot_lengths_ids_and_oov_counts(
    train: list[list[str]], test: list[list[str]], separator: str, hash_size: int | None
) -> None:
    assume(all([t for t in separator.join(b).split(separator) if t] == b for b in train + test))
    spec = FeatureSpec("tags", MULTI, separator=separator, hash_size=hash_size)
    schema = Schema((spec,), label="y")

    def frame(bags: list[list[str]]) -> pd.DataFrame:
        return pd.DataFrame({"tags": [separator.join(b) for b in bags], "y": [0] * len(bags)})

    pre = Preprocessor(schema).fit(frame(train))
    enc = pre.transform(frame(test))
    ids, lens = enc.values["tags"], enc.lengths["tags"]
    assert lens.tolist() == [len(b) for b in test] and int(lens.sum()) == len(ids)
    n_emb = pre.fitted_schema["tags"].num_embeddings
    assert ((ids >= 0) & (ids < n_emb)).all()
    flat = [t for b in test for t in b]
    if hash_size is None:
        seen = {t for b in train for t in b}
        assert enc.stats.oov["tags"] == sum(t not in seen for t in flat) == int((ids == OOV_ID).sum())
        vocab = pre.vocabularies["tags"]
        assert [vocab.tokens[i - 1] if i else None for i in ids] == [t if t in seen else None for t in flat]
    else:
        assert n_emb == hash_size + 1 and (ids >= 1).all() and enc.stats.oov["tags"] == 0
        np.testing.assert_array_equal(ids, hash_ids(np.array(flat, dtype=object), hash_size))
    flat_split, lens_split = split_multi(np.array([separator.join(b) for b in test], dtype=object), separator)
    assert flat_split.tolist() == flat and lens_split.tolist() == lens.tolist()


dense_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e39, -1e39, 3.5e38, FLOAT32_MAX, -FLOAT32_MAX, 1e-320, 0.0]),
)


@PROPS
@given(
    train=st.lists(dense_value, min_size=1, max_size=30),
    test=st.lists(dense_value, max_size=30),
    transform=st.sampled_from(list(DenseTransform)),
    fill=st.floats(-1e6, 1e6),
    missing=st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 999.0])),
)
@example(train=[0.0, 1e-40], test=[1e38], transform=DenseTransform.STANDARDIZE, fill=0.0, missing=None)
@example(train=[1e308, 1e308], test=[1.0], transform=DenseTransform.STANDARDIZE, fill=0.0, missing=None)
def test_dense_is_finite_and_fills_are_counted(
    train: list[float], test: list[float], transform: DenseTransform, fill: float, missing: float | None
) -> None:
    spec = FeatureSpec("x", DENSE, transform=transform, fill_value=fill, missing_value=missing)
    pre = Preprocessor(Schema((spec,), label="y")).fit(pd.DataFrame({"x": train, "y": 0}))
    enc = pre.transform(pd.DataFrame({"x": test, "y": 0}, dtype=np.float64))
    out = enc.dense[:, 0]
    assert out.dtype == np.float32 and out.shape == (len(test),) and np.isfinite(out).all()

    def is_filled(v: float) -> bool:
        return not abs(v) <= FLOAT32_MAX or (missing is not None and v == missing)

    assert enc.stats.dense_filled == {"x": sum(is_filled(v) for v in test)}
    fill_out = pre.encode_dense(spec, np.array([fill]))[0][0]
    assert all(o == fill_out for o, v in zip(out, test) if is_filled(v))
    if transform is DenseTransform.NONE:
        assert all(o == np.float32(v) for o, v in zip(out, test) if not is_filled(v))


@PROPS
@given(frame_cols=st.lists(st.sampled_from(["a", "b", "y", "other"]), unique=True, max_size=4))
def test_preprocessor_missing_column_is_a_schema_error(frame_cols: list[str]) -> None:
    schema = Schema((FeatureSpec("a"), FeatureSpec("b", DENSE)), label="y")
    frame = pd.DataFrame({c: ["1"] for c in frame_cols})
    missing = [c for c in ("a", "b") if c not in frame_cols]
    if missing:
        with pytest.raises(SchemaError, match=re.escape(str(missing))):
            Preprocessor(schema).fit(frame)
    else:
        Preprocessor(schema).fit(frame).transform(frame)


# -- schema files ---------------------------------------------------------------------------------
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(), st.text(max_size=6),
              st.sampled_from(["categorical", "dense", "multi_categorical", "log1p", "standardize", ""])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
feature_entry = st.one_of(
    column_name,
    st.fixed_dictionaries(
        {"name": st.one_of(column_name, json_value)},
        optional={k: json_value for k in ("kind", "embedding_dim", "min_count", "hash_size", "separator", "transform",
                                          "fill_value", "missing_value", "typo")},
    ),
    json_value,
)


@PROPS
@given(
    doc=st.fixed_dictionaries(
        {"features": st.one_of(st.lists(feature_entry, max_size=4), json_value)},
        optional={"label": st.one_of(column_name, json_value), "name": json_value, "extras": json_value,
                  "lable": json_value},
    ),
    suffix=st.sampled_from([".json", ".yaml"]),
)
@example(doc={"features": None}, suffix=".yaml")  # regression: TypeError ('NoneType' is not iterable)
@example(doc={"features": [[None]]}, suffix=".json")  # regression: AttributeError ('list' has no 'get')
@example(doc={"features": ["a"], 1: 2, "x": 3}, suffix=".yaml")  # regression: TypeError sorting int and str keys
@example(doc={"features": ["a"], "extras": 5}, suffix=".json")  # regression: TypeError from dict(5)
@example(doc={"features": [{"name": "x", "kind": "dense", "fill_value": float("nan")}]}, suffix=".yaml")
@example(doc={"features": [{"name": "x", "kind": "multi_categorical", "separator": ""}]}, suffix=".json")
def test_schema_files_load_or_raise_schema_error(doc: dict[str, object], suffix: str) -> None:
    with _folder() as folder:
        path = folder / f"s{suffix}"
        text = yaml.safe_dump(doc, allow_unicode=True) if suffix == ".yaml" else json.dumps(doc)
        path.write_text(text, encoding="utf-8")
        try:
            schema = Schema.load(path)
        except SchemaError as e:
            assert str(path) in str(e)
            return
        again = Schema.from_dict(json.loads(json.dumps(schema.to_dict())))  # round trip
        assert json.dumps(again.to_dict(), sort_keys=True) == json.dumps(schema.to_dict(), sort_keys=True)
        for f in schema.features:
            assert isinstance(f.name, str) and f.name and math.isfinite(f.fill_value) and f.separator


@PROPS
@given(content=st.one_of(st.binary(max_size=60), st.text(max_size=60).map(str.encode)),
       suffix=st.sampled_from([".json", ".yaml"]))
@example(content=b"features: [a\n  - b: {", suffix=".yaml")  # regression: a bare yaml.YAMLError
@example(content=b"\xff\xfe", suffix=".json")  # regression: a UnicodeDecodeError without the file name
def test_garbled_schema_files_are_a_schema_error(content: bytes, suffix: str) -> None:
    with _folder() as folder:
        path = folder / f"s{suffix}"
        path.write_bytes(content)
        try:
            Schema.load(path)
        except SchemaError as e:
            assert str(path) in str(e)


@PROPS
@given(sep=st.one_of(st.text(max_size=2), st.sampled_from(["", "ab", "§", "😀", '"', "\n", "\r"])))
def test_tabular_sep_must_be_one_ascii_character(sep: str) -> None:
    with _folder() as folder:
        data, schema = folder / "d.txt", folder / "s.json"
        data.write_text("a;y\nx;1\n")
        schema.write_text(json.dumps({"label": "y", "features": ["a"]}))
        try:
            raw = TabularReader(str(data), str(schema), sep=sep).read()
        except ValueError as e:  # DataError and SchemaError are ValueErrors too
            if len(sep) == 1 and sep.isascii() and sep not in '"\r\n':
                assert isinstance(e, (DataError, SchemaError)) and str(data) in str(e)  # the header is not split
            else:
                assert "sep" in str(e) and repr(sep) in str(e)
            return
        assert sep == ";" and len(raw) == 1


# -- the counts in the prepared summary -----------------------------------------------------------
def test_prepared_summary_reports_skips_oov_and_fills(tmp_path: Path) -> None:
    lines = ["user,price,y"] + [f"u{i % 7},{i}.5,{i % 2}" for i in range(60)]
    lines[5] = "u1,cheap,1"  # line 6: not a number
    lines[9] = "u1,2"  # line 10: a field short
    lines[12] = "u99,inf,0"  # line 13: filled
    lines[20] = "u1,\r,0"  # line 21: stray carriage return
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    schema = {"label": "y", "features": ["user", {"name": "price", "kind": "dense"}]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    reader = TabularReader(str(tmp_path / "d.csv"), str(tmp_path / "s.json"), skip_bad_rows=True)
    prepared = prepare_data(reader, PrepareConfig(SplitConfig(0.6, 0.2, 0.2, seed=1)))
    read = prepared.summary["read"]
    assert read["rows_read"] == 57 and read["rows_skipped"] == 3 and sorted(read["skipped_lines"]) == [6, 10, 21]
    assert sum(prepared.summary["split"][f"{s}_rows"] for s in ("train", "val", "test")) == 57
    assert sum(len(prepared.splits[s]) for s in prepared.splits) == 57  # every kept row is encoded
    encode = prepared.summary["encode"]
    assert sum(e["dense_filled"]["price"] for e in encode.values()) == 1
    assert all(set(e["oov"]) == {"user"} for e in encode.values())
    json.dumps(prepared.summary)  # what MLflow logs as data_summary.json


def test_bad_input_doc_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "bad-input.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", doc, flags=re.S)[-1]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/bad-input.md", "exec"), {})  # noqa: S102 - our own documentation
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("shop.csv:4: expected 3 comma-separated fields, found 2")
    assert "'rows_read': 3, 'rows_skipped': 2, 'skipped_lines': [4, 3]" in out[1]
    assert out[2] == "{'rows': 1, 'oov': {'user': 1}, 'dense_filled': {'price': 1}}"
