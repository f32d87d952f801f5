"""Baselines a searched plan must beat: uniform dims and the frequency-power heuristic of
Mixed-Dimension Embeddings (Ginart et al., "Mixed Dimension Embeddings with Application to
Memory-Efficient Recommendation Systems", ISIT 2021; ``md_solver`` in facebookresearch/dlrm).

MDE's power rule gives a table of ``n_f`` rows the width

    d_f = lambda * n_f ** (-alpha),     0 <= alpha <= 1,

so larger vocabularies (whose rows are each queried less often) get *smaller* dims; alpha = 0
is uniform, and the reference implementation defaults to alpha = 0.3. Under a parameter
budget ``B`` the reference solves ``lambda = B / sum(n_f ** (1 - alpha))`` and then rounds;
here dims are rounded to multiples of 4 and clipped to ``[4, max_dim]``, which breaks that
closed form, so ``lambda`` is found by bisection as the largest value whose rounded, clipped
plan stays within the budget. Rounding leaves budget unused (one step of 4 on a large table
can cost more than all the rest), so the plan is then topped up: while some step fits, the
feature furthest below the power curve (smallest ``d_f * n_f ** alpha``) gains 4, as long as
dims stay non-increasing in the vocabulary size and within ``max_dim``.

::

    budget = budget_of(schema, 16) // 2          # half of the uniform-16 model
    plan = mde_plan(schema, budget=budget, alpha=0.3)
    plan.num_parameters(schema) <= budget         # True
"""

from __future__ import annotations

import math

from embeddings.plan import (
    ALIGNMENT,
    DimensionPlan,
    DimensionPlanError,
    align_dim,
    check_budget,
    checked_dim,
    table_size,
    table_sizes,
)
from recsys.data.schema import Schema

__all__ = ["budget_of", "mde_dims", "mde_plan", "uniform_plan"]


def uniform_plan(schema: Schema, dim: int) -> DimensionPlan:
    """Every sparse feature of ``schema`` at ``dim`` (rounded up to a multiple of 4 with a
    warning when it is not one)."""
    if not schema.sparse:
        raise DimensionPlanError("the schema has no sparse feature to give a dim to")
    dim = checked_dim(dim, "uniform plan (every feature)")
    return DimensionPlan(
        dims={f.name: dim for f in schema.sparse},
        method="uniform",
        dataset=schema.name,
        num_embeddings=table_sizes(schema),
        config={"dim": int(dim)},
    )


def budget_of(schema: Schema, dim: int) -> int:
    """Embedding parameters of the uniform-``dim`` model of a fitted schema
    (``sum(num_embeddings) x dim``, with ``dim`` aligned as :func:`uniform_plan` aligns it)."""
    return uniform_plan(schema, dim).num_parameters(schema)


def mde_dims(sizes: dict[str, int], lam: float, alpha: float, max_dim: int) -> dict[str, int]:
    """The power rule ``lam * n ** -alpha`` per table, rounded to the nearest multiple of 4 and
    clipped to ``[4, max_dim]``."""
    out = {}
    for name, n in sizes.items():
        raw = lam * float(n) ** (-alpha)
        out[name] = int(min(max(ALIGNMENT * math.floor(raw / ALIGNMENT + 0.5), ALIGNMENT), max_dim))
    return out


def _top_up(dims: dict[str, int], sizes: dict[str, int], budget: int, alpha: float, max_dim: int) -> dict[str, int]:
    """Spend what rounding left of ``budget`` in steps of 4 (see the module docstring)."""
    dims = dict(dims)
    left = budget - sum(sizes[n] * d for n, d in dims.items())
    while True:
        best: str | None = None
        for name, d in dims.items():
            cap = min([max_dim] + [dims[g] for g in dims if sizes[g] < sizes[name]])
            if d + ALIGNMENT > cap or ALIGNMENT * sizes[name] > left:
                continue
            if best is None or d * sizes[name] ** alpha < dims[best] * sizes[best] ** alpha:
                best = name
        if best is None:
            return dims
        dims[best] += ALIGNMENT
        left -= ALIGNMENT * sizes[best]


def mde_plan(schema: Schema, budget: int, alpha: float = 0.3, max_dim: int = 64) -> DimensionPlan:
    """The MDE frequency-power plan that uses at most ``budget`` embedding parameters.

    Args:
        schema: fitted schema (``num_embeddings`` of every sparse feature known).
        budget: embedding-parameter budget, e.g. ``budget_of(schema, 16) // 2``.
        alpha: the power (0 = uniform; larger = steeper shrinking of large vocabularies).
        max_dim: the widest dim any feature gets (a multiple of 4).

    Returns:
        a plan with dims ``clip(round4(lambda * n_f ** -alpha), 4, max_dim)`` for the largest
        ``lambda`` within the budget, so dims never grow with the vocabulary size. A budget at
        or above ``max_dim`` for every table gives every table ``max_dim``.

    Raises:
        DimensionPlanError: a budget below one dim of 4 per feature (the error gives the
            minimum), ``alpha`` outside [0, 1], ``max_dim`` not a positive multiple of 4.
    """
    if not 0.0 <= float(alpha) <= 1.0:
        raise DimensionPlanError(f"alpha must be in [0, 1], got {alpha}")
    if int(max_dim) < ALIGNMENT or align_dim(int(max_dim)) != int(max_dim):
        raise DimensionPlanError(f"max_dim must be a positive multiple of {ALIGNMENT}, got {max_dim}")
    budget = check_budget(schema, budget)
    sizes = {f.name: table_size(schema, f.name) for f in schema.sparse}

    def cost(lam: float) -> int:
        dims = mde_dims(sizes, lam, alpha, max_dim)
        return sum(sizes[n] * d for n, d in dims.items())

    # cost is non-decreasing in lambda; lo is feasible (all dims 4, checked above), hi puts
    # every table at max_dim
    lo, hi = 0.0, 2.0 * max_dim * max(sizes.values()) ** alpha
    if cost(hi) <= budget:
        lo = hi
    else:
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if cost(mid) <= budget:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-9 * hi:
                break
    dims = _top_up(mde_dims(sizes, lo, alpha, max_dim), sizes, budget, alpha, max_dim)
    return DimensionPlan(
        dims=dims,
        method="mde",
        dataset=schema.name,
        num_embeddings=sizes,
        config={"budget": int(budget), "alpha": float(alpha), "max_dim": int(max_dim), "lambda": float(lo)},
    )
