"""Layouts for a byte budget (dims, row schemes) and ``salience compress`` without a checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from embeddings.compression.layouts import (
    Layout,
    choose_layout,
    importance_layout,
    layouts_for_budget,
    read_ranking,
    row_schemes,
    train_layouts,
)
from embeddings.compression.precision import uniform_bytes
from experiments.cli import main as salience
from recsys.export.quantize import Precision, PrecisionError
from recsys.train.recipe import Recipe
from tests.selection.conftest import tiny_config


def _config(n_rows: int = 4000, epochs: int = 1) -> dict:
    config = tiny_config(n_rows=n_rows, epochs=epochs, embedding_dim=16, cardinality_scale=0.05)
    config["model"]["early_stopping_patience"] = 0
    return config


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    return Recipe(_config(), workdir=tmp_path_factory.mktemp("layouts") / "fits", quiet=True, keep_checkpoints=False)


def _bytes(schema, layout: Layout, precision: Precision) -> int:
    rows = {f.name: int(f.num_embeddings) for f in schema.sparse}
    for f, spec in layout.rows.items():  # a quotient-remainder table: ceil(n / m) + m rows
        rows[f] = math.ceil(rows[f] / spec["buckets"]) + spec["buckets"]
    dims = layout.dims or {f.name: int(f.embedding_dim) for f in schema.sparse}
    return sum(rows[f] * precision.row_bytes(d) for f, d in dims.items())


def test_each_dims_layout_fits_the_budget_at_the_precision_it_is_sized_for(recipe: Recipe) -> None:
    schema = recipe.schema
    budget = uniform_bytes(schema) // 8
    layouts = {x.name: x for x in layouts_for_budget(schema, budget)}
    assert list(layouts)[0] == "full" and {"uniform@int4", "uniform@int8", "qr", "hash"} <= set(layouts)
    # 1/8 of uniform-16 fp32 is a dim-8 int4 row (4 bytes of values + 4 of scale and bias) or dim 4 at int8
    assert set(layouts["uniform@int4"].dims.values()) == {8} and set(layouts["uniform@int8"].dims.values()) == {4}
    for name, layout in layouts.items():
        if "@" in name:
            assert _bytes(schema, layout, Precision(name.split("@")[1])) <= budget, name
            assert all(d % 4 == 0 and d >= 4 for d in layout.dims.values()), name  # int4's row layout
    mde = [x for n, x in layouts.items() if n.startswith("mde@")]
    assert mde and all(len(set(x.dims.values())) > 1 for x in mde)  # mixed: small vocabularies wider
    assert all(max(x.dims.values()) <= 16 for x in mde)  # never wider than the config: the served model stays small
    sizes = {f.name: f.num_embeddings for f in schema.sparse}
    for x in mde:
        big, small = max(sizes, key=sizes.get), min(sizes, key=sizes.get)
        assert x.dims[big] <= x.dims[small]
    # a twice larger budget: uniform at int4 reaches the config's dim 16 (the full layout, listed once)
    wide = {x.name for x in layouts_for_budget(schema, budget * 2, kinds=("full", "uniform"))}
    assert "uniform@int4" not in wide and "full" in wide


def test_row_schemes_cover_the_large_features_only(recipe: Recipe) -> None:
    qr, hashed = row_schemes(recipe.schema, "qr", min_ids=64), row_schemes(recipe.schema, "hash", min_ids=64)
    large = {f.name for f in recipe.schema.sparse if f.num_embeddings >= 64}
    assert set(qr) == set(hashed) == large and large
    for f in recipe.schema.sparse:
        if f.name in qr:
            m = qr[f.name]["buckets"]
            assert m == math.ceil(math.sqrt(f.num_embeddings)) and hashed[f.name]["rows"] == math.ceil(f.num_embeddings / m) + m
    with pytest.raises(ValueError, match="'qr' or 'hash'"):
        row_schemes(recipe.schema, "bloom")


def test_the_importance_layout_widens_what_matters_and_shares_rows_of_what_does_not(recipe: Recipe, tmp_path: Path) -> None:
    from selection.report import ImportanceReport

    schema = recipe.schema
    sparse = [f.name for f in schema.sparse]
    ids = {f.name: f.num_embeddings for f in schema.sparse}
    # the largest table ranked first (by size alone it would be the one to shrink), the second largest last
    by_size = sorted(sparse, key=lambda f: -ids[f])
    order = [by_size[0], *by_size[2:], by_size[1]]
    scores = {f: float(len(order) - i) for i, f in enumerate(order)}
    path = ImportanceReport.from_scores("outrank", {**scores, "price": -1.0},
                                        excluded={"constant_field": "constant"}).save(tmp_path / "rank.json")
    ranking = read_ranking(path)
    assert ranking == [*order, "price", "constant_field"]
    budget = uniform_bytes(schema) // 8
    for precision in (Precision.INT8, Precision.INT4):
        layout = importance_layout(schema, budget, precision, ranking)
        assert layout is not None and layout.name == f"importance@{precision.value}"
        assert _bytes(schema, layout, precision) <= budget
        order = [f for f in ranking if f in ids]
        dims = [layout.dims[f] for f in order]
        assert dims == sorted(dims, reverse=True)  # never wider than a more important feature
        # int4 halves a row's values: the bytes the shared rows free widen the top of the ranking
        # (at int8 the budget is dim 4 everywhere, and the largest table ranks first)
        assert dims[0] > dims[-1] or precision is Precision.INT8
        assert all(d % 4 == 0 and 4 <= d <= 16 for d in dims)
        half = set(order[len(order) // 2 + len(order) % 2:])  # rank > n / 2
        assert set(layout.rows) == {f for f in half if ids[f] >= 64} and layout.rows  # QR for the lower half only
        assert all(spec["scheme"] == "qr" for spec in layout.rows.values())
        richer = importance_layout(schema, budget * 2, precision, ranking)
        assert richer is not None and all(richer.dims[f] >= layout.dims[f] for f in order)
    assert importance_layout(schema, 10, Precision.INT4, ranking) is None  # below dim 4 everywhere
    listed = {x.name for x in layouts_for_budget(schema, budget, kinds=("importance",), ranking=ranking)}
    assert listed == {"importance@int8", "importance@int4"}
    with pytest.raises(ValueError, match="no entry for sparse feature"):
        importance_layout(schema, budget, Precision.INT8, ranking[1:])
    with pytest.raises(ValueError, match="needs an importance ranking"):
        layouts_for_budget(schema, budget, kinds=("importance",))
    (tmp_path / "bad.json").write_text(json.dumps({"scores": {}}))
    with pytest.raises(ValueError, match="bad.json: not an importance report"):
        read_ranking(tmp_path / "bad.json")


def test_bad_layout_requests_are_refused(recipe: Recipe) -> None:
    budget = uniform_bytes(recipe.schema) // 8
    with pytest.raises(ValueError, match="unknown layout"):
        layouts_for_budget(recipe.schema, budget, kinds=("full", "pruned"))
    with pytest.raises(ValueError, match="needs a dimension plan"):
        layouts_for_budget(recipe.schema, budget, kinds=("plan",))
    with pytest.raises(ValueError, match="no dim for"):
        layouts_for_budget(recipe.schema, budget, kinds=("plan",), dims_plan={"user_id": 8})
    assert layouts_for_budget(recipe.schema, 10, kinds=("uniform", "mde")) == []  # nothing that small trains


def test_the_choice_is_the_layout_with_the_most_validation_auc_within_the_budget(recipe: Recipe) -> None:
    budget = uniform_bytes(recipe.schema) // 8
    layouts = [x for x in layouts_for_budget(recipe.schema, budget) if x.name in ("full", "uniform@int4", "hash")]
    trained = train_layouts(recipe, layouts, seed=0, log=lambda _: None)
    val = trained["full"].datamodule.split_data("val")
    choice = choose_layout({n: t.model for n, t in trained.items()}, budget, val)
    assert "below the smallest model" in choice.skipped["full"]  # its int4 rows at dim 16 are 1/6 of fp32
    assert set(choice.results) == {"uniform@int4", "hash"} and all(r.bytes <= budget for r in choice.results.values())
    assert choice.chosen == max(choice.results, key=lambda n: choice.results[n].val_auc)
    assert choice.to_dict()["chosen"] == choice.chosen
    with pytest.raises(PrecisionError, match="no trained layout fits"):
        choose_layout({"full": trained["full"].model}, budget, val)


def test_compress_without_a_checkpoint_trains_the_layouts_and_exports_the_best(tmp_path: Path, capsys) -> None:
    config = tmp_path / "fit.yaml"
    cfg = _config()
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "c"
    from selection.report import ImportanceReport

    schema = Recipe(str(config), quiet=True).schema
    rank = ImportanceReport.from_scores("outrank", {f.name: -i for i, f in enumerate(schema.sparse)}).save(tmp_path / "rank.json")
    assert salience(["compress", "--config", str(config), "--budget", "0.125x", "--output", str(out),
                     "--layouts", "full,uniform,hash", "--importance", str(rank), "--seed", "0"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    layouts = {c["layout"]: c for c in plan["layouts"]}
    assert {"importance@int8", "importance@int4"} <= set(layouts) | set(plan["skipped_layouts"])
    assert plan["layout"]["name"] == next(n for n, c in layouts.items() if c["chosen"])
    assert plan["layout"]["name"] == max(layouts, key=lambda n: layouts[n]["val_auc"])
    assert plan["bytes"] <= plan["budget_bytes"] == int(0.125 * plan["uniform16_fp32_bytes"])
    assert "full" in plan["skipped_layouts"] and plan["full_fp32_test"]["auc"] > 0.5
    assert plan["parity_max_abs_diff"] <= 1e-6 and (out / "comparison.md").is_file() and (out / "frontier.png").is_file()
    exported = json.loads((out / "export" / "schema.json").read_text())
    assert exported["embedding_precision"]["bytes"] == plan["bytes"]
    printed = capsys.readouterr().out
    assert "chosen layout" in printed and "comparison.md" in printed
    with pytest.raises(SystemExit):  # the layouts are sized for a budget
        salience(["compress", "--config", str(config), "--tolerance", "0.001", "--output", str(tmp_path / "x")])
    assert "without --checkpoint, give --budget" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        salience(["compress", "--config", str(config), "--budget", "0.125x", "--layouts", "full,pruned",
                  "--output", str(tmp_path / "x")])
    assert "unknown layout" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        salience(["compress", "--checkpoint", "x.ckpt", "--config", str(config), "--budget", "0.1x", "--seed", "1",
                  "--output", str(tmp_path / "x")])
    assert "--seed apply to the layout search" in capsys.readouterr().err
    (tmp_path / "scores.json").write_text("{}")
    with pytest.raises(SystemExit):
        salience(["compress", "--config", str(config), "--budget", "0.125x", "--importance", str(tmp_path / "scores.json"),
                  "--output", str(tmp_path / "x")])
    assert "scores.json: not an importance report" in capsys.readouterr().err
