"""OutRank on raw data read in chunks, in bounded memory (``salience rank`` / ``quality`` on files).

:func:`score_stream` returns the :class:`~selection.model_free.outrank_scoring.OutRankScores` that
:func:`~selection.model_free.outrank_scoring.score_raw` returns for the same rows, reading them twice through
a *chunk source* (a function returning a fresh iterator of :class:`RawData` chunks, such as
:func:`selection.model_free.rawfiles.raw_chunk_source` or ``lambda: reader.iter_chunks(rows)``):

1. survey (:func:`survey_chunks`): rows counted, the label checked, a seeded reservoir sample of
   ``edge_sample`` rows of the dense columns and the label (the quantile edges of dense bins and
   target bins come from it), each dense column's distinct values up to ``dense_bins + 1``, and
   each column's majority candidate (:class:`~selection.model_free.sketch.MisraGries`, ``k = 1``,
   fed each chunk's value counts or, for Arrow text and float64 columns on the compiled path, the
   chunk's Boyer-Moore vote, :func:`~selection.model_free.kernels.majority_vote` and
   :func:`~selection.model_free.kernels.majority_vote_numbers`, which hash nothing).
   Every column's per-chunk work runs on the column pool (:mod:`recsys.parallel`);
2. scoring: the selected rows (``subsampling``, ``max_rows``: the same rows as ``score_raw``)
   cut into the same mini-batches of ``minibatch_size`` rows, across chunk boundaries. Each
   batch is encoded on its own (the score of a batch does not change when its codes are
   relabelled, so categorical codes need no global vocabulary) and scored by the same
   :class:`~selection.model_free.outrank_scoring.BatchScores` as in memory. The majority candidate is
   counted exactly (constant and near-constant columns), bins by a bincount.

When the rows kept by ``subsampling`` are at most ``edge_sample``, the sample holds all of them,
so the bins and the scores equal ``score_raw``'s (to the rounding of sums taken in another
order, ~1e-15). On more rows the dense bin edges are the sample's quantiles.

Memory: one chunk, one batch, the sample (``edge_sample`` x (dense columns + 2) x 8 bytes,
allocated lazily: 112 MB for Criteo at the default 10^6 rows; fewer rows where that would pass
:data:`~recsys.data.streaming.chunking.SAMPLE_BYTES`, ~40k rows at 3,000 dense columns) and O(1) state
per column.

Options that are not streamed: none of OutRank's; the pair (3MR) matrices are computed on the
batches chosen by ``pair_batches``, as in memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.progress import Progress
from recsys.data.raw import DataError, RawData
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.streaming.chunking import SAMPLE_BYTES, rows_within
from recsys.data.streaming.replay import ChunkReplay
from recsys.parallel import map_ordered
from selection.model_free import kernels
from selection.model_free.column_codes import (
    EncodedColumn,
    arrow_text,
    bin_codes,
    code_values,
    dense_values,
    encode_binned,
    encode_column,
    encode_feature,
    feature_cells,
    missing_mask,
    quantile_edges,
    text_codes,
)
from selection.model_free.mutual_info import factorize, first_appearance
from selection.model_free.outrank_scoring import (
    NEAR_CONSTANT_SHARE,
    BatchScores,
    OutRankConfig,
    OutRankScores,
    Ranking,
    batch_ranges,
    pair_batch_ids,
)
from selection.model_free.sketch import MisraGries

if TYPE_CHECKING:
    from selection.model_free.outrank import OutRank
    from selection.report import ImportanceReport

__all__ = [
    "DEFAULT_EDGE_SAMPLE", "ChunkSource", "Survey", "rank_stream", "row_sample", "score_stream", "survey_chunks",
]

#: a function returning a fresh iterator over the data's chunks (called once per pass)
ChunkSource = Callable[[], Iterator[RawData]]
#: rows of the seeded sample the dense bin edges come from
DEFAULT_EDGE_SAMPLE = 1_000_000
_LABEL = "\0label"
#: distinct label values remembered (beyond this the label is continuous anyway)
_LABEL_CAP = 10_000


def row_sample(source: ChunkSource, fraction: float | None = None, max_rows: int | None = None,
               seed: int = 0) -> ChunkSource:
    """``source`` with each row kept with probability ``fraction`` (seeded Bernoulli, the same
    rows in every pass) and at most ``max_rows`` kept rows (the first ones); None: all."""
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise ValueError(f"sample fraction must be in (0, 1], got {fraction}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"sample max_rows must be >= 1, got {max_rows}")
    if fraction is None and max_rows is None:
        return source

    def chunks() -> Iterator[RawData]:
        rng = np.random.default_rng([seed, 3])
        kept = 0
        for chunk in source():
            frame = chunk.frame
            if fraction is not None and fraction < 1.0:
                frame = frame[rng.random(len(frame)) < fraction]
            if max_rows is not None:
                frame = frame.iloc[: max_rows - kept]
            if len(frame):
                kept += len(frame)
                yield RawData(frame, chunk.schema, chunk.report)
            if max_rows is not None and kept >= max_rows:
                return

    return chunks


class _LabelCheck:
    """What :func:`~selection.model_free.column_codes.label_codes` checks, counted chunk by chunk."""

    def __init__(self) -> None:
        self.missing = 0
        self.numeric = True
        self.continuous = False
        self.values: set[Any] = set()
        self.overflow = False
        self.first: Any = None

    def add(self, col: pd.Series) -> None:
        self.missing += int(col.isna().sum())
        if self.first is None and len(col):
            self.first = col.iloc[0]
        numeric = pd.to_numeric(col, errors="coerce")
        if numeric.isna().any():
            self.numeric = False
        else:
            x = numeric.to_numpy(dtype=np.float64)
            self.continuous = self.continuous or not np.all(np.isfinite(x)) or not np.all(x == np.round(x))
        if not self.overflow:
            self.values.update(col.dropna().unique().tolist())
            self.overflow = len(self.values) > _LABEL_CAP

    def error(self, source: str, name: str, method: OutRankConfig, rows: int, label_bins: np.ndarray | None) -> str | None:
        """The message ``label_codes`` raises for these rows, or None."""
        if self.missing:
            return f"{source}: label column {name!r} has {self.missing} missing value(s); drop or fill those rows before ranking"
        if method.target_bins is not None:
            if not self.numeric:
                return f"{source}: target_bins needs a numeric label column, {name!r} is not"
            classes = 0 if label_bins is None else len(np.unique(label_bins))
        else:
            n_distinct = len(self.values)
            continuous = self.numeric and self.continuous
            if continuous or n_distinct > method.max_classes:
                count = f"more than {_LABEL_CAP}" if self.overflow else str(n_distinct)
                why = "non-integer values" if continuous else f"{count} distinct values (max_classes={method.max_classes})"
                return (
                    f"{source}: label column {name!r} looks like a continuous target ({why}); OutRank "
                    f"groups rows by label value, so bin it: pass target_bins=K (e.g. OutRank(target_bins=10)) "
                    f"to cut it into K quantile bins"
                )
            classes = len(self.values)
        if classes < 2:
            return (
                f"{source}: label column {name!r} has a single class ({self.first!r} in all {rows} scored rows); "
                f"mutual information with the label is 0 for every feature, so nothing can be ranked"
            )
        return None


class _Reservoir:
    """A seeded uniform sample of ``k`` rows (Algorithm R, vectorised per chunk): float64 values
    of some columns and each row's number; holds every row while fewer than ``k`` came."""

    def __init__(self, k: int, names: list[str], seed: int) -> None:
        if k < 1:
            raise ValueError(f"edge_sample must be >= 1, got {k}")
        self.k, self.seen = k, 0
        self.rng = np.random.default_rng([seed, 2])
        self.rows = np.empty(k, dtype=np.int64)  # untouched pages cost no memory until filled
        self.values = {n: np.empty(k, dtype=np.float64) for n in names}

    def add(self, rows: np.ndarray, values: dict[str, np.ndarray]) -> None:
        n_first = max(0, min(len(rows), self.k - self.seen))  # rows that fill the free slots, in order
        if n_first:
            end = self.seen + n_first
            self.rows[self.seen:end] = rows[:n_first]
            for n, v in values.items():
                self.values[n][self.seen:end] = v[:n_first]
        if n_first < len(rows):  # the rest replace a uniform slot, or are dropped
            idx = self.seen + np.arange(n_first, len(rows), dtype=np.int64)
            slot = self.rng.integers(0, idx + 1)
            keep = np.flatnonzero(slot < self.k)
            dest = slot[keep]
            self.rows[dest] = rows[n_first:][keep]  # repeated slots: the later row wins, as in Algorithm R
            for n, v in values.items():
                self.values[n][dest] = v[n_first:][keep]
        self.seen += len(rows)

    @property
    def complete(self) -> bool:
        return self.seen <= self.k

    def restricted(self, selected: np.ndarray | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The sampled rows among ``selected`` (sorted row numbers; None = all)."""
        n = min(self.seen, self.k)
        mask = np.ones(n, dtype=bool) if selected is None else _member(self.rows[:n], selected)
        return self.rows[:n][mask], {k: v[:n][mask] for k, v in self.values.items()}


def _member(rows: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(sorted_set, rows)
    return (pos < len(sorted_set)) & (sorted_set[np.minimum(pos, len(sorted_set) - 1)] == rows)


def _value_counts(col: pd.Series, spec: FeatureSpec) -> pd.Series:
    """Rows per value of :func:`code_values` (order of first appearance; null and ``""`` one
    value of a text column), by pyarrow's kernel where the column is arrow-backed text."""
    if spec.kind is FeatureKind.CATEGORICAL and (arr := arrow_text(col)) is not None:
        counts = pc.value_counts(pc.fill_null(arr, ""))
        return pd.Series(counts.field("counts").to_numpy(zero_copy_only=False),
                         index=pd.Index(counts.field("values").to_pandas()), dtype=np.int64)
    return code_values(col, spec).value_counts(dropna=False, sort=False)


def _survey_column(work: tuple[FeatureSpec, np.ndarray | None, MisraGries], frame: pd.DataFrame,
                   dense_bins: int | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """One feature's share of a survey chunk (on a pool thread: it touches only this feature's
    ``majority`` summary, fed chunk by chunk in order): its value counts go into ``majority``;
    returns, for a dense feature, its values and the distinct values seen so far (``seen``, None
    once past the cap)."""
    spec, seen, majority = work
    col = feature_cells(frame, spec)
    arr = arrow_text(col) if spec.kind is FeatureKind.CATEGORICAL and kernels.active() == "numba" else None
    numbers = (spec.kind is FeatureKind.DENSE and col.dtype == np.float64 and kernels.active() == "numba")
    if arr is not None or numbers:  # the candidate without hashing the cells (pass 2 counts it exactly)
        value, net = kernels.majority_vote(arr) if arr is not None else kernels.majority_vote_numbers(col.to_numpy())
        if net:
            majority.add_counts(pd.Series([net], index=pd.Index([value]), dtype=np.int64))
        majority.rows += len(col) - net  # the cells paired off
    else:
        majority.add_counts(_value_counts(col, spec))
    if spec.kind is not FeatureKind.DENSE:
        return None, None
    x = dense_values(col)
    if seen is not None and dense_bins is not None:
        seen = np.union1d(seen, np.unique(x[~np.isnan(x)]))
    return x, seen


@dataclass
class Survey:
    """The first pass over the data (see the module docstring).

    Args:
        schema: the chunks' schema.
        source: where the rows came from (the first chunk's ``report.source``).
        rows: data rows read.
        scanned: rows kept by ``subsampling``.
        sample: the reservoir of dense values and labels.
        dense_distinct: dense feature -> distinct non-NaN values over the scanned rows, counted
            up to ``dense_bins + 1``.
        majority: feature -> Misra-Gries (k=1) summary of its codes' values (a value in more
            than half the rows is its candidate).
        label: the label checks.
        seconds: time taken.
    """

    schema: Schema
    source: str
    rows: int
    scanned: int
    sample: _Reservoir
    dense_distinct: dict[str, int]
    majority: dict[str, MisraGries]
    label: _LabelCheck
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _fraction(chunk: RawData) -> float | None:
    r = chunk.report
    return r.bytes_read / r.bytes_total if r.bytes_total else None


def survey_chunks(source: ChunkSource, method: OutRankConfig | None = None, *, edge_sample: int = DEFAULT_EDGE_SAMPLE,
                  on_chunk: Callable[[RawData], None] | None = None, progress: bool = True) -> Survey:
    """Pass 1 over ``source`` (``on_chunk`` also sees every chunk, all rows: the quality
    profile reads the data in the same pass)."""
    method = method or OutRankConfig()
    t0 = time.perf_counter()
    survey: Survey | None = None
    offset = 0
    cap = (method.dense_bins or 0) + 1
    distinct: dict[str, np.ndarray | None] = {}
    with Progress("outrank pass 1/2: survey", enabled=progress) as bar:
        for chunk in source():
            if on_chunk is not None:
                on_chunk(chunk)
            schema = chunk.schema
            if survey is None:
                dense = [s.name for s in schema.features if s.kind is FeatureKind.DENSE]
                # at most SAMPLE_BYTES of sampled floats: all of edge_sample rows at Criteo's width
                kept = rows_within(SAMPLE_BYTES, 8 * (len(dense) + 1), edge_sample)
                survey = Survey(schema, chunk.report.source, 0, 0, _Reservoir(kept, [*dense, _LABEL], method.seed),
                                {}, {s.name: MisraGries(1) for s in schema.features}, _LabelCheck())
                distinct = {n: np.empty(0) for n in dense}
            rows = offset + np.arange(len(chunk.frame), dtype=np.int64)
            keep = rows % method.subsampling == 0
            frame = chunk.frame[keep]
            label = frame[schema.label]
            survey.label.add(label)
            values = {_LABEL: pd.to_numeric(label, errors="coerce").to_numpy(dtype=np.float64)}
            specs = list(schema.features)
            # each task takes its own cells (a vector's row keys are built there, one at a time per thread)
            work = [(s, distinct.get(s.name), survey.majority[s.name]) for s in specs]
            counted = map_ordered(partial(_survey_column, frame=frame, dense_bins=method.dense_bins), work)
            for s, (x, seen) in zip(specs, counted):
                if x is not None:
                    values[s.name] = x
                    distinct[s.name] = seen if seen is None or len(seen) <= cap else None
            survey.sample.add(rows[keep], values)
            survey.rows += len(chunk.frame)
            survey.scanned += len(frame)
            offset += len(chunk.frame)
            bar.update(len(chunk.frame), _fraction(chunk))
    if survey is None:
        raise DataError("no data rows")
    survey.dense_distinct = {n: cap if v is None else len(v) for n, v in distinct.items()}
    survey.seconds = time.perf_counter() - t0
    return survey


@dataclass
class _Plan:
    """What the scoring pass needs, from the survey."""

    selected: np.ndarray | None  # sorted row numbers of a max_rows selection (None: every kept row)
    n: int  # rows scored (before the trailing-batch rule)
    edges: dict[str, np.ndarray | None]  # binned dense features -> edges
    label_edges: np.ndarray | None
    pair_excluded: set[str]  # features constant over every scanned row
    candidates: dict[str, Any]  # unbinned feature -> majority candidate (absent: none)


def _plan(survey: Survey, method: OutRankConfig) -> _Plan:
    selected = None
    n = survey.scanned
    if method.max_rows is not None and n > method.max_rows:  # score_raw's _select_rows, without its arange
        rng = np.random.default_rng([method.seed, 1])
        selected = np.sort(rng.choice(n, size=method.max_rows, replace=False)) * method.subsampling
        n = method.max_rows
    _, sample = survey.sample.restricted(selected)
    own_count = survey.sample.complete and selected is not None

    def dense_plan(s: FeatureSpec) -> tuple[bool, np.ndarray | None, bool]:
        """(binned, edges, constant over a complete sample) of one dense feature."""
        x = sample[s.name]
        # the survey's count (capped at dense_bins + 1) covers every scanned row; a max_rows
        # selection of a complete sample counts its own rows
        count = len(np.unique(x[~np.isnan(x)])) if own_count else survey.dense_distinct[s.name]
        if count <= int(method.dense_bins or 0):
            return False, None, False
        e = quantile_edges(x, int(method.dense_bins or 0))
        return True, e, survey.sample.complete and _one_bin(x, e)

    dense = [s for s in survey.schema.features if s.kind is FeatureKind.DENSE and method.dense_bins is not None]
    planned = dict(zip((s.name for s in dense), map_ordered(dense_plan, dense)))  # one feature per task
    edges = {name: e for name, (binned, e, _) in planned.items() if binned}
    label_edges = None
    if method.target_bins is not None:
        label_edges = quantile_edges(sample[_LABEL], int(method.target_bins))
    excluded, candidates = set(), {}
    for s in survey.schema.features:
        top = survey.majority[s.name].top()
        if s.name in edges:
            if planned[s.name][2]:
                excluded.add(s.name)
            continue
        if top is not None:
            candidates[s.name] = top[0]
            if top[1] == survey.scanned:
                excluded.add(s.name)
    return _Plan(selected, n, edges, label_edges, excluded, candidates)


def _one_bin(x: np.ndarray, edges: np.ndarray | None) -> bool:
    """Whether :func:`bin_codes` gives every value of ``x`` one code (without coding them: the
    bins are monotonic in the value, so the smallest and largest finite values decide; NaN has
    a code of its own)."""
    nan = np.isnan(x)
    missing = int(nan.sum())
    if missing == len(x):
        return True
    if edges is None:  # coded by sign (NaN with 0): rare, coded outright
        return len(np.unique(bin_codes(x, edges))) == 1
    if missing:
        return False
    lo, hi = np.searchsorted(edges, [x.min(), x.max()], side="right")
    return bool(lo == hi)


def _label_batch(col: pd.Series, plan: _Plan, method: OutRankConfig) -> np.ndarray:
    """Label codes of one batch (as ``label_codes``; a relabelling of them scores the same)."""
    if method.target_bins is not None:
        return factorize(bin_codes(pd.to_numeric(col).to_numpy(dtype=np.float64), plan.label_edges))
    numeric = pd.to_numeric(col, errors="coerce")
    return factorize(col if numeric.isna().any() else numeric)


def _label_chunk(col: pd.Series, plan: _Plan, method: OutRankConfig) -> np.ndarray | None:
    """Label codes of a whole chunk whose slices, relabelled by first appearance, are the codes
    :func:`_label_batch` gives each batch; None where a batch's coding depends on its own rows
    (a label that is not numeric throughout: each batch is then coded on its own)."""
    if method.target_bins is not None:
        return bin_codes(pd.to_numeric(col).to_numpy(dtype=np.float64), plan.label_edges)
    numeric = pd.to_numeric(col, errors="coerce")
    return None if numeric.isna().any() else factorize(numeric)


@dataclass
class _ChunkColumn:
    """One feature coded over a whole chunk. A batch's codes are a slice relabelled by first
    appearance (:func:`~selection.model_free.mutual_info.first_appearance`): exactly the codes
    of encoding the batch's rows alone (equal cells, equal codes), at one encoding per chunk."""

    codes: np.ndarray  # bin numbers (binned) or factorized cells, in the smallest unsigned dtype (:func:`_compact`)
    missing: np.ndarray  # bool, as EncodedColumn.missing
    uniques: Any = None  # unbinned: the cell of each code (a pandas Index, or a pyarrow array of text)
    binned: bool = False

    def count(self, value: Any, rows: slice) -> int:
        """Cells equal to ``value`` among ``rows`` (a NaN ``value`` counts the NaN cells)."""
        if isinstance(self.uniques, pa.Array):  # text: null and "" are one code, coded as ""
            at = pc.index(self.uniques, value).as_py() if isinstance(value, str) else -1
            return int((self.codes[rows] == at).sum()) if at >= 0 else 0
        u = pd.Index(self.uniques)
        hit = u.isna() if isinstance(value, float) and np.isnan(value) else np.asarray(u == value, dtype=bool)
        return int(np.isin(self.codes[rows], np.flatnonzero(hit)).sum()) if hit.any() else 0

    def batch(self, spec: FeatureSpec, rows: slice) -> EncodedColumn:
        return EncodedColumn(spec.name, spec.kind, first_appearance(self.codes[rows]), self.missing[rows],
                             binned=self.binned)


class _Rows:
    """Consecutive frames with the same columns, read as one without concatenating them whole: a
    column (or a few, for some rows) is concatenated when it is read, on the pool thread that
    codes it, so no copy of all the rows is ever held."""

    def __init__(self, parts: list[pd.DataFrame]) -> None:
        self.parts = parts
        self.stops = np.cumsum([len(p) for p in parts])
        self.starts = self.stops - [len(p) for p in parts]

    def __len__(self) -> int:
        return int(self.stops[-1]) if len(self.stops) else 0

    def column(self, name: str) -> pd.Series:
        if len(self.parts) == 1:  # narrow data: a chunk holds many batches (copy-on-write: no copy)
            return self.parts[0][name].reset_index(drop=True)
        return pd.concat([p[name] for p in self.parts], ignore_index=True)

    def frame(self, rows: slice, columns: list[str]) -> pd.DataFrame:
        """``columns`` of the rows ``rows`` (a step-1 slice), indexed from 0."""
        lo, hi, _ = rows.indices(len(self))
        pieces = [p[columns].iloc[max(lo - a, 0):hi - a] for p, a, z in zip(self.parts, self.starts, self.stops)
                  if a < hi and z > lo]
        if len(pieces) == 1:
            return pieces[0].reset_index(drop=True)
        return pd.concat(pieces, ignore_index=True) if pieces else self.parts[0][columns].iloc[:0]

    def after(self, row: int) -> list[pd.DataFrame]:
        """The parts' rows from ``row`` on, each copied (so that the frames they came from are freed)."""
        return [p.iloc[max(row - a, 0):].copy() for p, a, z in zip(self.parts, self.starts, self.stops) if z > row]


def _chunk_column(rows: _Rows, spec: FeatureSpec, plan: _Plan) -> _ChunkColumn | None:
    """``spec``'s column of ``rows`` coded once for all their batches (as :func:`_encode` codes a
    batch); None for the features coded batch by batch (multi-hot, whose token codes follow the
    stream's first appearances, and vectors)."""
    if spec.is_vector or spec.kind is FeatureKind.MULTI_CATEGORICAL:
        return None
    values = rows.column(spec.name)
    if spec.kind is FeatureKind.CATEGORICAL and (arr := arrow_text(values)) is not None:
        codes, missing, uniques = text_codes(arr, spec)
        return _ChunkColumn(_compact(codes), missing, uniques)
    missing = missing_mask(values, spec)
    if spec.name in plan.edges:
        x = dense_values(values)
        return _ChunkColumn(_compact(bin_codes(x, plan.edges[spec.name])), missing | np.isnan(x), binned=True)
    if spec.kind is FeatureKind.DENSE:  # at most dense_bins values over the scored rows: coded by value
        missing |= np.isnan(dense_values(values))
    codes, uniques = pd.factorize(code_values(values, spec), use_na_sentinel=False)
    return _ChunkColumn(_compact(codes), missing, uniques)


def _compact(codes: np.ndarray) -> np.ndarray:
    """Non-negative codes in the smallest unsigned dtype that holds them (a chunk's codes are
    held for all its batches: at F = 5,000 features the int64 copy was most of the pass's memory)."""
    top = int(codes.max()) if codes.size else 0
    return codes.astype(np.min_scalar_type(top), copy=False)


def _pooled_batch(spec: FeatureSpec, coded: dict[str, _ChunkColumn | None], rows: _Rows, part: slice,
                  plan: _Plan, dense_bins: int | None) -> EncodedColumn | None:
    """A batch's column on a pool thread: a slice of the rows' codes, or a vector coded from the
    batch's rows (its columns alone copied, here); None for a multi-hot column (its token codes
    follow the stream: coded in order)."""
    if (c := coded[spec.name]) is not None:
        return c.batch(spec, part)
    if spec.kind is FeatureKind.MULTI_CATEGORICAL and not spec.is_vector:
        return None
    return _encode(rows.frame(part, list(spec.columns)), spec, plan, {}, dense_bins)


def _encode(frame: pd.DataFrame, spec: FeatureSpec, plan: _Plan, vocabs: dict[str, dict[Any, int]],
            dense_bins: int | None) -> EncodedColumn:
    if spec.is_vector:
        return encode_feature(frame, spec, dense_bins)
    if spec.name in plan.edges:
        return encode_binned(frame[spec.name], spec, plan.edges[spec.name])
    if spec.kind is FeatureKind.MULTI_CATEGORICAL:
        return encode_column(frame[spec.name], spec, vocab=vocabs.setdefault(spec.name, {}))
    return encode_column(frame[spec.name], spec, None)


def _missing_count(values: pd.Series, spec: FeatureSpec) -> int:
    """Missing cells as :class:`EncodedColumn` counts them (a multi-hot bag without a token)."""
    if spec.kind is FeatureKind.MULTI_CATEGORICAL:
        return int((code_values(values, spec).str.replace(spec.separator, "", regex=False) == "").sum())
    miss = missing_mask(values, spec)
    if spec.kind is FeatureKind.DENSE:
        miss |= np.isnan(dense_values(values))
    return int(miss.sum())


def _count_value(values: pd.Series, value: Any) -> int:
    if isinstance(value, float) and np.isnan(value):
        return int(values.isna().sum())
    return int((values == value).sum())


def score_stream(source: ChunkSource, method: OutRankConfig | None = None, *, pairs: bool | None = None,
                 survey: Survey | None = None, edge_sample: int = DEFAULT_EDGE_SAMPLE,
                 progress: bool = True) -> OutRankScores:
    """:func:`~selection.model_free.outrank_scoring.score_raw` on the rows of ``source``, read in chunks.

    Args:
        source: the chunk source (called once per pass: twice, once if ``survey`` is given).
        method: the settings (``minibatch_size``, ``subsampling``, ``max_rows`` ... as in memory).
        pairs: also compute the pair matrices; default: when ``method.ranking`` is ``combined``.
        survey: the first pass, when the caller already made it (:func:`survey_chunks`).
        edge_sample: rows of the sample the dense bin edges come from.
        progress: show rows and rows/s of each pass.

    Raises:
        ValueError: the label errors of ``label_codes``; DataError when the data changed
            between the two passes.
    """
    method = method or OutRankConfig()
    pairs = method.ranking is Ranking.COMBINED if pairs is None else pairs
    t0 = time.perf_counter()
    survey = survey or survey_chunks(source, method, edge_sample=edge_sample, progress=progress)
    plan = _plan(survey, method)
    schema = survey.schema
    if (error := survey.label.error(survey.source, schema.label, method, plan.n, _sample_label_bins(survey, plan, method))):
        raise ValueError(error)
    specs = list(schema.features)
    names = [s.name for s in specs]
    batches = batch_ranges(plan.n, method.batch_rows(schema))
    pair_ids = pair_batch_ids(len(batches), method.pair_batches) if pairs else set()
    acc = BatchScores(method, names, [f for f in names if f not in plan.pair_excluded], pair_ids)
    scorer = _Scorer(specs, plan, method, batches, acc, schema.label)
    offset, scored = 0, 0  # rows read, rows selected
    columns = [*schema.columns, schema.label]
    with Progress("outrank pass 2/2: scoring", total=survey.rows, enabled=progress) as bar:
        for chunk in source():
            read, fraction = len(chunk.frame), _fraction(chunk)
            rows = offset + np.arange(read, dtype=np.int64)
            keep = rows % method.subsampling == 0
            if plan.selected is not None:
                keep &= _member(rows, plan.selected)
            frame = chunk.frame[columns]  # copy-on-write: no copy unless rows are dropped
            del chunk  # the scorer holds what it needs, and the next chunk is read without this one
            scorer.add(frame if keep.all() else frame.loc[keep])
            del frame
            offset += read
            scored += int(keep.sum())
            bar.update(read, fraction)
    scorer.finish()
    if offset != survey.rows or scored != plan.n or scorer.b != len(batches):
        raise DataError(f"{survey.source}: the data changed between the two passes ({survey.rows} rows, then {offset}); "
                        "run again once the file is complete")
    n, top, bins, missing = plan.n, scorer.top, scorer.bins, scorer.missing
    for f, counted in bins.items():
        top[f] = int(counted.max())
    constant = {f for f in names if top[f] == n or (f in bins and np.count_nonzero(bins[f]) <= 1)}
    near = {f for f in names if f not in constant and top[f] >= NEAR_CONSTANT_SHARE * n}
    all_missing = {f for f in names if missing[f] == n}
    return acc.finish({s.name: s.kind.value for s in specs}, constant, all_missing, near, pairs, time.perf_counter() - t0)


class _Scorer:
    """The scoring pass after the survey: selected rows wait until they complete a batch, then
    are coded once (:func:`_chunk_column`), counted, and their batches scored; the rows after the
    last whole batch wait for the next rows (at thousands of columns a batch spans many chunks:
    each row is coded once, and no more than a batch and a chunk of raw rows are held)."""

    def __init__(self, specs: list[FeatureSpec], plan: _Plan, method: OutRankConfig, batches: list[tuple[int, int]],
                 acc: BatchScores, label: str) -> None:
        self.specs, self.plan, self.method, self.batches, self.acc, self.label = specs, plan, method, batches, acc, label
        names = [s.name for s in specs]
        self.missing = dict.fromkeys(names, 0)  # counts over every selected row (the batches drop a short trailing one)
        self.top = dict.fromkeys(names, 0)
        self.bins = {f: np.zeros(3 if e is None else len(e) + 2, dtype=np.int64) for f, e in plan.edges.items()}
        self.b = 0  # the next batch
        self.vocabs: dict[str, dict[Any, int]] = {}  # multi-hot tokens -> first appearance (see encode_column)
        self.pending: list[pd.DataFrame] = []  # selected rows waiting for their batch (a few frames)
        self.counted = 0  # rows at the head of pending already counted (the rows a batch left)

    @property
    def waiting(self) -> int:
        """Rows in pending."""
        return sum(len(p) for p in self.pending)

    def add(self, frame: pd.DataFrame) -> None:
        self.pending.append(frame)
        if self.b < len(self.batches) and self.waiting < self.batches[self.b][1] - self.batches[self.b][0]:
            return  # coded with the rows that complete the batch
        self._flush()

    def finish(self) -> None:
        """Count the rows after the last batch."""
        if self.waiting > self.counted:
            self._flush()

    def _flush(self) -> None:
        rows = _Rows(self.pending)
        self.pending = []
        coded = dict(zip(self.missing, map_ordered(partial(_chunk_column, rows, plan=self.plan), self.specs)))
        self._count(rows, coded, slice(self.counted, len(rows)))
        at = self._score_batches(rows, coded)
        self.pending = rows.after(at) if self.b < len(self.batches) else []
        self.counted = self.waiting

    def _count(self, rows: _Rows, coded: dict[str, _ChunkColumn | None], new: slice) -> None:
        plan = self.plan
        for s in self.specs:
            col = coded[s.name]
            if col is None:
                cells = feature_cells(rows.frame(new, list(s.columns)), s)
                self.missing[s.name] += _missing_count(cells, s)
                if s.name in plan.candidates:
                    self.top[s.name] += _count_value(code_values(cells, s), plan.candidates[s.name])
                continue
            self.missing[s.name] += int(col.missing[new].sum())
            if s.name in self.bins:
                self.bins[s.name] += np.bincount(col.codes[new], minlength=len(self.bins[s.name]))
            elif s.name in plan.candidates:
                self.top[s.name] += col.count(plan.candidates[s.name], new)

    def _score_batches(self, rows: _Rows, coded: dict[str, _ChunkColumn | None]) -> int:
        """Score the batches that ``rows`` hold whole (from the first row); returns the rows they used."""
        plan, method, batches = self.plan, self.method, self.batches
        label = _label_chunk(rows.column(self.label), plan, method) if self.b < len(batches) else None
        at = 0
        while self.b < len(batches) and len(rows) - at >= batches[self.b][1] - batches[self.b][0]:
            start, stop = batches[self.b]
            part = slice(at, at + stop - start)
            y = (first_appearance(label[part]) if label is not None else
                 _label_batch(rows.frame(part, [self.label])[self.label], plan, method))
            # slices of the rows' codes and vectors on the pool; multi-hot here, in stream order
            pooled = map_ordered(partial(_pooled_batch, coded=coded, rows=rows, part=part, plan=plan,
                                         dense_bins=method.dense_bins), self.specs)
            cols = [c if c is not None else _encode(rows.frame(part, list(s.columns)), s, plan, self.vocabs, method.dense_bins)
                    for s, c in zip(self.specs, pooled)]
            self.acc.add(cols, 0, stop - start, y, start)
            at += stop - start
            self.b += 1
        return at


def _sample_label_bins(survey: Survey, plan: _Plan, method: OutRankConfig) -> np.ndarray | None:
    """The bins of the sampled labels (for the single-class check of ``target_bins``)."""
    if method.target_bins is None:
        return None
    _, sample = survey.sample.restricted(plan.selected)
    x = sample[_LABEL]
    return bin_codes(x, plan.label_edges) if len(x) else None


def rank_stream(source: ChunkSource, method: OutRank | None = None, *, edge_sample: int = DEFAULT_EDGE_SAMPLE,
                progress: bool = True, notes: dict[str, Any] | None = None,
                replay_bytes: int | None = None) -> ImportanceReport:
    """:func:`selection.model_free.outrank.rank_raw` on the rows of ``source``, read in chunks (two passes:
    the second reads the first one's parsed copy, :class:`~recsys.data.streaming.replay.ChunkReplay`,
    of at most ``replay_bytes``; 0: parse twice); ``notes`` (how the data was read) go to
    ``extras["streaming"]``."""
    from selection.model_free.outrank import OutRank, report_from_scores

    method = method or OutRank()
    t0 = time.perf_counter()
    with ChunkReplay(source, replay_bytes) as replay:
        survey = survey_chunks(replay, method, edge_sample=edge_sample, progress=progress)
        scores = score_stream(replay, method, survey=survey, edge_sample=edge_sample, progress=progress)
    report = report_from_scores(scores, method, survey.schema, t0)
    report.extras["streaming"] = {
        **(notes or {}), "rows_read": survey.rows, "edge_sample": edge_sample, "edge_sample_complete": survey.sample.complete,
        "replay": replay.summary(),
    }
    return report
