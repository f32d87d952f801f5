"""The base class of dimension searches: a recipe (and a parameter budget) in, a plan out.

Every search (uniform, MDE, DNIS, iHAS) returns a :class:`~embeddings.plan.DimensionPlan`;
``salience dims --method NAME`` looks searches up by their registered ``name``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from embeddings.plan import DimensionPlan
from recsys.registry import Registered
from recsys.train.recipe import Recipe

__all__ = ["DimensionSearch", "get_search", "search_names"]

class DimensionSearch(Registered, ABC):
    """Chooses embedding dims for the sparse features of a recipe.

    Subclasses set ``name`` (registered for the CLI) and implement :meth:`search`; a
    dataclass subclass gets :meth:`describe` for free.
    """

    kind: ClassVar[str] = "dimension search"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    #: the built-in searches, each imported when first looked up (DNIS and iHAS import torch)
    _builtins: ClassVar[Mapping[str, str]] = {
        "dnis": "embeddings.dims.dnis", "ihas": "embeddings.dims.ihas",
        "mde": "embeddings.dims.searches", "uniform": "embeddings.dims.searches",
    }

    @abstractmethod
    def search(self, recipe: Recipe, budget: int | None = None) -> DimensionPlan:
        """A plan for ``recipe.schema`` with at most ``budget`` embedding parameters (when given)."""


def search_names() -> list[str]:
    """Registered search names: the built-in ones and the plugins imported so far."""
    return DimensionSearch.registered_names()


def get_search(name: str, **options: Any) -> DimensionSearch:
    """Instantiate a registered search by name; unknown names list the known ones."""
    return DimensionSearch.create(name, **options)
