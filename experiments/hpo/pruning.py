"""Pruning a ``salience tune`` trial: the Lightning callback that reports every validation to its
Optuna trial, and the pruners chosen by name (``--pruner``).

``salience tune`` builds the callback for each trial's live ``optuna.Trial``
(:meth:`OptunaPruning.for_trial`) and hands it to the fit; a ``salience fit`` config can add it
from plain arguments instead, and it then rebuilds the trial from the storage.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import optuna
from lightning.pytorch.callbacks import Callback

from recsys.registry import Registered

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = [
    "FAIL_REASON_ATTR",
    "RUN_ID_ATTR",
    "MedianPruning",
    "NoPruning",
    "NonFiniteMetricError",
    "OptunaPruning",
    "PrunerChoice",
    "make_pruner",
]

log = logging.getLogger(__name__)

#: trial user attributes: the fit's MLflow run, and why a trial failed
RUN_ID_ATTR = "mlflow_run_id"
FAIL_REASON_ATTR = "fail_reason"


class NonFiniteMetricError(ValueError):
    """A trial's validation metric is NaN or infinite (training diverged)."""


# -- pruners by name ----------------------------------------------------------------------------
class PrunerChoice(Registered, ABC):
    """A pruner ``salience tune --pruner NAME`` can use: one subclass per name, each building its
    Optuna pruner (Optuna does not store pruners, so a trial rebuilt from storage names its own)."""

    kind: ClassVar[str] = "pruner"
    _registry: ClassVar[dict[str, type[Registered]]] = {}

    @abstractmethod
    def build(self) -> optuna.pruners.BasePruner:
        """The Optuna pruner."""


class MedianPruning(PrunerChoice):
    """``MedianPruner(n_startup_trials=5, n_warmup_steps=1)``: a trial is pruned from its second
    epoch on when below the median of earlier trials at the same epoch, once 5 trials finished."""

    name = "median"

    def build(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)


class NoPruning(PrunerChoice):
    """Every trial runs its full budget."""

    name = "none"

    def build(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.NopPruner()


def make_pruner(name: str | optuna.pruners.BasePruner | None) -> optuna.pruners.BasePruner:
    """The pruner registered as ``name`` (:class:`PrunerChoice`: ``median``, ``none``); ``None``
    is ``none``; a pruner instance is returned as is."""
    if isinstance(name, optuna.pruners.BasePruner):
        return name
    choice: PrunerChoice = PrunerChoice.create("none" if name is None else name)
    return choice.build()


# -- the callback -------------------------------------------------------------------------------
class OptunaPruning(Callback):
    """Report the validation metric of every epoch to an Optuna trial; prune when told to.

    ``salience tune`` binds it to the live trial (:meth:`for_trial`). Built from plain arguments,
    a ``salience fit`` config or command line can add it too::

        --trainer.callbacks+={"class_path": "experiments.hpo.pruning.OptunaPruning",
                              "init_args": {"storage": URL, "study_name": NAME, "trial_number": N}}

    and the trial is then rebuilt from the storage (with the pruner named by ``pruner``: Optuna
    does not store pruners). A non-finite metric raises :class:`NonFiniteMetricError` (the
    trial fails); a pruned trial's MLflow run ends ``KILLED`` with the tag ``optuna.state``.

    Args:
        storage: the study's storage URL.
        study_name: the study.
        trial_number: the trial's number in the study.
        monitor: metric reported each validation epoch.
        prune_warmup: also prune GIF warm-start trials (off: the importance assessment needs
            full evaluations).
        pruner: the pruner of a trial rebuilt from storage (see :func:`make_pruner`).
    """

    def __init__(
        self,
        storage: str | None = None,
        study_name: str | None = None,
        trial_number: int | None = None,
        monitor: str = "val_auc",
        prune_warmup: bool = False,
        pruner: str = "median",
    ) -> None:
        super().__init__()
        self.pruner = pruner
        self.storage = storage
        self.study_name = study_name
        self.trial_number = trial_number
        self.monitor = monitor
        self.prune_warmup = prune_warmup
        self._trial: optuna.Trial | None = None
        self._step = 0
        self._can_prune = True

    @classmethod
    def for_trial(cls, trial: optuna.Trial, monitor: str = "val_auc", prune_warmup: bool = False) -> OptunaPruning:
        """A callback bound to a live trial object (no storage lookup)."""
        cb = cls(
            study_name=trial.study.study_name, trial_number=trial.number, monitor=monitor, prune_warmup=prune_warmup
        )
        cb._bind(trial)
        return cb

    def _bind(self, trial: optuna.Trial) -> None:
        self._trial = trial
        if not self.prune_warmup:
            from experiments.hpo.gif import trial_phase

            # GIF writes the phase in before_trial, after the Trial object cached its state
            frozen = trial.study._storage.get_trial(trial._trial_id)
            self._can_prune = trial_phase(frozen)[0] != "warmup"

    @property
    def trial(self) -> optuna.Trial:
        """The bound trial, rebuilt from :attr:`storage` on first use when not given live."""
        if self._trial is None:
            self._bind(self._trial_from_storage())
        assert self._trial is not None
        return self._trial

    def _trial_from_storage(self) -> optuna.Trial:
        if self.study_name is None or self.trial_number is None:
            raise ValueError("OptunaPruning needs study_name and trial_number")
        if self.storage is None:
            raise ValueError(
                f"OptunaPruning: trial {self.trial_number} of study {self.study_name!r} was not given live; "
                "give the storage URL (init_args.storage)"
            )
        from experiments.hpo.storage import open_storage

        study = optuna.load_study(
            study_name=self.study_name,
            storage=open_storage(self.storage, heartbeat=False),
            pruner=make_pruner(self.pruner),
        )
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(self.trial_number))
        return optuna.trial.Trial(study, trial_id)

    def _tracker(self, trainer: pl.Trainer) -> Any:
        from recsys.tracking import MlflowTracking
        from recsys.trainer_attrs import trainer_callbacks

        tracking = next((c for c in trainer_callbacks(trainer) if isinstance(c, MlflowTracking)), None)
        return tracking.tracker if tracking is not None else None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        tracker = self._tracker(trainer)  # started in setup; a pruned or failed fit keeps its id too
        if tracker is not None:
            self.trial.set_user_attr(RUN_ID_ATTR, tracker.run_id)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metric = trainer.callback_metrics.get(self.monitor)
        if metric is None:
            log.warning("OptunaPruning: no %r logged this validation; nothing reported", self.monitor)
            return
        value = float(metric)
        step, self._step = self._step, self._step + 1
        if not math.isfinite(value):
            raise NonFiniteMetricError(f"{self.monitor} is {value} after validation {step} (training diverged)")
        trial = self.trial
        trial.report(value, step)
        if self._can_prune and trial.should_prune():
            raise optuna.TrialPruned(f"pruned after validation {step}: {self.monitor}={value:.4f}")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        tracker = self._tracker(trainer)
        if isinstance(exception, optuna.TrialPruned) and tracker is not None:
            tracker.set_tags({"optuna.state": "PRUNED"})
            tracker.finish("KILLED")
