"""Benchmark problems for importance-first HPO: anisotropic analytic functions and Bayesmark-style tasks.

Analytic problems (``analytic(name, dim)``): a standard test function ``f0`` (sphere, Rastrigin,
Rosenbrock, Ackley, Levy) whose inputs are scaled per dimension by geometrically decaying factors
``a_j = 10 ** (-decades * j / (d - 1))`` (``a_0 = 1`` ... ``a_{d-1} = 10 ** -decades``), so the
designed importance order is x0 > x1 > ... > x{d-1}. Every problem searches ``x_j in [-5, 5]``::

    z_j = z*_f + a_j * (x_j - s_j) * R_f / 5

``R_f`` is the half-width of the function's standard domain (``HALF_WIDTH``; Rosenbrock uses
2.048), ``z*_f`` its minimiser (0, or 1 for Rosenbrock and Levy) and ``s`` a fixed shift drawn
uniformly from ``[-3, 3]^d`` (``default_rng(shift_seed * 1000 + dim)``), so the minimum 0 lies
inside the box at ``x = s`` and the value of a point is its regret.

Bayesmark-style tasks (``bayesmark_tasks()``): scikit-learn models on the bundled datasets (no
download) with Bayesmark-like mixed search spaces (log floats, ints, categoricals, one
conditional parameter), scored by a 3-fold cross-validated loss to minimise (``1 - accuracy``,
log loss, or MSE / Var(y) for regression). A trial takes 2-100 ms on one core.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import optuna

__all__ = [
    "ANALYTIC",
    "BAYESMARK",
    "HALF_WIDTH",
    "AnalyticProblem",
    "BayesmarkTask",
    "ackley",
    "analytic",
    "bayesmark_tasks",
    "levy",
    "rastrigin",
    "rosenbrock",
    "sphere",
]

ANALYTIC = ("sphere", "rastrigin", "rosenbrock", "ackley", "levy")
#: search box of every analytic problem (each dimension)
LOW, HIGH = -5.0, 5.0
#: half-width R_f of each function's standard domain
HALF_WIDTH = {"sphere": 5.12, "rastrigin": 5.12, "rosenbrock": 2.048, "ackley": 32.768, "levy": 10.0}
#: each function's minimiser z*_f (the same in every coordinate); f0(z*) = 0
MINIMISER = {"sphere": 0.0, "rastrigin": 0.0, "rosenbrock": 1.0, "ackley": 0.0, "levy": 1.0}


# --- f0: vectorised over the leading axes, z has shape (..., d) -------------------------------


def sphere(z: np.ndarray) -> np.ndarray:
    """``sum z_j^2``."""
    z = np.asarray(z, dtype=float)
    return np.sum(z**2, axis=-1)


def rastrigin(z: np.ndarray) -> np.ndarray:
    """``10 d + sum (z_j^2 - 10 cos(2 pi z_j))``."""
    z = np.asarray(z, dtype=float)
    return 10.0 * z.shape[-1] + np.sum(z**2 - 10.0 * np.cos(2.0 * np.pi * z), axis=-1)


def rosenbrock(z: np.ndarray) -> np.ndarray:
    """``sum_{j<d-1} 100 (z_{j+1} - z_j^2)^2 + (1 - z_j)^2``."""
    z = np.asarray(z, dtype=float)
    head, tail = z[..., :-1], z[..., 1:]
    return np.sum(100.0 * (tail - head**2) ** 2 + (1.0 - head) ** 2, axis=-1)


def ackley(z: np.ndarray) -> np.ndarray:
    """``-20 exp(-0.2 sqrt(mean z^2)) - exp(mean cos(2 pi z)) + 20 + e``."""
    z = np.asarray(z, dtype=float)
    rms = np.sqrt(np.mean(z**2, axis=-1))
    value = -20.0 * np.exp(-0.2 * rms) - np.exp(np.mean(np.cos(2.0 * np.pi * z), axis=-1)) + 20.0 + np.e
    return np.maximum(value, 0.0)  # exact 0 at the optimum (no -4e-16 from rounding)


def levy(z: np.ndarray) -> np.ndarray:
    """Levy: ``w = 1 + (z - 1) / 4``; ``sin^2(pi w_1) + sum_{j<d} (w_j - 1)^2 (1 + 10 sin^2(pi w_j + 1))
    + (w_d - 1)^2 (1 + sin^2(2 pi w_d))``."""
    w = 1.0 + (np.asarray(z, dtype=float) - 1.0) / 4.0
    first = np.sin(np.pi * w[..., 0]) ** 2
    mid = np.sum((w[..., :-1] - 1.0) ** 2 * (1.0 + 10.0 * np.sin(np.pi * w[..., :-1] + 1.0) ** 2), axis=-1)
    last = (w[..., -1] - 1.0) ** 2 * (1.0 + np.sin(2.0 * np.pi * w[..., -1]) ** 2)
    return first + mid + last


F0: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sphere": sphere, "rastrigin": rastrigin, "rosenbrock": rosenbrock, "ackley": ackley, "levy": levy,
}


class AnalyticProblem:
    """One anisotropic analytic problem: ``f(x) = f0(z*_f + a * (x - s) * R_f / 5)`` on ``[-5, 5]^d``.

    Args:
        name: one of ``ANALYTIC``.
        dim: number of dimensions d (>= 2).
        decades: ``a_{d-1} = 10 ** -decades``.
        shift_seed: seed of the shift ``s`` (with ``dim``).

    Attributes:
        scales: ``a_j``, shape (d,), geometrically decaying from 1.
        shift: ``s``, shape (d,), the minimiser in x.
        bounds: ``(low, high)`` of every dimension.
        optimum: the minimum value (0.0), so a value is its regret.
    """

    optimum = 0.0
    bounds = (LOW, HIGH)

    def __init__(self, name: str, dim: int, decades: float = 3.0, shift_seed: int = 0) -> None:
        if name not in F0:
            raise ValueError(f"unknown analytic function {name!r}; choose from {ANALYTIC}")
        if dim < 2:
            raise ValueError(f"dim must be >= 2, got {dim}")
        self.name, self.dim, self.decades, self.shift_seed = name, int(dim), float(decades), int(shift_seed)
        self.scales = 10.0 ** (-self.decades * np.arange(self.dim) / (self.dim - 1))
        self.shift = np.random.default_rng(self.shift_seed * 1000 + self.dim).uniform(-3.0, 3.0, self.dim)
        self._f0 = F0[name]
        self._step = self.scales * HALF_WIDTH[name] / HIGH
        self._center = MINIMISER[name]

    @property
    def params(self) -> list[str]:
        """Parameter names ``x0 .. x{d-1}`` (most to least important)."""
        return [f"x{j}" for j in range(self.dim)]

    @property
    def true_importance(self) -> dict[str, float]:
        """``{"x{j}": a_j}``: the designed importance (monotone in the true effect size)."""
        return {p: float(a) for p, a in zip(self.params, self.scales)}

    def to_z(self, x: np.ndarray) -> np.ndarray:
        """The f0 input for x (shape (..., d))."""
        return self._center + (np.asarray(x, dtype=float) - self.shift) * self._step

    def evaluate(self, x: np.ndarray) -> np.ndarray:
        """Vectorised values for x of shape (..., d)."""
        return self._f0(self.to_z(x))

    def __call__(self, x: np.ndarray) -> float:
        x = np.asarray(x, dtype=float)
        if x.shape != (self.dim,):
            raise ValueError(f"expected x of shape ({self.dim},), got {x.shape}")
        return float(self.evaluate(x))

    def objective(self, trial: optuna.trial.BaseTrial) -> float:
        """Optuna objective: suggests ``x0 .. x{d-1}`` in [-5, 5] and returns f(x) (minimise)."""
        x = np.array([trial.suggest_float(p, LOW, HIGH) for p in self.params])
        return self(x)

    def __repr__(self) -> str:
        return f"AnalyticProblem({self.name!r}, dim={self.dim}, decades={self.decades}, shift_seed={self.shift_seed})"


def analytic(name: str, dim: int, **kwargs: Any) -> AnalyticProblem:
    """``AnalyticProblem(name, dim, **kwargs)``."""
    return AnalyticProblem(name, dim, **kwargs)


# --- Bayesmark-style sklearn tasks --------------------------------------------------------------

_CLASSIFICATION = {"iris", "wine", "breast", "digits"}


@functools.cache
def _dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    loader = {
        "iris": datasets.load_iris,
        "wine": datasets.load_wine,
        "breast": datasets.load_breast_cancer,
        "digits": datasets.load_digits,
        "diabetes": datasets.load_diabetes,
    }[name]
    x, y = loader(return_X_y=True)
    return np.asarray(x, dtype=float), np.asarray(y)


@functools.cache
def _folds(name: str, n_splits: int = 3) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Fixed shuffled (stratified for classification) folds, shared by every trial."""
    from sklearn.model_selection import KFold, StratifiedKFold

    x, y = _dataset(name)
    splitter = (StratifiedKFold if name in _CLASSIFICATION else KFold)(n_splits, shuffle=True, random_state=0)
    return tuple(splitter.split(x, y))


def _logit_float(trial: optuna.trial.BaseTrial, name: str, low: float, high: float) -> float:
    """Bayesmark's "logit" warping approximated by a log float (both ends away from 0)."""
    return trial.suggest_float(name, low, high, log=True)


def _tree_params(trial: optuna.trial.BaseTrial) -> dict[str, Any]:
    return {
        "max_depth": trial.suggest_int("max_depth", 1, 15),
        "min_samples_split": _logit_float(trial, "min_samples_split", 0.01, 0.99),
        "min_samples_leaf": _logit_float(trial, "min_samples_leaf", 0.01, 0.49),
        "min_weight_fraction_leaf": _logit_float(trial, "min_weight_fraction_leaf", 0.01, 0.49),
        "max_features": _logit_float(trial, "max_features", 0.01, 0.99),
        "min_impurity_decrease": trial.suggest_float("min_impurity_decrease", 0.0, 0.5),
    }


def _dt(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    params = _tree_params(trial)
    if regression:  # targets in the hundreds: impurity decreases of 0..0.5 are meaningless there
        params["min_impurity_decrease"] *= 1000.0
    return (DecisionTreeRegressor if regression else DecisionTreeClassifier)(random_state=0, **params)


def _rf(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.ensemble import RandomForestClassifier

    params = _tree_params(trial)
    params["n_estimators"] = trial.suggest_int("n_estimators", 5, 20)
    return RandomForestClassifier(random_state=0, n_jobs=1, **params)


def _svm(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    kernel = trial.suggest_categorical("kernel", ["rbf", "linear"])
    c = trial.suggest_float("C", 1e-2, 1e3, log=True)
    # conditional: gamma exists only for the RBF kernel
    gamma = trial.suggest_float("gamma", 1e-4, 1.0, log=True) if kernel == "rbf" else "scale"
    tol = trial.suggest_float("tol", 1e-5, 1e-1, log=True)
    return make_pipeline(StandardScaler(), SVC(kernel=kernel, C=c, gamma=gamma, tol=tol, max_iter=20000))


def _knn(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(
        StandardScaler(),
        KNeighborsClassifier(
            n_neighbors=trial.suggest_int("n_neighbors", 1, 25),
            p=trial.suggest_int("p", 1, 4),
            weights=trial.suggest_categorical("weights", ["uniform", "distance"]),
            algorithm="brute",
        ),
    )


def _ada(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.ensemble import AdaBoostClassifier

    return AdaBoostClassifier(
        n_estimators=trial.suggest_int("n_estimators", 10, 50),  # Bayesmark: 10..100; halved for cost
        learning_rate=trial.suggest_float("learning_rate", 1e-4, 1e1, log=True),
        random_state=0,
    )


def _mlp(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(
        StandardScaler(),
        MLPClassifier(
            hidden_layer_sizes=(trial.suggest_int("hidden_layer_sizes", 50, 200),),
            alpha=trial.suggest_float("alpha", 1e-5, 1e1, log=True),
            batch_size=trial.suggest_int("batch_size", 10, 250),
            learning_rate_init=trial.suggest_float("learning_rate_init", 1e-5, 1e-1, log=True),
            tol=trial.suggest_float("tol", 1e-5, 1e-1, log=True),
            validation_fraction=_logit_float(trial, "validation_fraction", 0.1, 0.9),
            beta_1=trial.suggest_float("beta_1", 0.5, 0.99),
            beta_2=trial.suggest_float("beta_2", 0.9, 1.0 - 1e-6),
            epsilon=trial.suggest_float("epsilon", 1e-9, 1e-6, log=True),
            solver="adam",
            early_stopping=True,
            max_iter=MLP_MAX_ITER,
            random_state=0,
        ),
    )


def _lasso(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.linear_model import Lasso
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(
        StandardScaler(),
        Lasso(
            alpha=trial.suggest_float("alpha", 1e-2, 1e2, log=True),
            fit_intercept=trial.suggest_categorical("fit_intercept", [True, False]),
            max_iter=trial.suggest_int("max_iter", 10, 5000, log=True),
            tol=trial.suggest_float("tol", 1e-5, 1e-1, log=True),
            positive=trial.suggest_categorical("positive", [True, False]),
            selection=trial.suggest_categorical("selection", ["cyclic", "random"]),
            random_state=0,
        ),
    )


def _logreg(trial: optuna.trial.BaseTrial, regression: bool) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(
        StandardScaler(),
        LogisticRegression(
            C=trial.suggest_float("C", 1e-2, 1e2, log=True),
            l1_ratio=trial.suggest_categorical("l1_ratio", [0.0, 1.0]),  # l2 or l1 penalty
            intercept_scaling=trial.suggest_float("intercept_scaling", 1e-2, 1e2, log=True),
            tol=trial.suggest_float("tol", 1e-5, 1e-1, log=True),
            solver="liblinear",
        ),
    )


#: MLP epochs cap (keeps a trial well under 0.2 s)
MLP_MAX_ITER = 30
#: model name -> builder(trial, regression) -> unfitted estimator
MODELS: dict[str, Callable[[Any, bool], Any]] = {
    "DT": _dt, "RF": _rf, "SVM": _svm, "kNN": _knn, "ada": _ada, "MLP-adam": _mlp, "lasso": _lasso, "linear": _logreg,
}
#: (model, dataset, metric): the committed task set (see the module docstring of experiments.benchmarks.hpo)
BAYESMARK: tuple[tuple[str, str, str], ...] = (
    ("DT", "wine", "acc"),
    ("DT", "diabetes", "mse"),
    ("RF", "breast", "acc"),
    ("SVM", "breast", "acc"),
    ("kNN", "wine", "acc"),
    ("ada", "wine", "acc"),
    ("MLP-adam", "wine", "acc"),
    ("lasso", "diabetes", "mse"),
    ("linear", "breast", "nll"),
)


def _loss(metric: str, estimator: Any, x: np.ndarray, y: np.ndarray) -> float:
    if metric == "acc":
        return float(1.0 - np.mean(estimator.predict(x) == y))
    if metric == "nll":
        from sklearn.metrics import log_loss

        return float(log_loss(y, np.clip(estimator.predict_proba(x), 1e-15, 1.0), labels=estimator.classes_))
    if metric == "mse":
        return float(np.mean((estimator.predict(x) - y) ** 2) / np.var(y))
    raise ValueError(f"unknown metric {metric!r}")


@dataclass(frozen=True)
class BayesmarkTask:
    """One (model, dataset, metric) task: 3-fold CV loss of the model built from a trial (minimise).

    ``acc`` -> 1 - accuracy, ``nll`` -> log loss, ``mse`` -> MSE / Var(y) on each test fold;
    the loss is the mean over the folds.
    """

    model: str
    dataset: str
    metric: str
    name: str = field(init=False)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose from {sorted(MODELS)}")
        if self.model == "linear" and self.dataset not in {"breast"}:
            raise ValueError("the 'linear' (liblinear logistic regression) model takes binary datasets only")
        object.__setattr__(self, "name", f"{self.model}-{self.dataset}-{self.metric}")

    @property
    def regression(self) -> bool:
        return self.dataset not in _CLASSIFICATION

    def objective(self, trial: optuna.trial.BaseTrial) -> float:
        estimator = MODELS[self.model](trial, self.regression)
        x, y = _dataset(self.dataset)
        losses = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence warnings of capped iterations are expected
            for train, test in _folds(self.dataset):
                estimator.fit(x[train], y[train])
                losses.append(_loss(self.metric, estimator, x[test], y[test]))
        return float(np.mean(losses))


def bayesmark_tasks(names: list[str] | None = None) -> list[BayesmarkTask]:
    """The committed Bayesmark-style tasks (``BAYESMARK``), or those named in ``names``."""
    tasks = [BayesmarkTask(*spec) for spec in BAYESMARK]
    if names is None:
        return tasks
    by_name = {t.name: t for t in tasks}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown Bayesmark task(s) {unknown}; available: {list(by_name)}")
    return [by_name[n] for n in names]
