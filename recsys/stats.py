"""Paired statistics for verdicts: two models scored on the same test rows, over seeds.

Every verdict of the form "A is better than / ties with / stays within tolerance of B" goes
through one :class:`Interval` of the difference ``A - B``:

* :func:`delong` — the difference of two correlated AUCs on the same rows (DeLong et al. 1988,
  the fast midrank algorithm of Sun & Xu 2014): exact variance, O(n log n);
  :func:`delong_contrast` any weighted sum of several models' AUCs on those rows (a
  difference of two AUKCs);
* :func:`paired_bootstrap` — any metric (AUC, log loss, ...) by resampling the same rows for
  both models (stratified by label), percentile interval;
* :func:`paired_mean_difference` — per-unit paired values (per-row log loss, per-user
  Recall@k): a t interval over the units; :func:`mean_interval` the same for differences
  already taken (per seed);
* :func:`over_seeds` — the differences of several seeds on the same test rows, combined:
  the seeds' spread plus the row-sampling variance they share (not divided by the seeds, since
  every seed reads the same rows), with Welch–Satterthwaite degrees of freedom.

:meth:`Interval.verdict` says ``better`` / ``worse`` only when the interval excludes zero, ``tie``
otherwise; :meth:`Interval.within` is true only when the whole interval lies inside
``[-tolerance, +tolerance]``.

>>> labels = [0, 0, 1, 1, 0, 1, 1, 0]
>>> a = [0.1, 0.2, 0.8, 0.7, 0.3, 0.9, 0.6, 0.4]
>>> b = [0.2, 0.1, 0.6, 0.9, 0.5, 0.7, 0.4, 0.3]
>>> diff = delong(labels, a, b)                 # AUC(a) - AUC(b) on the same 8 rows
>>> diff.text(), diff.verdict()
('+0.0625 [-0.1107, +0.2357]', 'tie')
>>> paired_mean_difference([1, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0, 1]).text()   # per-user hits of two models
'+0.3333 [-0.2086, +0.8753]'
>>> over_seeds([Interval(0.010, 0.000, 0.020, se=0.005), Interval(0.012, 0.002, 0.022, se=0.005)]).text()
'+0.0110 [+0.0010, +0.0210]'
>>> Interval(0.0004, -0.0006, 0.0014).within(0.002)
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["BETTER", "TIE", "WORSE", "Interval", "auc", "auc_se", "delong", "delong_contrast", "mean_interval", "over_seeds", "paired_bootstrap",
           "paired_mean_difference"]

BETTER, WORSE, TIE = "better", "worse", "tie"


@dataclass(frozen=True)
class Interval:
    """A difference ``A - B`` with its two-sided confidence interval.

    Attributes:
        estimate: the difference.
        low, high: the interval's ends.
        level: its confidence level.
        se: the standard error behind it (NaN for a percentile bootstrap: read the ends).
        method: how it was computed (``delong``, ``bootstrap``, ``paired_t``, ``seeds``).
        n: the units behind it (rows, users or seeds).
    """

    estimate: float
    low: float
    high: float
    level: float = 0.95
    se: float = float("nan")
    method: str = ""
    n: int = 0

    def verdict(self, lower_is_better: bool = False) -> str:
        """``better`` when A beats B (the interval excludes zero on A's side), ``worse`` when B
        beats A, else ``tie`` (a NaN end is a tie: no claim without numbers)."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return TIE
        above, below = self.low > 0, self.high < 0
        if lower_is_better:
            above, below = below, above
        return BETTER if above else WORSE if below else TIE

    def within(self, tolerance: float) -> bool:
        """The whole interval lies in ``[-tolerance, +tolerance]``."""
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance}")
        return bool(math.isfinite(self.low) and math.isfinite(self.high)
                    and -tolerance <= self.low and self.high <= tolerance)

    def no_worse_than(self, tolerance: float, lower_is_better: bool = False) -> bool:
        """A loses at most ``tolerance`` to B, at the interval's far end (non-inferiority)."""
        end = -self.high if lower_is_better else self.low
        return bool(math.isfinite(end) and end >= -tolerance)

    def text(self, digits: int = 4) -> str:
        """``+0.0012 [-0.0008, +0.0031]``."""
        return f"{self.estimate:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _quantile(level: float, df: float = math.inf) -> float:
    from scipy import stats

    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    q = 0.5 + level / 2
    return float(stats.norm.ppf(q) if not math.isfinite(df) else stats.t.ppf(q, df))


def _binary(labels: Any, *scores: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    y = np.asarray(labels).ravel()
    out = [np.asarray(s, dtype=np.float64).ravel() for s in scores]
    for i, s in enumerate(out):
        if s.shape != y.shape:
            raise ValueError(f"scores {i} have {s.size} rows, labels {y.size}: a paired comparison needs the same rows")
        if not np.isfinite(s).all():
            raise ValueError(f"scores {i} hold {int((~np.isfinite(s)).sum())} NaN/inf values")
    classes = set(np.unique(y).tolist())
    if not classes <= {0, 1} or len(classes) < 2:
        raise ValueError(f"AUC needs labels in {{0, 1}} with both classes present, got the values {sorted(classes)[:5]}")
    return y.astype(bool), out


def _midranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return np.asarray(rankdata(x, method="average"), dtype=np.float64)


def _structural(y: np.ndarray, scores: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AUCs (K,) and DeLong's structural components: V10 (K x m, per positive), V01 (K x n, per
    negative), by midranks (Sun & Xu 2014)."""
    m = int(y.sum())
    n = y.size - m
    aucs = np.empty(len(scores))
    v10 = np.empty((len(scores), m))
    v01 = np.empty((len(scores), n))
    for k, s in enumerate(scores):
        pos, neg = s[y], s[~y]
        tz = _midranks(np.concatenate([pos, neg]))
        tx, ty = _midranks(pos), _midranks(neg)
        aucs[k] = (tz[:m].sum() - m * (m + 1) / 2) / (m * n)
        v10[k] = (tz[:m] - tx) / n  # share of negatives each positive outranks (ties count 1/2)
        v01[k] = 1.0 - (tz[m:] - ty) / m  # share of positives that outrank each negative
    return aucs, v10, v01


def auc(labels: Any, scores: Any) -> float:
    """ROC AUC (the Mann–Whitney statistic; ties count 1/2)."""
    y, (s,) = _binary(labels, scores)
    return float(_structural(y, [s])[0][0])


def delong(labels: Any, scores_a: Any, scores_b: Any, level: float = 0.95) -> Interval:
    """AUC(A) - AUC(B) on the same rows, with DeLong's variance of the correlated difference.

    Args:
        labels: (N,) 0/1.
        scores_a, scores_b: (N,) the two models' scores of the same rows.
        level: the interval's confidence level (normal quantile).
    """
    return delong_contrast(labels, [scores_a, scores_b], [1.0, -1.0], level)


def delong_contrast(labels: Any, scores: Sequence[Any], weights: Sequence[float], level: float = 0.95) -> Interval:
    """``sum_k weights[k] * AUC(scores[k])`` of K models scored on the same rows, with DeLong's
    covariance of the K correlated AUCs (``w' S w``): a difference of two AUCs is the weights
    ``(1, -1)``; a difference of two AUKCs (areas under AUC-vs-k curves) is each curve's
    trapezoid weights, one curve's negated.

    Args:
        labels: (N,) 0/1.
        scores: K arrays (N,), the models' scores of the same rows.
        weights: (K,) the contrast.
        level: the interval's confidence level (normal quantile).
    """
    w = np.asarray(weights, dtype=np.float64).ravel()
    if len(scores) != w.size or w.size == 0:
        raise ValueError(f"delong_contrast: {len(scores)} score arrays and {w.size} weights; give one weight per model")
    y, arrays = _binary(labels, *scores)
    aucs, v10, v01 = _structural(y, arrays)
    # the contrast's own structural components: its variance is w' S w with S = cov(V10)/m + cov(V01)/n
    c10, c01 = w @ v10, w @ v01
    var = float(np.var(c10, ddof=1) / c10.size + np.var(c01, ddof=1) / c01.size) if min(c10.size, c01.size) > 1 else math.nan
    se = math.sqrt(max(var, 0.0)) if math.isfinite(var) else math.nan
    estimate = float(w @ aucs)
    z = _quantile(level)
    return Interval(estimate, estimate - z * se, estimate + z * se, level, se, "delong", int(y.size))


def auc_se(labels: Any, scores: Any) -> float:
    """DeLong's standard error of one model's AUC."""
    y, s = _binary(labels, scores)
    _, v10, v01 = _structural(y, s)
    return math.sqrt(float(np.var(v10[0], ddof=1) / v10.shape[1] + np.var(v01[0], ddof=1) / v01.shape[1]))


def _log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p))))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "auc": lambda y, s: float(_structural(y, [s])[0][0]),
    "logloss": _log_loss,
}


def paired_bootstrap(labels: Any, scores_a: Any, scores_b: Any, metric: str | Callable[[np.ndarray, np.ndarray], float] = "auc",
                     resamples: int = 1000, level: float = 0.95, seed: int = 0) -> Interval:
    """``metric(A) - metric(B)`` on the same rows, with a percentile interval from ``resamples``
    resamples of the rows (both models read the same resample; stratified by label, so every
    resample holds both classes).

    Args:
        labels: (N,) 0/1.
        scores_a, scores_b: (N,) scores (probabilities for ``logloss``).
        metric: ``auc``, ``logloss`` or ``f(labels: bool (N,), scores (N,)) -> float``.
    """
    y, (a, b) = _binary(labels, scores_a, scores_b)
    fn = METRICS[metric] if isinstance(metric, str) else metric
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    diffs = np.empty(resamples)
    for r in range(resamples):
        rows = np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)])
        diffs[r] = fn(y[rows], a[rows]) - fn(y[rows], b[rows])
    tail = (1 - level) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail])
    return Interval(float(fn(y, a) - fn(y, b)), float(low), float(high), level, float(np.std(diffs, ddof=1)), "bootstrap",
                    int(y.size))


def paired_mean_difference(values_a: Any, values_b: Any, level: float = 0.95) -> Interval:
    """``mean(A - B)`` over paired units (rows, users, seeds), with a t interval.

    Args:
        values_a, values_b: (N,) the two models' values of the same units (per-row log loss,
            per-user Recall@k, ...), N >= 2.
    """
    a = np.asarray(values_a, dtype=np.float64).ravel()
    b = np.asarray(values_b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same units: {a.size} vs {b.size}")
    if a.size < 2:
        raise ValueError(f"a paired interval needs at least 2 units, got {a.size}")
    d = a - b
    se = float(np.std(d, ddof=1) / math.sqrt(d.size))
    q = _quantile(level, d.size - 1)
    mean = float(d.mean())
    return Interval(mean, mean - q * se, mean + q * se, level, se, "paired_t", int(d.size))


def mean_interval(values: Any, level: float = 0.95) -> Interval:
    """The mean of per-seed (or per-unit) differences with its t interval; one value gives NaN
    ends (a tie under :meth:`Interval.verdict`, never within a tolerance)."""
    d = np.asarray(values, dtype=np.float64).ravel()
    if d.size == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = float(d.mean())
    if d.size == 1:
        return Interval(mean, math.nan, math.nan, level, math.nan, "t", 1)
    se = float(np.std(d, ddof=1) / math.sqrt(d.size))
    q = _quantile(level, d.size - 1)
    return Interval(mean, mean - q * se, mean + q * se, level, se, "t", int(d.size))


def over_seeds(per_seed: Sequence[Interval], level: float = 0.95) -> Interval:
    """The differences of several seeds on the same test rows, combined.

    The mean over seeds has the seeds' spread (training noise, ``s^2 / S``) plus the
    row-sampling variance of one seed's difference (the mean of their ``se^2``), which the seeds
    share because they read the same rows; degrees of freedom by Welch–Satterthwaite (the row
    part counts as known). One seed gives its own interval.
    """
    if not per_seed:
        raise ValueError("over_seeds needs at least one seed's interval")
    if len(per_seed) == 1:
        one = per_seed[0]
        return one if one.level == level else _rescaled(one, level)
    d = np.array([i.estimate for i in per_seed])
    row_var = float(np.mean([i.se**2 if math.isfinite(i.se) else 0.0 for i in per_seed]))
    seed_var = float(np.var(d, ddof=1) / d.size)
    total = seed_var + row_var
    se = math.sqrt(total)
    df = math.inf if seed_var == 0 else total**2 / (seed_var**2 / (d.size - 1))
    q = _quantile(level, df)
    mean = float(d.mean())
    return Interval(mean, mean - q * se, mean + q * se, level, se, "seeds", int(d.size))


def _rescaled(one: Interval, level: float) -> Interval:
    if not math.isfinite(one.se):
        raise ValueError(f"a {one.method} interval has no standard error to restate at level {level}")
    q = _quantile(level)
    return Interval(one.estimate, one.estimate - q * one.se, one.estimate + q * one.se, level, one.se, one.method, one.n)
