"""Readers streamed in chunks: the same rows as read(), errors and skips named by file and line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys.data.raw import DataError, RawData
from recsys.data.readers import CriteoReader, TabularReader, blocks, text_scan
from recsys.data.readers.blocks import LineBlocks, pool
from recsys.data.schema import SchemaError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TINY_SCHEMA = FIXTURES / "tiny_tabular_schema.yaml"


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of about ``rows`` lines even for tiny files, so block boundaries are exercised; every
    block counted by the compiled kernel (the whole-file tests of ``test_readers`` use the
    ``bytes`` methods)."""
    monkeypatch.setattr(blocks, "MIN_BLOCK", 1)
    monkeypatch.setattr(text_scan, "COMPILED_BYTES", 0)


def criteo_lines(n: int, seed: int = 0, cardinality: int = 40) -> list[str]:
    """Criteo-shaped lines: label, 13 integers (some empty), 26 hex ids (some empty)."""
    rng = np.random.default_rng(seed)
    ints = rng.integers(-2, 500, (n, 13)).astype(str).astype(object)
    ints[rng.random((n, 13)) < 0.2] = ""
    ids = rng.integers(0, cardinality, (n, 26))
    cats = np.char.mod("%08x", ids * 2654435761 % (1 << 32)).astype(object)
    cats[rng.random((n, 26)) < 0.05] = ""
    labels = rng.integers(0, 2, n).astype(str)
    return ["\t".join([labels[i], *ints[i], *cats[i]]) for i in range(n)]


def _write(path: Path, lines: list[str], gz: bool = False, end: str = "\n") -> Path:
    data = "".join(x + end for x in lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _pooled(chunks: list[RawData]) -> RawData:
    assert all(len(c) for c in chunks)
    return pool(chunks)


@pytest.mark.parametrize(("rows", "n"), [(1, 80), (13, 600), (250, 1200), (100_000, 1200)])
def test_criteo_chunks_equal_read(tmp_path: Path, rows: int, n: int) -> None:
    path = _write(tmp_path / "t.txt", criteo_lines(n))
    reader = CriteoReader(str(path))
    whole = reader.read()
    chunks = list(reader.iter_chunks(rows))
    assert len(chunks) >= n // (2 * rows + 2)  # bounded chunks of about `rows` rows, not one block
    pd.testing.assert_frame_equal(_pooled(chunks).frame, whole.frame)
    assert chunks[-1].report.rows_read == n and chunks[-1].report.lines == n


def test_criteo_errors_and_skips_name_the_line_in_a_late_block(tmp_path: Path) -> None:
    lines = criteo_lines(900)
    lines[700] = lines[700].rsplit("\t", 1)[0]  # line 701 loses a field
    lines[850] = "\t".join(["1", "x1", *lines[850].split("\t")[2:]])  # line 851: I1 not an integer
    lines.insert(500, "")  # a blank line 501 (later lines shift by one)
    path = _write(tmp_path / "t.txt", lines)
    with pytest.raises(DataError, match=r"t\.txt:501: empty line \(1 bad row\(s\) in this block"):
        list(CriteoReader(str(path)).iter_chunks(50))
    chunks = list(CriteoReader(str(path), skip_bad_rows=True).iter_chunks(50))
    report = chunks[-1].report
    assert report.skipped_lines == [501, 702, 852] and report.rows_skipped == 3 and report.rows_read == 898
    whole = CriteoReader(str(path), skip_bad_rows=True).read()
    pd.testing.assert_frame_equal(_pooled(chunks).frame, whole.frame)
    assert whole.report.skipped_lines == [501, 702, 852]


def test_mixed_gzip_and_plain_files(tmp_path: Path) -> None:
    lines = criteo_lines(600, seed=1)
    a = _write(tmp_path / "day_0", lines[:250], gz=True)  # gzip without a .gz name
    b = _write(tmp_path / "day_1.txt", lines[250:])
    reader = CriteoReader([str(a), str(b)], skip_bad_rows=True)
    chunks = list(reader.iter_chunks(40))
    assert {c.report.source for c in chunks} == {str(a), str(b)}
    assert [c.frame.index[0] for c in chunks if c.report.source == str(b)][0] == 1  # each file its own lines
    whole = reader.read()
    assert list(whole.frame.index[[0, 249, 250, -1]]) == [1, 250, 251, 600]  # pooled as Frappe does
    assert [f["file"] for f in whole.report.notes["files"]] == [str(a), str(b)]
    single = CriteoReader(str(_write(tmp_path / "all.txt", lines))).read()
    pd.testing.assert_frame_equal(whole.frame, single.frame)
    bad = lines[250:]
    bad[9] = "2" + bad[9][1:]
    _write(b, bad)
    with pytest.raises(DataError, match=r"day_1\.txt:10: label '2'"):
        list(CriteoReader([str(a), str(b)]).iter_chunks(40))


def test_truncated_gzip_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.gz"
    path.write_bytes(gzip.compress("\n".join(criteo_lines(3000)).encode())[:-5000])
    with pytest.raises(DataError, match=r"t\.gz: not a readable gzip file"):
        list(CriteoReader(str(path)).iter_chunks(100))


def test_empty_and_all_bad_files_in_chunks(tmp_path: Path) -> None:
    path = _write(tmp_path / "e.txt", ["", "", ""])
    with pytest.raises(DataError, match=r"e\.txt: the file is empty"):
        list(CriteoReader(str(path)).iter_chunks(1))
    path = _write(tmp_path / "b.txt", ["1\t2"] * 300)
    with pytest.raises(DataError, match=r"b\.txt: no data rows \(300 bad row\(s\) skipped\)"):
        list(CriteoReader(str(path), skip_bad_rows=True).iter_chunks(10))


def test_criteo_nrows_in_chunks(tmp_path: Path) -> None:
    lines = criteo_lines(500)
    lines[400] = "junk"  # beyond nrows: never read
    path = _write(tmp_path / "t.txt", lines)
    chunks = list(CriteoReader(str(path), nrows=333).iter_chunks(20))
    assert sum(len(c) for c in chunks) == 333 and chunks[-1].frame.index[-1] == 333


def test_columns_option_names_missing_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.txt", criteo_lines(5))
    with pytest.raises(SchemaError, match=r"\['day'\] are not in the data"):
        list(CriteoReader(str(path)).iter_chunks(10, columns=["day"]))


def _quoted_csv(path: Path, n: int) -> Path:
    """A CSV whose quoted fields hold separators, doubled quotes and line breaks."""
    rows = ["user,item,tags,price,score,clicked,comment"]
    for i in range(n):
        user = f'"u{i % 7}\n{i % 3}"' if i % 5 == 0 else f"u{i % 7}"
        comment = '"say ""hi"", ok"' if i % 3 == 0 else "plain"
        rows.append(f"{user},i{i % 11},a|b,{i * 0.5},{i % 4},{i % 2},{comment}")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("rows", [2, 9, 64])
def test_tabular_quoted_records_across_blocks(tmp_path: Path, rows: int) -> None:
    path = _quoted_csv(tmp_path / "q.csv", 400)
    reader = TabularReader(str(path), str(TINY_SCHEMA))
    whole = reader.read()
    chunks = list(reader.iter_chunks(rows))
    assert len(chunks) > 3
    pd.testing.assert_frame_equal(_pooled(chunks).frame, whole.frame)
    assert whole.frame.loc[2, "user"] == "u0\n0" and len(whole) == 400


def test_tabular_unclosed_quote_and_late_bad_row(tmp_path: Path) -> None:
    path = _quoted_csv(tmp_path / "q.csv", 300)
    text = path.read_text()
    path.write_text(text + 'u1,i1,a,1,2,1,"never closed\nmore\n')
    with pytest.raises(DataError, match=r"q\.csv:\d+: a quoted field is not closed"):
        list(TabularReader(str(path), str(TINY_SCHEMA)).iter_chunks(16))
    lines = _quoted_csv(tmp_path / "r.csv", 300).read_text().split("\n")
    lines[330] = lines[330].replace(",plain", ",plain,extra")  # a late record with 8 fields
    path.write_text("\n".join(lines))
    n_line = 331
    with pytest.raises(DataError, match=rf"q\.csv:{n_line}: expected 7 comma-separated fields, found 8"):
        list(TabularReader(str(path), str(TINY_SCHEMA)).iter_chunks(16))


def test_tabular_files_with_own_headers_and_time_column(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.tsv.gz"
    a.write_text("clicked,user,item,tags,price,score,day\n1,u1,i1,a,1,2,1\n0,u2,i2,,3,4,1\n")
    b.write_bytes(gzip.compress(b"day\tuser\titem\ttags\tprice\tscore\tclicked\n2\tu3\ti3\tb\t5\t6\t0\n"))
    reader = TabularReader([str(a), str(b)], str(TINY_SCHEMA))
    chunks = list(reader.iter_chunks(1, columns=["day"]))
    assert [d for c in chunks for d in c.frame["day"]] == ["1", "1", "2"]
    assert [c.report.source for c in chunks][-1] == str(b) and chunks[-1].frame.index[-1] == 2
    assert "day" not in reader.read().frame.columns and len(reader.read()) == 3
    with pytest.raises(SchemaError, match=r"\['hour'\]"):
        list(reader.iter_chunks(1, columns=["hour"]))


def test_parquet_batches(tmp_path: Path) -> None:
    n = 250
    score = [str(i) for i in range(n)]
    score[201] = "x"  # row 202 (1-based) is bad
    table = pa.table(
        {"user": [f"u{i % 9}" for i in range(n)], "item": list(range(n)), "tags": [["a", "b"]] * n,
         "price": [float(i) for i in range(n)], "score": score, "clicked": [i % 2 for i in range(n)]}
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path, row_group_size=64)
    with pytest.raises(DataError, match=r"d\.parquet: row 202: column 'score'"):
        list(TabularReader(str(path), str(TINY_SCHEMA)).iter_chunks(30))
    reader = TabularReader(str(path), str(TINY_SCHEMA), skip_bad_rows=True)
    chunks = list(reader.iter_chunks(30))
    assert max(len(c) for c in chunks) <= 30 and chunks[-1].report.skipped_lines == [202]
    pd.testing.assert_frame_equal(_pooled(chunks).frame, reader.read().frame)


def test_line_blocks_give_back_and_long_lines(tmp_path: Path) -> None:
    path = tmp_path / "l.txt"
    path.write_bytes(b"short\n" + b"x" * 20_000 + b"\nend")  # a line far longer than a block; no final newline
    blocks = list(LineBlocks(path, rows=1))
    assert b"".join(b for b, _, _ in blocks) == path.read_bytes()
    assert [first for _, first, _ in blocks] == [1, 2, 3] and blocks[-1][2]
    # each block's text counts ride along for the parser (one pass over the block, not two)
    reader = LineBlocks(path, rows=1)
    for block, _, _ in reader:
        assert reader.counts == text_scan.text_counts(bytes(block))
    for max_lines in (1, 2):  # the block cut at max_lines is counted as cut
        reader = LineBlocks(path, rows=1, max_lines=max_lines)
        for block, _, _ in reader:
            assert reader.counts == text_scan.text_counts(bytes(block))


@pytest.mark.parametrize("kernels", ["numba", "numpy"])
def test_text_counts_equal_the_bytes_methods(kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass counts of a block (compiled, or the ``bytes`` methods) on blocks of line ends,
    lone and paired carriage returns and non-ASCII bytes, at every length from 0."""
    import recsys.jit

    monkeypatch.setattr(text_scan, "COMPILED_BYTES", 0)
    rng = np.random.default_rng(5)
    alphabet = np.frombuffer(b"a\t\n\r\xc3\xa9\x00\x7f\x80", dtype=np.uint8)
    blocks_ = [b"", b"\n", b"\r", b"\r\n", b"\n\r", b"\r\r\n", b"\xff"]
    blocks_ += [alphabet[rng.integers(0, len(alphabet), n)].tobytes() for n in rng.integers(1, 3000, 60)]
    with recsys.jit.use(kernels):  # type: ignore[arg-type]
        for b in blocks_:
            for block in (b, bytearray(b)):
                got = text_scan.text_counts(block)
                assert got == (b.count(b"\n"), b.count(b"\r"), b.count(b"\r\n"), b.isascii()), b


@pytest.mark.parametrize("end", ["\n", ""])
def test_byte_spans_hold_every_line_once_and_read_as_the_file(tmp_path: Path, end: str) -> None:
    """Spans of every size (smaller than a line too) start at line starts, cover the file, and
    their readers, numbered from the counted lines, give the file's rows and line numbers."""
    from recsys.data.readers.spans import byte_spans, count_lines

    lines = criteo_lines(120, seed=9)
    lines[40] = "1\tshort"  # a bad line inside, skipped and named by its line in the file
    path = tmp_path / "t.txt"
    path.write_text("\n".join(lines) + end)
    reader = CriteoReader(str(path), skip_bad_rows=True)
    whole = reader.read().frame
    lines_seen = reader.read_reports()[0].lines  # line ends (120, or 119 without the last one)
    data = path.read_bytes()
    for size in (1, 50, 997, 4096, len(data) - 1, len(data)):
        cuts = byte_spans(path, size)
        assert cuts[0][0] == 0 and cuts[-1][1] == len(data)
        assert all(b == c for (_, b), (c, _) in zip(cuts, cuts[1:]))
        assert all(a == 0 or data[a - 1:a] == b"\n" for a, _ in cuts)
        counts = [count_lines(path, a, b) for a, b in cuts]
        assert sum(counts) == len(lines)
        first = 1 + np.cumsum([0, *counts[:-1]])
        frames, reports = [], []
        for (a, b), f in zip(cuts, first):
            span = reader.with_span(a, b, int(f))
            frames += [c.frame for c in span.iter_chunks(7)]
            reports += span.read_reports()  # a span of only the bad line yields no chunk
        pd.testing.assert_frame_equal(pd.concat(frames), whole)
        (report,) = blocks.join_spans(reports)
        assert (report.skipped_lines, report.rows_read, report.lines) == ([41], 119, lines_seen)
    gz = _write(tmp_path / "t.txt.gz", lines, gz=True)
    assert byte_spans(gz, 10) == [(0, gz.stat().st_size)]  # a gzip file is not cut
    with pytest.raises(ValueError, match="gzip"):
        list(CriteoReader(str(gz)).with_span(0, 10, 1).iter_chunks(5))
    with pytest.raises(ValueError, match="cannot read a byte span"):
        TabularReader(str(path), str(TINY_SCHEMA)).with_span(0, 10, 1)
