"""The objective of ``salience tune``: one trial is one ``salience fit`` of the config with the
sampled hyperparameters applied, a short per-trial budget and the test pass off; its value is
the best validation AUC.

The trial reaches the fit as an object: the objective binds an :class:`OptunaPruning` callback
to its live ``optuna.Trial`` and hands it to :meth:`Recipe.fit <recsys.train.recipe.Recipe.fit>`.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from experiments.hpo.fit_config import cli_args
from experiments.hpo.pruning import FAIL_REASON_ATTR, RUN_ID_ATTR, NonFiniteMetricError, OptunaPruning
from experiments.hpo.space import SearchSpace

if TYPE_CHECKING:
    from recsys.train.recipe import FitResult, Recipe

__all__ = ["Objective", "TrialSettings", "log_trial"]

#: the trial lines name the command, whichever module logs them
log = logging.getLogger("experiments.hpo.tune")


@dataclass
class TrialSettings:
    """What every worker needs to evaluate trials (picklable: spawned workers get a copy).

    Args:
        config: the ``salience fit`` config file.
        overrides: command-line overrides applied to every trial.
        storage: the study's storage URL.
        study_name: the study.
        sampler: registered sampler name (:class:`~experiments.hpo.samplers.SamplerChoice`).
        n_trials: the study's total trial budget.
        seed: seed of the sampler and of every fit.
        max_epochs: epochs per trial.
        limit_train_batches: training batches (int) or fraction (float) per epoch.
        tracking: one nested MLflow run per trial.
        experiment: MLflow experiment.
        parent_run_id: the study's MLflow parent run.
        workdir: folder of the trials' run folders.
        keep_checkpoints: keep every trial's checkpoints.
        prune_warmup: let the pruner stop GIF warm-start trials too.
        fixed: hyperparameters held out of the search.
    """

    config: str
    overrides: list[str]
    storage: str
    study_name: str
    sampler: str
    n_trials: int
    seed: int
    max_epochs: int
    limit_train_batches: float | None
    tracking: bool
    experiment: str
    parent_run_id: str | None
    workdir: str
    keep_checkpoints: bool
    prune_warmup: bool
    fixed: dict[str, Any] = field(default_factory=dict)


class Objective:
    """Trains one trial's config through the recipe; returns the best validation AUC.

    An exception or a non-finite AUC fails the trial (the reason in the user attribute
    ``fail_reason``); the trial's checkpoints are deleted unless ``keep_checkpoints``.
    """

    def __init__(
        self, settings: TrialSettings, recipe: Recipe, space: SearchSpace, base_args: Mapping[str, Any]
    ) -> None:
        self.settings = settings
        self.recipe = recipe
        self.space = space
        #: the config's backbone arguments (``model.backbone.init_args``) the sampled ones override
        self.base_args = dict(base_args)

    def extra_args(self, trial: optuna.Trial, params: Mapping[str, Any]) -> list[str]:
        """The trial's ``salience fit`` overrides: its hyperparameters and per-trial budget."""
        s = self.settings
        args = cli_args(self.space.config_updates(params, self.base_args))
        args.append("--after_fit.test=false")
        if s.limit_train_batches is not None:
            args.append(f"--trainer.limit_train_batches={s.limit_train_batches}")
        if s.tracking:
            args.append(f"--tracking.experiment={s.experiment}")
        return args

    def pruning(self, trial: optuna.Trial) -> OptunaPruning:
        """The pruning callback of ``trial``, bound to the live trial object."""
        return OptunaPruning.for_trial(trial, prune_warmup=self.settings.prune_warmup)

    def fit(self, trial: optuna.Trial, params: Mapping[str, Any]) -> FitResult:
        s = self.settings
        return self.recipe.fit(
            max_epochs=s.max_epochs,
            seed=s.seed,
            run_name=f"trial-{trial.number:04d}",
            parent_run_id=s.parent_run_id,
            tracking=s.tracking,
            extra_args=self.extra_args(trial, params),
            callbacks=[self.pruning(trial)],
        )

    def __call__(self, trial: optuna.Trial) -> float:
        params = self.space.suggest(trial)
        start = time.perf_counter()
        try:
            result = self.fit(trial, params)
            if result.run_id:
                trial.set_user_attr(RUN_ID_ATTR, result.run_id)
            value = result.metrics.get("best_val_auc", result.metrics.get("val_auc"))
            if value is None:
                raise NonFiniteMetricError("the fit logged no val_auc (no validation ran?)")
            value = float(value)
            if not math.isfinite(value):
                raise NonFiniteMetricError(f"best val_auc is {value} (training diverged)")
            return value
        except optuna.TrialPruned:
            raise
        except Exception as e:
            trial.set_user_attr(FAIL_REASON_ATTR, f"{type(e).__name__}: {e}"[:2000])
            raise
        finally:
            trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
            if not self.settings.keep_checkpoints:
                shutil.rmtree(Path(self.recipe.workdir) / f"trial-{trial.number:04d}", ignore_errors=True)


def log_trial(n_trials: int) -> Any:
    """A study callback logging one line per finished trial (value or why not, and the best)."""

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        try:
            best = f"best {study.best_value:.4f} (#{study.best_trial.number})"
        except ValueError:
            best = "no complete trial yet"
        if trial.state == TrialState.COMPLETE:
            what = f"val_auc {trial.value:.4f}"
        elif trial.state == TrialState.PRUNED:
            what = f"pruned at step {trial.last_step}"
        else:
            what = f"failed: {trial.user_attrs.get(FAIL_REASON_ATTR, 'see the log')}"[:160]
        seconds = trial.user_attrs.get("seconds")
        took = f" {seconds:.1f}s" if isinstance(seconds, (int, float)) else ""
        log.info("trial %d/%d %s%s; %s", trial.number + 1, n_trials, what, took, best)

    return callback
