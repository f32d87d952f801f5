"""Samplers by name: GIF, its baselines and ablations, and any registered later.

Each name is one :class:`SamplerChoice` subclass that builds its Optuna sampler; adding a
sampler is one new class::

    class Anneal(SamplerChoice):
        name = "anneal"

        def build(self, n_trials, seed=None, **options):
            return MyAnnealingSampler(seed=seed)

    make_sampler("anneal", n_trials=50, seed=0)      # salience tune --sampler anneal
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from experiments.hpo.gif import GIFConfig, GIFSampler, SequentialGroupingSampler
from recsys.registry import Registered

__all__ = [
    "GIFChoice",
    "GIFNoFallback",
    "GIFNoHIA",
    "GIFPaper",
    "GIFProportional",
    "RandomChoice",
    "SamplerChoice",
    "SequentialGroupingChoice",
    "TPEChoice",
    "make_sampler",
    "study_sampler",
]


class SamplerChoice(Registered, ABC):
    """A search strategy chosen by name (``make_sampler(name)``, ``salience tune --sampler``).

    Subclasses set ``name`` and build the Optuna sampler for a study of ``n_trials`` trials.
    """

    kind: ClassVar[str] = "sampler"
    _registry: ClassVar[dict[str, type[Registered]]] = {}

    @abstractmethod
    def build(self, n_trials: int, seed: int | None = None, **options: Any) -> BaseSampler:
        """The sampler; ``options`` are sampler-specific (GIF's :class:`GIFConfig` fields)."""


class GIFChoice(SamplerChoice):
    """GIF with the options of :class:`GIFConfig` preset ``preset``."""

    name = "gif"
    #: the :data:`~experiments.hpo.gif_config.GIF_PRESETS` entry this name runs
    preset: ClassVar[str] = "default"

    def build(self, n_trials: int, seed: int | None = None, **options: Any) -> BaseSampler:
        return GIFSampler(n_trials, seed=seed, config=GIFConfig.preset(self.preset), **options)


class TPEChoice(SamplerChoice):
    """Optuna's multivariate TPE (``constant_liar`` for parallel workers)."""

    name = "tpe"

    def build(self, n_trials: int, seed: int | None = None, **options: Any) -> BaseSampler:
        return optuna.samplers.TPESampler(multivariate=True, constant_liar=True, seed=seed)


class RandomChoice(SamplerChoice):
    """Random search."""

    name = "random"

    def build(self, n_trials: int, seed: int | None = None, **options: Any) -> BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)


class SequentialGroupingChoice(SamplerChoice):
    """Sequential Grouping (GSOS), the baseline GIF improves on."""

    name = "sg"

    def build(self, n_trials: int, seed: int | None = None, **options: Any) -> BaseSampler:
        return SequentialGroupingSampler(n_trials, seed=seed, **options)


class GIFNoHIA(GIFChoice):
    """Ablation: random groups, no importance assessment."""

    name = "gif-no-hia"
    preset = "no-hia"


class GIFProportional(GIFChoice):
    """Ablation: budgets in proportion to group importance (the paper's rule) instead of equal."""

    name = "gif-proportional"
    preset = "proportional"


class GIFNoFallback(GIFChoice):
    """Ablation: no final full-space search."""

    name = "gif-no-fallback"
    preset = "no-fallback"


class GIFPaper(GIFChoice):
    """The literal methods.md 6.2 design: space-filling warm start, PED-ANOVA, proportional
    allocation, TPE on all trials."""

    name = "gif-paper"
    preset = "paper"


def make_sampler(name: str, *, n_trials: int, seed: int | None = None, **options: Any) -> BaseSampler:
    """The sampler registered as ``name`` (:class:`SamplerChoice`); ``options`` go to its
    :meth:`~SamplerChoice.build` (GIF's: :class:`GIFConfig` fields). An unknown name is an
    error listing the registered ones."""
    choice: SamplerChoice = SamplerChoice.create(name)
    return choice.build(n_trials, seed=seed, **options)


def study_sampler(name: str, n_trials: int, seed: int) -> BaseSampler:
    """The sampler a ``salience tune`` process runs: GIF as is (its decisions are functions of
    the seed, the trial number and the storage, so every worker shares one seed); any other
    sampler seeded per trial (:class:`TrialSeededSampler`), since with one seed every process
    would draw the same points."""
    sampler = make_sampler(name, n_trials=n_trials, seed=seed)
    return sampler if isinstance(sampler, GIFSampler) else TrialSeededSampler(name, n_trials, seed)


class TrialSeededSampler(BaseSampler):
    """``make_sampler(name, seed=...)`` built afresh for every trial, seeded from ``(seed, trial
    number)``.

    A sampler seeded once draws the same sequence in every process, so ``--workers`` processes
    or ``salience tune`` commands on several machines sharing one study would evaluate the same
    points. Seeded per trial number, every trial gets its own draw wherever it runs, and a
    rerun of the study draws the same points again (for ``random``; TPE also depends on the
    trials finished so far). The samplers wrapped keep no state between trials but their random
    generator (TPE rebuilds its model from the study each trial).
    """

    def __init__(self, name: str, n_trials: int, seed: int) -> None:
        self.name = name
        self.n_trials = n_trials
        self.seed = seed
        self._samplers: dict[int, BaseSampler] = {}
        self._lock = threading.Lock()

    def _sampler(self, trial: FrozenTrial) -> BaseSampler:
        import warnings

        import numpy as np

        with self._lock:
            sampler = self._samplers.get(trial._trial_id)
            if sampler is None:
                seed = int(np.random.SeedSequence([self.seed % 2**32, trial.number]).generate_state(1)[0])
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # TPE's options
                    sampler = make_sampler(self.name, n_trials=self.n_trials, seed=seed)
                self._samplers[trial._trial_id] = sampler
            return sampler

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._sampler(trial).before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._sampler(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._sampler(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._sampler(trial).sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._sampler(trial).after_trial(study, trial, state, values)
        with self._lock:
            self._samplers.pop(trial._trial_id, None)

    def reseed_rng(self) -> None:  # every trial is seeded from its number
        pass
