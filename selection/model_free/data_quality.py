"""Data-quality report of raw data: what OutRank's screening outputs say about each feature.

Per feature: kind, exact cardinality, coverage, the most common value, rare values, the
value-repetition histogram (methods.md 2.4), constant / near-constant / entirely missing
columns, and, from OutRank's relevance scores with noise controls, suspected label leakage and
features scoring below the noise control of matching cardinality::

    report = data_quality(raw)
    print(report.format())             # aligned text table
    report.flags()                     # {"C22": ["below_noise"], "dead_col": ["missing", "constant"]}
    report.to_frame(); report.save("quality.json")

Bad input never crashes the report: an entirely missing or constant column is a row with its
flag, and a label OutRank cannot score (a single class, a continuous target) leaves the
leakage / noise columns empty with the reason in ``scoring_error``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from recsys.data.raw import RawData
from recsys.data.schema import FeatureKind, FeatureSpec
from selection.model_free.column_codes import arrow_text, feature_cells, text_codes
from selection.model_free.outrank import OutRank, Ranking, missing_mask, score_raw

if TYPE_CHECKING:
    from selection.model_free.outrank import OutRankConfig, OutRankScores

__all__ = ["REPETITION_THRESHOLDS", "FeatureQuality", "QualityReport", "data_quality", "quality_row", "with_scores"]

#: the value-repetition histogram counts distinct values seen more than n times for these n
REPETITION_THRESHOLDS = (0, 1, 10, 100, 1_000, 10_000, 100_000)
#: a feature whose most common value (missing included) covers this share of rows is near-constant
NEAR_CONSTANT_SHARE = 0.99
#: a sparse feature with at least this many distinct values per non-missing row is identifier-like ...
IDENTIFIER_SHARE = 0.9
#: ... once it has this many non-missing rows
IDENTIFIER_MIN_ROWS = 1000
MISSING = "<missing>"


@dataclass(frozen=True)
class FeatureQuality:
    """The quality row of one feature.

    Args:
        feature: name.
        kind: ``categorical``, ``multi_categorical`` or ``dense``.
        rows: rows of the data.
        cardinality: exact number of distinct non-missing values (tokens for multi-hot).
        coverage: share of non-missing cells (non-empty bags for multi-hot).
        missing_share: ``1 - coverage``.
        top_value: the most common cell value, missing counted as the value ``<missing>``
            (multi-hot: the token in most rows).
        top_share: share of rows holding ``top_value``.
        rare_values: distinct values seen exactly once (None when ``approximate``).
        rare_share: ``rare_values / cardinality`` (0 without values; None when ``approximate``).
        repetitions: n -> distinct values seen more than n times, n in
            :data:`REPETITION_THRESHOLDS` (n = 0 gives the cardinality; empty when ``approximate``).
        constant: one distinct value, missing included (an entirely missing column is constant).
        near_constant: not constant and ``top_share >= 0.99``. A warning, not a verdict: a rare
            but informative flag (a promotion seen in 1% of rows) is near-constant by design.
        all_missing: every cell missing.
        identifier_like: a categorical or multi-hot feature with a distinct value in nearly
            every row (``cardinality >= 0.9 x`` non-missing rows, at least 1,000 of them): an
            impression or user id, which carries no generalisable signal and scores ~0.
        approximate: the counts come from sketches (streaming with ``sketch``): cardinality
            is a HyperLogLog estimate (~1% error), the top value a Misra-Gries heavy hitter
            whose share is a lower bound; rare values and repetitions are not counted.
        relevance: OutRank's relevance score S (None when not scored).
        leakage: the reason when the feature scores like a copy of the label, else None.
        below_noise: the noise control it scores below, else None.
    """

    feature: str
    kind: str
    rows: int
    cardinality: int
    coverage: float
    missing_share: float
    top_value: str | None
    top_share: float
    rare_values: int | None
    rare_share: float | None
    repetitions: dict[int, int]
    constant: bool
    near_constant: bool
    all_missing: bool
    identifier_like: bool = False
    approximate: bool = False
    relevance: float | None = None
    leakage: str | None = None
    below_noise: str | None = None

    @property
    def flags(self) -> list[str]:
        out = []
        if self.all_missing:
            out.append("missing")
        if self.constant:
            out.append("constant")
        if self.near_constant:
            out.append("near_constant")
        if self.identifier_like:
            out.append("identifier_like")
        if self.leakage:
            out.append("leakage")
        if self.below_noise:
            out.append("below_noise")
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["repetitions"] = {str(k): v for k, v in self.repetitions.items()}
        out["flags"] = self.flags
        return out


@dataclass
class QualityReport:
    """Per-feature quality rows of one dataset plus what the OutRank scoring saw.

    Args:
        source: where the data came from (``raw.report.source``).
        dataset: dataset (schema) name.
        label: label column.
        rows: rows of the data.
        label_counts: label value -> rows.
        features: one :class:`FeatureQuality` per feature, schema order.
        scoring: OutRank scoring summary (controls, label copy score, rows scored), None when
            not scored.
        scoring_error: why OutRank could not score, if it could not.
        notes: how the data was read (streaming: chunk rows, row sample, sketches).
    """

    source: str
    dataset: str
    label: str
    rows: int
    label_counts: dict[str, int]
    features: list[FeatureQuality]
    scoring: dict[str, Any] | None = None
    scoring_error: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    _index: dict[str, FeatureQuality] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = {f.feature: f for f in self.features}

    def __getitem__(self, feature: str) -> FeatureQuality:
        try:
            return self._index[feature]
        except KeyError:
            raise KeyError(f"no quality row for {feature!r}; features: {list(self._index)}") from None

    def __len__(self) -> int:
        return len(self.features)

    def flags(self) -> dict[str, list[str]]:
        """Flagged features -> their flags (unflagged features are left out)."""
        return {f.feature: f.flags for f in self.features if f.flags}

    def to_frame(self) -> pd.DataFrame:
        """One row per feature; the repetition histogram as ``seen>n`` columns."""
        rows = []
        for f in self.features:
            row = {k: v for k, v in f.to_dict().items() if k != "repetitions"}
            row["flags"] = ",".join(f.flags)
            row.update({f"seen>{n}": c for n, c in f.repetitions.items()})
            rows.append(row)
        return pd.DataFrame(rows)

    def _table(self) -> tuple[list[str], list[list[str]]]:
        head = ["feature", "kind", "card", "coverage", "top value", "top share", "rare", "rare/card", "seen>10",
                "relevance", "flags"]
        body = []
        for f in self.features:
            top = f.top_value if f.top_value is None or len(f.top_value) <= 16 else f.top_value[:15] + "~"
            body.append([
                f.feature, f.kind.replace("multi_categorical", "multi"), str(f.cardinality), f"{f.coverage:.3f}",
                str(top), f"{f.top_share:.3f}", "" if f.rare_values is None else str(f.rare_values),
                "" if f.rare_share is None else f"{f.rare_share:.2f}",
                str(f.repetitions.get(10, "")), "" if f.relevance is None else f"{f.relevance:.4g}",
                ",".join(f.flags),
            ])
        return head, body

    def _summary(self) -> list[str]:
        lines = [f"data quality of {self.dataset} ({self.source}): {self.rows} rows, {len(self.features)} features, "
                 f"label {self.label!r} {self.label_counts}"]
        if self.notes.get("sample"):
            lines.append(f"row sample: {self.notes['sample']}")
        if any(f.approximate for f in self.features):
            lines.append("card and top share of sketched features (no rare/seen>10) are estimates (HyperLogLog, Misra-Gries)")
        if self.scoring_error:
            lines.append(f"OutRank scoring skipped: {self.scoring_error}")
        elif self.scoring:
            lines.append(f"OutRank relevance over {self.scoring['rows_scored']} rows in {self.scoring['batches']} "
                         f"batch(es); label copy scores {self.scoring['label_copy_score']:.4g}")
        return lines

    def format(self) -> str:
        """Aligned plain-text table for the terminal."""
        head, body = self._table()
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
        lines = self._summary()
        for r in [head, *body]:
            lines.append("  ".join(c.ljust(w) if i in (0, 1, 4, 10) else c.rjust(w) for i, (c, w) in
                                   enumerate(zip(r, widths))).rstrip())
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """A Markdown table (summary lines first)."""
        head, body = self._table()
        lines = [*self._summary(), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in body]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dataset": self.dataset,
            "label": self.label,
            "rows": self.rows,
            "label_counts": self.label_counts,
            "features": [f.to_dict() for f in self.features],
            "flags": self.flags(),
            "scoring": self.scoring,
            "scoring_error": self.scoring_error,
            "notes": self.notes,
        }

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON (atomically); returns the path."""
        from recsys.io import atomic_write_text

        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, default=str))
        return path


def count_values(values: pd.Series, spec: FeatureSpec, sort: bool = True) -> tuple[np.ndarray, pd.Series]:
    """``(missing mask, counts of the non-missing values)``; for multi-hot the counts are rows
    holding each token (a token repeated in one bag counts once) and an empty bag is missing.
    ``sort=False``: the values in order of first appearance."""
    values = values.reset_index(drop=True)
    if not sort and spec.kind is FeatureKind.CATEGORICAL and (arr := arrow_text(values)) is not None:
        return _text_counts(arr, spec)
    missing = missing_mask(values, spec)
    if spec.kind is FeatureKind.MULTI_CATEGORICAL:
        cells = values.where(~missing, "").astype(str)
        tokens = cells.str.split(spec.separator, regex=False).explode()
        tokens = tokens[tokens != ""]
        pairs = pd.DataFrame({"row": tokens.index.to_numpy(), "tok": tokens.to_numpy()}).drop_duplicates()
        missing = np.bincount(pairs["row"].to_numpy(dtype=np.int64), minlength=len(values)) == 0
        return missing, pairs["tok"].value_counts(sort=sort)
    present = values[~missing]
    if spec.kind is FeatureKind.DENSE:
        present = pd.to_numeric(present, errors="coerce")
    return missing, present.value_counts(dropna=True, sort=sort)


def _text_counts(arr: pa.Array, spec: FeatureSpec) -> tuple[np.ndarray, pd.Series]:
    """:func:`count_values` (``sort=False``) of arrow-backed text, by pyarrow's kernels."""
    codes, missing, values = text_codes(arr, spec)
    counts = np.bincount(codes[~missing], minlength=len(values))
    seen = np.flatnonzero(counts)  # codes in order of first appearance: the present ones keep it
    present = values.take(pa.array(seen)).to_pandas() if len(seen) < len(values) else values.to_pandas()
    return missing, pd.Series(counts[seen], index=pd.Index(present), dtype=np.int64)


def quality_row(spec: FeatureSpec, n: int, n_missing: int, counts: pd.Series | None, *,
                cardinality: int | None = None, top: tuple[object, int] | None = None) -> FeatureQuality:
    """The quality row of a feature over ``n`` rows with ``n_missing`` missing cells.

    Args:
        counts: exact counts of the non-missing values, most common first (ties in order of
            first appearance, as ``value_counts`` gives); None for a sketched feature, which
            passes ``cardinality`` (an estimate) and ``top`` (its heaviest value and a lower
            bound of its count, None without values) instead.
    """
    approximate = counts is None
    if counts is not None:
        card = int(len(counts))
        top = (counts.index[0], int(counts.iloc[0])) if card else None
        c = counts.to_numpy()
        rare: int | None = int(np.sum(c == 1))
        repetitions = {t: int(np.sum(c > t)) for t in REPETITION_THRESHOLDS}
    else:
        card, rare, repetitions = int(cardinality or 0), None, {}
    top_count = top[1] if top is not None else 0
    if n_missing > top_count or top is None:
        top_value, top_count = MISSING, n_missing
    else:
        top_value = str(top[0])
    top_share = top_count / n if n else 0.0
    constant = card + (1 if n_missing else 0) <= 1
    present = n - n_missing
    return FeatureQuality(
        feature=spec.name,
        kind=spec.kind.value,
        rows=n,
        cardinality=card,
        coverage=1.0 - n_missing / n if n else 0.0,
        missing_share=n_missing / n if n else 0.0,
        top_value=top_value,
        top_share=top_share,
        rare_values=rare,
        rare_share=None if rare is None else (rare / card if card else 0.0),
        repetitions=repetitions,
        constant=constant,
        near_constant=not constant and top_share >= NEAR_CONSTANT_SHARE,
        all_missing=n > 0 and n_missing == n,
        identifier_like=spec.is_sparse and present >= IDENTIFIER_MIN_ROWS
        and card >= IDENTIFIER_SHARE * present,
        approximate=approximate,
    )


def _feature_quality(values: pd.Series, spec: FeatureSpec) -> FeatureQuality:
    missing, counts = count_values(values, spec)
    return quality_row(spec, len(values), int(missing.sum()), counts)


def with_scores(rows: list[FeatureQuality], scores: OutRankScores,
                method: OutRankConfig) -> tuple[list[FeatureQuality], dict[str, Any]]:
    """The rows with OutRank's relevance, leakage and below-noise columns, and the scoring summary."""
    leak = scores.leakage(method.leakage_threshold)
    below = scores.below_noise() if method.controls else {}
    rows = [
        replace(r, relevance=scores.relevance[r.feature], leakage=leak.get(r.feature), below_noise=below.get(r.feature))
        for r in rows
    ]
    scoring = {
        "config": method.describe(),
        "label_copy_score": scores.label_copy_score,
        "label_entropy": scores.label_entropy,
        "controls": scores.controls,
        "rows_scored": scores.rows_scored,
        "batches": scores.batches,
        "seconds": scores.seconds,
    }
    return rows, scoring


def data_quality(raw: RawData, outrank: OutRank | None = None, *, score: bool = True) -> QualityReport:
    """The data-quality report of ``raw``.

    Args:
        raw: the data (all its rows are profiled).
        outrank: OutRank settings of the leakage / below-noise scoring (default
            ``OutRank(ranking="relevance", progress=False)``; pair matrices are never computed).
        score: run the OutRank scoring at all.

    Returns:
        :class:`QualityReport`. :func:`selection.model_free.data_quality_stream.data_quality_stream` gives the
        same report reading a file in chunks.
    """
    rows = [_feature_quality(feature_cells(raw.frame, s), s) for s in raw.schema.features]
    label = raw.frame[raw.schema.label]
    label_counts = {str(k): int(v) for k, v in label.value_counts(dropna=False).sort_index().items()}
    scoring: dict[str, Any] | None = None
    error: str | None = None
    if score:
        method = outrank or OutRank(ranking=Ranking.RELEVANCE, progress=False)
        try:
            scores: OutRankScores = score_raw(raw, method, pairs=False)
        except ValueError as e:
            error = str(e)
        else:
            rows, scoring = with_scores(rows, scores, method)
    return QualityReport(
        source=raw.report.source,
        dataset=raw.schema.name,
        label=raw.schema.label,
        rows=len(raw.frame),
        label_counts=label_counts,
        features=rows,
        scoring=scoring,
        scoring_error=error,
    )
