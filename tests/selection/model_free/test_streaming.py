"""Streaming OutRank and quality: the same scores and report as in memory, read in chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from selection.model_free.data_quality import QualityReport, data_quality
from selection.model_free.data_quality_stream import data_quality_stream
from selection.model_free.outrank import OutRank, rank_raw
from selection.model_free.outrank_scoring import OutRankConfig, OutRankScores, score_raw
from selection.model_free.outrank_stream import ChunkSource, rank_stream, row_sample, score_stream
from tests.conftest import require_dataset

TOL = 1e-12


def _synthetic(n: int = 12_000, seed: int = 0) -> RawData:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    cols = {
        "signal": np.where(rng.random(n) < 0.3, y, rng.integers(0, 5, n)).astype(str),
        "zipf": rng.zipf(1.5, n).astype(str),
        "gappy": np.where(rng.random(n) < 0.5, "", rng.integers(0, 50, n).astype(str)),
        "const": np.array(["k"] * n, dtype=object),
        "near": np.where(rng.random(n) < 0.995, "a", "b"),
        "bag": np.array(["|".join(map(str, rng.integers(0, 9, rng.integers(0, 4)))) for _ in range(n)], dtype=object),
        "price": np.where(rng.random(n) < 0.1, np.nan, rng.normal(y, 1.0, n)),
        "few": rng.integers(0, 5, n).astype(float),
        "blank": np.full(n, np.nan),
        "impression_id": np.char.add("imp", np.arange(n).astype(str)).astype(object),
    }
    kinds = {"bag": FeatureKind.MULTI_CATEGORICAL, "price": FeatureKind.DENSE, "few": FeatureKind.DENSE,
             "blank": FeatureKind.DENSE}
    frame = pd.DataFrame({**cols, "label": y})
    frame.index = pd.RangeIndex(2, n + 2)
    schema = Schema(tuple(FeatureSpec(c, kinds.get(c, FeatureKind.CATEGORICAL)) for c in cols), label="label", name="syn")
    return RawData(frame, schema, ReadReport(source="syn.csv", rows_read=n))


def _chunks(raw: RawData, rows: int = 997) -> ChunkSource:
    def source() -> Iterator[RawData]:
        for i in range(0, len(raw.frame), rows):
            yield RawData(raw.frame.iloc[i:i + rows], raw.schema, raw.report)

    return source


def _assert_same(a: OutRankScores, b: OutRankScores) -> None:
    for name in ("features", "kinds", "constant", "all_missing", "near_constant", "rows_scored", "batches",
                 "pair_features", "cardinality"):
        assert getattr(a, name) == getattr(b, name), name
    for f in a.features:
        assert abs(a.relevance[f] - b.relevance[f]) <= TOL, f
        np.testing.assert_allclose(a.batch_relevance[f], b.batch_relevance[f], rtol=0, atol=TOL)
    assert a.controls.keys() == b.controls.keys()
    for c in a.controls:
        assert abs(a.controls[c]["score"] - b.controls[c]["score"]) <= TOL, c
        assert a.controls[c]["cardinality"] == b.controls[c]["cardinality"]
    assert abs(a.label_copy_score - b.label_copy_score) <= TOL
    assert abs(a.label_entropy - b.label_entropy) <= TOL
    for m in ("redundancy", "relation", "synergy"):
        x, y = getattr(a, m), getattr(b, m)
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=0, atol=TOL)


@pytest.mark.parametrize("config", [
    OutRankConfig(progress=False, minibatch_size=4096),  # combined: the pair matrices too
    OutRankConfig(progress=False, minibatch_size=3000, subsampling=3, max_rows=3000, null="package", pair_batches=None),
    OutRankConfig(progress=False, ranking="relevance", dense_bins=None, controls=False),
    OutRankConfig(progress=False, ranking="relevance", minibatch_size=2500, target_bins=4),
])
def test_streamed_scores_equal_in_memory_scores(config: OutRankConfig) -> None:
    raw = _synthetic()
    _assert_same(score_raw(raw, config), score_stream(_chunks(raw), config, progress=False))


def test_scores_and_quality_do_not_depend_on_the_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The column pool (recsys.parallel) only changes who computes a column: the scores, the pair
    matrices and the quality report are equal to the bit on 1 and 4 threads."""
    raw = _synthetic()
    config = OutRankConfig(progress=False, minibatch_size=4096)
    runs = []
    for threads in ("1", "4"):
        monkeypatch.setenv("SALIENCE_THREADS", threads)
        runs.append((score_stream(_chunks(raw), config, progress=False), score_raw(raw, config),
                     data_quality_stream(_chunks(raw), progress=False).to_dict()))
        runs[-1][2]["scoring"].pop("seconds")
    (one, one_memory, one_quality), (four, four_memory, four_quality) = runs
    for a, b in ((one, four), (one_memory, four_memory)):
        assert a.batch_relevance == b.batch_relevance and a.cardinality == b.cardinality and a.controls == b.controls
        for m in ("redundancy", "relation", "synergy"):
            np.testing.assert_array_equal(getattr(a, m), getattr(b, m))
    assert one_quality == four_quality


def test_batches_cross_chunk_boundaries_and_trailing_rule() -> None:
    raw = _synthetic(n=9_500)
    config = OutRankConfig(progress=False, ranking="relevance", minibatch_size=2048)  # 4 batches, 1308 trailing rows
    for rows in (997, 2048, 20_000):
        streamed = score_stream(_chunks(raw, rows), config, progress=False)
        _assert_same(score_raw(raw, config), streamed)
    assert streamed.batches == 5 and streamed.rows_scored == 9_500
    # at width the batches shrink to max_batch_bytes of parsed rows, the same in memory and streamed
    from recsys.data.streaming.chunking import parsed_row_bytes

    narrow = OutRankConfig(progress=False, ranking="relevance", max_batch_bytes=1024 * parsed_row_bytes(raw.schema))
    assert narrow.batch_rows(raw.schema) == 1024 and OutRankConfig().batch_rows(raw.schema) == 2**14
    streamed = score_stream(_chunks(raw, 997), narrow, progress=False)
    _assert_same(score_raw(raw, narrow), streamed)
    assert streamed.batches == 9


def test_edge_sample_smaller_than_the_data_bins_from_the_sample() -> None:
    raw = _synthetic()
    config = OutRankConfig(progress=False, ranking="relevance")
    exact, sampled = score_raw(raw, config), score_stream(_chunks(raw), config, edge_sample=2000, progress=False)
    assert sampled.rows_scored == exact.rows_scored
    assert abs(sampled.relevance["price"] - exact.relevance["price"]) < 0.01  # edges from 2,000 of 12,000 rows
    assert sampled.relevance["signal"] == pytest.approx(exact.relevance["signal"], abs=TOL)  # no bins: exact


def test_rank_stream_equals_rank_raw() -> None:
    raw = _synthetic()
    method = OutRank(progress=False, minibatch_size=4096)
    a, b = rank_raw(raw, method), rank_stream(_chunks(raw), method, progress=False)
    assert a.ranking == b.ranking and a.excluded == b.excluded
    assert [f.flags for f in a.features] == [f.flags for f in b.features]
    np.testing.assert_allclose([f.score for f in a.features], [f.score for f in b.features], rtol=0, atol=TOL)
    assert b.extras["streaming"]["edge_sample_complete"] and b.extras["streaming"]["rows_read"] == 12_000


def test_label_errors_are_the_in_memory_ones() -> None:
    raw = _synthetic(n=3000)
    for label in (np.linspace(0, 1, 3000), np.zeros(3000, dtype=int)):
        frame = raw.frame.assign(label=label)
        bad = RawData(frame, raw.schema, raw.report)
        with pytest.raises(ValueError) as memory:
            score_raw(bad, OutRankConfig(progress=False))
        with pytest.raises(ValueError) as streamed:
            score_stream(_chunks(bad), OutRankConfig(progress=False), progress=False)
        assert str(streamed.value) == str(memory.value)
        q = data_quality_stream(_chunks(bad), progress=False)
        assert q.scoring is None and q.scoring_error == str(memory.value) and q["signal"].cardinality == 5


def test_data_that_changes_between_the_passes_is_refused() -> None:
    raw = _synthetic(n=3000)
    calls = []

    def source() -> Iterator[RawData]:
        calls.append(1)
        yield from _chunks(raw)() if len(calls) == 1 else _chunks(RawData(raw.frame.iloc[:2000], raw.schema, raw.report))()

    with pytest.raises(DataError, match="changed between the two passes"):
        score_stream(source, OutRankConfig(progress=False), progress=False)


def _quality_dict(report: QualityReport | dict[str, Any]) -> dict[str, Any]:
    d = json.loads(json.dumps(report if isinstance(report, dict) else report.to_dict(), default=str))
    d.pop("notes")
    if d["scoring"]:
        d["scoring"].pop("seconds")
    for f in d["features"]:
        f["relevance"] = None if f["relevance"] is None else round(f["relevance"], 12)
    return d


def test_streamed_quality_equals_in_memory_quality_and_flags_identifiers() -> None:
    raw = _synthetic()
    memory = data_quality(raw)
    streamed = data_quality_stream(_chunks(raw), progress=False)
    assert _quality_dict(streamed) == _quality_dict(memory)
    ident = streamed["impression_id"]
    assert ident.identifier_like and "identifier_like" in ident.flags and ident.cardinality == 12_000
    assert not any(streamed[f].identifier_like for f in ("signal", "zipf", "gappy", "bag", "price"))
    assert memory["impression_id"].identifier_like  # the in-memory report flags it too
    unscored = data_quality_stream(_chunks(raw), score=False, progress=False)
    assert _quality_dict(unscored) == _quality_dict(data_quality(raw, score=False))


def test_sketched_quality_is_close_and_bounded() -> None:
    raw = _synthetic()
    exact = data_quality(raw, score=False)
    for report in (data_quality_stream(_chunks(raw), score=False, sketch=True, progress=False),
                   data_quality_stream(_chunks(raw), score=False, sketch_threshold=100, progress=False)):
        ident = report["impression_id"]
        assert ident.approximate and ident.rare_values is None and ident.repetitions == {}
        assert abs(ident.cardinality / 12_000 - 1) < 0.03 and ident.identifier_like
        assert report["zipf"].top_value == exact["zipf"].top_value
        assert report["zipf"].top_share <= exact["zipf"].top_share
        assert report["near"].near_constant and report["const"].constant
        assert "identifier_like" in report.format() or "impression_id" in report.format()
    threshold = data_quality_stream(_chunks(raw), score=False, sketch_threshold=100, progress=False)
    assert not threshold["signal"].approximate and threshold["signal"] == exact["signal"]


def test_row_sample_is_seeded_and_capped() -> None:
    raw = _synthetic(n=5000)
    half = row_sample(_chunks(raw), 0.5, seed=1)
    a, b = [len(c.frame) for c in half()], [len(c.frame) for c in half()]
    assert a == b and 2300 < sum(a) < 2700
    capped = row_sample(_chunks(raw), max_rows=1234)
    assert sum(len(c.frame) for c in capped()) == 1234
    with pytest.raises(ValueError, match="fraction"):
        row_sample(_chunks(raw), 1.5)


@pytest.fixture
def criteo_head(data_dir: Path) -> Path:
    return require_dataset(data_dir, "criteo-kaggle-head10k") / "train_head10k.txt.gz"


def test_criteo_head_streamed_equals_in_memory(criteo_head: Path) -> None:
    from recsys.data.readers import CriteoReader

    reader = CriteoReader(path=str(criteo_head))
    raw = reader.read()
    # the pair synergy streams like the rest (the synthetic cases above check it); here it would
    # only add minutes of 39-field pair scoring
    for config in (OutRankConfig(progress=False, interactions=False),
                   OutRankConfig(progress=False, ranking="relevance", null="package", dense_bins=None)):
        _assert_same(score_raw(raw, config), score_stream(lambda: reader.iter_chunks(997), config, progress=False))
    assert _quality_dict(data_quality_stream(lambda: reader.iter_chunks(997), progress=False)) == \
        _quality_dict(data_quality(raw))


def test_cli_quality_streams_files_like_in_memory(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    rng = np.random.default_rng(0)
    n = 3000
    y = rng.integers(0, 2, n)
    pd.DataFrame({"useful": np.where(rng.random(n) < 0.8, y, 1 - y).astype(str), "id": np.arange(n).astype(str),
                  "noise": rng.integers(0, 50, n).astype(str), "y": y}).to_csv(tmp_cwd / "d.csv", index=False)
    assert main(["quality", "d.csv", "--label", "y", "--chunk-rows", "997", "--no-progress", "--output", "s.json"]) == 0
    assert main(["quality", "d.csv", "--label", "y", "--in-memory", "--output", "m.json"]) == 0
    s, m = (json.loads((tmp_cwd / f).read_text()) for f in ("s.json", "m.json"))
    replay = s["notes"].pop("replay")  # the scoring pass read the survey's parsed copy, not the text
    assert replay["replayed"] == 1 and replay["bytes"] > 0 and replay["dropped"] is None
    assert s["notes"] == {"chunk_rows": 997} and s["flags"]["id"] == ["identifier_like"]
    assert _quality_dict(s) == _quality_dict(m)
    assert main(["quality", "d.csv", "--label", "y", "--sample", "0.5", "--sketch", "--no-progress"]) == 0
    assert "row sample" in capsys.readouterr().out
    assert main(["rank", "--method", "outrank", "d.csv", "--label", "y", "--chunk-rows", "500", "--no-progress",
                 "--output", "r.json"]) == 0
    ranked = json.loads((tmp_cwd / "r.json").read_text())
    assert ranked["features"][0]["feature"] == "useful"
    assert ranked["extras"]["streaming"]["replay"]["replayed"] == 1
    assert main(["rank", "--method", "outrank", "d.csv", "--label", "y", "--chunk-rows", "500", "--no-progress",
                 "--replay-bytes", "0", "--output", "r0.json"]) == 0  # parsed twice: the same ranking
    parsed_twice = json.loads((tmp_cwd / "r0.json").read_text())
    assert parsed_twice["extras"]["streaming"]["replay"] == {"replayed": 0, "bytes": 0, "dropped": "turned off (max_bytes=0)"}
    assert [f["score"] for f in parsed_twice["features"]] == [f["score"] for f in ranked["features"]]
    with pytest.raises(SystemExit, match="--replay-bytes must be >= 0"):
        main(["rank", "--method", "outrank", "d.csv", "--label", "y", "--replay-bytes", "-1"])
    with pytest.raises(SystemExit):
        main(["rank", "--method", "permutation", "d.csv"])


def test_exact_counts_stay_within_their_budget_at_width() -> None:
    # the budget sketches the features with the most distinct values first; the rest stay exact
    raw = _synthetic()
    exact = data_quality_stream(_chunks(raw), score=False, progress=False)
    budget = 5000
    bounded = data_quality_stream(_chunks(raw), score=False, exact_entries=budget, progress=False)
    sketched = {f.feature for f in bounded.features if f.approximate}
    assert "impression_id" in sketched and bounded.notes["sketched_for_memory"] == len(sketched)
    for f in exact.features:
        if f.feature in sketched:
            assert abs(bounded[f.feature].cardinality / max(f.cardinality, 1) - 1) < 0.05
        else:
            assert bounded[f.feature] == f
    assert {"signal", "const"} - sketched == {"signal", "const"}  # few distinct values: exact
    assert "sketched_for_memory" not in exact.notes


@pytest.mark.parametrize("kind", ["text", "arrow-text", "float-with-nan", "int"])
def test_merged_value_counts_equal_pandas_groupby(kind: str) -> None:
    from selection.model_free.data_quality_stream import _sum_by_value

    rng = np.random.default_rng(3)
    keys: Any = rng.integers(0, 300, 20_000)
    if kind == "float-with-nan":
        keys = keys.astype(float)
        keys[::7] = np.nan
    index = pd.Index(keys.astype(str), dtype="string[pyarrow]" if kind == "arrow-text" else None) if "text" in kind \
        else pd.Index(keys)
    counts = pd.Series(rng.integers(1, 50, len(index)), index=index, dtype=np.int64)
    pd.testing.assert_series_equal(_sum_by_value(counts), counts.groupby(level=0, sort=False).sum())


def test_one_bin_agrees_with_coding_every_value() -> None:
    from selection.model_free.column_codes import bin_codes
    from selection.model_free.outrank_stream import _one_bin

    rng = np.random.default_rng(5)
    edges = np.array([-1.0, 0.0, 2.5])
    cases = [np.array([]), np.full(4, np.nan), np.array([0.5, 1.0, 2.5 - 1e-9]), np.array([0.5, 2.5]),
             np.array([0.5, np.nan]), np.array([-np.inf, -5.0]), np.array([3.0, np.inf]), np.array([np.inf, np.inf])]
    cases += [rng.choice([-2.0, -1.0, 0.0, 1.0, 2.5, 9.0, np.nan, np.inf], rng.integers(1, 6)) for _ in range(300)]
    for x in cases:
        for e in (edges, None):
            assert _one_bin(x, e) == (len(np.unique(bin_codes(x, e))) <= 1), (x, e)


def test_vectors_stream_like_in_memory_on_any_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pre-computed vector beside text, multi-hot and dense columns: the streamed scores (vectors
    coded batch by batch on the column pool, multi-hot in stream order) equal the in-memory ones,
    on 1 and 3 threads."""
    raw = _synthetic(n=7_000)
    rng = np.random.default_rng(1)
    y = raw.frame["label"].to_numpy()
    emb = rng.standard_normal((len(y), 4)) + 0.8 * y[:, None]
    frame = raw.frame.assign(**{f"emb_{i}": emb[:, i] for i in range(4)})
    schema = Schema((*raw.schema.features, FeatureSpec("emb", FeatureKind.VECTOR, dim=4)), label="label", name="syn")
    raw = RawData(frame, schema, raw.report)
    config = OutRankConfig(progress=False, ranking="relevance", minibatch_size=2048)
    memory = score_raw(raw, config)
    for threads in ("1", "3"):
        monkeypatch.setenv("SALIENCE_THREADS", threads)
        _assert_same(memory, score_stream(_chunks(raw, 1_500), config, progress=False))
    assert memory.relevance["emb"] > memory.relevance["zipf"]


def test_rows_read_across_frames_as_their_concatenation() -> None:
    """The scoring pass reads the frames waiting for a batch column by column (``_Rows``): every
    column, row range and remainder equals the one of the frames concatenated."""
    from selection.model_free.outrank_stream import _Rows

    frame = _synthetic(n=1_000).frame
    cuts = [0, 1, 250, 251, 700, 1_000]
    rows = _Rows([frame.iloc[a:b] for a, b in zip(cuts, cuts[1:])])
    whole = frame.reset_index(drop=True)
    assert len(rows) == 1_000
    pd.testing.assert_series_equal(rows.column("price"), whole["price"])
    pd.testing.assert_series_equal(rows.column("bag"), whole["bag"])
    for lo, hi in ((0, 1_000), (0, 1), (1, 251), (249, 702), (700, 1_000), (999, 1_000), (300, 300)):
        pd.testing.assert_frame_equal(rows.frame(slice(lo, hi), ["zipf", "label"]),
                                      whole[["zipf", "label"]].iloc[lo:hi].reset_index(drop=True))
    for at in (0, 1, 251, 999, 1_000):
        rest = rows.after(at)
        assert sum(map(len, rest)) == 1_000 - at
        if rest:
            pd.testing.assert_frame_equal(pd.concat(rest).reset_index(drop=True), whole.iloc[at:].reset_index(drop=True))


def test_edge_sample_is_algorithm_r_whatever_the_chunks() -> None:
    """The survey's reservoir (filled in chunks, the free slots by a copy and the later rows by
    one vectorised draw) keeps what Algorithm R keeps row by row with the same generator."""
    from selection.model_free.outrank_stream import _Reservoir

    rng = np.random.default_rng(11)
    for k in (1, 5, 64, 500):
        n = 1_000
        x = rng.random(n)
        chunked = _Reservoir(k, ["x"], seed=3)
        cuts = np.unique(np.r_[0, rng.integers(0, n, 12), k, n])
        for a, b in zip(cuts, cuts[1:]):
            chunked.add(np.arange(a, b, dtype=np.int64), {"x": x[a:b]})
        draw = np.random.default_rng([3, 2])  # the reservoir's generator
        kept = list(range(min(k, n)))
        for i in range(k, n):
            j = int(draw.integers(0, i + 1))
            if j < k:
                kept[j] = i
        rows, values = chunked.restricted(None)
        assert rows.tolist() == kept
        np.testing.assert_array_equal(values["x"], x[kept])
