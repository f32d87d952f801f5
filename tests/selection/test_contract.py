"""One contract every importance method passes (Optuna-style: parametrised over the registry).

Each method must be deterministic for a seed, recover the planted signal of the synthetic
data, return the documented report schema, and produce a selection that trains.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import selection
from recsys.data.synthetic import GroundTruth
from recsys.train.recipe import Recipe
from selection.base import ImportanceMethod, get_method
from selection.report import ImportanceReport
from tests.selection.conftest import tiny_config

METHODS = ["outrank", "permutation", "leap"]
#: strongest planted features of the synthetic default that a few thousand rows can teach
STRONG = ["item_id", "site_category"]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    root = tmp_path_factory.mktemp("contract")
    return Recipe(tiny_config(n_rows=16_000, epochs=3), workdir=root / "fits", quiet=True)


@pytest.fixture(scope="module")
def reports(recipe: Recipe) -> dict[str, tuple[ImportanceReport, ImportanceReport]]:
    """Each method run twice with the same seed (MLflow in a throw-away database)."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(recipe.workdir)  # MLflow's artifact root (./mlruns) lands there too
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{recipe.workdir}/mlflow.db")
        for name in METHODS:
            out[name] = (get_method(name, seed=0).rank(recipe), get_method(name, seed=0).rank(recipe))
    return out


def test_registry_has_every_method() -> None:
    assert set(METHODS) <= set(selection.method_names())
    for name in METHODS:
        assert isinstance(get_method(name), ImportanceMethod)


@pytest.mark.parametrize("name", METHODS)
def test_deterministic_for_a_seed(reports: dict, name: str) -> None:
    a, b = reports[name]
    assert a.ranking == b.ranking
    np.testing.assert_allclose([f.score for f in a.features], [f.score for f in b.features], rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", METHODS)
def test_recovers_planted_features(recipe: Recipe, reports: dict, name: str) -> None:
    report = reports[name][0]
    truth = GroundTruth.from_raw(recipe.raw_split("train"))
    ranks = {f.feature: f.rank for f in report.features}
    top = report.top_k(6)
    assert set(STRONG) <= set(top), f"{name}: {top}"
    signal = [ranks[n] for n in truth.names("informative") if n in ranks]
    noise = [ranks[n] for n in truth.names("noise") if n in ranks]
    assert np.mean(signal) < np.mean(noise), f"{name}: signal ranks {signal}, noise ranks {noise}"


@pytest.mark.parametrize("name", METHODS)
def test_report_schema(recipe: Recipe, reports: dict, name: str) -> None:
    report = reports[name][0]
    schema = recipe.schema
    assert report.method == name and report.dataset == recipe.dataset_name
    assert sorted(report.ranking + list(report.excluded)) == sorted(schema.names)
    assert [f.rank for f in report.features] == list(range(1, len(report) + 1))
    scores = [f.score for f in report.features]
    assert scores == sorted(scores, reverse=True)
    for f in report.features:
        spec = schema[f.feature]
        assert f.width == (1 if spec.kind.value == "dense" else spec.embedding_dim)
        assert f.kind == spec.kind.value
    assert report.cost_seconds > 0 and report.config
    back = ImportanceReport.from_dict(report.to_dict())
    assert back.ranking == report.ranking


@pytest.mark.parametrize("name", METHODS)
def test_selection_applies_back_and_trains(recipe: Recipe, reports: dict, name: str, tmp_path: Path) -> None:
    report = reports[name][0]
    config = report.reduced_config(recipe.config, 3)
    smaller = Recipe(config, workdir=tmp_path, quiet=True)
    assert smaller.schema.names == [n for n in recipe.schema.names if n in report.top_k(3)]
    result = smaller.fit(tracking=False, max_epochs=1)
    assert 0.5 < result.metrics["test_auc"] <= 1.0
