"""OutRank's pass over the rows: mini-batches, noise controls and pair matrices -> :class:`OutRankScores`.

:func:`score_raw` scores every feature of a :class:`~recsys.data.raw.RawData` against its label
with the settings of an :class:`OutRankConfig` (:class:`selection.model_free.outrank.OutRank` is one), batch
by batch, without ranking; :mod:`selection.model_free.outrank` turns the scores into the report and
:func:`selection.base.screen_leakage` reads the label-copy check from them.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from enum import Enum, unique
from typing import Any

import numpy as np

from recsys.data.raw import RawData
from recsys.data.schema import Schema
from recsys.parallel import map_ordered
from selection.model_free.column_codes import EncodedColumn, encode_column, encode_feature, label_codes
from selection.model_free.mutual_info import (
    NullModel,
    distinct_count,
    factorize,
    outrank_score,
    pair_codes,
    plain_mi,
    rotation_significance,
)

__all__ = [
    "CONTROL_PREFIX",
    "MIN_TRAILING_BATCH",
    "NEAR_CONSTANT_SHARE",
    "Aggregation",
    "BatchScores",
    "OutRankConfig",
    "OutRankScores",
    "Ranking",
    "RedundancyScore",
    "memorisable_features",
    "redundant_features",
    "score_raw",
]

#: a feature whose most common code holds this share of the scored rows is near-constant
NEAR_CONSTANT_SHARE = 0.99
#: prefix of the control (noise baseline) columns
CONTROL_PREFIX = "CONTROL-"
#: a trailing partial batch is scored only above this many rows (unless it is the only batch)
MIN_TRAILING_BATCH = 1024
#: chunks of each pair batch the synergy is scored on (the spread its significance is judged by)
SYNERGY_CHUNKS = 4
#: pair batches the synergy is scored on (the first ones; it costs about two more pair matrices)
SYNERGY_BATCHES = 3
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
class Aggregation(str, Enum):
    """How 3MR aggregates a pair score over the already selected features."""

    MEDIAN = "median"  # the package's default
    MEAN = "mean"
    MAX = "max"  # the strongest pair: an exact copy of any selected feature is demoted


@dataclass(frozen=True)
class OutRankConfig:
    """The settings of an OutRank pass, what :func:`score_raw` reads (each one is documented on
    :class:`selection.model_free.outrank.OutRank`, the importance method built on them)."""

    minibatch_size: int = 2**14
    max_batch_bytes: int | None = 1 << 30
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
    pair_features: int | None = 48
    interactions: bool = True
    interaction_alpha: float = 0.01
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
        for name, low in (("max_batch_bytes", 1), ("max_rows", 2), ("dense_bins", 2), ("target_bins", 2), ("pair_batches", 1), ("pair_features", 2)):
            if getattr(self, name) is not None and getattr(self, name) < low:
                raise ValueError(f"OutRank: {name} must be >= {low} or None, got {getattr(self, name)}")
        if not 0.0 < self.leakage_threshold <= 1.0:
            raise ValueError(f"OutRank: leakage_threshold must be in (0, 1], got {self.leakage_threshold}")

    def batch_rows(self, schema: Schema) -> int:
        """Rows per mini-batch: ``minibatch_size``, or fewer where a batch of ``schema``'s parsed
        rows would pass ``max_batch_bytes`` (at thousands of columns; never below 256 rows)."""
        from recsys.data.streaming.chunking import parsed_row_bytes, rows_within

        if self.max_batch_bytes is None:
            return self.minibatch_size
        return min(self.minibatch_size, rows_within(self.max_batch_bytes, parsed_row_bytes(schema), self.minibatch_size))

    def describe(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items()}


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
        synergy: per chunk of a pair batch (C x F x F), ``S[i, j]`` = what feature i adds to the pair
            "i AND j" beyond its own score, against a row permutation of i (see :func:`_pair_matrices`).
        interaction_alpha: family-wise error rate of the synergy tests (:meth:`interaction_partners`).
        pairs_pruned: the pair matrices cover ``pair_features`` only, the ``pair_features`` most
            relevant features of the first pair batch among more (``OutRankConfig.pair_features``),
            and no synergy was scored (:meth:`untested`).
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
    synergy: np.ndarray | None = None
    interaction_alpha: float = 0.01
    pairs_pruned: bool = False

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
        out: dict[str, str] = {}
        if ref <= 0:
            return out
        for f in self.features:
            s = self.relevance[f]
            if s >= threshold * ref:
                out[f] = f"leakage: score {s:.4g} = {s / ref:.2f} x the label copy's ({ref:.4g})"
        return out

    def interaction_partners(self) -> dict[str, tuple[str, float]]:
        """Features whose signal shows in a pair -> (partner, mean synergy in nats).

        A pair counts when the mean of ``synergy[i, j]`` over the C chunks of the pair batches is
        above 0 by a one-sided t test with a Bonferroni correction over the F (F - 1) ordered
        pairs: ``mean / se > t_{1 - alpha / (F (F - 1))}(C - 1)``; the partner is the pair with
        the largest such mean. Few chunks (small data) make the test strict: with fewer than 3,
        nothing counts.
        """
        if self.synergy is None or self.pair_features is None or len(self.synergy) < 3 or len(self.pair_features) < 2:
            return {}
        from scipy.stats import t as student

        n, f = len(self.synergy), len(self.pair_features)
        mean = self.synergy.mean(axis=0)
        se = self.synergy.std(axis=0, ddof=1) / math.sqrt(n)
        critical = float(student.ppf(1.0 - self.interaction_alpha / (f * (f - 1)), df=n - 1))
        significant = (mean > 0) & (mean > critical * se)
        np.fill_diagonal(significant, False)
        out: dict[str, tuple[str, float]] = {}
        for i, name in enumerate(self.pair_features):
            if significant[i].any():
                j = int(np.argmax(np.where(significant[i], mean[i], -np.inf)))
                out[name] = (self.pair_features[j], float(mean[i, j]))
        return out

    def below_noise(self, interactions: bool = True) -> dict[str, str]:
        """Features scoring below the noise control closest in log-cardinality -> that control.

        With ``interactions`` (and pair scores computed), a feature with an
        :meth:`interaction_partners` entry is not listed: its signal is in a pair (the
        planted ``ad_slot`` x ``daypart`` of the synthetic data), not absent. Nor is, when the
        pairs were pruned, a feature outside them: its pairs were never tested
        (:meth:`untested`).
        """
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
        if interactions:
            for f in self.interaction_partners():
                out.pop(f, None)
            for f in self.untested(out):
                out.pop(f, None)
        return out

    def untested(self, below: dict[str, str] | None = None) -> dict[str, str]:
        """Features below the noise control that were never tested for an interaction, so a noise
        gate must keep them -> that control; empty unless the pairs were pruned. With pruned
        pairs no synergy is scored at all: testing each of W weak features against every other
        costs W x F pair scores (20M at F = 5,000), and the pair candidates are chosen by their
        own relevance, which a pure interaction's members lack."""
        if not self.pairs_pruned:
            return {}
        return dict(self.below_noise(interactions=False) if below is None else below)


def _select_rows(n: int, method: OutRankConfig) -> np.ndarray:
    rows = np.arange(0, n, method.subsampling, dtype=np.int64)
    if method.max_rows is not None and len(rows) > method.max_rows:
        rng = np.random.default_rng([method.seed, 1])
        rows = np.sort(rng.choice(rows, size=method.max_rows, replace=False))
    return rows


def batch_ranges(n: int, size: int) -> list[tuple[int, int]]:
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
    for c in columns:  # in place: int64 codes viewed as uint64 are their astype (two's complement)
        np.bitwise_xor(h, c.view(np.uint64) if c.dtype == np.int64 else c.astype(np.uint64), out=h)
        np.multiply(h, prime, out=h)
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


def pair_batch_ids(n_batches: int, cap: int | None) -> set[int]:
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
                   null: NullModel, rotations: int, rng: np.random.Generator | None = None,
                   weak: set[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Redundancy ``D[i, j] = score(x_j; x_i)``, relation ``Q[i, j] = score(x_i AND x_j; label)``
    and, with ``rng``, synergy ``S[c, i, j] = Q_c[i, j] - score(π(x_i) AND x_j; label) - score(x_i; label)``
    on each of :data:`SYNERGY_CHUNKS` consecutive chunks c of the batch (corrected scores):
    what x_i adds to the pair beyond its own score, against the same pair with x_i's rows
    permuted (π drawn from ``rng``), which keeps both cardinalities, so the bias of a many-valued
    pair cancels. ~0 when x_i and x_j carry no signal together; large for a feature whose signal
    is only in an interaction with x_j. Only rows i in ``weak`` (default: all) are scored, the
    features the noise gate could drop (below this batch's strongest noise control); the others
    stay 0."""

    def score(x: np.ndarray, y: np.ndarray) -> float:
        return plain_mi(x, y) if plain else outrank_score(x, y, null, rotations)

    def corrected(x: np.ndarray, y: np.ndarray) -> float:
        return outrank_score(x, y, null, rotations)

    f = len(cols)
    d = np.zeros((f, f))
    q = np.zeros((f, f))
    syn = np.zeros((SYNERGY_CHUNKS, f, f)) if rng is not None else None
    for i in range(f):
        for j in range(i + 1, f):
            xi, xj, lab = _pair_view(cols[i], cols[j], start, stop, label)
            xi, xj = _compact(xi), _compact(xj)
            d[i, j] = score(xj, xi)
            d[j, i] = score(xi, xj)
            q[i, j] = q[j, i] = score(pair_codes(xi, xj), lab)
            if syn is None or rng is None:
                continue
            for c, part in enumerate(np.array_split(np.arange(len(xi)), SYNERGY_CHUNKS)):
                a, b, y = _compact(xi[part]), _compact(xj[part]), lab[part]
                perm_a, perm_b = rng.permutation(len(a)), rng.permutation(len(b))  # drawn always: same stream
                if weak is not None and i not in weak and j not in weak:
                    continue
                pair = corrected(pair_codes(a, b), y)
                if weak is None or i in weak:
                    syn[c, i, j] = pair - corrected(pair_codes(a[perm_a], b), y) - corrected(a, y)
                if weak is None or j in weak:
                    syn[c, j, i] = pair - corrected(pair_codes(a, b[perm_b]), y) - corrected(b, y)
    return d, q, syn


def _progress(items: list[Any], show: bool, desc: str) -> Iterator[Any]:
    if not show:
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(items, desc=desc, leave=False)


class BatchScores:
    """The per-batch scores of one OutRank pass, batch by batch, and their aggregation.

    :func:`score_raw` (all rows in memory) and :func:`selection.model_free.outrank_stream.score_stream`
    (rows read in chunks) both feed their batches here, so they score them identically.

    Args:
        method: the settings.
        names: scored feature names, schema order.
        pair_names: the features of the pair matrices (the non-constant ones).
        pair_ids: batch numbers whose pair matrices are computed.
    """

    def __init__(self, method: OutRankConfig, names: list[str], pair_names: list[str], pair_ids: set[int]) -> None:
        self.method = method
        self.names = names
        self.pair_names = pair_names
        self.pair_ids = pair_ids
        self._pair_set = set(pair_names)
        self.pairs_pruned = False
        self.rel: dict[str, list[float]] = {f: [] for f in names}
        self.card: dict[str, list[int]] = {f: [] for f in names}
        self.ctrl: dict[str, list[float]] = {}
        self.ctrl_card: dict[str, list[int]] = {}
        self.label_entropy: list[float] = []
        self.label_copy: list[float] = []
        self.d_list: list[np.ndarray] = []
        self.q_list: list[np.ndarray] = []
        self.s_list: list[np.ndarray] = []
        self.rows = 0
        self.batches = 0
        self.rng = np.random.default_rng(method.seed)

    def _score(self, x: np.ndarray, y: np.ndarray) -> float:
        return outrank_score(x, y, self.method.null, self.method.null_rotations)

    def _relevance(self, c: EncodedColumn, lo: int, hi: int, label: np.ndarray) -> tuple[float, int]:
        x, y = c.batch(lo, hi, label)
        return self._score(x, y), distinct_count(x)

    def add(self, cols: list[EncodedColumn], lo: int, hi: int, label: np.ndarray, start: int) -> None:
        """Score batch number ``self.batches``: rows ``lo:hi`` of the encoded ``cols`` and of
        ``label`` (codes over the same rows), ``start`` its first row in the scored order."""
        method, b = self.method, self.batches
        lab = label[lo:hi]
        controls: dict[str, np.ndarray] = {}
        if method.controls:  # drawn here, in batch order (one generator)
            controls = _control_columns(self.rng, lab, start, _row_hash((c.codes[lo:hi] for c in cols), hi - lo))

        def score(item: EncodedColumn | np.ndarray | None) -> tuple[float, float | int]:
            if isinstance(item, EncodedColumn):
                return self._relevance(item, lo, hi, label)
            if item is None:  # the label against itself: plain MI and the label-copy score
                return plain_mi(lab, lab), self._score(lab, lab)
            return self._score(item, lab), distinct_count(item)

        # features, controls and the label on the column pool, one score per task; appended in order
        scored = map_ordered(score, [*cols, *controls.values(), None])
        for c, (rel, card) in zip(cols, scored):
            self.rel[c.name].append(rel)
            self.card[c.name].append(int(card))
        for cname, (ctrl, card) in zip(controls, scored[len(cols):]):
            self.ctrl.setdefault(CONTROL_PREFIX + cname, []).append(ctrl)
            self.ctrl_card.setdefault(CONTROL_PREFIX + cname, []).append(int(card))
        entropy, copy = scored[-1]
        self.label_entropy.append(entropy)
        self.label_copy.append(float(copy))
        if b in self.pair_ids and not self.d_list:
            self._prune_pairs()
        pair_cols = [c for c in cols if c.name in self._pair_set]
        if b in self.pair_ids and pair_cols:
            noise = [v[-1] for k, v in self.ctrl.items() if k.removeprefix(CONTROL_PREFIX) in _NOISE_CONTROLS]
            weak = {i for i, c in enumerate(pair_cols) if not noise or self.rel[c.name][-1] < max(noise)}
            d, q, syn = _pair_matrices(pair_cols, lo, hi, label, method.redundancy_score is RedundancyScore.PLAIN,
                                       method.null, method.null_rotations,
                                       np.random.default_rng([method.seed, 2, b])
                                       if method.interactions and not self.pairs_pruned
                                       and len(self.s_list) < SYNERGY_BATCHES * SYNERGY_CHUNKS else None, weak)
            if syn is not None:
                self.s_list.extend(syn)
            self.d_list.append(d)
            self.q_list.append(q)
        self.rows += hi - lo
        self.batches += 1

    def _prune_pairs(self) -> None:
        """Keep the ``pair_features`` most relevant features of this (the first pair) batch for
        the pair matrices, when there are more: pairs cost ~3 F^2 / 2 scores a batch."""
        cap = self.method.pair_features
        if cap is None or len(self.pair_names) <= cap:
            return
        latest = {f: self.rel[f][-1] for f in self.pair_names}
        keep = set(sorted(self.pair_names, key=lambda f: -latest[f])[:cap])
        self.pair_names = [f for f in self.pair_names if f in keep]
        self._pair_set = keep
        self.pairs_pruned = True

    def finish(self, kinds: dict[str, str], constant: set[str], all_missing: set[str], near_constant: set[str],
               pairs: bool, seconds: float) -> OutRankScores:
        """The :class:`OutRankScores` of the batches added."""
        return OutRankScores(
            features=self.names,
            kinds=kinds,
            relevance={f: float(np.median(v)) for f, v in self.rel.items()},
            batch_relevance={f: [float(x) for x in v] for f, v in self.rel.items()},
            cardinality={f: float(np.median(v)) for f, v in self.card.items()},
            constant=constant,
            all_missing=all_missing,
            near_constant=near_constant,
            controls={
                k: {"score": float(np.median(v)), "cardinality": float(np.median(self.ctrl_card[k]))}
                for k, v in self.ctrl.items()
            },
            label_copy_score=float(np.median(self.label_copy)),
            label_entropy=float(np.median(self.label_entropy)),
            rows_scored=self.rows,
            batches=self.batches,
            seconds=seconds,
            pair_features=self.pair_names if pairs else None,
            redundancy=np.median(np.stack(self.d_list), axis=0) if self.d_list else None,
            relation=np.median(np.stack(self.q_list), axis=0) if self.q_list else None,
            synergy=np.stack(self.s_list) if self.s_list else None,
            interaction_alpha=self.method.interaction_alpha,
            pairs_pruned=self.pairs_pruned and pairs,
        )


def score_raw(raw: RawData, method: OutRankConfig | None = None, *, pairs: bool | None = None) -> OutRankScores:
    """Score every feature of ``raw`` against its label, batch by batch (no ranking).

    Args:
        raw: the data (its label column is the target).
        method: the settings (default :class:`OutRankConfig`(), the defaults of :class:`OutRank`).
        pairs: also compute the redundancy and relation matrices over the non-constant
            features; default: when ``method.ranking`` is ``combined``.

    Returns:
        :class:`OutRankScores`.
    """
    method = method or OutRankConfig()
    pairs = method.ranking is Ranking.COMBINED if pairs is None else pairs
    t0 = time.perf_counter()
    rows = _select_rows(len(raw.frame), method)
    label = label_codes(raw, rows, target_bins=method.target_bins, max_classes=method.max_classes)
    specs = raw.schema.features
    cols = [encode_feature(raw.frame, s, method.dense_bins, rows) for s in specs]
    n = len(rows)
    batches = batch_ranges(n, method.batch_rows(raw.schema))

    constant = {c.name for c in cols if len(np.unique(c.codes)) <= 1}
    all_missing = {c.name for c in cols if c.missing.all()}
    near_constant = set()
    for c in cols:
        if c.name not in constant and np.bincount(c.codes).max() >= NEAR_CONSTANT_SHARE * n:
            near_constant.add(c.name)
    pair_names = [c.name for c in cols if c.name not in constant]
    pair_ids = pair_batch_ids(len(batches), method.pair_batches) if pairs else set()
    acc = BatchScores(method, [s.name for s in specs], pair_names, pair_ids)
    show = method.progress and len(batches) > 4
    for start, stop in _progress(batches, show, "outrank batches"):
        acc.add(cols, start, stop, label, start)
    return acc.finish({s.name: s.kind.value for s in specs}, constant, all_missing, near_constant, pairs,
                      time.perf_counter() - t0)


def redundant_features(raw: RawData, ranking: list[str], threshold: float = 0.9, rows: int = 2**14,
                       dense_bins: int | None = 32, candidates: int | None = 256) -> dict[str, str]:
    """Features of ``ranking`` that (nearly) copy a feature ranked above them -> that feature.

    Walking the ranking down, feature j is redundant with an earlier kept feature i when the
    corrected score of j grouped by i reaches ``threshold`` x j's score grouped by itself:
    ``S(x_j; x_i) >= threshold * S(x_j; x_j)`` (:func:`~selection.model_free.mutual_info.outrank_score`,
    rotation null), i.e. i determines j as well as j does itself (a relabelled copy, a rescaled
    dense column). The null's correction keeps an ID-like i (a distinct value in nearly every
    row, which "determines" anything in a sample) from claiming every feature. Read on the
    first ``rows`` rows of ``raw``; at most ``len(ranking)^2 / 2`` scores. What two columns share
    is at most the smaller one's own score, so a pair whose own scores differ by more than a
    factor ``threshold^2`` (a margin of one more ``threshold`` for the estimates' noise) is not
    scored: on Criteo's 39 fields that skips 2 pairs of 3.

    At width the pairs are pruned (``candidates``): a feature whose codes equal an earlier
    feature's up to a relabelling (an exact copy: a relabelled id, a rescaled column whose bins
    coincide) is found anywhere in the ranking by hashing its codes in order of first
    appearance, and so is a vector equal to an earlier one in standard units (a rescaled
    vector), in O(F) work; the near copies are looked for among the first ``candidates``
    features of the ranking only, where a top-k selection reads them (a vector's near copies
    are not looked for: its row codes are nearly all distinct).

    Args:
        raw: raw rows (its schema names the features' kinds).
        ranking: feature names, most important first (names not in ``raw`` are skipped).
        threshold: the share of its own score a feature must keep to be a copy.
        rows: rows read.
        dense_bins: quantile bins of a many-valued dense column (as OutRank's encoding).
        candidates: near copies are looked for among this many features at the top of the
            ranking (None: all of them, ``len(ranking)^2 / 2`` scores at most).
    """
    specs = {s.name: s for s in raw.schema.features}
    frame = raw.frame.iloc[:rows]
    named = list(dict.fromkeys(f for f in ranking if f in specs))
    top = set(named if candidates is None else named[:candidates])
    first = {f: _vector_signature(frame, specs[f]) if specs[f].is_vector else
             factorize(encode_feature(frame, specs[f], dense_bins).codes) for f in named}
    codes = {f: _compact(first[f]) for f in named if f in top and not specs[f].is_vector}
    own = {f: outrank_score(c, c, NullModel.ROTATION) for f, c in codes.items()}

    def copies(f: str, g: str) -> bool:  # each determines the other
        if not (own[f] > 0 and own[g] > 0 and min(own[f], own[g]) >= threshold**2 * max(own[f], own[g])):
            return False
        return (outrank_score(codes[f], codes[g], NullModel.ROTATION) >= threshold * own[f]
                and outrank_score(codes[g], codes[f], NullModel.ROTATION) >= threshold * own[g])

    kept: list[str] = []
    out: dict[str, str] = {}
    seen: dict[bytes, list[str]] = {}  # hash of the codes in order of first appearance -> features
    for f in named:
        key = hashlib.blake2b(first[f].tobytes(), digest_size=16).digest()
        same = next((g for g in seen.get(key, []) if np.array_equal(first[g], first[f])), None) if threshold <= 1 else None
        seen.setdefault(key, []).append(f)
        if same is not None and not specs[f].is_vector and outrank_score(
                _compact(first[f]), _compact(first[f]), NullModel.ROTATION) <= 0:
            same = None  # a constant, or ID-like in the sample (a distinct value in every row "copies" any other)
        if same is not None:  # an exact copy (each determines the other): of what ``same`` copies, if anything
            out[f] = out.get(same, same)
            continue
        source = next((g for g in kept if copies(f, g)), None) if f in codes else None
        if source is None:
            if f in codes:
                kept.append(f)
        else:
            out[f] = source
    return out


def _vector_signature(frame: Any, spec: Any) -> np.ndarray:
    """A vector feature's values in standard units per column, rounded to 1e-6 (equal for a
    rescaled or shifted copy; a vector has a distinct value in nearly every row, so its row
    codes cannot tell a copy from chance), as an int64 array (the exact-copy key)."""
    x = frame[list(spec.columns)].to_numpy(dtype=np.float64)
    std = np.nanstd(x, axis=0)
    z = (x - np.nanmean(x, axis=0)) / np.where(std > 0, std, 1.0)
    return np.round(np.nan_to_num(z, nan=1e9) * 1e6).astype(np.int64)


def memorisable_features(raw: RawData, features: Iterable[str], min_distinct_share: float = 0.1, min_z: float = 2.0,
                         rows: int = 2**18, rotations: int = 32) -> dict[str, str]:
    """[INF] Single-id categorical features of ``features`` that a model can memorise but that
    show no signal beyond chance -> why.

    A feature is listed when it has a distinct value in at least ``min_distinct_share`` of the
    rows of ``raw`` (an impression or session id, a raw timestamp: few repeats, so a model fits
    the training labels through it) and, on the first ``rows`` rows, its corrected relevance to
    the label stands less than ``min_z`` null standard deviations above its rotation null
    (:func:`~selection.model_free.mutual_info.rotation_significance`). An informative
    id of the same cardinality (a user id the label depends on) stands out of its null and is
    not listed. Multi-hot bags and dense columns are never listed: their many distinct codes
    are combinations of a few values, not identifiers.

    Args:
        raw: raw training rows (its schema names the kinds and the label).
        features: the features to check (names not in ``raw`` are skipped).
        min_distinct_share: distinct values per row from which a feature counts as ID-like.
        min_z: the z a listed feature falls short of.
        rows: rows the relevance is scored on.
        rotations: rotations of the null.
    """
    specs = {s.name: s for s in raw.schema.features}
    names = [f for f in features if f in specs and specs[f].kind.value == "categorical"]
    frame = raw.frame.iloc[:rows]
    if not names or len(frame) < 2:
        return {}
    label = _compact(label_codes(raw, np.arange(len(frame))))
    out: dict[str, str] = {}
    for f in names:
        share = distinct_count(factorize(raw.frame[f])) / len(raw.frame)
        if share < min_distinct_share:
            continue
        score, z = rotation_significance(_compact(encode_column(frame[f], specs[f]).codes), label, rotations)
        if z < min_z:
            out[f] = (f"ID-like: {share:.0%} of {len(raw.frame):,} training rows hold a distinct value, and its relevance "
                      f"({score:+.5f} nats on {len(frame):,} rows) is {z:+.2f} null standard deviations from chance "
                      f"(< {min_z:g})")
    return out
