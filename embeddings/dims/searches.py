"""The baseline dimension searches, registered for ``salience dims --method NAME``.

* ``uniform`` (:class:`UniformDims`): every sparse feature at one dim; under a budget, the
  largest aligned dim whose uniform model fits it.
* ``mde`` (:class:`MDEDims`): the Mixed-Dimension-Embeddings frequency-power rule
  (:func:`~embeddings.dims.baselines.mde_plan`) under a budget; without one, half the embedding
  parameters of the uniform-16 model.

Both only read the fitted schema of the recipe (no training), so they are the cheap
references that the learned searches (DNIS, iHAS) are read against::

    plan = get_search("mde", alpha=0.3).search(recipe, budget=budget_of(recipe.schema, 16) // 2)
    recipe.fit(extra_args=plan.to_config_overrides())
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import ClassVar

from embeddings.dims.base import DimensionSearch
from embeddings.dims.baselines import budget_of, mde_plan, uniform_plan
from embeddings.plan import ALIGNMENT, DimensionPlan, check_budget, table_size
from recsys.data.schema import Schema
from recsys.train.recipe import Recipe

__all__ = ["DEFAULT_REFERENCE_DIM", "MDEDims", "UniformDims", "default_budget", "largest_uniform_dim"]

log = logging.getLogger(__name__)

#: the uniform dim that default budgets and the CLI's reference model are measured against
DEFAULT_REFERENCE_DIM = 16


def default_budget(schema: Schema, fraction: float = 0.5, dim: int = DEFAULT_REFERENCE_DIM) -> int:
    """``fraction`` of the embedding parameters of the uniform-``dim`` model (default: half of
    uniform-16, the issue's target for a searched plan)."""
    return int(fraction * budget_of(schema, dim))


def largest_uniform_dim(schema: Schema, budget: int) -> int:
    """The largest multiple of 4 whose uniform model has at most ``budget`` embedding
    parameters (a budget below 4 per row is refused with the minimum)."""
    budget = check_budget(schema, budget)
    rows = sum(table_size(schema, f.name) for f in schema.sparse)
    return ALIGNMENT * (budget // (ALIGNMENT * rows))


@dataclass
class UniformDims(DimensionSearch):
    """Every sparse feature at the same dim.

    Args:
        dim: the dim without a budget (aligned to 4 with a warning). With a budget, ``dim`` is
            ignored and the largest aligned uniform dim within the budget is used.
    """

    name: ClassVar[str] = "uniform"
    dim: int = DEFAULT_REFERENCE_DIM

    def search(self, recipe: Recipe, budget: int | None = None) -> DimensionPlan:
        schema = recipe.schema
        if budget is None:
            plan = uniform_plan(schema, self.dim)
            return _with_config(plan, {"dim": plan.dims[schema.sparse_names[0]]})
        dim = largest_uniform_dim(schema, budget)
        return _with_config(uniform_plan(schema, dim), {"dim": dim, "budget": int(budget)})


@dataclass
class MDEDims(DimensionSearch):
    """The MDE frequency-power rule ``d_f ~ n_f ** -alpha`` under a parameter budget.

    Args:
        alpha: the power (0 = uniform; the reference implementation's default is 0.3).
        max_dim: the widest dim any feature gets (a multiple of 4).

    Without a budget, :meth:`search` uses half of the uniform-16 model's embedding parameters
    (:func:`default_budget`) and says so in the log and in the plan's ``config``.
    """

    name: ClassVar[str] = "mde"
    alpha: float = 0.3
    max_dim: int = 64

    def search(self, recipe: Recipe, budget: int | None = None) -> DimensionPlan:
        schema = recipe.schema
        note = None
        if budget is None:
            budget = default_budget(schema)
            note = f"default budget: half of the uniform-{DEFAULT_REFERENCE_DIM} model ({budget} embedding parameters)"
            log.info("mde: %s", note)
        plan = mde_plan(schema, budget=budget, alpha=self.alpha, max_dim=self.max_dim)
        return _with_config(plan, {"budget_note": note} if note else {})


def _with_config(plan: DimensionPlan, extra: dict[str, object]) -> DimensionPlan:
    """``plan`` with ``extra`` merged into its ``config`` (plans are frozen)."""
    return replace(plan, config={**plan.config, **extra})
