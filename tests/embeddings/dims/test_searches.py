"""The registered baseline searches (``uniform``, ``mde``) on a fitted toy schema."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import embeddings.dims.searches  # noqa: F401 - registers the searches
from embeddings import DimensionPlanError, budget_of, mde_plan
from embeddings.dims.base import get_search, search_names
from embeddings.dims.searches import MDEDims, UniformDims, default_budget, largest_uniform_dim
from tests.embeddings.dims.test_baselines import make_schema


def _recipe():  # noqa: ANN202 - the searches only read recipe.schema
    return SimpleNamespace(schema=make_schema())


def test_the_baselines_are_registered() -> None:
    assert {"uniform", "mde"} <= set(search_names())
    assert isinstance(get_search("uniform", dim=8), UniformDims)
    assert get_search("mde", alpha=0.5).describe() == {"alpha": 0.5, "max_dim": 64}
    with pytest.raises(ValueError, match=r"unknown dimension search 'nope'; available: .*'mde'.*'uniform'"):
        get_search("nope")
    with pytest.raises(TypeError, match="bogus"):
        get_search("mde", bogus=1)


def test_uniform_without_a_budget_is_its_dim() -> None:
    plan = UniformDims().search(_recipe())
    assert plan.method == "uniform" and set(plan.dims.values()) == {16} and plan.config == {"dim": 16}
    assert set(UniformDims(dim=32).search(_recipe()).dims.values()) == {32}


def test_uniform_under_a_budget_takes_the_largest_dim_that_fits() -> None:
    schema = make_schema()  # 1144 rows in all
    assert largest_uniform_dim(schema, budget_of(schema, 8)) == 8
    assert largest_uniform_dim(schema, budget_of(schema, 8) - 1) == 4
    assert largest_uniform_dim(schema, budget_of(schema, 12) + 4 * 1144 - 1) == 12
    plan = UniformDims(dim=64).search(_recipe(), budget=budget_of(schema, 16) // 2)  # dim is ignored under a budget
    assert set(plan.dims.values()) == {8} and plan.config == {"dim": 8, "budget": 8 * 1144}
    assert plan.num_parameters(schema) <= budget_of(schema, 16) // 2


def test_mde_defaults_to_half_of_uniform_16(caplog: pytest.LogCaptureFixture) -> None:
    schema = make_schema()
    assert default_budget(schema) == budget_of(schema, 16) // 2
    with caplog.at_level("INFO", logger="embeddings.dims.searches"):
        plan = MDEDims().search(_recipe())
    assert "half of the uniform-16 model" in caplog.text
    assert plan.method == "mde" and plan.config["budget"] == default_budget(schema)
    assert "half of the uniform-16" in plan.config["budget_note"]
    assert plan.dims == mde_plan(schema, default_budget(schema)).dims
    assert plan.num_parameters(schema) <= default_budget(schema)
    given = MDEDims(alpha=0.5, max_dim=32).search(_recipe(), budget=budget_of(schema, 8))
    assert given.dims == mde_plan(schema, budget_of(schema, 8), alpha=0.5, max_dim=32).dims
    assert "budget_note" not in given.config


@pytest.mark.parametrize("search", [UniformDims(), MDEDims()])
def test_a_budget_below_one_dim_per_feature_is_refused(search) -> None:  # noqa: ANN001
    with pytest.raises(DimensionPlanError, match=r"raise the budget to at least 4576"):
        search.search(_recipe(), budget=4575)
