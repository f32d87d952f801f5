"""Hyperparameter optimisation: the GIF sampler on Optuna, its baselines and ablations, MLflow
tracking of studies, and ``salience tune`` for ranking models.

    import optuna
    from experiments.hpo import make_sampler

    study = optuna.create_study(sampler=make_sampler("gif", n_trials=100, seed=0))
    study.optimize(objective, n_trials=100)

Samplers are chosen by name from one registry (:class:`SamplerChoice`); adding one is one new
class.
"""

from __future__ import annotations

from typing import Any

from experiments.hpo.gif import (
    GIF_PRESETS,
    GIFConfig,
    GIFSampler,
    Schedule,
    SequentialGroupingSampler,
    read_schedule,
    trial_phase,
)
from experiments.hpo.importance import EvaluatorChoice, NRReliefFImportanceEvaluator, make_evaluator
from experiments.hpo.samplers import SamplerChoice, make_sampler

__all__ = [
    "GIF_PRESETS",
    "SAMPLER_NAMES",
    "EvaluatorChoice",
    "GIFConfig",
    "GIFSampler",
    "NRReliefFImportanceEvaluator",
    "SamplerChoice",
    "Schedule",
    "SequentialGroupingSampler",
    "make_evaluator",
    "make_sampler",
    "read_schedule",
    "trial_phase",
]


def __getattr__(name: str) -> Any:
    if name == "SAMPLER_NAMES":  # the registered sampler names, read when asked (never stale)
        return tuple(SamplerChoice.registered_names())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
