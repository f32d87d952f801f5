"""Streaming encoders: StreamingFit equals Preprocessor.fit, ChunkEncoder equals transform, progress lines."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import recsys.jit
from recsys.data.encoders import Preprocessor, Vocabulary
from recsys.data.progress import Progress, format_seconds
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema
from recsys.data.streaming.encoders import ChunkEncoder, StreamingFit, TokenCounts, keys_to_tokens, token_keys
from tests.recsys.data.assertions import assert_same_encoding

#: tokens that trip naive byte keys: empty, trailing NUL, embedded terminator byte, non-ASCII, long
ODD_TOKENS = ["", "a", "a\x00", "a\x00\x00", "a\x01", "\x01", "é", "e\u0301", "ß" * 40, "b", "ab", "a b"]


def _schema() -> Schema:
    return Schema(
        (
            FeatureSpec("cat", min_count=2),
            FeatureSpec("odd"),
            FeatureSpec("gone", missing_value="NA"),
            FeatureSpec("hashed", hash_size=7),
            FeatureSpec("tags", FeatureKind.MULTI_CATEGORICAL, separator="|", min_count=2),
            FeatureSpec("x", FeatureKind.DENSE, transform=DenseTransform.STANDARDIZE),
            FeatureSpec("y", FeatureKind.DENSE, missing_value=-1.0, transform=DenseTransform.LOG1P),
        ),
        label="label",
    )


def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    tags = np.array(["", "a", "a|b", "b||c", "|d", "c|c", "e|"], dtype=object)
    x = rng.normal(3.0, 2.0, n)
    x[rng.random(n) < 0.1] = np.nan
    x[rng.random(n) < 0.02] = np.inf
    frame = pd.DataFrame(
        {
            # few values with many equal counts: the frequency-tie order and min_count both matter
            "cat": pd.Series([f"v{i}" for i in rng.integers(0, 12, n)], dtype="str"),
            "odd": pd.Series(rng.choice(np.array(ODD_TOKENS, dtype=object), n), dtype="str"),
            "gone": pd.Series(rng.choice(np.array(["NA", "p", "q", ""], dtype=object), n), dtype="str"),
            "hashed": pd.Series([f"h{i}" for i in rng.integers(0, 40, n)], dtype="str"),
            "tags": pd.Series(rng.choice(tags, n), dtype="str"),
            "x": x,
            "y": np.where(rng.random(n) < 0.1, -1.0, rng.integers(0, 50, n).astype(float)),
            "label": rng.integers(0, 2, n).astype(np.int8),
        }
    )
    frame.index = pd.RangeIndex(1, n + 1)
    return frame


def _chunks(frame: pd.DataFrame, size: int) -> list[pd.DataFrame]:
    return [frame.iloc[i : i + size] for i in range(0, len(frame), size)]


@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
def test_streaming_fit_equals_fit(size: int) -> None:
    frame = _frame(600, seed=1)
    ref = Preprocessor(_schema()).fit(frame)
    fit = StreamingFit(_schema())
    for part in _chunks(frame, size):
        fit.update(part)
    got = fit.result().state_dict()
    want = ref.state_dict()
    assert got["vocabularies"] == want["vocabularies"]  # tokens, counts, order and min_count cut
    assert got["schema"] == want["schema"]
    if size >= len(frame):  # one chunk: the very same float operations
        assert got["dense_stats"] == want["dense_stats"]
    for k, v in want["dense_stats"].items():
        np.testing.assert_allclose(got["dense_stats"][k], v, rtol=1e-12)
    assert "hashed" not in got["vocabularies"] and len(got["vocabularies"]["cat"]["tokens"]) == 12


def test_streaming_fit_counts_only_the_given_rows() -> None:
    frame = _frame(300, seed=2)
    rows = np.flatnonzero(np.random.default_rng(0).random(300) < 0.6)
    fit = StreamingFit(_schema())
    for start in range(0, 300, 50):
        part = rows[(rows >= start) & (rows < start + 50)] - start
        fit.update(frame.iloc[start : start + 50], part)
    assert fit.result().state_dict()["vocabularies"] == Preprocessor(_schema()).fit(frame.iloc[rows]).state_dict()["vocabularies"]
    assert fit.rows == len(rows)


def test_token_keys_round_trip_and_distinct() -> None:
    arr = pa.array(ODD_TOKENS, type=pa.string())
    keys, fits = token_keys(arr)
    assert fits.all() and len(set(keys.tolist())) == len(ODD_TOKENS)  # "a" and "a\x00" stay apart
    assert list(keys_to_tokens(keys)) == ODD_TOKENS
    short, fits = token_keys(arr, width=3)  # tokens of 3+ bytes do not fit
    assert list(fits) == [len(t.encode()) < 3 for t in ODD_TOKENS]
    sliced, _ = token_keys(arr.slice(3, 4))
    assert list(keys_to_tokens(sliced)) == ODD_TOKENS[3:7]


@pytest.mark.skipif(not recsys.jit.available(), reason="numba is a dependency; this checks its key kernel")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab\x00\x01\u00e9z", max_size=9), min_size=1, max_size=40),
       st.sampled_from([None, 1, 2, 5, 12]), st.integers(0, 3))
def test_compiled_token_keys_equal_the_numpy_ones(tokens: list[str], width: int | None, skip: int) -> None:
    """The compiled key fill writes the reference's keys and ``fits`` to the byte, for any width
    (truncated tokens), NUL and terminator bytes, empty tokens and a sliced array."""
    arr = pa.array(tokens, type=pa.large_string() if skip % 2 else pa.string()).slice(min(skip, len(tokens) - 1))
    with recsys.jit.use("numpy"):
        want, want_fits = token_keys(arr, width)
    with recsys.jit.use("numba"):
        got, got_fits = token_keys(arr, width)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(got_fits, want_fits)


def test_token_counts_merge_many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffered merges of sorted keys (forced to flush every chunk) count exactly like one fit."""
    monkeypatch.setattr(TokenCounts, "flush_rows", 5)
    rng = np.random.default_rng(3)
    tokens = np.array([f"t{int(z)}" for z in rng.zipf(1.3, 5000) % 997] + ODD_TOKENS * 3, dtype=object)
    rng.shuffle(tokens)
    counts = TokenCounts()
    for i in range(0, len(tokens), 37):
        counts.add(pa.array(tokens[i : i + 37].tolist(), type=pa.string()))
    for min_count in (1, 3):
        assert counts.vocabulary(min_count) == Vocabulary.fit(tokens, min_count)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="ab\x00\x01\u00e9", max_size=5), st.integers(1, 2**40)), max_size=60))
def test_sum_by_key_equals_a_counter(pairs: list[tuple[str, int]]) -> None:
    """Counts summed per key equal a plain Counter's, in order of first appearance (as a Counter
    keeps them), for tokens that differ by NUL bytes; the compiled path's arrays equal the
    reference's to the byte."""
    from collections import Counter

    from recsys.data.streaming.encoders import sum_by_key

    want: Counter[str] = Counter()
    for t, c in pairs:
        want[t] += c
    keys, _ = token_keys(pa.array([t for t, _ in pairs], type=pa.string()))
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    paths = ["numpy", "numba"] if recsys.jit.available() else ["numpy"]
    got = {}
    for path in paths:
        with recsys.jit.use(path):  # type: ignore[arg-type]
            got[path] = sum_by_key(keys, counts)
        got_keys, total = got[path]
        assert total.dtype == np.int64 and got_keys.dtype == keys.dtype
        assert list(zip(keys_to_tokens(got_keys), total.tolist())) == list(want.items())
    for a, b in zip(got["numpy"], got[paths[-1]]):
        np.testing.assert_array_equal(a, b)


def test_chunk_encoder_equals_transform() -> None:
    train, other = _frame(500, seed=4), _frame(200, seed=5)  # other holds unseen tokens -> OOV
    other.loc[other.index[:5], "cat"] = "never-seen"
    pre = Preprocessor(_schema()).fit(train)
    enc = ChunkEncoder(pre)
    for frame in (train, other):
        assert_same_encoding(enc.transform(frame), pre.transform(frame))
    parts = {"a": np.arange(0, 200, 3), "b": np.array([1, 5, 199])}
    got = enc.encode(other, parts)
    for name, rows in parts.items():
        assert_same_encoding(got[name], pre.transform(other.iloc[rows]))
    assert got["a"].stats.oov["cat"] == pre.transform(other.iloc[parts["a"]]).stats.oov["cat"] > 0


def test_chunk_encoder_object_columns_and_empty_vocabulary() -> None:
    """Columns that are not Arrow strings (object, int) take the generic path with the same result."""
    schema = Schema((FeatureSpec("u", min_count=50), FeatureSpec("n")), label="label")
    frame = pd.DataFrame({"u": np.array(["a", None, "b"], dtype=object), "n": [1, 2, 2], "label": [0, 1, 0]})
    pre = Preprocessor(schema).fit(frame)
    assert len(pre.vocabularies["u"]) == 0  # everything below min_count: all OOV
    assert_same_encoding(ChunkEncoder(pre).transform(frame), pre.transform(frame))
    fit = StreamingFit(schema)
    fit.update(frame)
    assert fit.result().state_dict() == pre.state_dict()


def test_vocabulary_index_is_built_once() -> None:
    vocab = Vocabulary.fit(np.array(["a", "b", "b"], dtype=object))
    first = vocab.index
    assert vocab.index is first and list(vocab.encode(np.array(["b", "z"], dtype=object))) == [1, 0]


def test_progress_logs_rate_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="recsys.data.progress")
    with Progress("pass", total=1000, interval=0.0, terminal=False) as bar:
        bar.update(250)
        bar.update(250)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("pass: 250 rows, ") and "rows/s" in lines[0] and "25%" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("pass: 500 rows in ")
    bar = Progress("bytes", enabled=False)
    bar.update(10, fraction=0.25)
    assert bar.eta() is not None and bar.line().endswith(tuple("0123456789s"))
    assert [format_seconds(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]


@pytest.mark.skipif(not recsys.jit.available(), reason="numba is a dependency; this checks its look-up kernel")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab\x00\u00e9z", max_size=6), max_size=40, unique=True),
       st.lists(st.text(alphabet="ab\x00\u00e9zq", max_size=9), max_size=40))
def test_hash_lookup_equals_the_binary_search(vocab_tokens: list[str], queries: list[str]) -> None:
    """Vocabulary ids by hash equal the binary search's, for chunk keys of any width (longer and
    shorter than the vocabulary's), tokens with NUL bytes, unseen tokens (OOV) and an empty vocabulary."""
    from recsys.data.streaming.encoders import _Lookup

    with recsys.jit.use("numba"):
        lookup = _Lookup(Vocabulary.fit(np.array(vocab_tokens, dtype=object)))
    assert lookup.table is not None
    for width in (None, 2, 12):
        keys, fits = token_keys(pa.array(queries + ODD_TOKENS, type=pa.string()), width)
        if width is not None:
            keys = keys[fits]  # chunk keys always hold the whole token
        np.testing.assert_array_equal(lookup.map_keys(keys), lookup.search_keys(keys))
    known = token_keys(pa.array(vocab_tokens, type=pa.string()))[0]
    assert (lookup.map_keys(known) > 0).all() if vocab_tokens else len(lookup.map_keys(known)) == 0


def test_spill_folder_writes_in_the_background_in_order_and_raises_a_failed_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks saved on the writer's thread come back in order; a failed save is raised to the
    caller (by the next write, settle or read), and close removes the folder."""
    from recsys.data.streaming.spill import SpilledChunk, SpillFolder

    def chunk(i: int) -> SpilledChunk:
        return SpilledChunk(np.zeros(3, np.int8), np.full(3, i, np.float32), {}, {}, {}, {}, {})

    with SpillFolder(tmp_path / "ok") as spill:
        for i in range(5):
            spill.write(chunk(i))
        assert [float(c.labels[0]) for c in spill] == [0, 1, 2, 3, 4]
    assert not (tmp_path / "ok").exists()

    saved, calls = SpilledChunk.save, []

    def fails_on_the_second(self: SpilledChunk, path: Path) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        saved(self, path)

    monkeypatch.setattr(SpilledChunk, "save", fails_on_the_second)
    with SpillFolder(tmp_path / "full") as spill:
        spill.write(chunk(0))
        spill.write(chunk(1))
        with pytest.raises(OSError, match="No space left"):
            spill.settle()
    assert not (tmp_path / "full").exists()


def test_spilled_chunks_come_back_as_written(tmp_path: Path) -> None:
    """The spill's raw format: every group, dtype and shape back (byte keys, N x D vectors, empty arrays)."""
    from recsys.data.streaming.spill import SpilledChunk, chunk_path

    rng = np.random.default_rng(0)
    chunk = SpilledChunk(
        codes=np.array([0, 1, 2, 0], dtype=np.int8), labels=rng.random(4).astype(np.float32),
        dense={"price": np.array([1.5, np.nan, 0.0, -2.0]), "vec": rng.random((4, 3))},
        indices={"cat": np.array([0, 1, 0, 2], dtype=np.int32), "none": np.zeros(0, dtype=np.int32)},
        keys={"cat": token_keys(pa.array(["a", "a\x00", "é"]))[0], "none": np.zeros(0, dtype="S1")},
        ids={"hashed": np.array([5, 9, 5, 1], dtype=np.int64)},
        lengths={"cat": np.ones(4, np.int32), "none": np.zeros(4, np.int32), "hashed": np.ones(4, np.int32)},
    )
    chunk.save(chunk_path(tmp_path, 3))
    back = SpilledChunk.load(chunk_path(tmp_path, 3))
    for name in ("codes", "labels"):
        np.testing.assert_array_equal(getattr(back, name), getattr(chunk, name))
        assert getattr(back, name).dtype == getattr(chunk, name).dtype
    for group in ("dense", "indices", "keys", "ids", "lengths"):
        want, got = getattr(chunk, group), getattr(back, group)
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
            np.testing.assert_array_equal(got[k], want[k])
