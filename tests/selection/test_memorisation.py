"""The learned selectors' ID screen: ID-like fields with no signal beyond chance rank last.

Planted truth: the synthetic data's ``noise_id`` is a user-like id (a distinct value in about
half of the training rows) unrelated to the label; ``user_id`` has the same cardinality and
drives the label. The screen must list the first and not the second, and every learned method
of the registry must carry it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import selection
from recsys.train.recipe import Recipe
from selection.base import ImportanceMethod, get_method, with_memorisable_demoted
from selection.model_free.mutual_info import rotation_significance
from selection.model_free.outrank import OutRank
from selection.model_free.outrank_scoring import memorisable_features
from selection.report import ImportanceReport
from tests.selection.conftest import tiny_config


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    root = tmp_path_factory.mktemp("memorisation")
    return Recipe(tiny_config(n_rows=8_000, epochs=1, n_noise=4, cardinality_scale=0.05), workdir=root / "fits", quiet=True)


def test_rotation_significance_separates_a_dependent_id_from_an_unrelated_one() -> None:
    rng = np.random.default_rng(0)
    n, ids = 8_000, 3_000
    user = rng.integers(0, ids, n)
    rate = rng.uniform(0.05, 0.6, ids)  # each id has its own click rate
    label = (rng.random(n) < rate[user]).astype(np.int64)
    noise = rng.integers(0, ids, n)
    score, z = rotation_significance(user, label)
    assert score > 0 and z > 4
    zs = [rotation_significance(rng.integers(0, ids, n), label)[1] for _ in range(5)]
    assert max(abs(v) for v in zs) < 3 and abs(rotation_significance(noise, label)[1]) < 3
    assert rotation_significance(np.zeros(n, dtype=np.int64), label) == (0.0, 0.0)  # no spread: z 0
    with pytest.raises(ValueError, match="at least 2 rotations"):
        rotation_significance(user, label, rotations=1)


def test_memorisable_features_lists_the_unrelated_id_only(recipe: Recipe) -> None:
    raw = recipe.raw_split("train")
    share = {f: raw.frame[f].nunique() / len(raw) for f in ("user_id", "noise_id")}
    assert share["user_id"] > 0.4 and share["noise_id"] > 0.4  # the same ID-like cardinality
    found = memorisable_features(raw, recipe.schema.names)
    assert "noise_id" in found and "user_id" not in found and "item_id" not in found
    assert "ID-like" in found["noise_id"] and "training rows" in found["noise_id"]
    assert all(recipe.schema[f].kind.value == "categorical" for f in found)  # bags and dense never listed
    assert memorisable_features(raw, recipe.schema.names, min_distinct_share=0.9) == {}  # nothing that unique
    assert memorisable_features(raw, ["not_a_feature"]) == {}


def test_demotion_moves_listed_features_last_and_keeps_the_order_before() -> None:
    report = ImportanceReport.from_scores("m", {"a": 3.0, "noise_id": 2.0, "b": 1.0})
    out = with_memorisable_demoted(report, {"noise_id": "ID-like"})
    assert out.ranking == ["a", "b", "noise_id"] and out["noise_id"].flags == ("id_like",)
    assert out.extras["memorisable"] == {"noise_id": "ID-like"} and out.extras["unscreened_ranking"] == ["a", "noise_id", "b"]
    assert [f.score for f in out.features] == sorted((f.score for f in out.features), reverse=True)
    assert with_memorisable_demoted(report, {"other": "x"}) is report


def test_every_learned_method_carries_the_screen() -> None:
    built_in = [ImportanceMethod.registered_class(n) for n in selection.method_names()]  # plug-in tests add toys
    learned = [k for k in built_in if k.__module__.startswith("selection.") and not k.baseline and not issubclass(k, OutRank)]
    assert len(learned) >= 12
    for kind in learned:
        fields = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
        assert "id_screen" in fields and fields["id_screen"].default is True, kind.name


def test_a_shallow_selector_ranks_the_unrelated_id_last(recipe: Recipe) -> None:
    screened = get_method("lasso", seed=0).rank(recipe)
    assert screened.ranking[-1] == "noise_id" and "id_like" in screened["noise_id"].flags
    assert "noise_id" in screened.extras["memorisable"] and "user_id" not in screened.extras["memorisable"]
    plain = get_method("lasso", seed=0, id_screen=False).rank(recipe)
    assert "memorisable" not in plain.extras and not any("id_like" in f.flags for f in plain.features)
    assert plain.ranking == screened.extras["unscreened_ranking"]  # the screen reorders, the scores stay
    assert plain.scores["noise_id"] == pytest.approx(
        screened.scores["noise_id"] + (max(plain.scores.values()) - min(plain.scores.values()) + 1.0))


def test_permutation_screens_too(recipe: Recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    report = get_method("permutation", seed=0, repeats=1, tracking=False).rank(recipe)
    assert report.ranking[-1] in report.extras["memorisable"] and "noise_id" in report.extras["memorisable"]
