"""Permutation importance at the seam.

* the seam-cached computation against a plain-PyTorch reference that permutes the *encoded
  input* of one field over the whole split and runs the full model forward (DCNv2, DLRM and
  DeepFM; a multi-hot and two dense fields included);
* the AUC against scikit-learn, ties included; ``FieldShuffle`` against indexing;
* planted truth: informative fields get a positive drop, noise fields ~0, on a hand-built
  dataset and through a recipe on the synthetic generator; determinism for a seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from recsys.data.batching import make_batch
from recsys.data.encoders import EncodedData, Preprocessor, gather_jagged
from recsys.data.schema import FeatureSpec, Schema
from recsys.models.archs import DLRM, DCNv2, DeepFM
from recsys.models.base import RankingModel
from selection.model_based.permutation import (
    FieldShuffle,
    PermutationImportance,
    binary_auc,
    field_permutation,
    permutation_drops,
    permutation_importance,
    seam_fields,
)

INFORMATIVE = ("user", "genres", "score")
NOISE = ("junk", "noise")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread (with two, every small op waits on a barrier, which on
    a busy shared machine made the module's training take 40 s instead of 0.3 s). Module scope,
    so it is in force before the module-scoped fixtures train."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_frame(n: int = 3000, seed: int = 0) -> tuple[pd.DataFrame, Schema]:
    """``user``, multi-hot ``genres`` and dense ``score`` drive the label; ``junk`` and dense
    ``noise`` do not. Returns (raw frame, unfitted schema)."""
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 30, n)
    user_effect = rng.normal(0, 1.2, 30)
    genres = [rng.choice(6, rng.integers(0, 4), replace=False) for _ in range(n)]
    genre_effect = np.array([1.5, -1.5, 0.8, -0.8, 0.0, 0.5])
    score = rng.normal(0, 1, n)
    logit = user_effect[user] + np.array([genre_effect[g].sum() for g in genres]) + 1.2 * score
    frame = pd.DataFrame(
        {
            "user": [f"u{u}" for u in user],
            "junk": [f"j{j}" for j in rng.integers(0, 20, n)],
            "genres": ["|".join(f"g{g}" for g in gs) for gs in genres],
            "score": score,
            "noise": rng.normal(0, 1, n),
            "click": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int),
        }
    )
    schema = Schema(
        (
            FeatureSpec("user", embedding_dim=8),
            FeatureSpec("junk", embedding_dim=4),
            FeatureSpec("genres", kind="multi_categorical", embedding_dim=4),
            FeatureSpec("score", kind="dense"),
            FeatureSpec("noise", kind="dense"),
        ),
        label="click",
    )
    return frame, schema


def make_data(n: int = 3000, seed: int = 0) -> tuple[Schema, EncodedData, EncodedData]:
    """:func:`make_frame` encoded: (fitted schema, train = first 70%, validation = the rest)."""
    frame, schema = make_frame(n, seed)
    cut = int(0.7 * n)
    pre = Preprocessor(schema).fit(frame.iloc[:cut])
    return pre.fitted_schema, pre.transform(frame.iloc[:cut]), pre.transform(frame.iloc[cut:])


def make_model(arch: str, schema: Schema) -> RankingModel:
    if arch == "dlrm":
        return DLRM(schema, bottom_mlp=[8, 8], top_mlp=[16])
    if arch == "deepfm":
        return DeepFM(schema, deep_mlp=[16])
    return DCNv2(schema, cross_layers=1, deep_mlp=[16])


def train(
    model: RankingModel, data: EncodedData, epochs: int = 4, batch_size: int = 128, seed: int = 0
) -> RankingModel:
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    model.train()
    for epoch in range(epochs):
        order = np.random.default_rng(seed + epoch).permutation(len(data))
        for start in range(0, len(data), batch_size):
            batch = make_batch(data, order[start : start + batch_size])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(batch.dense_features, batch.sparse_features), batch.labels
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def trained() -> dict[str, Any]:
    schema, tr, va = make_data()
    torch.manual_seed(0)
    models = {arch: train(make_model(arch, schema), tr) for arch in ("dcnv2", "dlrm", "deepfm")}
    return {"schema": schema, "val": va, "models": models}


# -- reference: permute the encoded input, run the whole model ----------------------------------
def permute_field(data: EncodedData, field: str, perm: np.ndarray) -> EncodedData:
    """``data`` with the rows of one field (a jagged sparse column or a dense column) permuted."""
    values, lengths, dense = dict(data.values), dict(data.lengths), data.dense
    if field in data.sparse_names:
        values[field], lengths[field] = gather_jagged(
            data.values[field], data.offsets(field), data.lengths[field], perm
        )
    else:
        dense = data.dense.copy()
        j = data.dense_names.index(field)
        dense[:, j] = data.dense[perm, j]
    return EncodedData(data.sparse_names, data.dense_names, values, lengths, dense, data.labels)


def reference_auc(model: RankingModel, data: EncodedData, batch_size: int) -> float:
    with torch.no_grad():
        logits = [
            model(b.dense_features, b.sparse_features)
            for b in (
                make_batch(data, np.arange(s, min(s + batch_size, len(data)))) for s in range(0, len(data), batch_size)
            )
        ]
    return float(roc_auc_score(data.labels, torch.cat(logits).numpy()))


@pytest.mark.parametrize("arch", ["dcnv2", "dlrm", "deepfm"])
def test_seam_cached_drops_equal_the_full_forward_reference(trained: dict[str, Any], arch: str) -> None:
    model, data = trained["models"][arch], trained["val"]
    batch_size, repeats = 256, 2
    base, drops = permutation_drops(model, data, repeats=repeats, seed=3, batch_size=batch_size)
    assert list(drops) == ["user", "junk", "genres", "score", "noise"]  # sparse then dense fields
    assert base == pytest.approx(reference_auc(model, data, batch_size), abs=1e-9)
    for field, per_repeat in drops.items():
        for r, drop in enumerate(per_repeat):
            perm = field_permutation(len(data), 3, field, r)
            expected = base - reference_auc(model, permute_field(data, field, perm), batch_size)
            # same rows in the same chunks through the same kernels: equal up to float summation order
            assert drop == pytest.approx(expected, abs=1e-6), (field, r)


def test_field_shuffle_on_the_model_equals_the_cached_computation(trained: dict[str, Any]) -> None:
    """Installing ``FieldShuffle`` with the split-level permutation and running the whole split
    as one batch gives the same AUC as the cached path."""
    model, data = trained["models"]["dcnv2"], trained["val"]
    _, drops = permutation_drops(model, data, repeats=1, seed=0, batch_size=len(data))
    base = reference_auc(model, data, len(data))
    seam = model.seam
    try:
        for field in ("genres", "noise"):
            model.set_seam(FieldShuffle(field, torch.from_numpy(field_permutation(len(data), 0, field, 0))))
            assert base - reference_auc(model, data, len(data)) == pytest.approx(drops[field][0], abs=1e-6)
    finally:
        model.seam = seam


def test_field_shuffle_permutes_exactly_one_field() -> None:
    sparse = {"a": torch.arange(12.0).reshape(4, 3), "b": torch.arange(8.0).reshape(4, 2)}
    dense = torch.arange(8.0).reshape(4, 2)
    perm = torch.tensor([2, 0, 3, 1])
    shuffle = FieldShuffle("b", perm)
    shuffle.bind(["a", "b"], [3, 2], ["x", "y"])
    out, d = shuffle(sparse, dense)
    assert torch.equal(out["b"], sparse["b"][perm]) and torch.equal(out["a"], sparse["a"]) and torch.equal(d, dense)
    shuffle = FieldShuffle("y", perm)
    shuffle.bind(["a", "b"], [3, 2], ["x", "y"])
    out, d = shuffle(sparse, dense)
    assert torch.equal(d[:, 0], dense[:, 0]) and torch.equal(d[:, 1], dense[perm, 1]) and out is sparse
    # drawn permutations come from the generator
    a = FieldShuffle("a", generator=torch.Generator().manual_seed(5))
    b = FieldShuffle("a", generator=torch.Generator().manual_seed(5))
    assert torch.equal(a(sparse, dense)[0]["a"], b(sparse, dense)[0]["a"])
    with pytest.raises(ValueError, match="not a seam field"):
        FieldShuffle("zzz").bind(["a"], [3], ["x"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_auc_matches_sklearn_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 8, 500).astype(float)  # many ties
    labels = rng.integers(0, 2, 500)
    assert binary_auc(torch.from_numpy(scores), torch.from_numpy(labels)) == pytest.approx(
        roc_auc_score(labels, scores), abs=1e-12
    )
    assert np.isnan(binary_auc(scores, np.zeros(500)))


# -- planted truth and determinism -----------------------------------------------------------------
def test_planted_truth_informative_fields_drop_auc_noise_does_not(trained: dict[str, Any]) -> None:
    model, data = trained["models"]["dcnv2"], trained["val"]
    mean, std, base = permutation_importance(model, data, repeats=3, seed=0)
    assert base > 0.7
    assert set(mean) == set(seam_fields(model))
    for f in INFORMATIVE:  # multi-hot and dense included
        assert mean[f] > 0.01 and mean[f] > 3 * std[f], (f, mean[f], std[f])
    for f in NOISE:
        assert abs(mean[f]) < 0.01, (f, mean[f])
    assert min(mean[f] for f in INFORMATIVE) > max(mean[f] for f in NOISE)


def test_same_seed_same_report_other_seed_other_drops(trained: dict[str, Any]) -> None:
    model, data, schema = trained["models"]["dlrm"], trained["val"], trained["schema"]
    method = PermutationImportance(repeats=2, seed=7)
    a = method.rank_model(model, data, schema, dataset="toy")
    b = method.rank_model(model, data, schema, dataset="toy")
    assert a.ranking == b.ranking and a.scores == b.scores and a.extras["drops"] == b.extras["drops"]
    c = PermutationImportance(repeats=2, seed=8).rank_model(model, data, schema)
    assert c.extras["drops"] != a.extras["drops"]
    # report contents
    assert a.method == "permutation" and a.dataset == "toy"
    assert a["user"].width == 8 and a["genres"].width == 4 and a["score"].width == 1
    assert a["score"].kind == "dense" and a["genres"].kind == "multi_categorical"
    assert a["user"].uncertainty == pytest.approx(float(np.std(a.extras["drops"]["user"])))
    assert a.extras["repeats"] == 2 and a.extras["base_auc"] > 0.7 and a.extras["eval_seconds"] > 0
    assert "within_noise" in a["junk"].flags or a["junk"].score < a["user"].score
    assert not model.training  # the training flag is restored (it was eval)


def test_training_flag_is_restored_and_unknown_features_are_refused(trained: dict[str, Any]) -> None:
    model, data = trained["models"]["deepfm"], trained["val"]
    model.train()
    try:
        mean, _, _ = permutation_importance(model, data, repeats=1, features=["score"])
        assert list(mean) == ["score"] and model.training and all(m.training for m in model.modules())
    finally:
        model.eval()
    with pytest.raises(ValueError, match="not seam fields"):
        permutation_importance(model, data, features=["nope"])
    with pytest.raises(ValueError, match="refused"):
        PermutationImportance(split="test")


def synthetic_config(root: Path) -> dict[str, Any]:
    return {
        "seed_everything": 0,
        "trainer": {"max_epochs": 2, "enable_progress_bar": False, "enable_model_summary": False},
        "model": {
            "backbone": {"class_path": "recsys.models.DCNv2", "init_args": {"cross_layers": 1, "deep_mlp": [32]}},
            "embedding_kernel": "plain",
            "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}},
            "early_stopping_patience": 0,
        },
        "data": {
            "reader": {
                "class_path": "recsys.data.synthetic.SyntheticReader",
                "init_args": {
                    "n_rows": 20000,
                    "seed": 0,
                    "cardinality_scale": 0.01,
                    "n_noise": 3,
                    "n_noise_dense": 2,
                    "embedding_dim": 8,
                    "interaction": False,
                    "near_copy": False,
                },
            },
            "batch_size": 256,
            "cache_dir": None,
        },
    }


def test_rank_through_a_recipe_recovers_the_planted_truth(tmp_cwd: Path) -> None:
    from recsys.data.synthetic import GroundTruth
    from recsys.train.recipe import Recipe

    recipe = Recipe(synthetic_config(tmp_cwd), workdir=tmp_cwd / "fits", quiet=True)
    report = PermutationImportance(repeats=2, tracking=False).rank(recipe)
    truth = GroundTruth.from_dict(recipe.schema.extras["ground_truth"])
    strong = ["item_id", "site_category", "price"]  # the strongest planted effects
    noise = truth.names("noise")
    scores = report.scores
    assert set(scores) == set(recipe.schema.names) and not report.excluded
    for f in strong:
        assert scores[f] > 0.01, (f, scores[f])
    for f in noise:
        assert abs(scores[f]) < 0.005, (f, scores[f])
    assert set(report.top_k(3)) <= set(truth.signal)
    assert report.extras["train_seconds"] > 0 and report.cost_seconds >= report.extras["train_seconds"]
    assert report.extras["split"] == "val" and report.extras["test_auc"] > 0.6
