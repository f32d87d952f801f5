"""Paired statistics (recsys.stats): golden values by hand, a brute-force DeLong reference,
bootstrap agreement, planted differences and the coverage of the intervals under the null."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from sklearn.metrics import roc_auc_score

from recsys.stats import (
    Interval,
    auc,
    auc_se,
    delong,
    delong_contrast,
    over_seeds,
    paired_bootstrap,
    paired_mean_difference,
)


def _brute_delong(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The textbook definition: psi over every (positive, negative) pair, O(m n)."""
    def comps(s: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        x, z = s[y == 1][:, None], s[y == 0][None, :]
        psi = (x > z) + 0.5 * (x == z)
        return float(psi.mean()), psi.mean(axis=1), psi.mean(axis=0)

    (aa, a10, a01), (ab, b10, b01) = comps(a), comps(b)
    m, n = a10.size, a01.size
    var = (np.var(a10, ddof=1) + np.var(b10, ddof=1) - 2 * np.cov(a10, b10)[0, 1]) / m \
        + (np.var(a01, ddof=1) + np.var(b01, ddof=1) - 2 * np.cov(a01, b01)[0, 1]) / n
    return aa - ab, float(var)


def _pair(n: int, gap: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels and two correlated scores: A sees the signal with less noise than B when gap > 0."""
    g = np.random.default_rng(seed)
    signal = g.standard_normal(n)
    y = (signal + g.standard_normal(n) > 0).astype(int)
    shared = g.standard_normal(n)
    a = signal + shared + (1.0 - gap) * g.standard_normal(n)
    b = signal + shared + 1.0 * g.standard_normal(n)
    return y, a, b


def test_auc_and_se_golden_by_hand() -> None:
    # positives {0.9, 0.4}, negatives {0.5, 0.1}: 3 of 4 pairs ordered; V10 = (1, 1/2), V01 = (1/2, 1)
    y, s = np.array([1, 1, 0, 0]), np.array([0.9, 0.4, 0.5, 0.1])
    assert auc(y, s) == pytest.approx(0.75, abs=1e-15)
    assert auc_se(y, s) == pytest.approx(math.sqrt(0.125 / 2 + 0.125 / 2), abs=1e-15)


def test_auc_matches_sklearn_with_ties() -> None:
    g = np.random.default_rng(0)
    y = g.integers(0, 2, 2000)
    s = np.round(y + g.standard_normal(2000), 1)  # many ties
    assert auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_delong_matches_the_pairwise_definition_to_the_last_bits() -> None:
    g = np.random.default_rng(1)
    y = g.integers(0, 2, 600)
    a = np.round(y + g.standard_normal(600), 1)
    b = np.round(0.5 * y + a * 0.3 + g.standard_normal(600), 1)
    got = delong(y, a, b)
    diff, var = _brute_delong(y, a, b)
    assert got.estimate == pytest.approx(diff, abs=1e-12)
    assert got.se == pytest.approx(math.sqrt(var), rel=1e-9)
    assert got.high - got.estimate == pytest.approx(1.959963985 * got.se, rel=1e-8) and got.n == 600


def _brute_contrast_var(y: np.ndarray, scores: list[np.ndarray], w: np.ndarray) -> tuple[float, float]:
    """sum_k w_k AUC_k and its DeLong variance w' S w, S from the pairwise psi of every model."""
    comps = []
    for s in scores:
        psi = (s[y == 1][:, None] > s[y == 0][None, :]) + 0.5 * (s[y == 1][:, None] == s[y == 0][None, :])
        comps.append((float(psi.mean()), psi.mean(axis=1), psi.mean(axis=0)))
    aucs = np.array([c[0] for c in comps])
    v10, v01 = np.array([c[1] for c in comps]), np.array([c[2] for c in comps])
    cov = np.cov(v10) / v10.shape[1] + np.cov(v01) / v01.shape[1]
    return float(w @ aucs), float(w @ cov @ w)


def test_delong_contrast_is_the_pairwise_definition_and_delong_its_two_model_case() -> None:
    g = np.random.default_rng(5)
    y = g.integers(0, 2, 500)
    scores = [np.round(y * c + g.standard_normal(500), 1) for c in (1.0, 0.7, 0.4, 0.2)]
    w = np.array([0.25, 0.75, -0.5, -0.5])  # two trapezoid-weighted "curves" of two points each
    got = delong_contrast(y, scores, w)
    est, var = _brute_contrast_var(y, scores, w)
    assert got.estimate == pytest.approx(est, abs=1e-12)
    assert got.se == pytest.approx(math.sqrt(var), rel=1e-9)
    two = delong_contrast(y, scores[:2], [1.0, -1.0])
    assert two == delong(y, scores[0], scores[1])
    # a bootstrap over rows of the same contrast agrees
    rng = np.random.default_rng(0)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    draws = []
    for _ in range(300):
        rows = np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)])
        draws.append(sum(wk * auc(y[rows], s[rows]) for wk, s in zip(w, scores, strict=True)))
    assert float(np.std(draws, ddof=1)) == pytest.approx(got.se, rel=0.15)


def test_delong_contrast_of_identical_curves_is_zero_and_planted_gaps_are_found() -> None:
    y, a, b = _pair(5000, 0.6, seed=6)
    same = delong_contrast(y, [a, b, a, b], [0.5, 0.5, -0.5, -0.5])
    assert same.estimate == 0 and same.se == 0 and same.verdict() == "tie"
    better = delong_contrast(y, [a, a, b, b], [0.5, 0.5, -0.5, -0.5])
    assert better.verdict() == "better" and better.estimate == pytest.approx(delong(y, a, b).estimate, abs=1e-12)
    with pytest.raises(ValueError, match="one weight per model"):
        delong_contrast(y, [a, b], [1.0])


def test_bootstrap_agrees_with_delong_and_does_logloss() -> None:
    y, a, b = _pair(4000, 0.4, seed=2)
    d = delong(y, a, b)
    boot = paired_bootstrap(y, a, b, resamples=400, seed=0)
    assert boot.estimate == pytest.approx(d.estimate, abs=1e-12)
    assert boot.se == pytest.approx(d.se, rel=0.15)
    assert boot.low == pytest.approx(d.low, abs=2 * d.se * 0.25)
    pa, pb = 1 / (1 + np.exp(-a)), 1 / (1 + np.exp(-b))
    ll = paired_bootstrap(y, pa, pb, metric="logloss", resamples=200)
    assert ll.verdict(lower_is_better=True) == "better" and ll.estimate < 0


def test_planted_differences_give_the_right_verdicts() -> None:
    y, a, b = _pair(5000, 0.6, seed=3)
    assert delong(y, a, b).verdict() == "better" and delong(y, b, a).verdict() == "worse"
    same = delong(y, a, a + 1e-9)  # the same model
    assert same.estimate == 0 and same.verdict() == "tie"
    # a real but tiny gap on few rows: no claim
    y, a, b = _pair(300, 0.02, seed=4)
    assert delong(y, a, b).verdict() == "tie"


def test_delong_interval_covers_the_null_at_its_level() -> None:
    # two models of the same quality (independent noise of the same size): the 95% interval
    # should cover the true difference, 0, in ~95% of repetitions
    covered = 0
    reps = 300
    for r in range(reps):
        y, a, b = _pair(400, 0.0, seed=100 + r)
        i = delong(y, a, b)
        covered += i.low <= 0 <= i.high
    assert 0.91 <= covered / reps <= 0.985


def test_paired_mean_difference_is_the_paired_t_interval() -> None:
    g = np.random.default_rng(5)
    a = g.standard_normal(50) + 0.3
    b = a - 0.3 + 0.5 * g.standard_normal(50)
    got = paired_mean_difference(a, b)
    ci = sps.ttest_rel(a, b).confidence_interval(0.95)
    assert (got.low, got.high) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))
    with pytest.raises(ValueError, match="same units"):
        paired_mean_difference(a, b[:-1])


def test_over_seeds_adds_the_shared_row_variance_to_the_seed_spread() -> None:
    seeds = [Interval(d, d - 0.002, d + 0.002, se=0.001, method="delong") for d in (0.010, 0.012, 0.011)]
    got = over_seeds(seeds)
    seed_var = np.var([0.010, 0.012, 0.011], ddof=1) / 3
    se = math.sqrt(seed_var + 0.001**2)
    df = se**4 / (seed_var**2 / 2)
    assert got.se == pytest.approx(se, rel=1e-12) and got.estimate == pytest.approx(0.011)
    assert got.high - got.estimate == pytest.approx(sps.t.ppf(0.975, df) * se, rel=1e-9)
    assert got.verdict() == "better" and got.method == "seeds" and got.n == 3
    # the seeds disagree in sign: no claim, however small each seed's own interval
    split = over_seeds([Interval(d, d, d, se=0.0) for d in (0.01, -0.012, 0.004)])
    assert split.verdict() == "tie"
    one = seeds[0]
    assert over_seeds([one]) is one


def test_interval_rules() -> None:
    i = Interval(0.001, -0.0005, 0.0025)
    assert i.verdict() == "tie" and not i.within(0.002) and i.within(0.003)
    assert i.no_worse_than(0.001) and not Interval(-0.003, -0.004, -0.002).no_worse_than(0.003)
    assert Interval(-0.01, -0.02, -0.005).verdict(lower_is_better=True) == "better"
    assert Interval(float("nan"), float("nan"), float("nan")).verdict() == "tie"
    assert i.text() == "+0.0010 [-0.0005, +0.0025]"


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="same rows"):
        delong([0, 1, 1], [0.1, 0.2, 0.3], [0.1, 0.2])
    with pytest.raises(ValueError, match="both classes"):
        delong([1, 1, 1], [0.1, 0.2, 0.3], [0.3, 0.2, 0.1])
    with pytest.raises(ValueError, match="NaN"):
        auc([0, 1], [0.1, float("nan")])


def test_mean_interval_is_the_paired_t_of_differences_already_taken() -> None:
    from recsys.stats import mean_interval, paired_mean_difference

    d = [0.004, -0.001, 0.002, 0.003]
    iv = mean_interval(d)
    ref = paired_mean_difference(d, [0.0] * len(d))
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((ref.estimate, ref.low, ref.high))
    assert iv.n == 4 and iv.method == "t"
    one = mean_interval([0.01])
    assert one.estimate == 0.01 and math.isnan(one.low) and one.verdict() == "tie" and not one.within(1.0)
