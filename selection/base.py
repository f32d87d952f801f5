"""The base class of importance methods and the random-ranking baseline.

Every method answers one question: given a training recipe (data + backbone + trainer
settings), how much does each feature matter? It returns an
:class:`~selection.report.ImportanceReport`. Model-free methods (OutRank) read the raw
training rows; model-based ones (permutation importance, LeAP) train through the recipe.
Subclasses register themselves by ``name``, which is what ``salience rank --method`` takes.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from recsys.data.schema import Schema
from recsys.registry import Registered
from recsys.train.recipe import Recipe
from selection.report import ImportanceReport

if TYPE_CHECKING:
    from selection.model_free.outrank_scoring import OutRankScores

__all__ = [
    "ImportanceMethod", "WidthRefusal", "RandomRanking", "feature_widths", "get_method", "method_names", "method_report", "screen_leakage",
    "screen_memorisable", "trained_schema", "training_relevance", "with_memorisable_demoted",
]

class WidthRefusal(ValueError):
    """A method refuses a ranking at once because of its cost at this width; the message names
    the cost (what it would take) and what to use instead."""


#: the built-in methods: name -> the module that defines (and, imported, registers) it. A method is
#: imported when it is first looked up, so that ranking a file with OutRank does not import the
#: model-based methods, and torch with them. None of them is a baseline (tested).
BUILTIN_METHODS: dict[str, str] = {
    "adafs": "selection.model_based.adafs", "autofield": "selection.model_based.autofield",
    "gbdt": "selection.shallow.gbdt", "lasso": "selection.shallow.lasso", "leap": "selection.model_based.leap",
    "lightgbm": "selection.shallow.lightgbm_importance", "lpfs": "selection.model_based.lpfs",
    "optfs": "selection.model_based.optfs", "outrank": "selection.model_free.outrank",
    "permutation": "selection.model_based.permutation", "random_forest": "selection.shallow.random_forest",
    "sfs": "selection.model_based.sensitivity", "shark": "selection.model_based.sensitivity",
}


class ImportanceMethod(Registered, ABC):
    """Ranks the features of a recipe.

    Subclasses set ``name`` (registered for the CLI) and implement :meth:`rank`; a dataclass
    subclass gets :meth:`describe` for free. The built-in methods are registered by name before
    their modules are imported (:data:`BUILTIN_METHODS`).
    """

    kind: ClassVar[str] = "importance method"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    #: a reference ranking that reads no signal (the random baseline): kept out of the contract
    #: that every method recovers planted features
    baseline: ClassVar[bool] = False
    _builtins: ClassVar[Mapping[str, str]] = BUILTIN_METHODS

    @classmethod
    def selector_names(cls) -> list[str]:
        """The registered methods that read signal (every one but the baselines), without importing
        the built-in ones not imported yet."""
        return [n for n in cls.registered_names() if not getattr(cls._registry.get(n), "baseline", False)]

    @abstractmethod
    def rank(self, recipe: Recipe) -> ImportanceReport:
        """Rank every feature of ``recipe`` (most important first)."""


def method_names() -> list[str]:
    """Registered method names: the built-in ones and the plugins imported so far."""
    return ImportanceMethod.registered_names()


def get_method(name: str, **options: Any) -> ImportanceMethod:
    """Instantiate a registered method by name; unknown names list the known ones."""
    return ImportanceMethod.create(name, **options)


def training_relevance(recipe: Recipe) -> OutRankScores:
    """OutRank's relevance of every feature on ``recipe``'s raw training rows (model-free; no
    pairs): what :func:`screen_leakage` reads, and LeAP's rank-fusion partner."""
    from selection.model_free.outrank_scoring import OutRankConfig, Ranking, score_raw

    settings = OutRankConfig(ranking=Ranking.RELEVANCE, progress=False)
    return score_raw(recipe.raw_split("train"), settings, pairs=False)


def screen_leakage(recipe: Recipe, threshold: float = 0.9, scores: OutRankScores | None = None) -> dict[str, str]:
    """Features of the training rows that (nearly) copy the label -> reason.

    OutRank's label-copy check (relevance at least ``threshold`` x the score of a copy of the
    label). Model-based methods train without these features and list them as excluded, so
    a leak is flagged instead of silently ranked first. ``scores``: :func:`training_relevance`
    of ``recipe`` when the caller has it already.
    """
    return (scores or training_relevance(recipe)).leakage(threshold)


def screen_memorisable(recipe: Recipe, report: ImportanceReport) -> ImportanceReport:
    """``report`` with the ID-like features that carry no signal beyond chance on the recipe's
    training rows (:func:`~selection.model_free.outrank_scoring.memorisable_features`) ranked after all
    the others (:func:`with_memorisable_demoted`).

    A learned selector scores what its model fitted on the training rows, and a model fits the
    training labels through an impression id as well as through a real signal: gates, tree
    gains and gradient scores of such a field reward memorisation, not what generalises. This
    is the learned selectors' shared guard (their ``id_screen`` option); the model-free OutRank
    needs none, its null correction already scores such a field ~0.
    """
    from selection.model_free.outrank_scoring import memorisable_features

    return with_memorisable_demoted(report, memorisable_features(recipe.raw_split("train"), report.ranking))


def with_memorisable_demoted(report: ImportanceReport, memorisable: dict[str, str]) -> ImportanceReport:
    """``report`` with ``memorisable`` (feature -> why) moved after every other feature, flagged
    ``id_like``; ``extras["memorisable"]`` lists them and ``extras["unscreened_ranking"]`` keeps
    the order before this screen."""
    if not any(f in memorisable for f in report.ranking):
        return report
    out = report.demoted(memorisable, flag="id_like", key="memorisable")
    out.extras["unscreened_ranking"] = report.ranking
    return out


def method_report(
    method: ImportanceMethod, recipe: Recipe, scores: dict[str, float], start: float,
    excluded: dict[str, str] | None = None, extras: dict[str, Any] | None = None, id_screen: bool = False,
) -> ImportanceReport:
    """The report of ``scores`` (seam fields or features of ``recipe``) for ``method``: widths and
    kinds from the recipe's schema, features without a score listed as excluded, cost counted
    from ``start`` (a ``time.perf_counter()`` value); with ``id_screen``, passed through
    :func:`screen_memorisable`."""
    schema = trained_schema(recipe)
    widths = feature_widths(schema)
    out = dict(excluded or {})
    out.update({f: "not a seam field of the model" for f in schema.names if f not in scores and f not in out})
    report = ImportanceReport.from_scores(
        method.name, scores, widths={f: widths.get(f, 1) for f in scores},
        kinds={f.name: f.kind.value for f in schema.features}, config=method.describe(),
        cost_seconds=time.perf_counter() - start, dataset=recipe.dataset_name, excluded=out, extras=dict(extras or {}),
    )
    if id_screen:
        report = screen_memorisable(recipe, report)
        report.cost_seconds = time.perf_counter() - start
    return report


def trained_schema(recipe: Recipe) -> Schema:
    """The recipe's fitted schema with its ``data.embedding_dims`` applied: the widths its
    models train with."""
    dims = getattr(recipe.datamodule, "embedding_dims", None)
    return recipe.schema.with_dims(dims) if dims else recipe.schema


def feature_widths(schema: Schema) -> dict[str, int]:
    """Width each feature occupies at the seam, its input dimensions: the embedding dim of an id,
    1 for a dense scalar, D for a vector."""
    return {f.name: f.width for f in schema.features}


@dataclass
class RandomRanking(ImportanceMethod):
    """A uniformly random ranking: the baseline every selection curve is drawn against.

    Args:
        seed: seed of the permutation.
    """

    name: ClassVar[str] = "random"
    baseline: ClassVar[bool] = True
    seed: int = 0

    def rank(self, recipe: Recipe) -> ImportanceReport:
        start = time.perf_counter()
        schema = recipe.schema
        return self.rank_schema(schema, dataset=recipe.dataset_name, start=start)

    def rank_schema(self, schema: Schema, dataset: str = "", start: float | None = None) -> ImportanceReport:
        """Rank the features of ``schema`` at random (no data needed)."""
        start = time.perf_counter() if start is None else start
        names = schema.names
        order = np.random.default_rng(self.seed).permutation(len(names))
        scores = {names[i]: float(len(names) - r) for r, i in enumerate(order)}
        return ImportanceReport.from_scores(
            "random",
            scores,
            widths=feature_widths(schema),
            kinds={f.name: f.kind.value for f in schema.features},
            config=self.describe(),
            cost_seconds=time.perf_counter() - start,
            dataset=dataset,
        )
