"""The base class of dimension searches: a recipe (and a parameter budget) in, a plan out.

Every search (uniform, MDE, DNIS, iHAS) returns a :class:`~embeddings.plan.DimensionPlan`;
``salience dims --method NAME`` looks searches up by their registered ``name``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, is_dataclass
from typing import Any, ClassVar

from embeddings.plan import DimensionPlan
from recsys.train.recipe import Recipe

__all__ = ["DimensionSearch", "get_search", "search_names"]

_REGISTRY: dict[str, type[DimensionSearch]] = {}


class DimensionSearch(ABC):
    """Chooses embedding dims for the sparse features of a recipe.

    Subclasses set ``name`` (registered for the CLI) and implement :meth:`search`; a
    dataclass subclass gets :meth:`describe` for free.
    """

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            _REGISTRY[name] = cls

    @abstractmethod
    def search(self, recipe: Recipe, budget: int | None = None) -> DimensionPlan:
        """A plan for ``recipe.schema`` with at most ``budget`` embedding parameters (when given)."""

    def describe(self) -> dict[str, Any]:
        """The search's settings (stored in the plan's ``config``)."""
        if is_dataclass(self):
            return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(self).items()}
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def search_names() -> list[str]:
    """Registered search names (import :mod:`embeddings` to register the built-in ones)."""
    return sorted(_REGISTRY)


def get_search(name: str, **options: Any) -> DimensionSearch:
    """Instantiate a registered search by name; unknown names list the known ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown dimension search {name!r}; available: {search_names()}")
    return _REGISTRY[name](**options)
