"""Bad input the selection stage must handle clearly (the issue's list, across methods)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from recsys.train.recipe import Recipe
from selection import LeAP, OutRank, PermutationImportance
from selection.curve import parse_ks
from tests.selection.conftest import tiny_config


@pytest.fixture(scope="module")
def leaky_recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    """The synthetic data plus ``leak`` (= the label) written to a CSV with a schema file."""
    from recsys.data.synthetic import SyntheticConfig, generate

    root = tmp_path_factory.mktemp("leaky")
    raw, _ = generate(SyntheticConfig(n_rows=6000, seed=0, cardinality_scale=0.01, n_noise=1, n_noise_dense=0, embedding_dim=8))
    frame = raw.frame[["item_id", "site_category", "device_type", "noise_c2", "label"]].copy()
    frame["leak"] = frame["label"].astype(str)
    frame.to_csv(root / "leaky.csv", index=False)
    (root / "schema.yaml").write_text(
        "name: leaky\nlabel: label\nfeatures:\n"
        + "".join(f"  - {{name: {n}, kind: categorical, embedding_dim: 8}}\n" for n in ["item_id", "site_category", "device_type", "noise_c2", "leak"])
    )
    cfg = tiny_config()
    cfg["data"]["reader"] = {"class_path": "recsys.data.readers.TabularReader",
                             "init_args": {"path": str(root / "leaky.csv"), "schema": str(root / "schema.yaml")}}
    return Recipe(cfg, workdir=root / "fits", quiet=True)


@pytest.mark.parametrize("method", [OutRank(progress=False), PermutationImportance(repeats=2, tracking=False),
                                    LeAP(tracking=False)], ids=["outrank", "permutation", "leap"])
def test_feature_equal_to_label_is_flagged_not_ranked_first(leaky_recipe: Recipe, method) -> None:  # noqa: ANN001
    report = method.rank(leaky_recipe)
    assert "leak" in report.excluded and report.excluded["leak"].startswith("leakage")
    assert "leak" not in report.ranking and report.ranking[0] != "leak"
    assert sorted(report.ranking) == ["device_type", "item_id", "noise_c2", "site_category"]


def test_k_larger_than_the_number_of_features(leaky_recipe: Recipe) -> None:
    report = OutRank(progress=False).rank(leaky_recipe)
    with pytest.raises(ValueError, match=r"k=9 is out of range: outrank ranked 4 features \(1 more excluded"):
        report.top_k(9)
    with pytest.raises(ValueError, match="the ranking has 4 features"):
        parse_ks("2,9", len(report))


def test_single_class_label_is_refused(tmp_path: Path) -> None:
    from selection.rawfiles import read_raw_file
    from selection.outrank import rank_raw

    pd.DataFrame({"a": ["x", "y"] * 50, "label": [1] * 100}).to_csv(tmp_path / "one.csv", index=False)
    raw = read_raw_file(tmp_path / "one.csv")
    with pytest.raises(ValueError, match="single class"):
        rank_raw(raw, OutRank(progress=False))
