"""Tests of iHAS (:mod:`embeddings.dims.ihas`): the gate (regularisers as stated, deterministic eval
gates, both sampling modes), seeded K-means and per-cluster dims, an end-to-end search on
planted synthetic data (noise fields get fewer active dims, no empty cluster, determinism,
budget, file round trip), routing against hand-built centroids, and the retrained routed
model (each row gets its cluster's logit; TorchScript parity)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from embeddings import DimensionPlan, DimensionPlanError, budget_of, min_budget
from embeddings.dims.ihas import IHAS, GateSampling, IHASGate, IHASRoutedModel, IHASRouter, cluster_dims, kmeans
from recsys.data.batching import BatchDataset, random_batch
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.models import DCNv2
from recsys.models.base import SparseArchConfig
from recsys.train.recipe import Recipe
from tests.selection.conftest import tiny_config

INFORMATIVE = ("item_id", "site_category", "user_id")
NOISE = ("noise_c2", "noise_c10", "noise_tags")
SEARCH = {"width": 16, "search_epochs": 12, "num_clusters": 3, "seed": 0}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread avoids barrier waits on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_schema() -> Schema:
    return Schema(
        features=(
            FeatureSpec("user", num_embeddings=10, embedding_dim=8),
            FeatureSpec("genre", kind=FeatureKind.MULTI_CATEGORICAL, num_embeddings=50, embedding_dim=4),
            FeatureSpec("price", kind=FeatureKind.DENSE),
        ),
        name="toy",
    )


def bound_gate(sampling: str = "straight_through", **kwargs: float) -> IHASGate:
    torch.manual_seed(0)
    gate = IHASGate(sampling, **kwargs)
    gate.bind(["user", "genre"], [8, 4], ["price"])
    with torch.no_grad():
        for layer in gate.gates.values():
            layer.weight.normal_()
            layer.bias.normal_()
    return gate


def seam_input(batch: int = 6) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"user": torch.randn(batch, 8, generator=g), "genre": torch.randn(batch, 4, generator=g)}, torch.randn(batch, 1, generator=g)


# -- the gate ------------------------------------------------------------------------------------


def test_regularization_is_sparsity_plus_bipolarization() -> None:
    gate = bound_gate(sparsity=0.3, polarization=0.7).train()
    sparse, dense = seam_input()
    assert float(gate.regularization()) == 0.0  # before any training forward
    gate(sparse, dense)
    pi = torch.cat([torch.sigmoid(gate.gates[n](sparse[n])).reshape(-1) for n in ("user", "genre")])
    expected = 0.3 * pi.mean() + 0.7 * (pi * (1 - pi)).mean()
    torch.testing.assert_close(gate.regularization(), expected, rtol=1e-6, atol=1e-7)
    # the penalty reaches the gate layers
    gate.regularization().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gate.parameters())
    gate.eval()
    gate(sparse, dense)
    assert float(gate.regularization()) == 0.0


def test_eval_gates_are_deterministic_and_dense_passes_through() -> None:
    gate = bound_gate().eval()
    sparse, dense = seam_input()
    out1, d1 = gate(sparse, dense)
    out2, _ = gate(sparse, dense)
    assert d1 is dense
    for n in ("user", "genre"):
        z = (torch.sigmoid(gate.gates[n](sparse[n])) > 0.5).float()
        assert 0 < z.sum() < z.numel()  # some gates open, some closed
        torch.testing.assert_close(out1[n], sparse[n] * z, rtol=0, atol=0)
        torch.testing.assert_close(out1[n], out2[n], rtol=0, atol=0)
    masks = gate.masks(sparse)
    assert masks.shape == (6, 12) and set(masks.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("sampling", list(GateSampling))
def test_training_gates_sample_and_pass_gradients(sampling: GateSampling) -> None:
    gate = bound_gate(sampling.value, temperature=0.5).train()
    sparse, dense = seam_input(64)
    ones = {n: torch.ones_like(e) for n, e in sparse.items()}
    torch.manual_seed(3)
    out, _ = gate(ones, dense)
    z = torch.cat([out["user"], out["genre"]], dim=1)
    if sampling is GateSampling.STRAIGHT_THROUGH:
        assert set(z.detach().unique().tolist()) <= {0.0, 1.0}  # hard 0/1 in the forward
    else:
        assert ((z > 0) & (z < 1)).float().mean() > 0.5  # relaxed: fractional gates
    z.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gate.parameters())


def test_gate_in_a_model_scripts_and_matches_eager() -> None:
    schema = make_schema()
    torch.manual_seed(0)
    model = DCNv2(schema, SparseArchConfig(), cross_layers=1, deep_mlp=[8])
    model.set_seam(IHASGate())
    model.eval()
    batch = random_batch(schema, 9, seed=2)
    scripted = torch.jit.script(model)
    torch.testing.assert_close(scripted(batch.dense_features, batch.sparse_features),
                               model(batch.dense_features, batch.sparse_features), rtol=0, atol=1e-6)


# -- clustering ---------------------------------------------------------------------------------


def test_kmeans_is_seeded_and_finds_planted_groups() -> None:
    g = np.random.default_rng(0)
    a = (g.random((40, 6)) < np.array([0.95, 0.95, 0.95, 0.05, 0.05, 0.05])).astype(float)
    b = (g.random((60, 6)) < np.array([0.05, 0.05, 0.05, 0.95, 0.95, 0.95])).astype(float)
    x = np.concatenate([a, b])
    c1, l1 = kmeans(x, 2, seed=4)
    c2, l2 = kmeans(x, 2, seed=4)
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_array_equal(c1, c2)
    # the planted groups are recovered (a few noisy rows may sit nearer the other centroid)
    first, second = np.bincount(l1[:40], minlength=2).argmax(), np.bincount(l1[40:], minlength=2).argmax()
    assert first != second
    assert ((l1[:40] == first).sum() + (l1[40:] == second).sum()) >= 95
    # k is capped at the number of distinct points
    centroids, labels = kmeans(np.repeat(np.eye(2), 5, axis=0), 4)
    assert len(centroids) == 2 and sorted(np.bincount(labels)) == [5, 5]
    with pytest.raises(ValueError, match="k must be"):
        kmeans(x, 0)


def test_cluster_dims_mean_rule_and_threshold_rule() -> None:
    # two fields of width 8; cluster 0 uses 5 dims of field 0 on average, cluster 1 uses 0
    masks = np.zeros((4, 16))
    masks[0, :6] = 1
    masks[1, :4] = 1
    masks[2:, 8:17] = 1
    labels = np.array([0, 0, 1, 1])
    assert cluster_dims(masks, labels, [8, 8]) == {0: [8, 4], 1: [4, 8]}  # mean 5 -> 8, 0 -> 4 (min)
    # dims active in at least half the cluster: 6 of field 0 -> 8; at 0.75 only 4 -> 4
    assert cluster_dims(masks, labels, [8, 8], threshold=0.5) == {0: [8, 4], 1: [4, 8]}
    assert cluster_dims(masks, labels, [8, 8], threshold=0.75) == {0: [4, 4], 1: [4, 8]}


# -- end to end on planted synthetic data --------------------------------------------------------


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    return Recipe(tiny_config(n_rows=8000), workdir=tmp_path_factory.mktemp("ihas"), quiet=True)


@pytest.fixture(scope="module")
def searched(recipe: Recipe) -> tuple[DimensionPlan, torch.nn.Module]:
    return IHAS(**SEARCH).search_with_model(recipe)


def test_noise_fields_get_fewer_active_dims(searched: tuple[DimensionPlan, torch.nn.Module]) -> None:
    plan, _ = searched
    stats = plan.extras["gate_stats"]
    active = {n: stats[n]["mean_active_dims"] for n in INFORMATIVE + NOISE}
    assert np.mean([active[n] for n in INFORMATIVE]) > np.mean([active[n] for n in NOISE]) + 3, active
    for n in ("noise_c2", "noise_c10"):
        assert all(active[good] > active[n] for good in INFORMATIVE), active
    # the searched gates cut the embedding width, and the cluster dims follow them
    assert sum(s["mean_active_dims"] for s in stats.values()) < 0.5 * 16 * len(stats)
    for cdims in plan.clusters.values():
        assert sum(cdims[n] for n in INFORMATIVE) > sum(cdims[n] for n in NOISE)
    assert plan.extras["searched_val_auc"] > 0.6


def test_plan_has_no_empty_cluster_and_round_trips(recipe: Recipe, searched: tuple[DimensionPlan, torch.nn.Module],
                                                   tmp_path: Path) -> None:
    plan, _ = searched
    schema = recipe.schema
    assert plan.method == "ihas" and plan.is_clustered
    assert sorted(plan.clusters) == list(range(len(plan.extras["centroids"])))
    assert all(s > 0 for s in plan.cluster_sizes.values())
    assert sum(plan.cluster_sizes.values()) == len(recipe.datamodule.prepared.splits["train"])
    assert abs(sum(plan.extras["cluster_share"].values()) - 1) < 1e-9
    for cdims in plan.clusters.values():
        assert all(d % 4 == 0 and 4 <= d <= 16 for d in cdims.values())
    assert plan.num_parameters(schema) == sum(plan.cluster_parameters(schema).values())
    for suffix in (".json", ".yaml"):
        loaded = DimensionPlan.load(plan.save(tmp_path / f"plan{suffix}"))
        assert loaded.clusters == plan.clusters and loaded.cluster_sizes == plan.cluster_sizes
        assert loaded.num_parameters(schema) == plan.num_parameters(schema)
        np.testing.assert_allclose(loaded.extras["centroids"], plan.extras["centroids"])


def test_search_is_deterministic_for_a_seed(recipe: Recipe, searched: tuple[DimensionPlan, torch.nn.Module]) -> None:
    plan, _ = searched
    again = IHAS(**SEARCH).search(recipe)
    assert again.clusters == plan.clusters and again.cluster_sizes == plan.cluster_sizes
    np.testing.assert_array_equal(again.extras["centroids"], plan.extras["centroids"])


def test_budget_is_met_and_too_small_a_budget_is_refused(recipe: Recipe) -> None:
    schema = recipe.schema.with_uniform_dim(16)
    # every cluster has its own tables: three clusters share one uniform-16 model's parameters
    budget = budget_of(schema, 16)
    options = {**SEARCH, "search_epochs": 2}
    plan = IHAS(**options).search(recipe, budget=budget)
    assert plan.num_parameters(recipe.schema) <= budget and plan.extras["threshold"] is not None
    assert plan.num_parameters(recipe.schema) > min_budget(schema) * options["num_clusters"]
    need = options["num_clusters"] * min_budget(schema)
    with pytest.raises(DimensionPlanError, match="cluster models"):
        IHAS(**options).search(recipe, budget=need - 1)


def test_empty_clusters_are_dropped_and_renumbered(recipe: Recipe, monkeypatch: pytest.MonkeyPatch) -> None:
    import embeddings.dims.ihas as ihas

    def three_with_middle_empty(x: np.ndarray, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        labels = np.where(np.arange(len(x)) % 2 == 0, 0, 2)
        return np.stack([x[0], x[0], x[1]]), labels

    monkeypatch.setattr(ihas, "kmeans", three_with_middle_empty)
    plan = IHAS(**{**SEARCH, "search_epochs": 1, "max_steps": 3}).search(recipe)
    assert sorted(plan.clusters) == [0, 1] and plan.extras["dropped_clusters"] == [1]
    assert len(plan.extras["centroids"]) == 2 and all(s > 0 for s in plan.cluster_sizes.values())


# -- routing -------------------------------------------------------------------------------------


def test_router_sends_each_row_to_its_nearest_hand_built_centroid() -> None:
    schema = make_schema()
    torch.manual_seed(0)
    model = DCNv2(schema, SparseArchConfig(), cross_layers=1, deep_mlp=[8])
    gate = IHASGate()
    model.set_seam(gate)
    centroids = torch.zeros(3, 12)
    centroids[1, :8] = 1  # "user" open, "genre" closed
    centroids[2] = 1  # all open
    router = IHASRouter(model.sparse_arch, gate, centroids)
    masks = torch.zeros(4, 12)
    masks[1, :7] = 1
    masks[2, 2:] = 1
    masks[3, 0] = 1
    assert router.assign(masks).tolist() == [0, 1, 2, 0]
    router.train()
    assert not router.training and not router.gate.training  # stays frozen


def _routed_model(schema: Schema) -> tuple[IHASRoutedModel, list[torch.nn.Module]]:
    torch.manual_seed(0)
    search_model = DCNv2(schema, SparseArchConfig(), cross_layers=1, deep_mlp=[8])
    search_model.set_seam(IHASGate())
    batch = random_batch(schema, 64, seed=5)
    with torch.no_grad():
        masks = search_model.seam.masks(search_model.sparse_arch(batch.sparse_features))
    centroids = torch.stack([masks[0], masks[1 + int(torch.argmax((masks[1:] - masks[0]).abs().sum(1)))]])
    router = IHASRouter(search_model.sparse_arch, search_model.seam, centroids)
    plan = DimensionPlan(clusters={0: {"user": 4, "genre": 4}, 1: {"user": 8, "genre": 4}}, method="ihas")
    models = [DCNv2(plan.apply_cluster(schema, c), cross_layers=1, deep_mlp=[8]).eval() for c in (0, 1)]
    return IHASRoutedModel(router, models).eval(), models


def test_routed_model_returns_each_rows_cluster_model_output() -> None:
    schema = make_schema()
    routed, models = _routed_model(schema)
    batch = random_batch(schema, 64, seed=5)
    with torch.no_grad():
        cluster = routed.router(batch.sparse_features)
        out = routed(batch.dense_features, batch.sparse_features)
        per_model = [m(batch.dense_features, batch.sparse_features) for m in models]
    assert set(cluster.tolist()) == {0, 1}  # both clusters are used
    expected = torch.where(cluster == 0, per_model[0], per_model[1])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_routed_model_scripts_and_matches_eager() -> None:
    """Scripted, not traced: batch size and bag lengths are free; float32 tolerance 1e-6."""
    schema = make_schema()
    routed, _ = _routed_model(schema)
    scripted = torch.jit.script(routed)
    for size, seed in ((64, 5), (3, 11)):
        batch = random_batch(schema, size, seed=seed, max_bag=7)
        with torch.no_grad():
            torch.testing.assert_close(scripted(batch.dense_features, batch.sparse_features),
                                       routed(batch.dense_features, batch.sparse_features), rtol=0, atol=1e-6)


def test_retrain_builds_one_model_per_cluster_on_its_rows(recipe: Recipe,
                                                          searched: tuple[DimensionPlan, torch.nn.Module]) -> None:
    plan, gate_model = searched
    search = IHAS(**{**SEARCH, "retrain_epochs": 1, "max_steps": 10})
    routed = search.retrain(recipe, plan, gate_model)
    assert len(routed.models) == len(plan.clusters)
    for c, model in enumerate(routed.models):
        assert model.embedding_dims == [plan.clusters[c].get(n, recipe.schema[n].embedding_dim) for n in model.sparse_names]
    val = recipe.datamodule.prepared.splits["val"]
    batch = next(iter(BatchDataset(val, 300)))
    with torch.no_grad():
        out = routed(batch.dense_features, batch.sparse_features)
    assert out.shape == (300,) and torch.isfinite(out).all()
    # the router reproduces the search's training-split assignment sizes
    train = recipe.datamodule.prepared.splits["train"]
    from embeddings.dims.ihas import _route

    sizes = np.bincount(_route(routed.router, train, 1024), minlength=len(plan.clusters))
    assert sizes.tolist() == [plan.cluster_sizes[c] for c in sorted(plan.cluster_sizes)]


def test_retrain_to_plateau_keeps_the_best_epochs_weights(recipe: Recipe, searched: tuple[DimensionPlan, torch.nn.Module],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With retrain_patience the returned routed model carries the best epoch's weights (its
    validation AUC is the recorded best, to the bit), every epoch trains in training mode (the
    validation pass between epochs does not leave the models in eval mode), and training stopped
    `patience` epochs after the best epoch or at the epoch cap."""
    import embeddings.dims.ihas as ihas_module
    from embeddings.dims.ihas import _evaluate

    modes: list[bool] = []
    fit = ihas_module.fit_split

    def recording_fit(task: torch.nn.Module, *args: object, **kwargs: object) -> int:
        modes.append(all(m.training for m in task.modules()))
        return fit(task, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ihas_module, "fit_split", recording_fit)
    plan, gate_model = searched
    search = IHAS(**{**SEARCH, "retrain_epochs": 6, "retrain_patience": 1})
    routed, record = search.retrain_with_record(recipe, plan, gate_model)
    assert len(modes) == record["epochs_run"] * len(plan.clusters) and all(modes)
    assert 1 <= record["best_epoch"] <= record["epochs_run"] <= 6
    assert record["epochs_run"] in (record["best_epoch"] + 1, 6)
    val = recipe.datamodule.prepared.splits["val"]
    assert _evaluate(routed, val, 4 * recipe.datamodule.batch_size) == record["best_val_auc"]
    assert not routed.training
    fixed, fixed_record = IHAS(**{**SEARCH, "retrain_epochs": 2}).retrain_with_record(recipe, plan, gate_model)
    assert fixed_record == {"epochs_run": 2, "best_epoch": 2, "best_val_auc": None}
    with pytest.raises(ValueError, match="retrain_patience"):
        IHAS(retrain_patience=-1)


def test_registered_and_options_validated(recipe: Recipe) -> None:
    from embeddings.dims.base import get_search, search_names

    assert "ihas" in search_names()
    search = get_search("ihas", num_clusters=2, sampling="relaxed")
    assert isinstance(search, IHAS) and search.sampling == "relaxed"
    for bad in ({"num_clusters": 0}, {"sampling": "gumbel"}, {"width": 6}, {"tau_end": 2.0}):
        with pytest.raises(ValueError):
            IHAS(**bad)


def test_compare_sampling_reports_both_options(recipe: Recipe) -> None:
    from embeddings.dims.ihas import compare_sampling

    out = compare_sampling(recipe, width=8, search_epochs=1, max_steps=4, num_clusters=2)
    assert set(out) == {"straight_through", "relaxed"}
    for row in out.values():
        assert 0.0 <= row["searched_val_auc"] <= 1.0 and set(INFORMATIVE) <= set(row["mean_active_dims"])
