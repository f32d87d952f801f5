"""The base of the gate-based selectors: one training run with a transform at the seam, then a
score per field read from the trained transform (methods.md §7.2: AutoField, AdaFS, OptFS, LPFS;
LeAP is the same shape with its own reporting, :mod:`selection.model_based.leap`).

    class MyGates(SeamSelector):
        name = "my_gates"
        def seam_spec(self): return {"class_path": "mypkg.MySeam", "init_args": {...}}
        def field_scores(self, fit): return {field: score, ...}, {"extra": ...}
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, TypeVar

from recsys.models.seam import SeamTransform
from recsys.train.recipe import FitResult, Recipe
from selection.base import ImportanceMethod, method_report, screen_leakage
from selection.report import ImportanceReport

__all__ = ["SeamSelector", "trained_seam"]

S = TypeVar("S", bound=SeamTransform)


def trained_seam(fit: FitResult, kind: type[S]) -> S:
    """The seam transform of ``fit``'s model, checked to be a ``kind``."""
    seam = fit.task.model.seam
    if not isinstance(seam, kind):
        raise TypeError(f"the fit's seam is {type(seam).__name__}, not {kind.__name__}")
    return seam


@dataclass
class SeamSelector(ImportanceMethod):
    """Trains once with :meth:`seam_spec` installed and ranks by :meth:`field_scores`.

    Args:
        max_epochs: override the recipe's ``trainer.max_epochs`` (None: the recipe's).
        seed: ``seed_everything`` of the fit.
        tracking: log the fit to MLflow.
        leakage_threshold: features of the training rows scoring at least this x a copy of the
            label (OutRank's check) are left out of the fit and listed as excluded; 0 turns the
            screen off.
        id_screen: rank ID-like features with no signal beyond chance on the training rows
            after all the others (:func:`~selection.base.screen_memorisable`).
    """

    max_epochs: int | None = None
    seed: int = 0
    tracking: bool = True
    leakage_threshold: float = 0.9
    id_screen: bool = True

    @abstractmethod
    def seam_spec(self) -> dict[str, Any]:
        """The ``model.seam`` spec of the fit (``class_path`` and ``init_args``)."""

    @abstractmethod
    def field_scores(self, fit: FitResult) -> tuple[dict[str, float], dict[str, Any]]:
        """``(score of every seam field, report extras)`` of the trained ``fit``."""

    def rank(self, recipe: Recipe, run_name: str | None = None, parent_run_id: str | None = None) -> ImportanceReport:
        start = time.perf_counter()
        leaks = screen_leakage(recipe, self.leakage_threshold) if self.leakage_threshold > 0 else {}
        fit = recipe.fit(
            features=[n for n in recipe.schema.names if n not in leaks] if leaks else None,
            seam=self.seam_spec(), max_epochs=self.max_epochs, seed=self.seed, run_name=run_name or self.name,
            parent_run_id=parent_run_id, tracking=self.tracking,
        )
        scores, extras = self.field_scores(fit)
        extras.update(test_auc=fit.metrics.get("test_auc"), best_val_auc=fit.metrics.get("best_val_auc"),
                      run_id=fit.run_id, fit_seconds=fit.seconds)
        return method_report(self, recipe, scores, start,
                             {f: f"{reason} (trained without it)" for f, reason in leaks.items()}, extras,
                             id_screen=self.id_screen)
