"""Embedding dimension search: mixed-dimension plans, their baselines, DNIS and iHAS.

* :class:`DimensionPlan`: per-feature, per-(feature, frequency block) or per-cluster embedding
  dims, aligned to multiples of 4; counts embedding parameters exactly, applies to a schema,
  saves/loads as JSON or YAML and logs to MLflow;
* baselines: :func:`uniform_plan` and the Mixed-Dimension-Embeddings power rule
  :func:`mde_plan` under a parameter budget (:func:`budget_of` for "half of uniform-16");
* :class:`IHAS`: instance-wise Bernoulli gates per field and dimension, K-means over the
  deterministic masks, per-cluster dims and a router to one retrained model per cluster;
* :class:`DNIS`: differentiable search of soft masks over (frequency block x dimension) at
  the embedding tables, bi-level (weights on training, masks on validation batches).
"""

# ruff: noqa: F401
from __future__ import annotations

from typing import TYPE_CHECKING

from recsys.lazy import lazy_exports

#: public name -> the module that defines it (imported on first use: DNIS and iHAS import torch)
_EXPORTS = {
    **dict.fromkeys(["DimensionSearch", "get_search", "search_names"], "embeddings.dims.base"),
    **dict.fromkeys(["budget_of", "mde_dims", "mde_plan", "uniform_plan"], "embeddings.dims.baselines"),
    **dict.fromkeys(["DNIS"], "embeddings.dims.dnis"),
    **dict.fromkeys(["IHAS", "IHASGate", "IHASRoutedModel", "IHASRouter"], "embeddings.dims.ihas"),
    **dict.fromkeys(["MDEDims", "UniformDims"], "embeddings.dims.searches"),
    **dict.fromkeys(["ALIGNMENT", "DimensionAlignmentWarning", "DimensionPlan", "DimensionPlanError", "FrequencyBlock", "align_dim", "check_budget", "min_budget"], "embeddings.plan"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the names for type checkers (ruff cannot read the computed __all__)
    from embeddings.dims.base import DimensionSearch, get_search, search_names
    from embeddings.dims.baselines import budget_of, mde_dims, mde_plan, uniform_plan
    from embeddings.dims.dnis import DNIS
    from embeddings.dims.ihas import IHAS, IHASGate, IHASRoutedModel, IHASRouter
    from embeddings.dims.searches import MDEDims, UniformDims
    from embeddings.plan import (
        ALIGNMENT,
        DimensionAlignmentWarning,
        DimensionPlan,
        DimensionPlanError,
        FrequencyBlock,
        align_dim,
        check_budget,
        min_budget,
    )
