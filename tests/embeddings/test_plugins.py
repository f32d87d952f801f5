"""Adding a dimension search is one class: a toy one, registered here, runs through ``salience dims``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from embeddings import DimensionPlan, DimensionSearch, get_search
from experiments.cli import main
from recsys.train.recipe import Recipe
from tests.conftest import registered as registered_plugin
from tests.conftest import toy_plugin
from tests.selection.conftest import tiny_config


@toy_plugin
@dataclass
class SmallTablesWide(DimensionSearch):
    """Dim 8 for tables of at most ``threshold`` rows, 4 for the rest: a planted, checkable plan."""

    name: ClassVar[str] = "toy-small-wide"
    threshold: int = 100

    def search(self, recipe: Recipe, budget: int | None = None) -> DimensionPlan:
        schema = recipe.schema
        dims = {f.name: (8 if f.num_embeddings <= self.threshold else 4) for f in schema.sparse}
        return DimensionPlan(dims, method=self.name, dataset=recipe.dataset_name, config=self.describe())


@pytest.fixture()
def registered() -> Iterator[None]:
    with registered_plugin(SmallTablesWide):
        yield


def test_a_new_search_is_one_class_and_runs_by_name(registered: None, tmp_cwd: Path) -> None:
    cfg = tmp_cwd / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(n_rows=3000, epochs=1)))
    assert isinstance(get_search("toy-small-wide"), SmallTablesWide)
    assert main(["dims", "--config", str(cfg), "--method", "toy-small-wide", "--option", "threshold=50",
                 "--no-tracking", "--output", "out"]) == 0
    plan = DimensionPlan.load(tmp_cwd / "out" / "plan.json")
    assert plan.method == "toy-small-wide" and plan.config["threshold"] == 50
    assert set(plan.dims.values()) <= {4, 8} and len(plan.dims) > 5
    summary = json.loads((tmp_cwd / "out" / "summary.json").read_text())
    assert summary["points"][0]["dims"] == plan.dims  # the retrained model has the toy plan's dims
