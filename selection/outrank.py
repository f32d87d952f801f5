"""OutRank: cardinality-corrected mutual-information ranking, noise controls and 3MR.

A reimplementation of the ``MI-numba-randomized`` heuristic of the ``outrank`` package
(outbrain/outrank, RecSys'23), see ``docs/methods.md`` section 2. For a feature X and the label
L over N rows, both integer-coded (every column categorical, a missing value its own code):

.. code-block:: text

    H(X|L)      = sum_{c: n_c >= 2} (n_c / N) * H( X[rows with L = c] )
    H_null(X|L) = sum_{c: n_c >= 2} (n_c / N) * H( X[(rows with L = c) + n_c  mod N] )
    S(X; L)     = H_null(X|L) - H(X|L)          (natural logarithms)

``S`` is the plug-in mutual information minus what the same values would get in a
label-unrelated arrangement (the null reads the feature cyclically shifted by the label
group's size: deterministic, no random numbers). It demotes ID-like columns whose plug-in MI is
inflated by their cardinality. :func:`outrank_score` with ``null="package"`` reproduces the
package's scores on the Criteo head to ~3e-7 (``tests/selection/test_outrank.py``).

The package's shifted groups do not partition the rows, so the null does not keep the
feature's marginal and its sampling noise does not cancel: on skewed high-cardinality columns
S spreads ~5x more than a permutation null (a Zipf column with 1,000 values, 16k rows: std
0.010 vs 0.002 nats), enough to rank a noise ID among the top features. :class:`OutRank`
therefore defaults to ``null="rotation"``: the same formula with the null read from whole-column
cyclic rotations (mean of 4), which keep the marginal (std 0.0015 in the same test).

Everything here is vectorised with numpy: joint counts come from ``np.bincount`` (small key
spaces) or ``np.unique`` (large ones) on combined int64 keys, the null is a gather (or a roll);
there is no Python loop over rows.

Usage::

    report = OutRank().rank(recipe)                 # the training split of a recipe
    report = rank_raw(raw, OutRank(ranking="relevance", minibatch_size=2**15))
    report.top_k(10); report.extras["controls"]; report.excluded

On top of the score (our design, documented per option in :class:`OutRank`):

* **Streaming.** Rows (every ``subsampling``-th, optionally at most ``max_rows``) are cut into
  mini-batches of ``minibatch_size`` rows; every batch is scored on its own and a feature's
  score is the median over batches (the package's aggregation); the across-batch IQR is the
  reported uncertainty.
* **Columns.** Categorical columns as above; multi-hot columns are scored on their exploded
  tokens; dense columns with many distinct values are cut into quantile bins.
* **Controls** (``CONTROL-*``): random columns of known cardinality, a row sequence, a row hash
  and a copy of the label, redrawn per batch and scored like features. A real feature scoring
  below the noise control of matching cardinality is flagged ``below_noise``; one scoring like
  the label copy is excluded as leakage.
* **3MR** (``ranking="combined"``, the default): greedy minimum-redundancy /
  maximum-relevance / maximum-relation ranking with the pair scores actually computed (the
  package scores them all as 0 and never builds the relation columns, methods.md 2.3), through
  the corrected score, with redundancy aggregated by its max over the selected features.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from enum import Enum, unique
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from recsys.data.raw import RawData
from recsys.data.schema import FeatureKind, FeatureSpec
from selection.base import ImportanceMethod
from selection.report import FeatureImportance, ImportanceReport

if TYPE_CHECKING:
    from recsys.train.recipe import Recipe

__all__ = [
    "CONTROL_PREFIX",
    "EMPTY_BAG",
    "Aggregation",
    "EncodedColumn",
    "NullModel",
    "OutRank",
    "OutRankScores",
    "Ranking",
    "RedundancyScore",
    "combined_ranking",
    "conditional_entropy",
    "encode_column",
    "entropy",
    "factorize",
    "label_codes",
    "missing_mask",
    "outrank_score",
    "pair_codes",
    "plain_mi",
    "rank_raw",
    "score_raw",
]

#: prefix of the control (noise baseline) columns
CONTROL_PREFIX = "CONTROL-"
#: the token an empty multi-hot bag is scored as
EMPTY_BAG = "<empty>"
#: a trailing partial batch is scored only above this many rows (unless it is the only batch)
MIN_TRAILING_BATCH = 1024
#: controls that are pure noise, used to flag features ``below_noise`` (closest log-cardinality)
_NOISE_CONTROLS = ("binary", "int100", "int2000", "int10000", "int50000", "gaussian", "uniform")


@unique
class Ranking(str, Enum):
    """What the report ranks by."""

    COMBINED = "combined"  # 3MR greedy: relevance - alpha * redundancy + beta * relation
    RELEVANCE = "relevance"  # the corrected score S(feature; label) alone


@unique
class RedundancyScore(str, Enum):
    """How the feature-feature (redundancy) and pair-vs-label (relation) scores are computed."""

    CORRECTED = "corrected"  # the cardinality-corrected score S (our choice, methods.md 2.3 [INF])
    PLAIN = "plain"  # plug-in MI: the package's last working 3MR behaviour (up to 8524859)


@unique
class NullModel(str, Enum):
    """The label-unrelated arrangement the corrected score subtracts."""

    PACKAGE = "package"  # each label group reads X shifted by its own size: the package, exactly
    ROTATION = "rotation"  # the whole column rotated (mean over a few offsets): a permutation-like null


@unique
class Aggregation(str, Enum):
    """How 3MR aggregates a pair score over the already selected features."""

    MEDIAN = "median"  # the package's default
    MEAN = "mean"
    MAX = "max"  # the strongest pair: an exact copy of any selected feature is demoted


# =============================================================================================
# the score
# =============================================================================================
def factorize(values: pd.Series | np.ndarray | Sequence[Any]) -> np.ndarray:
    """Integer codes of ``values`` like pandas ``category`` codes, a missing value its own code.

    Codes are ``0..K-1`` in order of first appearance (int64). NaN and None share one code; an
    empty string is a value like any other (it is what missing sparse cells hold).
    """
    codes, _ = pd.factorize(pd.Series(values, copy=False) if not isinstance(values, pd.Series) else values,
                            use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64)


def _xlogx(counts: np.ndarray) -> float:
    """``sum(c * log c)`` over positive counts."""
    c = np.asarray(counts, dtype=np.float64)
    return float(np.sum(c * np.log(c))) if c.size else 0.0


def _joint_counts(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-zero joint counts of the pairs ``(y, x)``: ``(y value of each pair, count)``."""
    kx = int(x.max()) + 1
    keys = y * kx + x
    span = (int(y.max()) + 1) * kx
    if span <= max(4 * len(x), 1 << 16):  # small key space: one bincount
        counts = np.bincount(keys, minlength=span)
        nz = np.flatnonzero(counts)
        return nz // kx, counts[nz]
    uniq, counts = np.unique(keys, return_counts=True)
    return uniq // kx, counts


def _n_cond_entropy(x: np.ndarray, y: np.ndarray, ny: np.ndarray) -> float:
    """``N * H(X|Y)`` over the groups of Y with at least 2 rows (``ny = bincount(y)``)."""
    g, cnt = _joint_counts(x, y)
    keep = ny[g] >= 2
    return _xlogx(ny[ny >= 2]) - _xlogx(cnt[keep])


def _check_codes(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.int64)
    y = np.asarray(y, dtype=np.int64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"expected two 1-d code arrays of equal length, got shapes {x.shape} and {y.shape}")
    if x.size and (x.min() < 0 or y.min() < 0):
        raise ValueError("codes must be non-negative integers (see factorize)")
    return x, y


def entropy(x: np.ndarray) -> float:
    """Plug-in entropy H(X) in nats of integer codes ``x``."""
    x = np.asarray(x, dtype=np.int64)
    n = len(x)
    if n == 0:
        return 0.0
    counts = np.bincount(x)
    return math.log(n) - _xlogx(counts[counts > 0]) / n


def conditional_entropy(x: np.ndarray, y: np.ndarray) -> float:
    """H(X|Y) in nats over the groups of Y that hold at least 2 rows (N counts all rows).

    Args:
        x (np.ndarray): N non-negative integer codes of the scored column.
        y (np.ndarray): N non-negative integer codes of the grouping column (the label).
    """
    x, y = _check_codes(x, y)
    if len(x) == 0:
        return 0.0
    return _n_cond_entropy(x, y, np.bincount(y)) / len(x)


def outrank_score(x: np.ndarray, y: np.ndarray, null: NullModel | str = "package", rotations: int = 4) -> float:
    """The corrected score ``S(X;Y) = H_null(X|Y) - H(X|Y)`` (methods.md 2.1), in nats.

    Rows are grouped by Y (the label's role). With ``null="package"`` the null reads X at
    positions ``(row + n_c) mod N`` for the rows of group c: the ``outrank`` package's
    ``MI-numba-randomized`` score of the pair (label Y, feature X), equal up to its float32
    rounding. With ``null="rotation"`` the null is the mean of ``H(X'|Y)`` over ``rotations``
    whole-column cyclic rotations X' of X (offsets ``j * N / (rotations + 1)``): the rotated
    column keeps X's marginal, so the groups' sampling noise cancels as in a permutation test
    (the package's per-group shifts do not partition the rows: on a Zipf column with 1,000
    values and 16k rows its null has ~5x the spread, see :class:`NullModel`).

    Args:
        x (np.ndarray): N non-negative integer codes of the feature.
        y (np.ndarray): N non-negative integer codes of the label (or of the feature playing
            its role in a redundancy score).
        null (NullModel | str): ``package`` or ``rotation``.
        rotations (int): rotations averaged by the ``rotation`` null.

    Returns:
        S in nats; ~0 for an unrelated column whatever its cardinality, can be slightly < 0.
    """
    x, y = _check_codes(x, y)
    n = len(x)
    if n == 0:
        return 0.0
    ny = np.bincount(y)
    if NullModel(null) is NullModel.PACKAGE:
        shifted = x[(np.arange(n, dtype=np.int64) + ny[y]) % n]
        h_null = _n_cond_entropy(shifted, y, ny)
    else:
        offsets = [(j + 1) * n // (rotations + 1) for j in range(rotations)]
        h_null = float(np.mean([_n_cond_entropy(np.roll(x, k), y, ny) for k in offsets]))
    return (h_null - _n_cond_entropy(x, y, ny)) / n


def plain_mi(x: np.ndarray, y: np.ndarray) -> float:
    """Plug-in mutual information ``H(X) - H(X|Y)`` (groups of Y with one row skipped).

    This is what the package returns for the label-vs-itself pair, where the correction is
    switched off; ``plain_mi(l, l) == entropy(l)`` for a label whose classes all repeat.
    """
    x, y = _check_codes(x, y)
    return entropy(x) - conditional_entropy(x, y) if len(x) else 0.0


def pair_codes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Codes of the pair column "a AND b": ``a * K_b + b`` (``K_b = max(b) + 1``), compacted.

    The package hashes the concatenated strings with xxh64; the exact product code has no
    collisions and gives the same partition of the rows.
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    kb = int(b.max()) + 1 if b.size else 1
    return np.unique(a * kb + b, return_inverse=True)[1].astype(np.int64).reshape(-1)


# =============================================================================================
# columns -> codes
# =============================================================================================
@dataclass
class EncodedColumn:
    """One feature as integer codes over the selected rows.

    Args:
        name: feature name.
        kind: the feature's kind.
        codes: one code per row (int64, ``0..K-1``). For a multi-hot feature the code of the
            whole bag (used in feature-feature and pair scores, which are row-level).
        missing: boolean mask of missing cells (empty bag for multi-hot).
        token_rows: multi-hot only: the row of each (row, token) instance, ascending.
        token_codes: multi-hot only: the token code of each instance (an empty bag is one
            :data:`EMPTY_BAG` token).
        binned: dense only: True when the values were cut into quantile bins.
    """

    name: str
    kind: FeatureKind
    codes: np.ndarray
    missing: np.ndarray
    token_rows: np.ndarray | None = None
    token_codes: np.ndarray | None = None
    binned: bool = False

    @property
    def is_multi_hot(self) -> bool:
        return self.token_rows is not None

    def batch(self, start: int, stop: int, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(feature codes, label codes)`` of rows ``start:stop`` (token instances for multi-hot)."""
        if self.token_rows is None:
            return self.codes[start:stop], label[start:stop]
        lo, hi = np.searchsorted(self.token_rows, [start, stop])
        return self.token_codes[lo:hi], label[self.token_rows[lo:hi]]  # type: ignore[index]


def missing_mask(values: pd.Series, spec: FeatureSpec | None = None) -> np.ndarray:
    """Missing cells: NaN/None, an empty string, or ``spec.missing_value``."""
    miss = np.array(values.isna().to_numpy(), dtype=bool)
    if values.dtype == object or pd.api.types.is_string_dtype(values.dtype):
        miss |= (values == "").to_numpy()
    if spec is not None and spec.missing_value is not None:
        miss |= (values == spec.missing_value).to_numpy()
    return miss


def _quantile_codes(x: np.ndarray, bins: int) -> np.ndarray:
    """Quantile-bin codes of floats ``x`` (ties merge bins); NaN gets its own last code."""
    finite = np.isfinite(x)
    if not finite.any():
        return factorize(np.where(np.isnan(x), 0, np.sign(x)).astype(np.int64))
    edges = np.unique(np.quantile(x[finite], np.linspace(0.0, 1.0, bins + 1)[1:-1]))
    codes = np.searchsorted(edges, x, side="right").astype(np.int64)
    codes[np.isnan(x)] = len(edges) + 1
    return factorize(codes)


def encode_column(values: pd.Series, spec: FeatureSpec | None = None, dense_bins: int | None = 32) -> EncodedColumn:
    """Integer-code one raw column for OutRank.

    * categorical (and any column without a spec): every distinct raw value is a category, a
      missing cell (NaN or empty string) is one more category; ``"1"`` and ``1.0`` are
      different values, as in pandas ``category`` codes.
    * multi-categorical: cells are token strings joined by ``spec.separator``; each (row,
      token) pair becomes an instance carrying its row's label (empty tokens are dropped, a
      repeated token in one bag counts once, an empty bag is the one token ``<empty>``). The
      row-level ``codes`` are the bag's own codes (its cell string).
    * dense: with more than ``dense_bins`` distinct finite values, the values are cut into
      ``dense_bins`` quantile bins (ties merge bins, NaN its own bin); otherwise, or with
      ``dense_bins=None`` (the package's behaviour), every raw value is a category.

    Args:
        values: the column over the selected rows (any index).
        spec: the feature's schema entry (its kind and separator); None = categorical.
        dense_bins: quantile bins of a many-valued dense column; None keeps raw values.

    Returns:
        The :class:`EncodedColumn`.
    """
    kind = spec.kind if spec is not None else FeatureKind.CATEGORICAL
    name = spec.name if spec is not None else str(values.name)
    values = values.reset_index(drop=True)
    missing = missing_mask(values, spec)
    if kind is FeatureKind.MULTI_CATEGORICAL:
        sep = spec.separator if spec is not None else "|"
        cells = values.where(~missing, "").astype(str)
        parts = cells.str.split(sep, regex=False).explode()
        rows = parts.index.to_numpy(dtype=np.int64)
        tokens = parts.to_numpy(dtype=object)
        keep = tokens != ""
        has_token = np.bincount(rows[keep], minlength=len(values)) > 0
        empty_bag = ~has_token
        rows = np.concatenate([rows[keep], np.flatnonzero(empty_bag)])
        tokens = np.concatenate([tokens[keep], np.full(int(empty_bag.sum()), EMPTY_BAG, dtype=object)])
        tok = factorize(tokens)
        pairs = np.unique(rows * (int(tok.max()) + 1 if tok.size else 1) + tok)
        k = int(tok.max()) + 1 if tok.size else 1
        return EncodedColumn(name, kind, factorize(cells), empty_bag, token_rows=pairs // k, token_codes=pairs % k)
    if kind is FeatureKind.DENSE:
        x = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
        missing = missing | np.isnan(x)
        distinct = len(np.unique(x[~np.isnan(x)]))
        if dense_bins is not None and distinct > dense_bins:
            return EncodedColumn(name, kind, _quantile_codes(x, int(dense_bins)), missing, binned=True)
        return EncodedColumn(name, kind, factorize(values), missing)
    if missing.any() and not pd.api.types.is_numeric_dtype(values.dtype):  # NaN, None and "": one code
        values = values.where(values.notna(), "")
    return EncodedColumn(name, kind, factorize(values), missing)


def label_codes(
    raw: RawData,
    rows: np.ndarray | None = None,
    *,
    target_bins: int | None = None,
    max_classes: int = 50,
) -> np.ndarray:
    """Integer codes of the label over ``rows`` (positions into ``raw.frame``; None = all).

    Binary and multi-class integer (or string) labels are coded by value. A continuous target
    (non-integer floats, or more than ``max_classes`` distinct values) is refused unless
    ``target_bins=K`` bins it into K quantile bins.

    Raises:
        ValueError: naming the label column and ``raw.report.source`` for a missing label
            value, a continuous target without ``target_bins``, or a single class.
    """
    col_name = raw.schema.label
    source = raw.report.source
    col = raw.frame[col_name]
    if rows is not None:
        col = col.iloc[rows]
    if col.isna().any():
        raise ValueError(
            f"{source}: label column {col_name!r} has {int(col.isna().sum())} missing value(s); "
            f"drop or fill those rows before ranking"
        )
    numeric = pd.to_numeric(col, errors="coerce")
    is_numeric = not numeric.isna().any()
    if target_bins is not None:
        if not is_numeric:
            raise ValueError(f"{source}: target_bins needs a numeric label column, {col_name!r} is not")
        if target_bins < 2:
            raise ValueError(f"target_bins must be >= 2, got {target_bins}")
        codes = _quantile_codes(numeric.to_numpy(dtype=np.float64), int(target_bins))
    else:
        n_distinct = int(col.nunique())
        if is_numeric:
            x = numeric.to_numpy(dtype=np.float64)
            continuous = not np.all(np.isfinite(x)) or not np.all(x == np.round(x))
        else:
            continuous = False
        if continuous or n_distinct > max_classes:
            why = "non-integer values" if continuous else f"{n_distinct} distinct values (max_classes={max_classes})"
            raise ValueError(
                f"{source}: label column {col_name!r} looks like a continuous target ({why}); OutRank "
                f"groups rows by label value, so bin it: pass target_bins=K (e.g. OutRank(target_bins=10)) "
                f"to cut it into K quantile bins"
            )
        codes = factorize(numeric if is_numeric else col)
    if len(np.unique(codes)) < 2:
        value = col.iloc[0] if len(col) else None
        raise ValueError(
            f"{source}: label column {col_name!r} has a single class ({value!r} in all {len(col)} scored rows); "
            f"mutual information with the label is 0 for every feature, so nothing can be ranked"
        )
    return codes


# =============================================================================================
# the method's configuration
# =============================================================================================
@dataclass(frozen=True)
class OutRank(ImportanceMethod):
    """OutRank feature ranking (``name = "outrank"``); see the module docstring.

    Defaults were chosen on the planted-truth synthetic data (40k rows, 21 features, seeds
    0-2; precision@10 against the 11 features with a planted effect, whose ceiling is 0.9
    because the interaction pair ``ad_slot``/``daypart`` has no single-feature signal):

    ============================================================  ============
    setting                                                       precision@10
    ============================================================  ============
    relevance, package null                                       0.60
    relevance, rotation null                                      0.70
    combined, package null, plain-MI pairs, median (the package)  0.57
    combined, package null, corrected pairs, median               0.70
    combined, rotation null, corrected pairs, median              0.77
    combined, rotation null, corrected pairs, max (default)       0.90
    ============================================================  ============

    Use ``OutRank(null="package", dense_bins=None, ranking="relevance")`` to reproduce the
    package's ``MI-numba-randomized`` ranking.

    Args:
        minibatch_size (int): rows per mini-batch (the package's default 2^14). Scores are
            computed per batch and aggregated by the median.
        subsampling (int): keep every ``subsampling``-th row. The package defaults to 10
            because it streams huge files line by line; our data is already in memory, so 1.
        max_rows (int | None): when set, score a seeded random subset of at most this many rows
            (kept in file order: the null of the score depends on the row order).
        dense_bins (int | None): dense columns with more distinct values are cut into this many
            quantile bins (NaN its own bin); None treats raw values as categories like the
            package (a continuous column then looks ID-like and scores ~0).
        target_bins (int | None): bin a continuous target into this many quantile bins.
        max_classes (int): a label with more distinct values is treated as continuous.
        null (NullModel): ``rotation`` (default: a permutation-like null, about 5x less spread
            on skewed high-cardinality columns, so noise IDs stop ranking high) or
            ``package`` (the package's per-group shift, reproduces its scores exactly).
        null_rotations (int): rotations averaged by the ``rotation`` null.
        controls (bool): add the ``CONTROL-*`` columns (reported in ``extras["controls"]``,
            never ranked) and flag features below the noise control of matching cardinality.
        leakage_threshold (float): a feature scoring at least this share of the label copy's
            score is excluded as leakage.
        ranking (Ranking): ``combined`` (3MR, default) or ``relevance`` (S alone).
        alpha (float): weight of the redundancy term in 3MR.
        beta (float): weight of the relation term in 3MR.
        redundancy_score (RedundancyScore): ``corrected`` (S, default: plain MI is inflated
            by cardinality, so ID pairs look related; precision@10 0.6-0.8 with ``plain``) or
            ``plain`` plug-in MI (the package's last working 3MR).
        redundancy_agg (Aggregation): how D(s, f) is aggregated over the selected s. ``max``
            (default, our change): the package's ``median`` cannot demote an exact copy once
            three or more features are selected (the copy is unrelated to most of them).
        relation_agg (Aggregation): how Q(s, f) is aggregated (``median``, the package's).
        pair_batches (int | None): the redundancy and relation matrices are medians over at
            most this many batches (spread evenly; None = all); they cost 3 F^2 / 2 scores a
            batch.
        seed (int): seed of the controls and of ``max_rows``.
        progress (bool): show a progress bar over batches when there are more than 4.
    """

    name: ClassVar[str] = "outrank"

    minibatch_size: int = 2**14
    subsampling: int = 1
    max_rows: int | None = None
    dense_bins: int | None = 32
    target_bins: int | None = None
    max_classes: int = 50
    null: NullModel = NullModel.ROTATION
    null_rotations: int = 4
    controls: bool = True
    leakage_threshold: float = 0.9
    ranking: Ranking = Ranking.COMBINED
    alpha: float = 1.0
    beta: float = 1.0
    redundancy_score: RedundancyScore = RedundancyScore.CORRECTED
    redundancy_agg: Aggregation = Aggregation.MAX
    relation_agg: Aggregation = Aggregation.MEDIAN
    pair_batches: int | None = 8
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        for name, enum in (("ranking", Ranking), ("redundancy_score", RedundancyScore), ("null", NullModel),
                           ("redundancy_agg", Aggregation), ("relation_agg", Aggregation)):
            try:
                object.__setattr__(self, name, enum(getattr(self, name)))
            except ValueError:
                raise ValueError(
                    f"OutRank: {name}={getattr(self, name)!r} is not one of {[e.value for e in enum]}"
                ) from None
        for name, low in (("minibatch_size", 2), ("subsampling", 1), ("null_rotations", 1), ("max_classes", 2)):
            if getattr(self, name) < low:
                raise ValueError(f"OutRank: {name} must be >= {low}, got {getattr(self, name)}")
        for name, low in (("max_rows", 2), ("dense_bins", 2), ("target_bins", 2), ("pair_batches", 1)):
            if getattr(self, name) is not None and getattr(self, name) < low:
                raise ValueError(f"OutRank: {name} must be >= {low} or None, got {getattr(self, name)}")
        if not 0.0 < self.leakage_threshold <= 1.0:
            raise ValueError(f"OutRank: leakage_threshold must be in (0, 1], got {self.leakage_threshold}")

    def describe(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items()}

    def rank(self, recipe: Recipe) -> ImportanceReport:
        """Rank the features of the recipe's training split (test rows are never read)."""
        report = rank_raw(recipe.raw_split("train"), self)
        report.dataset = getattr(recipe, "dataset_name", report.dataset)
        return report

    def rank_raw(self, raw: RawData) -> ImportanceReport:
        """Rank the features of ``raw`` (all its rows)."""
        return rank_raw(raw, self)


# =============================================================================================
# scoring over batches
# =============================================================================================
@dataclass
class OutRankScores:
    """Per-feature relevance (and optionally pair) scores of one OutRank pass.

    Args:
        features: scored feature names, schema order.
        kinds: feature -> kind value.
        relevance: feature -> median over batches of S(feature; label).
        batch_relevance: feature -> per-batch scores.
        cardinality: feature -> median per-batch distinct values (tokens for multi-hot).
        constant: features with a single code over all scored rows.
        all_missing: features missing in every scored row.
        near_constant: features whose most common code holds >= 99% of the scored rows.
        controls: control name -> {"score", "cardinality"} (median over batches).
        label_copy_score: median S(label copy; label): the leakage reference.
        label_entropy: median H(label) (the label-vs-itself pair: plain MI).
        rows_scored / batches / seconds: what was scored and how long it took.
        pair_features: features of the pair matrices (None when not computed).
        redundancy: ``D[i, j]`` = score of feature j with feature i in the label's role.
        relation: ``Q[i, j]`` = score of the pair column "i AND j" against the label.
    """

    features: list[str]
    kinds: dict[str, str]
    relevance: dict[str, float]
    batch_relevance: dict[str, list[float]]
    cardinality: dict[str, float]
    constant: set[str]
    all_missing: set[str]
    near_constant: set[str]
    controls: dict[str, dict[str, float]]
    label_copy_score: float
    label_entropy: float
    rows_scored: int
    batches: int
    seconds: float
    pair_features: list[str] | None = None
    redundancy: np.ndarray | None = None
    relation: np.ndarray | None = None

    def spread(self, feature: str) -> float | None:
        """Across-batch IQR of ``feature``'s relevance (None with a single batch)."""
        xs = self.batch_relevance[feature]
        if len(xs) < 2:
            return None
        q1, q3 = np.percentile(xs, [25, 75])
        return float(q3 - q1)

    def leakage(self, threshold: float) -> dict[str, str]:
        """Features scoring at least ``threshold`` x the label copy's score -> reason."""
        ref = self.label_copy_score
        out = {}
        if ref <= 0:
            return out
        for f in self.features:
            s = self.relevance[f]
            if s >= threshold * ref:
                out[f] = f"leakage: score {s:.4g} = {s / ref:.2f} x the label copy's ({ref:.4g})"
        return out

    def below_noise(self) -> dict[str, str]:
        """Features scoring below the noise control closest in log-cardinality -> that control."""
        noise = {n: c for n, c in self.controls.items() if n.removeprefix(CONTROL_PREFIX) in _NOISE_CONTROLS}
        out: dict[str, str] = {}
        if not noise:
            return out
        for f in self.features:
            if f in self.constant:
                continue
            card = max(self.cardinality[f], 1.0)
            dist = {n: abs(math.log(card) - math.log(max(c["cardinality"], 1.0))) for n, c in noise.items()}
            best = min(dist.values())
            closest = [n for n, d in dist.items() if d <= best + 1e-9]
            ref = max(closest, key=lambda n: noise[n]["score"])
            if self.relevance[f] < noise[ref]["score"]:
                out[f] = ref
        return out


def _select_rows(n: int, method: OutRank) -> np.ndarray:
    rows = np.arange(0, n, method.subsampling, dtype=np.int64)
    if method.max_rows is not None and len(rows) > method.max_rows:
        rng = np.random.default_rng([method.seed, 1])
        rows = np.sort(rng.choice(rows, size=method.max_rows, replace=False))
    return rows


def _batches(n: int, size: int) -> list[tuple[int, int]]:
    """Row ranges of the mini-batches; a trailing partial batch of <= 1024 rows is dropped
    (the package's rule) unless it is the only batch (the package would score nothing)."""
    out = [(s, min(s + size, n)) for s in range(0, n, size)]
    if len(out) > 1 and out[-1][1] - out[-1][0] <= MIN_TRAILING_BATCH:
        out.pop()
    return out


def _row_hash(columns: Iterable[np.ndarray], n: int) -> np.ndarray:
    """FNV-style hash of each row's codes (uint64 arithmetic wraps)."""
    h = np.full(n, 14695981039346656037, dtype=np.uint64)
    prime = np.uint64(1099511628211)
    for c in columns:
        h = (h ^ c.astype(np.uint64)) * prime
    return h


def _control_columns(rng: np.random.Generator, label: np.ndarray, start: int,
                     row_hash: np.ndarray) -> dict[str, np.ndarray]:
    """The control columns of one batch (random ones redrawn every batch)."""
    n = len(label)
    return {
        "constant": np.zeros(n, dtype=np.int64),
        "gaussian": factorize(rng.standard_normal(n)),
        "uniform": factorize(rng.random(n)),
        "binary": rng.integers(0, 2, n),
        "int100": rng.integers(0, 101, n),
        "int2000": rng.integers(0, 2001, n),
        "int10000": rng.integers(0, 10001, n),
        "int50000": rng.integers(0, 50001, n),
        "sequence": start + np.arange(n, dtype=np.int64),
        "label-copy": label.copy(),
        "row-hash": factorize(row_hash),
    }


def _pair_batch_ids(n_batches: int, cap: int | None) -> set[int]:
    if cap is None or n_batches <= cap:
        return set(range(n_batches))
    return {int(round(x)) for x in np.linspace(0, n_batches - 1, cap)}


def _compact(x: np.ndarray) -> np.ndarray:
    return np.unique(x, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _pair_view(a: EncodedColumn, b: EncodedColumn, start: int, stop: int,
               label: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes of ``a`` and ``b`` and the label over the instances of rows ``start:stop``.

    Row-level unless one column is multi-hot: then one instance per (row, token) of that
    column, the other column's row code repeated (two multi-hot columns: ``a``'s tokens
    against ``b``'s whole bag).
    """
    for m, other, swap in ((a, b, False), (b, a, True)):
        if m.token_rows is not None:
            lo, hi = np.searchsorted(m.token_rows, [start, stop])
            rows = m.token_rows[lo:hi]
            tok = m.token_codes[lo:hi]  # type: ignore[index]
            oth = other.codes[rows]
            return (oth, tok, label[rows]) if swap else (tok, oth, label[rows])
    return a.codes[start:stop], b.codes[start:stop], label[start:stop]


def _pair_matrices(cols: list[EncodedColumn], start: int, stop: int, label: np.ndarray, plain: bool,
                   null: NullModel, rotations: int) -> tuple[np.ndarray, np.ndarray]:
    """Redundancy ``D[i, j] = score(x_j; x_i)`` and relation ``Q[i, j] = score(x_i AND x_j; label)``."""

    def score(x: np.ndarray, y: np.ndarray) -> float:
        return plain_mi(x, y) if plain else outrank_score(x, y, null, rotations)

    f = len(cols)
    d = np.zeros((f, f))
    q = np.zeros((f, f))
    for i in range(f):
        for j in range(i + 1, f):
            xi, xj, lab = _pair_view(cols[i], cols[j], start, stop, label)
            xi, xj = _compact(xi), _compact(xj)
            d[i, j] = score(xj, xi)
            d[j, i] = score(xi, xj)
            q[i, j] = q[j, i] = score(pair_codes(xi, xj), lab)
    return d, q


def _progress(items: list[Any], show: bool, desc: str) -> Iterator[Any]:
    if not show:
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(items, desc=desc, leave=False)


def score_raw(raw: RawData, method: OutRank | None = None, *, pairs: bool | None = None) -> OutRankScores:
    """Score every feature of ``raw`` against its label, batch by batch (no ranking).

    Args:
        raw: the data (its label column is the target).
        method: the settings (default :class:`OutRank`()).
        pairs: also compute the redundancy and relation matrices over the non-constant
            features; default: when ``method.ranking`` is ``combined``.

    Returns:
        :class:`OutRankScores`.
    """
    method = method or OutRank()
    pairs = method.ranking is Ranking.COMBINED if pairs is None else pairs
    t0 = time.perf_counter()
    rows = _select_rows(len(raw.frame), method)
    label = label_codes(raw, rows, target_bins=method.target_bins, max_classes=method.max_classes)
    specs = raw.schema.features
    cols = [encode_column(raw.frame[s.name].iloc[rows], s, method.dense_bins) for s in specs]
    names = [s.name for s in specs]
    n = len(rows)
    batches = _batches(n, method.minibatch_size)

    constant = {c.name for c in cols if len(np.unique(c.codes)) <= 1}
    all_missing = {c.name for c in cols if c.missing.all()}
    near_constant = set()
    for c in cols:
        if c.name not in constant and np.bincount(c.codes).max() >= 0.99 * n:
            near_constant.add(c.name)
    pair_names = [c.name for c in cols if c.name not in constant]
    pair_cols = [c for c in cols if c.name not in constant]
    pair_ids = _pair_batch_ids(len(batches), method.pair_batches) if pairs else set()

    rel: dict[str, list[float]] = {f: [] for f in names}
    card: dict[str, list[int]] = {f: [] for f in names}
    ctrl: dict[str, list[float]] = {}
    ctrl_card: dict[str, list[int]] = {}
    label_entropy: list[float] = []
    d_list, q_list = [], []
    rng = np.random.default_rng(method.seed)

    def score(x: np.ndarray, y: np.ndarray) -> float:
        return outrank_score(x, y, method.null, method.null_rotations)

    show = method.progress and len(batches) > 4
    for b, (start, stop) in enumerate(_progress(batches, show, "outrank batches")):
        lab = label[start:stop]
        label_entropy.append(plain_mi(lab, lab))  # the label-vs-itself pair: plain MI
        for c in cols:
            x, y = c.batch(start, stop, label)
            rel[c.name].append(score(x, y))
            card[c.name].append(len(np.unique(x)))
        if method.controls:
            h = _row_hash((c.codes[start:stop] for c in cols), stop - start)
            for cname, x in _control_columns(rng, lab, start, h).items():
                key = CONTROL_PREFIX + cname
                ctrl.setdefault(key, []).append(score(x, lab))
                ctrl_card.setdefault(key, []).append(len(np.unique(x)))
        if b in pair_ids and pair_cols:
            d, q = _pair_matrices(pair_cols, start, stop, label, method.redundancy_score is RedundancyScore.PLAIN,
                                  method.null, method.null_rotations)
            d_list.append(d)
            q_list.append(q)
    label_copy = [score(label[s:e], label[s:e]) for s, e in batches]
    seconds = time.perf_counter() - t0
    return OutRankScores(
        features=names,
        kinds={s.name: s.kind.value for s in specs},
        relevance={f: float(np.median(v)) for f, v in rel.items()},
        batch_relevance={f: [float(x) for x in v] for f, v in rel.items()},
        cardinality={f: float(np.median(v)) for f, v in card.items()},
        constant=constant,
        all_missing=all_missing,
        near_constant=near_constant,
        controls={
            k: {"score": float(np.median(v)), "cardinality": float(np.median(ctrl_card[k]))} for k, v in ctrl.items()
        },
        label_copy_score=float(np.median(label_copy)),
        label_entropy=float(np.median(label_entropy)),
        rows_scored=int(sum(e - s for s, e in batches)),
        batches=len(batches),
        seconds=seconds,
        pair_features=pair_names if pairs else None,
        redundancy=np.median(np.stack(d_list), axis=0) if d_list else None,
        relation=np.median(np.stack(q_list), axis=0) if q_list else None,
    )


# =============================================================================================
# 3MR and the report
# =============================================================================================
def _minmax(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    vals = x[mask] if mask is not None else x
    if vals.size == 0:
        return np.zeros_like(x)
    lo, hi = float(vals.min()), float(vals.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


_AGG = {Aggregation.MEDIAN: np.median, Aggregation.MEAN: np.mean, Aggregation.MAX: np.max}


def combined_ranking(
    relevance: Sequence[float],
    redundancy: np.ndarray,
    relation: np.ndarray,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    redundancy_agg: Aggregation | str = Aggregation.MEDIAN,
    relation_agg: Aggregation | str = Aggregation.MEDIAN,
) -> tuple[list[int], list[float]]:
    """3MR greedy order ("minimum redundancy, maximum relevance, maximum relation", methods.md 2.3).

    Each family is min-max normalised (D and Q over their off-diagonal entries). Start with
    the most relevant feature; then repeatedly add the unselected f maximising
    ``R(f) - alpha * agg_{s in S} D(s, f) + beta * agg_{s in S} Q(s, f)`` (the package:
    ``agg`` = median for both).

    Args:
        relevance: ``R`` of F features.
        redundancy: F x F, ``D[s, f]`` = score of f with s in the label's role.
        relation: F x F, ``Q[s, f]`` = score of the pair column "s AND f" against the label.
        alpha: weight of redundancy.
        beta: weight of relation.
        redundancy_agg: aggregation of D over the selected features.
        relation_agg: aggregation of Q over the selected features.

    Returns:
        ``(order, gains)``: feature indices in selection order and the objective value each had
        when selected (the first one's is its normalised relevance).
    """
    r = _minmax(np.asarray(relevance, dtype=np.float64))
    f = len(r)
    if f == 0:
        return [], []
    off = ~np.eye(f, dtype=bool)
    d = _minmax(np.asarray(redundancy, dtype=np.float64), off)
    q = _minmax(np.asarray(relation, dtype=np.float64), off)
    red, rel = _AGG[Aggregation(redundancy_agg)], _AGG[Aggregation(relation_agg)]
    first = int(np.argmax(r))
    order, gains = [first], [float(r[first])]
    left = np.ones(f, dtype=bool)
    left[first] = False
    while left.any():
        sel = np.asarray(order)
        gain = r - alpha * red(d[sel], axis=0) + beta * rel(q[sel], axis=0)
        gain[~left] = -np.inf
        nxt = int(np.argmax(gain))
        order.append(nxt)
        gains.append(float(gain[nxt]))
        left[nxt] = False
    return order, gains


def rank_raw(raw: RawData, method: OutRank | None = None) -> ImportanceReport:
    """Run OutRank on ``raw`` and build the :class:`ImportanceReport`.

    Ranked rows: every feature except the excluded (leakage) ones; constant and entirely
    missing features come last (flags ``constant`` / ``missing``) with the lowest score shown
    (their S is exactly 0, but 0 can beat features whose S is slightly negative), so scores
    never increase down the ranking.
    ``score`` is the corrected relevance S (``ranking="relevance"``) or, for ``combined``, the
    largest 3MR objective at or after the feature's position, so scores never increase down
    the ranking (the raw objective at each greedy step can rise: the first pick has no
    redundancy or relation term; it is kept in ``extras["combined"]["gain"]``). ``uncertainty`` is the
    across-batch IQR of the relevance (None for one batch).

    Extras: ``relevance`` (feature -> S), ``redundancy`` (``features`` and ``matrix``, D[i][j]
    = score of feature j with feature i as the target), ``relation`` (same layout),
    ``controls`` (name -> score, cardinality), ``label_entropy``, ``label_copy_score``,
    ``rows_scored``, ``batches``, ``rows_per_second``.
    """
    method = method or OutRank()
    t0 = time.perf_counter()
    scores = score_raw(raw, method)
    excluded = scores.leakage(method.leakage_threshold)
    below = scores.below_noise() if method.controls else {}

    flags: dict[str, list[str]] = {f: [] for f in scores.features}
    for f in scores.features:
        if f in scores.all_missing:
            flags[f].append("missing")
        if f in scores.constant:
            flags[f].append("constant")
        if f in scores.near_constant:
            flags[f].append("near_constant")
        if f in below:
            flags[f].append("below_noise")
    ranked = [f for f in scores.features if f not in excluded and f not in scores.constant]
    last = [f for f in scores.features if f not in excluded and f in scores.constant]

    extras: dict[str, Any] = {"relevance": dict(scores.relevance)}
    if method.ranking is Ranking.COMBINED and scores.pair_features is not None and ranked:
        pos = {f: i for i, f in enumerate(scores.pair_features)}
        idx = np.array([pos[f] for f in ranked])
        d = scores.redundancy[np.ix_(idx, idx)]  # type: ignore[index]
        q = scores.relation[np.ix_(idx, idx)]  # type: ignore[index]
        order, gains = combined_ranking([scores.relevance[f] for f in ranked], d, q, alpha=method.alpha,
                                        beta=method.beta, redundancy_agg=method.redundancy_agg,
                                        relation_agg=method.relation_agg)
        ranked = [ranked[i] for i in order]
        shown = list(np.maximum.accumulate(np.asarray(gains)[::-1])[::-1])
        value = dict(zip(ranked, shown))
        floor = min(shown) if shown else 0.0
        value.update({f: floor for f in last})
        extras["combined"] = {"order": ranked, "gain": gains}
    else:
        ranked.sort(key=lambda f: -scores.relevance[f])  # stable: ties keep schema order
        value = {f: scores.relevance[f] for f in ranked}
        floor = min([0.0, *value.values()])
        value.update({f: floor for f in last})
    if scores.pair_features is not None and scores.redundancy is not None and scores.relation is not None:
        extras["redundancy"] = {"features": scores.pair_features, "matrix": scores.redundancy.tolist()}
        extras["relation"] = {"features": scores.pair_features, "matrix": scores.relation.tolist()}
    extras["controls"] = scores.controls
    extras["below_noise"] = below
    extras.update(
        label_entropy=scores.label_entropy,
        label_copy_score=scores.label_copy_score,
        rows_scored=scores.rows_scored,
        batches=scores.batches,
        rows_per_second=scores.rows_scored / scores.seconds if scores.seconds > 0 else None,
    )
    specs = {s.name: s for s in raw.schema.features}
    rows = [
        FeatureImportance(
            feature=f,
            score=float(value[f]),
            rank=r + 1,
            uncertainty=scores.spread(f),
            width=specs[f].embedding_dim if specs[f].is_sparse else 1,
            kind=specs[f].kind.value,
            flags=tuple(flags[f]),
        )
        for r, f in enumerate([*ranked, *last])
    ]
    return ImportanceReport(
        method=OutRank.name,
        features=rows,
        config=method.describe(),
        cost_seconds=time.perf_counter() - t0,
        dataset=raw.schema.name,
        excluded=excluded,
        extras=extras,
    )

