"""One contract every registered dimension search passes, generated from the registry: under a
budget of half the uniform-16 parameters it returns a plan for every sparse feature that fits the
budget, round-trips through a file, applies to the schema, and is the same plan for the same seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import embeddings  # noqa: F401 - registers the built-in searches
from embeddings import DimensionPlan, budget_of
from embeddings.dims.base import get_search, search_names
from recsys.train.recipe import Recipe
from tests.selection.conftest import tiny_config

#: options that keep a training search to a few steps (a search without an entry runs its defaults)
QUICK: dict[str, dict[str, Any]] = {
    "dnis": {"warm_start_epochs": 1, "search_epochs": 1, "max_steps": 12, "seed": 0},
    "ihas": {"search_epochs": 1, "retrain_epochs": 1, "max_steps": 8, "seed": 0},
}
SEARCHES = search_names()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    return Recipe(tiny_config(n_rows=3000, epochs=1), workdir=tmp_path_factory.mktemp("dims-contract"), quiet=True)


@pytest.mark.parametrize("name", SEARCHES)
def test_every_search_fits_its_budget_and_is_seeded(name: str, recipe: Recipe, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a search that tracks writes its MLflow store here
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    schema = recipe.schema
    budget = budget_of(schema, 16) // 2
    plan = get_search(name, **QUICK.get(name, {})).search(recipe, budget=budget)
    assert isinstance(plan, DimensionPlan) and plan.method == name
    assert set(plan.dims) == set(schema.sparse_names), f"{name}: a plan names every sparse feature"
    assert all(d >= 1 for d in plan.dims.values())
    assert plan.num_parameters(schema) <= budget, f"{name}: {plan.num_parameters(schema)} > budget {budget}"
    loaded = DimensionPlan.load(plan.save(tmp_path / "plan.json"))
    assert loaded.dims == plan.dims and loaded.blocks == plan.blocks
    assert plan.apply(schema).sparse_names == schema.sparse_names
    again = get_search(name, **QUICK.get(name, {})).search(recipe, budget=budget)
    assert again.dims == plan.dims and again.blocks == plan.blocks, f"{name} is not deterministic for one seed"
