"""Hyperparameter importance: an N-RReliefF evaluator and one registry of the evaluators GIF uses.

N-RReliefF (methods.md 7.3) is RReliefF (Robnik-Šikonja and Kononenko, 1997) for a regression
target, with the weights clipped at zero and normalised to sum to one: a hyperparameter matters
when configurations that lie close in the whole space but differ in it also differ in the
objective. It needs no surrogate model, works from a few dozen trials and handles categorical and
conditional parameters (absent counts as its own value)::

    import optuna
    from experiments.hpo.importance import NRReliefFImportanceEvaluator

    optuna.importance.get_param_importances(study, evaluator=NRReliefFImportanceEvaluator())
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.importance import BaseImportanceEvaluator
from optuna.trial import FrozenTrial, TrialState

from recsys.registry import Registered

__all__ = [
    "ElementaryEffectsImportanceEvaluator",
    "EvaluatorChoice",
    "NRReliefFImportanceEvaluator",
    "make_evaluator",
    "unit_encode",
]


class EvaluatorChoice(Registered, ABC):
    """An importance evaluator GIF can be given by name: one subclass per name (plus its
    ``aliases``), each building the evaluator."""

    kind: ClassVar[str] = "importance evaluator"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    #: other accepted spellings of ``name``
    aliases: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def build(self, seed: int | None = None) -> BaseImportanceEvaluator:
        """The evaluator (``seed`` for the randomised ones)."""

    @classmethod
    def resolve(cls, name: str) -> str:
        """The registered name of ``name`` or one of its aliases (case and ``_``/``-``
        insensitive); an unknown name is an error listing the registered ones."""
        key = str(name).lower().replace("_", "-")
        for registered, choice in cls._registry.items():
            if key == registered or key in getattr(choice, "aliases", ()):
                return registered
        raise ValueError(f"unknown {cls.kind} {name!r}; available: {cls.registered_names()}")


class PedAnova(EvaluatorChoice):
    """Optuna's default, PED-ANOVA."""

    name = "ped-anova"
    aliases = ("pedanova", "ped")

    def build(self, seed: int | None = None) -> BaseImportanceEvaluator:
        return optuna.importance.PedAnovaImportanceEvaluator()


class Fanova(EvaluatorChoice):
    """fANOVA: random-forest variance decomposition."""

    name = "fanova"

    def build(self, seed: int | None = None) -> BaseImportanceEvaluator:
        return optuna.importance.FanovaImportanceEvaluator(seed=seed)


class RReliefF(EvaluatorChoice):
    """:class:`NRReliefFImportanceEvaluator`."""

    name = "rrelieff"
    aliases = ("n-rrelieff", "relieff")

    def build(self, seed: int | None = None) -> BaseImportanceEvaluator:
        return NRReliefFImportanceEvaluator()


class MeanDecreaseImpurity(EvaluatorChoice):
    """Mean decrease in impurity of a random forest."""

    name = "mdi"

    def build(self, seed: int | None = None) -> BaseImportanceEvaluator:
        return optuna.importance.MeanDecreaseImpurityImportanceEvaluator(seed=seed)


class ElementaryEffects(EvaluatorChoice):
    """:class:`ElementaryEffectsImportanceEvaluator`."""

    name = "elementary-effects"
    aliases = ("oat", "morris")

    def build(self, seed: int | None = None) -> BaseImportanceEvaluator:
        return ElementaryEffectsImportanceEvaluator()


def make_evaluator(name: str | BaseImportanceEvaluator, seed: int | None = None) -> BaseImportanceEvaluator:
    """An importance evaluator by registered name (:class:`EvaluatorChoice`: ``ped-anova``,
    ``fanova``, ``rrelieff``, ``mdi``, ``elementary-effects``, or an alias); an evaluator
    instance is returned as is."""
    if isinstance(name, BaseImportanceEvaluator):
        return name
    choice: EvaluatorChoice = EvaluatorChoice.create(EvaluatorChoice.resolve(name))
    return choice.build(seed=seed)


def _finite_trials(study: optuna.Study, target: Callable[[FrozenTrial], float] | None) -> list[tuple[FrozenTrial, float]]:
    """Completed trials with a finite target value (the objective by default)."""
    if target is None and len(study.directions) > 1:
        raise ValueError("a multi-objective study needs `target` to assess importance")
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    values = [target(t) if target is not None else t.value for t in trials]
    return [(t, float(v)) for t, v in zip(trials, values) if v is not None and math.isfinite(v)]


def unit_encode(values: list[object], dist: BaseDistribution) -> tuple[np.ndarray, bool]:
    """Map one parameter's values (``None`` = absent) into ``[0, 1]`` (log scale where the
    distribution is), absent as ``nan``. Returns ``(x [n], categorical)``; categorical values
    come back as their choice index."""
    x = np.full(len(values), np.nan)
    if isinstance(dist, CategoricalDistribution):
        for i, v in enumerate(values):
            if v is not None:
                x[i] = dist.to_internal_repr(v)  # type: ignore[arg-type]
        return x, True
    assert isinstance(dist, (FloatDistribution, IntDistribution))
    low, high = float(dist.low), float(dist.high)
    for i, v in enumerate(values):
        if v is not None:
            x[i] = float(v)  # type: ignore[arg-type]
    if dist.log:
        low, high, x = math.log(low), math.log(high), np.log(x)
    return (x - low) / (high - low) if high > low else np.zeros_like(x), False


class NRReliefFImportanceEvaluator(BaseImportanceEvaluator):
    """Normalised RReliefF importance of each hyperparameter.

    For every completed trial ``i`` and its ``k`` nearest neighbours ``j`` (range-normalised
    Manhattan distance over all parameters; rank-based weights ``w_ij ∝ exp(-(rank/sigma)^2)``)::

        N_dC      += w_ij |y_i - y_j|
        N_dA      += w_ij diff_A(i, j)
        N_dCdA    += w_ij |y_i - y_j| diff_A(i, j)
        W_A        = N_dCdA / N_dC - (N_dA - N_dCdA) / (m - N_dC)

    with ``y`` scaled to ``[0, 1]`` by rank (robust to outliers and to the objective's units),
    ``diff_A`` the absolute difference in the unit-scaled parameter (0/1 for categoricals; an
    absent conditional parameter differs from any present value by 1). Negative weights are
    clipped to zero; :func:`optuna.importance.get_param_importances` normalises them to sum 1.

    Args:
        n_neighbors: neighbours per trial ``k`` (capped at the number of trials minus one).
        sigma: width of the rank weighting (in neighbours).
    """

    def __init__(self, n_neighbors: int = 10, sigma: float = 5.0) -> None:
        if n_neighbors < 1:
            raise ValueError(f"n_neighbors must be at least 1, got {n_neighbors}")
        self.n_neighbors = n_neighbors
        self.sigma = sigma

    def evaluate(
        self,
        study: optuna.Study,
        params: list[str] | None = None,
        *,
        target: Callable[[FrozenTrial], float] | None = None,
    ) -> dict[str, float]:
        kept = _finite_trials(study, target)
        trials = [t for t, _ in kept]
        values = np.array([v for _, v in kept], dtype=float)
        distributions: dict[str, BaseDistribution] = {}
        for t in trials:
            for name, dist in t.distributions.items():
                distributions.setdefault(name, dist)
        names = sorted(distributions) if params is None else list(params)
        missing = [n for n in names if n not in distributions]
        if missing:
            raise ValueError(f"no completed trial has the parameter(s) {missing}")
        if len(trials) < 3 or not names:
            return {n: 0.0 for n in names}
        columns = [unit_encode([t.params.get(n) for t in trials], distributions[n]) for n in names]
        weights = self._weights(np.stack([c for c, _ in columns], 1), np.array([cat for _, cat in columns]), values)
        order = np.argsort(-weights, kind="stable")
        return {names[i]: float(weights[i]) for i in order}

    def _weights(self, x: np.ndarray, categorical: np.ndarray, y: np.ndarray) -> np.ndarray:
        """RReliefF weights ``[d]`` of unit-scaled parameters ``x [n, d]`` (nan = absent)."""
        n = len(y)
        # per-pair, per-parameter differences [n, n, d]
        diff = np.abs(x[:, None, :] - x[None, :, :])
        diff[:, :, categorical] = (diff[:, :, categorical] > 0).astype(float)
        absent = np.isnan(x)
        both_absent = absent[:, None, :] & absent[None, :, :]
        diff = np.where(np.isnan(diff), np.where(both_absent, 0.0, 1.0), diff)
        ranks = np.argsort(np.argsort(y, kind="stable"), kind="stable")
        dy = np.abs(ranks[:, None] - ranks[None, :]) / max(n - 1, 1)
        dist = diff.sum(-1)
        np.fill_diagonal(dist, np.inf)
        k = min(self.n_neighbors, n - 1)
        neighbours = np.argsort(dist, axis=1, kind="stable")[:, :k]  # [n, k]
        w = np.exp(-((np.arange(1, k + 1) / self.sigma) ** 2))
        w = np.broadcast_to(w / w.sum(), (n, k))
        rows = np.arange(n)[:, None]
        dy_k = dy[rows, neighbours]  # [n, k]
        da_k = diff[rows, neighbours]  # [n, k, d]
        n_dc = float((w * dy_k).sum())
        n_da = (w[..., None] * da_k).sum((0, 1))
        n_dcda = (w[..., None] * dy_k[..., None] * da_k).sum((0, 1))
        m = float(n)
        if n_dc <= 0.0:  # every neighbour has the same value: nothing to attribute
            return np.zeros(x.shape[1])
        score = n_dcda / n_dc - (n_da - n_dcda) / max(m - n_dc, 1e-12)
        return np.clip(score, 0.0, None)


class ElementaryEffectsImportanceEvaluator(BaseImportanceEvaluator):
    """Importance from one-at-a-time pairs: the mean ``|y_a - y_b|`` over pairs of completed
    trials that differ in exactly that one parameter (Morris's ``mu*`` without the step
    scaling, since GIF's probes all move half the range). Parameters with no such pair get 0.

    GIF's default warm start adds one probe per parameter around the best Latin-hypercube
    trial, which this evaluator reads; on a space-filling design alone it finds no pairs.
    """

    def evaluate(
        self,
        study: optuna.Study,
        params: list[str] | None = None,
        *,
        target: Callable[[FrozenTrial], float] | None = None,
    ) -> dict[str, float]:
        kept = _finite_trials(study, target)
        names = sorted({p for t, _ in kept for p in t.params}) if params is None else list(params)
        effects: dict[str, list[float]] = {n: [] for n in names}
        for name in names:  # trials that agree on every other parameter share a key
            buckets: dict[str, list[tuple[object, float]]] = {}
            for t, v in kept:
                if name in t.params:
                    rest = repr(sorted((k, repr(x)) for k, x in t.params.items() if k != name))
                    buckets.setdefault(rest, []).append((t.params[name], v))
            for members in buckets.values():
                for i in range(len(members)):
                    for j in range(i + 1, len(members)):
                        if members[i][0] != members[j][0]:
                            effects[name].append(abs(members[i][1] - members[j][1]))
        scores = {n: float(np.mean(e)) if e else 0.0 for n, e in effects.items()}
        return dict(sorted(scores.items(), key=lambda kv: -kv[1]))
