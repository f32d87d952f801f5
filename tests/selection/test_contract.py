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

#: every registered method that reads signal (the random baseline does not), from the registry
METHODS = [n for n in selection.method_names() if not ImportanceMethod.registered_class(n).baseline]
#: strongest planted features of the synthetic default that a few thousand rows can teach
STRONG = ["item_id", "site_category"]
#: methods that read no trained model, so the planted signal is not theirs to recover; they are
#: checked against plain-PyTorch references instead (tests/selection/model_based/test_sensitivity.py)
UNTRAINED = {"sfs": "scores mask gradients of the model at initialisation (SNIP-style)"}
#: methods whose field scores are a roll-up that ranks signal above noise on average but not
#: the strongest fields first (checked against their formulas in their own test modules)
ROLLED_UP = {"optfs": "value-level mask weights: a many-valued field's rare ids drift down under the L1 term"}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    root = tmp_path_factory.mktemp("contract")
    return Recipe(tiny_config(n_rows=16_000, epochs=3), workdir=root / "fits", quiet=True)


def _rank_all(recipe: Recipe, times: int) -> dict[str, list[ImportanceReport]]:
    """Each method run ``times`` times with seed 0 (MLflow in a throw-away database)."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(recipe.workdir)  # MLflow's artifact root (./mlruns) lands there too
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{recipe.workdir}/mlflow.db")
        for name in METHODS:
            out[name] = [get_method(name, seed=0).rank(recipe) for _ in range(times)]
    return out


@pytest.fixture(scope="module")
def reports(recipe: Recipe) -> dict[str, list[ImportanceReport]]:
    """Each method once on the recipe that teaches the planted signal."""
    return _rank_all(recipe, 1)


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[ImportanceReport]]:
    """Each method twice with the same seed, on a small recipe (determinism needs no signal)."""
    root = tmp_path_factory.mktemp("contract-repeat")
    return _rank_all(Recipe(tiny_config(n_rows=3_000, epochs=1), workdir=root / "fits", quiet=True), 2)


def test_registry_has_every_method() -> None:
    assert {"outrank", "permutation", "leap", "lasso", "gbdt", "random_forest", "lightgbm"} <= set(METHODS)
    assert "random" not in METHODS
    for name in METHODS:
        assert isinstance(get_method(name), ImportanceMethod)


@pytest.mark.parametrize("name", METHODS)
def test_deterministic_for_a_seed(repeated: dict, name: str) -> None:
    a, b = repeated[name]
    assert a.ranking == b.ranking
    np.testing.assert_allclose([f.score for f in a.features], [f.score for f in b.features], rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", [m for m in METHODS if m not in UNTRAINED])
def test_recovers_planted_features(recipe: Recipe, reports: dict, name: str) -> None:
    report = reports[name][0]
    truth = GroundTruth.from_raw(recipe.raw_split("train"))
    ranks = {f.feature: f.rank for f in report.features}
    top = report.top_k(6)
    if name not in ROLLED_UP:
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


#: one method of each kind trains its reduced config (the reduction is the report's, not the method's)
TRAINED_BACK = ("outrank", "lasso", "leap")


@pytest.mark.parametrize("name", METHODS)
def test_selection_applies_back_and_trains(recipe: Recipe, reports: dict, name: str, tmp_path: Path) -> None:
    report = reports[name][0]
    config = report.reduced_config(recipe.config, 3)
    smaller = Recipe(config, workdir=tmp_path, quiet=True)
    assert smaller.schema.names == [n for n in recipe.schema.names if n in report.top_k(3)]
    if name in TRAINED_BACK:
        result = smaller.fit(tracking=False, max_epochs=1)
        assert 0.5 < result.metrics["test_auc"] <= 1.0


def _model_based(name: str) -> bool:
    from selection.model_free.outrank import OutRank
    from selection.shallow.tabular import ShallowMethod

    return not issubclass(ImportanceMethod.registered_class(name), (OutRank, ShallowMethod))


#: backbone x kernel per model-based method, cycled so that together they cover every backbone
#: with both kernels; every run has multi-hot and dense fields and mixed embedding widths
COMBOS = [("DLRM", "fused"), ("DeepFM", "plain"), ("DCNv2", "fused"), ("DLRM", "plain"), ("DeepFM", "fused"),
          ("DCNv2", "plain")]
MODEL_BASED = [n for n in METHODS if _model_based(n)]


@pytest.mark.parametrize("name, backbone, kernel",
                         [(n, *COMBOS[i % len(COMBOS)]) for i, n in enumerate(MODEL_BASED)])
def test_every_backbone_and_kernel_with_mixed_widths(name: str, backbone: str, kernel: str, tmp_path: Path) -> None:
    import json

    config = tiny_config(n_rows=3_000, epochs=1)
    config["model"]["backbone"] = {"class_path": f"recsys.models.{backbone}", "init_args": {}}
    config["model"]["embedding_kernel"] = kernel
    dims = {"item_id": 4, "user_id": 12, "tags": 16}
    recipe = Recipe(config, [f"--data.embedding_dims={json.dumps(dims)}"], workdir=tmp_path, quiet=True)
    options = {"seed": 0}
    if "tracking" in ImportanceMethod.registered_class(name).__dataclass_fields__:
        options["tracking"] = False
    report = get_method(name, **options).rank(recipe)
    schema = recipe.schema
    assert sorted(report.ranking + list(report.excluded)) == sorted(schema.names)
    assert all(np.isfinite(f.score) for f in report.features)
    kinds = {schema[f].kind.value for f in report.ranking}
    assert {"dense", "multi_categorical", "categorical"} <= kinds
    widths = {f.feature: f.width for f in report.features}
    assert {widths[n] for n in dims if n in widths} == {dims[n] for n in dims if n in widths} != set()
