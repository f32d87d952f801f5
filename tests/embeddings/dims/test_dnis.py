"""Tests of DNIS (:mod:`embeddings.dims.dnis`): the masked lookup against a plain-PyTorch reference
(forward and backward, single- and multi-hot), the per-block-row gradient normalisation, the
frequency blocks, dim derivation, and an end-to-end search on planted synthetic data (masks
move the way the loss says, budget, file round trip, determinism)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from embeddings import DimensionPlan, DimensionPlanError, FrequencyBlock, budget_of, min_budget
from embeddings.dims.base import get_search
from embeddings.dims.dnis import (
    DNIS,
    block_bounds,
    derive_dims,
    hard_alpha,
    mask_tables,
    normalize_alpha_grads,
    plan_parameters,
    table_weights,
)
from recsys.data.batching import random_batch
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.models import DCNv2
from recsys.models.base import EmbeddingKernel, SparseArchConfig
from recsys.train.recipe import Recipe
from tests.selection.conftest import tiny_config

INFORMATIVE = ("item_id", "site_category")
NOISE = ("noise_c10", "noise_tags")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread avoids barrier waits on a busy 2-core machine (module
    scope, so that it also covers the module-scoped search fixtures)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_schema(pooling_dim: int = 8) -> Schema:
    return Schema(
        features=(
            FeatureSpec("user", num_embeddings=10, embedding_dim=pooling_dim),
            FeatureSpec("genre", kind=FeatureKind.MULTI_CATEGORICAL, num_embeddings=50, embedding_dim=pooling_dim),
            FeatureSpec("price", kind=FeatureKind.DENSE),
        ),
        name="toy",
    )


def small_model(schema: Schema, kernel: EmbeddingKernel = EmbeddingKernel.PLAIN, pooling: str = "sum"):  # noqa: ANN201
    torch.manual_seed(0)
    return DCNv2(schema, SparseArchConfig(kernel=kernel, pooling=pooling), cross_layers=1, deep_mlp=[8])


# -- frequency blocks ----------------------------------------------------------------------------


def test_block_bounds_fractions_absolute_sizes_and_small_tables() -> None:
    assert block_bounds(100, (0.1, 0.2, 0.3, 0.4)) == [(0, 10), (10, 30), (30, 60), (60, 100)]
    # floors: 0.1 x 15 = 1, 0.2 x 15 = 3, 0.3 x 15 = 4; the last takes the remainder
    assert block_bounds(15, (0.1, 0.2, 0.3, 0.4)) == [(0, 1), (1, 4), (4, 8), (8, 15)]
    # empty blocks of a small table are dropped
    assert block_bounds(3, (0.1, 0.2, 0.3, 0.4)) == [(0, 3)]
    # absolute sizes (first entry > 1) with a trailing 0 for the rest, as the Criteo script
    assert block_bounds(1000, (51, 126, 0)) == [(0, 51), (51, 177), (177, 1000)]
    assert block_bounds(7, (1.0,)) == [(0, 7)]
    with pytest.raises(ValueError, match="sum to at most 1"):
        block_bounds(10, (0.5, 0.7))
    with pytest.raises(ValueError, match="non-negative"):
        block_bounds(10, ())


# -- the masked lookup equals a plain-PyTorch reference ------------------------------------------


def _reference_pooled(weight: torch.Tensor, alpha: torch.Tensor, bounds: list[tuple[int, int]],
                      values: torch.Tensor, lengths: torch.Tensor, pooling: str) -> torch.Tensor:
    """E * alpha[block(id)] gathered per id and pooled per bag, with Python loops."""
    rows = []
    pos = 0
    for ln in lengths.tolist():
        acc = torch.zeros(weight.shape[1], dtype=weight.dtype)
        for i in values[pos : pos + ln].tolist():
            b = next(k for k, (s, e) in enumerate(bounds) if s <= i < e)
            acc = acc + weight[i] * alpha[b]
        rows.append(acc / ln if pooling == "mean" and ln > 0 else acc)
        pos += ln
    return torch.stack(rows)


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_masked_lookup_and_gradients_match_reference(pooling: str) -> None:
    schema = make_schema()
    model = small_model(schema, pooling=pooling)
    blocks = (0.2, 0.3, 0.5)
    masks = mask_tables(model, blocks)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in masks.values():
            m.alpha.copy_(torch.rand(m.alpha.shape, generator=g))
    batch = random_batch(schema, 12, seed=3, max_bag=4)
    kjt = batch.sparse_features
    out = model.sparse_arch(kjt)
    probe = {n: torch.randn(o.shape, generator=g) for n, o in out.items()}
    sum((out[n] * probe[n]).sum() for n in out).backward()

    features = kjt.to_dict()
    for name in ("user", "genre"):
        bag = model.sparse_arch.table(name)
        raw = bag.parametrizations.weight.original
        mask = masks[name]
        assert mask.bounds == block_bounds(raw.shape[0], blocks)
        w = raw.detach().clone().requires_grad_(True)
        a = mask.alpha.detach().clone().requires_grad_(True)
        ref = _reference_pooled(w, a, mask.bounds, features[name].values(), features[name].lengths(), pooling)
        torch.testing.assert_close(out[name], ref, rtol=1e-5, atol=1e-6)
        (ref * probe[name]).sum().backward()
        torch.testing.assert_close(raw.grad, w.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mask.alpha.grad, a.grad, rtol=1e-5, atol=1e-6)
    assert features["genre"].lengths().max() > 1 and (features["genre"].lengths() == 0).any()  # multi-hot, empty bags


def test_mask_of_ones_changes_nothing_and_raw_weights_are_the_tables() -> None:
    schema = make_schema()
    model = small_model(schema)
    batch = random_batch(schema, 8, seed=0)
    before = model(batch.dense_features, batch.sparse_features).detach()
    mask_tables(model, (0.5, 0.5))
    torch.testing.assert_close(model(batch.dense_features, batch.sparse_features), before)
    assert [tuple(w.shape) for w in table_weights(model)] == [(10, 8), (50, 8)]
    with pytest.raises(ValueError, match="already masked"):
        mask_tables(model)


def test_fused_kernel_is_refused_with_the_switch_named() -> None:
    model = small_model(make_schema(), kernel=EmbeddingKernel.FUSED)
    with pytest.raises(ValueError, match=r"fused.*embedding_kernel: plain"):
        mask_tables(model)


def test_hashed_features_get_one_block() -> None:
    schema = Schema(features=(FeatureSpec("h", hash_size=99, num_embeddings=100, embedding_dim=8),), name="h")
    masks = mask_tables(small_model(schema), (0.1, 0.9))
    assert masks["h"].bounds == [(0, 100)]


# -- alpha gradients are normalised per block row ----------------------------------------------


def test_alpha_gradient_is_divided_by_its_mean_abs_per_block_row() -> None:
    schema = make_schema()
    model = small_model(schema)
    masks = mask_tables(model, (0.2, 0.3, 0.5))
    batch = random_batch(schema, 32, seed=1, max_bag=3)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch.dense_features, batch.sparse_features), batch.labels)
    loss.backward()
    raw = {n: m.alpha.grad.clone() for n, m in masks.items()}
    normalize_alpha_grads(masks)
    for name, m in masks.items():
        expected = raw[name] / (raw[name].abs().mean(dim=-1, keepdim=True) + 1e-8)
        torch.testing.assert_close(m.alpha.grad, expected)
        nonzero = raw[name].abs().sum(-1) > 0
        mean_abs = m.alpha.grad.abs().mean(-1)
        torch.testing.assert_close(mean_abs[nonzero], torch.ones_like(mean_abs[nonzero]), rtol=0, atol=1e-3)  # 1e-8 eps vs tiny grads
        assert torch.all(torch.sign(m.alpha.grad) == torch.sign(raw[name]))


# -- deriving dims -------------------------------------------------------------------------------


def test_derive_dims_rounds_up_to_4_and_hard_alpha_keeps_the_top_entries() -> None:
    alpha = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.1, 0.0, 0.0], [0.2, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    assert derive_dims({"f": alpha}, 0.55) == {"f": [4, 4]}
    assert derive_dims({"f": alpha}, 0.5) == {"f": [8, 4]}  # 5 kept -> 8
    assert derive_dims({"f": alpha}, 0.0) == {"f": [8, 8]}
    assert derive_dims({"f": alpha}, 1.1) == {"f": [4, 4]}  # at least one aligned dim
    assert plan_parameters({"f": [8, 4]}, {"f": [(0, 10), (10, 30)]}) == 10 * 8 + 20 * 4
    a = torch.tensor([[0.1, 0.9, 0.5, 0.7]])
    torch.testing.assert_close(hard_alpha(a, [2]), torch.tensor([[0.0, 0.9, 0.0, 0.7]]))


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        DNIS(width=10)
    with pytest.raises(ValueError, match="sum to at most 1"):
        DNIS(blocks=(0.6, 0.6))
    assert isinstance(get_search("dnis", search_epochs=2), DNIS)


# -- end to end on planted synthetic data --------------------------------------------------------


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    return Recipe(tiny_config(n_rows=8000), workdir=tmp_path_factory.mktemp("dnis"), quiet=True)


#: a stronger L1 than the reference's 1e-5: the tiny data gives ~250 mask steps, not thousands
SEARCH = {"width": 16, "warm_start_epochs": 2, "search_epochs": 10, "l1": 1e-4, "seed": 0}


@pytest.fixture(scope="module")
def searched(recipe: Recipe) -> tuple[DimensionPlan, int]:
    budget = budget_of(recipe.schema, 16) // 2
    return DNIS(**SEARCH).search(recipe, budget=budget), budget


def _mean_alpha(plan: DimensionPlan, name: str) -> float:
    """Row-weighted mean alpha of a feature (the never-trained OOV row left out)."""
    alpha = np.asarray(plan.extras["alpha"][name])
    rows = np.array([b - a for a, b in plan.extras["block_bounds"][name]], dtype=float)
    rows[0] -= 1
    return float((alpha.mean(axis=1) * rows).sum() / rows.sum())


def test_masks_move_the_way_the_loss_says(recipe: Recipe, searched: tuple[DimensionPlan, int]) -> None:
    plan, _ = searched
    schema = recipe.schema
    per_feature = plan.parameters_per_feature(schema)
    kept = {n: per_feature[n] / (16 * schema[n].num_embeddings) for n in INFORMATIVE + NOISE}
    alpha = {n: _mean_alpha(plan, n) for n in INFORMATIVE + NOISE}
    for good in INFORMATIVE:
        for noise in NOISE:
            assert alpha[good] > alpha[noise], alpha
            assert kept[good] > kept[noise], kept
            assert plan.dims[good] >= plan.dims[noise]
    # the search helps validation AUC over the warm start (masking noise out), and the
    # hard-masked sweep covers full width down to the smallest plan
    assert plan.extras["searched_val_auc"] > plan.extras["warm_start_val_auc"]
    sweep = plan.extras["sweep"]
    params = [s["parameters"] for s in sweep]
    assert params == sorted(params, reverse=True)
    assert params[0] == budget_of(schema, 16) and params[-1] == min_budget(schema)
    assert all(0.5 < s["val_auc"] <= 1.0 for s in sweep)


def test_plan_meets_the_budget_and_round_trips(recipe: Recipe, searched: tuple[DimensionPlan, int], tmp_path: Path) -> None:
    plan, budget = searched
    schema = recipe.schema
    assert plan.method == "dnis" and plan.config["budget"] == budget
    assert plan.num_parameters(schema) <= budget
    # the smallest threshold that fits: one step lower would break the budget
    values = sorted({v for a in plan.extras["alpha"].values() for row in a for v in row} | {0.0})
    below = [v for v in values if v < plan.extras["threshold"]]
    if below:
        alphas = {n: np.asarray(a) for n, a in plan.extras["alpha"].items()}
        bounds = {n: [tuple(b) for b in bl] for n, bl in plan.extras["block_bounds"].items()}
        assert plan_parameters(derive_dims(alphas, below[-1]), bounds) > budget
    for name, blocks in plan.blocks.items():
        assert len(blocks) > 1 and blocks[0].start == 0 and blocks[-1].stop is None
        assert all(isinstance(b, FrequencyBlock) and b.dim % 4 == 0 and 4 <= b.dim <= 16 for b in blocks)
        assert plan.dims[name] == max(b.dim for b in blocks)
    assert plan.blocks, "the search should give some feature different dims per frequency block"
    for suffix in (".yaml", ".json"):
        loaded = DimensionPlan.load(plan.save(tmp_path / f"plan{suffix}"))
        assert loaded.dims == plan.dims and loaded.blocks == plan.blocks
        assert loaded.num_parameters(schema) == plan.num_parameters(schema)
        assert loaded.extras["threshold"] == pytest.approx(plan.extras["threshold"])
    assert plan.apply(schema).sparse_names == schema.sparse_names


def test_search_is_deterministic_for_a_seed(recipe: Recipe) -> None:
    quick = {**SEARCH, "warm_start_epochs": 1, "search_epochs": 1, "max_steps": 12}
    a = DNIS(**quick).search(recipe)
    b = DNIS(**quick).search(recipe)
    c = DNIS(**{**quick, "seed": 1}).search(recipe)
    assert a.extras["alpha"] == b.extras["alpha"] and a.dims == b.dims and a.blocks == b.blocks
    assert a.extras["alpha"] != c.extras["alpha"]
    # without a budget: the default threshold
    assert a.extras["threshold"] == 0.5 and a.config["budget"] is None


def test_auc_tolerance_picks_the_largest_threshold_within_tolerance(recipe: Recipe) -> None:
    plan = DNIS(**{**SEARCH, "search_epochs": 1, "max_steps": 12, "auc_tolerance": 0.01}).search(recipe)
    base = plan.extras["searched_val_auc"]
    ok = [s["threshold"] for s in plan.extras["sweep"] if s["val_auc"] >= base - 0.01]
    assert plan.extras["threshold"] == max(ok)


def test_eval_rows_scores_every_model_on_a_validation_sample(recipe: Recipe, monkeypatch: pytest.MonkeyPatch) -> None:
    """``eval_rows``: the warm-start, searched and every swept model are scored on the same
    seeded sample of validation rows, not the whole split."""
    import embeddings.dims.dnis as dnis

    seen: list[int] = []
    evaluate = dnis._evaluate

    def counted(model, data, batch_size):  # type: ignore[no-untyped-def]
        seen.append(len(data))
        return evaluate(model, data, batch_size)

    monkeypatch.setattr(dnis, "_evaluate", counted)
    plan = DNIS(**{**SEARCH, "warm_start_epochs": 1, "search_epochs": 1, "max_steps": 12, "eval_rows": 300}).search(recipe)
    assert len(recipe.datamodule.split_data("val")) > 300
    assert seen == [300] * (2 + len(plan.extras["sweep"]))
    with pytest.raises(ValueError, match="eval_rows"):
        DNIS(eval_rows=0)


def test_budget_below_one_dim_per_feature_is_refused_before_training(recipe: Recipe) -> None:
    with pytest.raises(DimensionPlanError, match="smaller than one dim"):
        DNIS(**SEARCH).search(recipe, budget=min_budget(recipe.schema) - 1)


def test_replan_cuts_the_same_masks_at_other_budgets(recipe: Recipe, searched: tuple[DimensionPlan, int]) -> None:
    from embeddings.dims.dnis import replan

    plan, budget = searched
    schema = recipe.schema
    same = replan(plan, budget)
    assert same.dims == plan.dims and same.blocks == plan.blocks  # the search's own cut
    bigger = replan(plan, budget * 3 // 2)
    smaller = replan(plan, budget // 2)
    assert smaller.num_parameters(schema) <= budget // 2 < plan.num_parameters(schema) <= budget
    assert plan.num_parameters(schema) <= bigger.num_parameters(schema) <= budget * 3 // 2
    assert bigger.extras["threshold"] <= plan.extras["threshold"] <= smaller.extras["threshold"]
    with pytest.raises(DimensionPlanError, match="one dim of 4 per block"):
        replan(plan, 10)
    with pytest.raises(ValueError, match="needs a DNIS plan"):
        replan(DimensionPlan(dims={"item_id": 8}), budget)
