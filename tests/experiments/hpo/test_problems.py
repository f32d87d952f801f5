"""Benchmark problems: golden values of the analytic functions, the anisotropic map, Bayesmark tasks."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from experiments.hpo.problems import (
    ANALYTIC,
    HALF_WIDTH,
    AnalyticProblem,
    ackley,
    analytic,
    bayesmark_tasks,
    levy,
    rastrigin,
    rosenbrock,
    sphere,
)

DIMS = (5, 10, 30, 50)


def test_golden_values_of_f0() -> None:
    ones = np.ones(4)
    assert sphere(ones) == pytest.approx(4.0)
    assert rastrigin(ones) == pytest.approx(4.0, abs=1e-9)  # 10 d + d (1 - 10)
    assert rastrigin(0.5 * ones) == pytest.approx(4 * 20.25, abs=1e-9)  # 10 d + d (0.25 + 10)
    assert rosenbrock(np.zeros(4)) == pytest.approx(3.0)  # (d - 1) (1 - 0)^2
    assert rosenbrock(np.array([0.0, 1.0])) == pytest.approx(101.0)
    assert ackley(ones) == pytest.approx(20.0 - 20.0 * math.exp(-0.2), rel=1e-12)  # 3.6253849...
    # Levy at z = 0 (d = 3): w = 0.75 everywhere
    w = 0.75
    expected = math.sin(math.pi * w) ** 2 + 2 * (w - 1) ** 2 * (1 + 10 * math.sin(math.pi * w + 1) ** 2) \
        + (w - 1) ** 2 * (1 + math.sin(2 * math.pi * w) ** 2)
    assert levy(np.zeros(3)) == pytest.approx(expected, rel=1e-12)
    assert levy(np.zeros(3)) == pytest.approx(0.806689108233949, rel=1e-9)


@pytest.mark.parametrize("f0,z_star", [(sphere, 0.0), (rastrigin, 0.0), (rosenbrock, 1.0), (ackley, 0.0), (levy, 1.0)])
def test_f0_is_zero_at_its_minimiser_and_vectorised(f0, z_star) -> None:  # type: ignore[no-untyped-def]
    assert f0(np.full(7, z_star)) == pytest.approx(0.0, abs=1e-12)
    z = np.random.default_rng(0).normal(size=(6, 7))
    np.testing.assert_allclose(f0(z), [f0(row) for row in z], rtol=1e-12)
    assert np.all(f0(z) > 0)


@pytest.mark.parametrize("name", ANALYTIC)
@pytest.mark.parametrize("dim", DIMS)
def test_optimum_inside_the_box_with_value_zero(name: str, dim: int) -> None:
    problem = analytic(name, dim)
    low, high = problem.bounds
    assert (low, high) == (-5.0, 5.0)
    assert np.all(problem.shift >= -3.0) and np.all(problem.shift <= 3.0)
    assert problem(problem.shift) == pytest.approx(problem.optimum, abs=1e-12)
    x = np.random.default_rng(1).uniform(low, high, size=(50, dim))
    assert np.all(problem.evaluate(x) > 0.0)


@pytest.mark.parametrize("dim", DIMS)
def test_scales_decay_geometrically_over_three_decades(dim: int) -> None:
    problem = analytic("sphere", dim)
    a = problem.scales
    assert a[0] == pytest.approx(1.0) and a[-1] == pytest.approx(1e-3)
    np.testing.assert_allclose(a[1:] / a[:-1], 10 ** (-3 / (dim - 1)), rtol=1e-12)
    assert list(problem.true_importance) == [f"x{j}" for j in range(dim)]
    np.testing.assert_allclose(list(problem.true_importance.values()), a)
    assert analytic("sphere", dim, decades=2.0).scales[-1] == pytest.approx(1e-2)


def test_hand_computed_point_of_the_map() -> None:
    # sphere, d = 5, x = s + 1: z_j = a_j * 5.12 / 5, so f = 1.024^2 * sum a_j^2
    problem = analytic("sphere", 5)
    a = 10 ** (-0.75 * np.arange(5))
    assert problem(problem.shift + 1.0) == pytest.approx(1.024**2 * float(np.sum(a**2)), rel=1e-12)
    # rosenbrock, d = 2, x = s + (1, 0): z = (1 + 2.048 / 5, 1) -> 100 (1 - z0^2)^2 + (1 - z0)^2
    problem = analytic("rosenbrock", 2)
    z0 = 1.0 + 2.048 / 5.0
    assert problem(problem.shift + np.array([1.0, 0.0])) == pytest.approx(100 * (1 - z0**2) ** 2 + (1 - z0) ** 2)
    # ackley, d = 2, x = s + (0, 5): z = (0, 1e-3 * 32.768) (two dims: a_1 = 10^-3)
    problem = analytic("ackley", 2)
    z = np.array([0.0, 1e-3 * HALF_WIDTH["ackley"]])
    assert problem(problem.shift + np.array([0.0, 5.0])) == pytest.approx(float(ackley(z)), rel=1e-12)


def test_shift_is_fixed_by_seed_and_dim() -> None:
    np.testing.assert_array_equal(analytic("sphere", 10).shift, analytic("levy", 10).shift)
    assert not np.allclose(analytic("sphere", 10).shift, analytic("sphere", 10, shift_seed=1).shift)
    with pytest.raises(ValueError, match="unknown"):
        AnalyticProblem("griewank", 5)
    with pytest.raises(ValueError, match="shape"):
        analytic("sphere", 5)(np.zeros(4))


def test_objective_suggests_every_dimension() -> None:
    problem = analytic("levy", 5)
    trial = optuna.trial.FixedTrial({f"x{j}": float(v) for j, v in enumerate(problem.shift)})
    assert problem.objective(trial) == pytest.approx(0.0, abs=1e-12)
    assert set(trial.params) == {f"x{j}" for j in range(5)}


def test_bayesmark_objectives_run_and_are_deterministic() -> None:
    tasks = bayesmark_tasks()
    assert len({t.name for t in tasks}) == len(tasks) >= 6
    for task in tasks:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(task.objective, n_trials=1)
        value = task.objective(optuna.trial.FixedTrial(study.trials[0].params))
        assert math.isfinite(value) and value >= 0.0, task.name
        assert value == pytest.approx(study.trials[0].value), task.name


def test_bayesmark_conditional_parameter_and_selection() -> None:
    (svm,) = bayesmark_tasks(["SVM-breast-acc"])
    linear = optuna.trial.FixedTrial({"kernel": "linear", "C": 1.0, "tol": 1e-3})  # no gamma
    assert 0.0 <= svm.objective(linear) < 0.2
    rbf = optuna.trial.FixedTrial({"kernel": "rbf", "C": 1.0, "gamma": 0.01, "tol": 1e-3})
    assert 0.0 <= svm.objective(rbf) < 0.2
    with pytest.raises(ValueError, match="unknown"):
        bayesmark_tasks(["nope"])
