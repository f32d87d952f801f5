"""The data-quality report of raw data read in chunks (``salience quality FILE...``).

:func:`data_quality_stream` gives the :class:`~selection.model_free.data_quality.QualityReport` that
:func:`~selection.model_free.data_quality.data_quality` gives for the same rows, reading them through a chunk
source (see :mod:`selection.model_free.outrank_stream`) in two passes: the profile of every feature is
counted in the first pass (OutRank's survey), the scores in the second::

    source = raw_chunk_source("train.txt", rows=262_144)
    report = data_quality_stream(source)                      # exact, = data_quality(read_raw_file(...))
    report = data_quality_stream(source, sketch=True)         # bounded per feature (HyperLogLog, Misra-Gries)

Memory: one chunk, OutRank's edge sample, and per feature its value counts. Exact counts keep
one entry per distinct value (a Criteo field with 10^7 ids holds 10^7 of them: the only state
that grows with the data). ``sketch=True`` or a feature passing ``sketch_threshold`` distinct
values switches that feature to a fixed-size summary: a HyperLogLog of 2^14 registers for the
cardinality (~1% error) and the ``TOP_K`` heaviest values (Misra-Gries) for the top value,
with rare values and repetitions left out (``FeatureQuality.approximate``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from recsys.data.raw import DataError, RawData
from recsys.data.schema import FeatureSpec, Schema
from recsys.data.streaming.replay import ChunkReplay
from recsys.parallel import map_ordered
from selection.model_free.column_codes import feature_cells
from selection.model_free.data_quality import FeatureQuality, QualityReport, count_values, quality_row, with_scores
from selection.model_free.outrank import OutRank
from selection.model_free.outrank_scoring import OutRankConfig, Ranking
from selection.model_free.outrank_stream import DEFAULT_EDGE_SAMPLE, ChunkSource, score_stream, survey_chunks
from selection.model_free.sketch import HyperLogLog, MisraGries

__all__ = ["EXACT_COUNT_ENTRIES", "TOP_K", "FeatureProfile", "data_quality_stream"]

#: heavy-hitter counters of a sketched feature
TOP_K = 1024
#: pending chunk counts are merged once they hold this many entries (or the merged counts' size)
_MERGE_MIN = 1 << 16
#: exact value counts held over all features at once (merged and pending entries; 16 bytes each
#: for numbers, ~100 for string ids, more while pandas merges them: about 1 GB): past it the
#: features with the most distinct values switch to sketches, largest first, until half of it is
#: left. Memory then stays bounded at any width: at most this many exact entries plus one sketch
#: per feature (16 KiB of HyperLogLog registers and TOP_K heavy-hitter counters).
EXACT_COUNT_ENTRIES = 1 << 23


def _sum_by_value(counts: pd.Series) -> pd.Series:
    """``counts.groupby(level=0, sort=False).sum()`` (values in order of first appearance, NaN
    values dropped) by one factorisation of the index: pandas' groupby first builds a hash table
    of the whole index to look for a column named like it, which cost as much as the sum."""
    codes, values = pd.factorize(counts.index, sort=False)
    keep = codes >= 0
    sums = np.bincount(codes[keep], weights=counts.to_numpy(dtype=np.float64)[keep], minlength=len(values))
    return pd.Series(sums.astype(np.int64), index=values, dtype=np.int64)  # exact below 2**53 rows


class FeatureProfile:
    """One feature's quality counts, chunk by chunk.

    Args:
        spec: the feature.
        sketch: summarise with sketches from the start.
        sketch_threshold: switch to sketches once this many distinct values were counted
            (None: stay exact).
        seed: hash seed of the HyperLogLog.
    """

    def __init__(self, spec: FeatureSpec, sketch: bool = False, sketch_threshold: int | None = None, seed: int = 0) -> None:
        self.spec = spec
        self.rows = 0
        self.missing = 0
        self.threshold = sketch_threshold
        self.seed = seed
        self.merged: pd.Series | None = None
        self.pending: list[pd.Series] = []
        self.pending_size = 0
        self.hll: HyperLogLog | None = None
        self.top: MisraGries | None = None
        if sketch:
            self._to_sketch()

    def add(self, values: pd.Series) -> None:
        """Count one chunk's cells."""
        missing, counts = count_values(values, self.spec, sort=False)
        self.rows += len(values)
        self.missing += int(missing.sum())
        if self.hll is not None and self.top is not None:
            self.hll.add(counts.index.to_numpy())
            self.top.add_counts(counts)
            return
        self.pending.append(counts)
        self.pending_size += len(counts)
        if self.pending_size > max(_MERGE_MIN, 0 if self.merged is None else len(self.merged)):
            self._merge()

    @property
    def entries(self) -> int:
        """Exact value-count entries held (0 once sketched)."""
        return 0 if self.hll is not None else self.pending_size + (0 if self.merged is None else len(self.merged))

    def sketch_now(self) -> None:
        """Switch to sketches with every value counted so far."""
        if self.hll is None:
            self._merge()
        if self.hll is None:
            self._to_sketch()

    def _merge(self) -> None:
        parts = ([] if self.merged is None else [self.merged]) + self.pending
        if parts:
            self.merged = _sum_by_value(pd.concat(parts)) if len(parts) > 1 else parts[0]
        self.pending, self.pending_size = [], 0
        if self.threshold is not None and self.merged is not None and len(self.merged) > self.threshold:
            self._to_sketch()

    def _to_sketch(self) -> None:
        self.hll, self.top = HyperLogLog(seed=self.seed), MisraGries(TOP_K)
        if self.merged is not None:  # a sketch of the values counted so far: the same as if fed from the start
            self.hll.add(self.merged.index.to_numpy())
            self.top.add_counts(self.merged)
        self.merged, self.pending, self.pending_size = None, [], 0

    def result(self) -> FeatureQuality:
        if self.hll is None:
            self._merge()  # (may pass the threshold)
        if self.hll is not None and self.top is not None:
            return quality_row(self.spec, self.rows, self.missing, None, cardinality=round(self.hll.count()),
                               top=self.top.top())
        counts = self.merged if self.merged is not None else pd.Series(dtype=np.int64)
        return quality_row(self.spec, self.rows, self.missing, counts.sort_values(ascending=False, kind="stable"))


def _add_cells(profile: FeatureProfile, frame: pd.DataFrame) -> None:
    """Count one feature's cells of ``frame`` (taken here, so a pool thread holds one feature's
    cells at a time: a vector's row keys are built per task)."""
    profile.add(feature_cells(frame, profile.spec))


class _Profile:
    """Every feature's :class:`FeatureProfile` and the label counts."""

    def __init__(self, sketch: bool, sketch_threshold: int | None, seed: int, budget: int = EXACT_COUNT_ENTRIES) -> None:
        self.options = (sketch, sketch_threshold, seed)
        self.budget = budget
        self.schema: Schema | None = None
        self.source = ""
        self.features: list[FeatureProfile] = []
        self.labels: pd.Series | None = None
        self.rows = 0
        self.sketched_for_memory: list[str] = []

    def add(self, chunk: RawData) -> None:
        if self.schema is None:
            self.schema, self.source = chunk.schema, chunk.report.source
            self.features = [FeatureProfile(s, *self.options) for s in chunk.schema.features]
        map_ordered(partial(_add_cells, frame=chunk.frame), self.features)  # each task touches its own profile
        counts = chunk.frame[chunk.schema.label].value_counts(dropna=False)
        self.labels = counts if self.labels is None else self.labels.add(counts, fill_value=0)
        self.rows += len(chunk.frame)
        self._within_budget()

    def _within_budget(self) -> None:
        """Sketch the features with the most exact entries while all of them pass the budget."""
        held = sum(p.entries for p in self.features)
        if held <= self.budget:
            return
        for p in sorted(self.features, key=lambda p: -p.entries):  # stable: feature order breaks ties
            if held <= self.budget // 2 or not p.entries:
                break
            held -= p.entries
            p.sketch_now()
            self.sketched_for_memory.append(p.spec.name)


def data_quality_stream(
    source: ChunkSource,
    outrank: OutRankConfig | None = None,
    *,
    score: bool = True,
    sketch: bool = False,
    sketch_threshold: int | None = None,
    exact_entries: int = EXACT_COUNT_ENTRIES,
    edge_sample: int = DEFAULT_EDGE_SAMPLE,
    progress: bool = True,
    notes: dict[str, Any] | None = None,
    replay_bytes: int | None = None,
) -> QualityReport:
    """:func:`~selection.model_free.data_quality.data_quality` of the rows of ``source``, read in chunks.

    Args:
        source: the chunk source (read twice when scoring, else once).
        outrank: OutRank settings of the scoring (default ``OutRank(ranking="relevance")``,
            pair matrices never computed).
        score: run the OutRank scoring at all.
        sketch: count every feature with sketches (bounded memory, approximate counts).
        sketch_threshold: sketch a feature once it has this many distinct values.
        exact_entries: exact value counts held over all features at once; past it the features
            with the most distinct values are sketched (:data:`EXACT_COUNT_ENTRIES`: memory stays
            bounded at any width; ``notes["sketched_for_memory"]`` counts them).
        edge_sample: rows of the sample OutRank's dense bin edges come from.
        progress: show rows and rows/s of each pass.
        notes: recorded in ``report.notes`` (how the data was read).
        replay_bytes: the most bytes of the first pass's parsed copy, which the scoring pass
            reads instead of parsing again (:class:`~recsys.data.streaming.replay.ChunkReplay`;
            None: half the free temporary disk space, at most 16 GiB; 0: parse twice).
    """
    profile = _Profile(sketch, sketch_threshold, 0, exact_entries)
    method = outrank or OutRank(ranking=Ranking.RELEVANCE, progress=False)
    with ChunkReplay(source, replay_bytes if score else 0) as replay:
        return _quality(replay, profile, method, score, edge_sample, progress, notes)


def _quality(replay: ChunkReplay, profile: _Profile, method: OutRankConfig, score: bool, edge_sample: int,
             progress: bool, notes: dict[str, Any] | None) -> QualityReport:
    source = replay.origin
    survey = None
    if score:
        survey = survey_chunks(replay, method, edge_sample=edge_sample, on_chunk=profile.add, progress=progress)
    else:
        from recsys.data.progress import Progress

        with Progress("quality: profiling", enabled=progress) as bar:
            for chunk in source():
                profile.add(chunk)
                bar.update(len(chunk.frame))
    if profile.schema is None or profile.labels is None:
        raise DataError("no data rows")
    rows = [p.result() for p in profile.features]
    profile.features = []  # the counts are in the rows: free them before the scoring pass
    if profile.sketched_for_memory:
        notes = {**(notes or {}), "sketched_for_memory": len(profile.sketched_for_memory),
                 "exact_count_entries": profile.budget}
    scoring: dict[str, Any] | None = None
    error: str | None = None
    if survey is not None:
        try:
            scores = score_stream(replay, method, pairs=False, survey=survey, progress=progress)
        except DataError:
            raise
        except ValueError as e:
            error = str(e)
        else:
            rows, scoring = with_scores(rows, scores, method)
        notes = {**(notes or {}), "replay": replay.summary()}
    labels = profile.labels.astype(np.int64).sort_index()
    return QualityReport(
        source=profile.source,
        dataset=profile.schema.name,
        label=profile.schema.label,
        rows=profile.rows,
        label_counts={str(k): int(v) for k, v in labels.items()},
        features=rows,
        scoring=scoring,
        scoring_error=error,
        notes=dict(notes or {}),
    )
