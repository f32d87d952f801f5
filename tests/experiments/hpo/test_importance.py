"""Importance evaluators: N-RReliefF against a plain-loop reference and planted importance;
elementary effects against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from experiments.hpo.importance import (
    ElementaryEffectsImportanceEvaluator,
    NRReliefFImportanceEvaluator,
    make_evaluator,
    unit_encode,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(rows: list[dict], values: list[float], dists: dict) -> optuna.Study:
    study = optuna.create_study()
    for params, value in zip(rows, values):
        study.add_trial(
            optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params}, value=value)
        )
    return study


def _reference_rrelieff(x: np.ndarray, categorical: list[bool], y: np.ndarray, k: int, sigma: float) -> np.ndarray:
    """RReliefF written as the paper's loops (no vectorisation)."""
    n, d = x.shape
    rank = np.argsort(np.argsort(y, kind="stable"), kind="stable")

    def diff(a: int, i: int, j: int) -> float:
        u, v = x[i, a], x[j, a]
        if math.isnan(u) or math.isnan(v):
            return 0.0 if (math.isnan(u) and math.isnan(v)) else 1.0
        return float(u != v) if categorical[a] else abs(u - v)

    n_dc, n_da, n_dcda = 0.0, np.zeros(d), np.zeros(d)
    raw = np.exp(-((np.arange(1, k + 1) / sigma) ** 2))
    w = raw / raw.sum()
    for i in range(n):
        dist = [(sum(diff(a, i, j) for a in range(d)), j) for j in range(n) if j != i]
        neighbours = [j for _, j in sorted(dist, key=lambda t: t[0])[:k]]  # stable on ties
        for r, j in enumerate(neighbours):
            dy = abs(rank[i] - rank[j]) / (n - 1)
            n_dc += w[r] * dy
            for a in range(d):
                da = diff(a, i, j)
                n_da[a] += w[r] * da
                n_dcda[a] += w[r] * dy * da
    return np.clip(n_dcda / n_dc - (n_da - n_dcda) / (n - n_dc), 0, None)


def test_rrelieff_matches_the_plain_loop_reference() -> None:
    rng = np.random.default_rng(0)
    dists = {
        "lr": FloatDistribution(1e-4, 1e-1, log=True),
        "depth": IntDistribution(1, 8),
        "opt": CategoricalDistribution(["adam", "sgd", "adagrad"]),
        "momentum": FloatDistribution(0.0, 0.99),  # conditional: only with sgd
    }
    rows, values = [], []
    for _ in range(25):
        p = {"lr": float(10 ** rng.uniform(-4, -1)), "depth": int(rng.integers(1, 9)), "opt": str(rng.choice(["adam", "sgd", "adagrad"]))}
        if p["opt"] == "sgd":
            p["momentum"] = float(rng.uniform(0, 0.99))
        rows.append(p)
        values.append(float(rng.normal()))
    evaluator = NRReliefFImportanceEvaluator(n_neighbors=6, sigma=3.0)
    got = evaluator.evaluate(_study(rows, values, dists))
    names = sorted(dists)
    cols = [unit_encode([r.get(n) for r in rows], dists[n]) for n in names]
    want = _reference_rrelieff(np.stack([c for c, _ in cols], 1), [c for _, c in cols], np.array(values), 6, 3.0)
    np.testing.assert_allclose([got[n] for n in names], want, rtol=1e-10, atol=1e-12)
    assert list(got) == sorted(got, key=lambda n: -got[n])  # sorted descending


def test_rrelieff_recovers_planted_importance() -> None:
    rng = np.random.default_rng(1)
    dists = {f"x{j}": FloatDistribution(0.0, 1.0) for j in range(4)}
    rows = [{f"x{j}": float(rng.random()) for j in range(4)} for _ in range(80)]
    values = [5 * r["x0"] + 1.5 * r["x1"] + 0.2 * r["x2"] for r in rows]  # x3 is noise
    imp = optuna.importance.get_param_importances(_study(rows, values, dists), evaluator=NRReliefFImportanceEvaluator())
    assert list(imp)[:2] == ["x0", "x1"]
    assert imp["x0"] > 0.5 and imp["x3"] < 0.1
    assert sum(imp.values()) == pytest.approx(1.0)


def test_rrelieff_with_too_few_trials_is_all_zero() -> None:
    dists = {"a": FloatDistribution(0, 1), "b": FloatDistribution(0, 1)}
    got = NRReliefFImportanceEvaluator().evaluate(_study([{"a": 0.1, "b": 0.2}, {"a": 0.5, "b": 0.9}], [1.0, 2.0], dists))
    assert got == {"a": 0.0, "b": 0.0}
    with pytest.raises(ValueError, match="n_neighbors"):
        NRReliefFImportanceEvaluator(n_neighbors=0)


def test_elementary_effects_are_the_one_at_a_time_differences() -> None:
    dists = {"a": FloatDistribution(0, 1), "b": FloatDistribution(0, 1), "c": CategoricalDistribution(["x", "y"])}
    base = {"a": 0.2, "b": 0.4, "c": "x"}
    rows = [base, {**base, "a": 0.7}, {**base, "b": 0.9}, {**base, "c": "y"}, {"a": 0.9, "b": 0.1, "c": "y"}]
    values = [1.0, 4.0, 1.5, 0.25, 9.0]  # the last trial pairs with nothing
    got = ElementaryEffectsImportanceEvaluator().evaluate(_study(rows, values, dists))
    assert got == {"a": 3.0, "c": 0.75, "b": 0.5}
    # two probes of the same parameter from the same base are averaged (and pair with each other)
    rows.append({**base, "a": 0.95})
    values.append(2.0)
    got = ElementaryEffectsImportanceEvaluator().evaluate(_study(rows, values, dists))
    assert got["a"] == pytest.approx((3.0 + 1.0 + 2.0) / 3)


def test_make_evaluator_names() -> None:
    assert isinstance(make_evaluator("ped-anova"), optuna.importance.PedAnovaImportanceEvaluator)
    assert isinstance(make_evaluator("fanova", seed=0), optuna.importance.FanovaImportanceEvaluator)
    assert isinstance(make_evaluator("rrelieff"), NRReliefFImportanceEvaluator)
    assert isinstance(make_evaluator("elementary-effects"), ElementaryEffectsImportanceEvaluator)
    own = NRReliefFImportanceEvaluator()
    assert make_evaluator(own) is own
    with pytest.raises(ValueError, match="unknown importance evaluator 'shap'"):
        make_evaluator("shap")
