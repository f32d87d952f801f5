"""A DimensionPlan drives a `salience fit` run (data.embedding_dims) and the exported model."""

from __future__ import annotations

from pathlib import Path

from embeddings import DimensionPlan, budget_of, mde_plan
from recsys.train.recipe import Recipe
from tests.selection.conftest import tiny_config


def test_plan_trains_through_the_recipe_and_exports(tmp_cwd: Path) -> None:
    recipe = Recipe(tiny_config(n_rows=4000, epochs=1), workdir=tmp_cwd / "fits", quiet=True)
    schema = recipe.schema
    plan = mde_plan(schema, budget=budget_of(schema, 8) // 2)
    path = plan.save(tmp_cwd / "plan.yaml")
    plan = DimensionPlan.load(path)
    result = recipe.fit(extra_args=plan.to_config_overrides(), tracking=False, export=True)
    model = result.task.model
    assert {n: d for n, d in zip(model.sparse_names, model.embedding_dims)} == {f: plan[f] for f in model.sparse_names}
    assert model.embedding_parameters() == plan.num_parameters(schema) <= budget_of(schema, 8) // 2
    export = next(Path(result.root_dir).rglob("MANIFEST.json")).parent
    assert (export / "model.pt").exists()
