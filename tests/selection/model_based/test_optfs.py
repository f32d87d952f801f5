"""OptFS's value-level masks against their formulas (plain tensors), inside a model against a
plain-PyTorch per-id reference, and its retrain-with-mask path; the registry contract trains it
on the synthetic recipe (tests/selection/test_contract.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from selection.model_based.optfs import OptFS, OptFSSeam

SIG = 1.0 / (1.0 + math.exp(-0.5))


def _seam(**kwargs: object) -> OptFSSeam:
    seam = OptFSSeam(gamma=16.0, pretrain_epochs=5, **kwargs)  # growth 2 per epoch
    seam.bind(["a", "b"], [3, 2], ["d0"])
    seam.bind_values([5, 4])
    with torch.no_grad():
        seam.weights[0].copy_(torch.tensor([0.5, -1.0, 0.2, 2.0, -0.1]))
        seam.weights[1].copy_(torch.tensor([0.3, 0.0, -0.4, 1.0]))
        seam.dense_weights.fill_(-0.25)
    return seam


def _kjt() -> KeyedJaggedTensor:
    # a: single-valued rows 1, 3, 0; b: rows [0, 2], [], [3]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.tensor([1, 3, 0, 0, 2, 3]), lengths=torch.tensor([1, 1, 1, 2, 0, 1]))


def test_temperature_grows_by_gamma_over_pretrain_epochs_and_values_are_masked() -> None:
    seam = _seam()
    assert seam.temperature == 1.0  # before the first epoch
    seam.start_epoch(0)
    assert seam.temperature == pytest.approx(2.0)
    seam.start_epoch(3)
    assert seam.temperature == pytest.approx(16.0)  # gamma at the fourth epoch, and it keeps growing
    seam.start_epoch(0)
    seam.eval()
    pooled = {"a": torch.randn(3, 3), "b": torch.randn(3, 2)}
    out = seam.transform_values(pooled, _kjt())

    def m(w: float) -> float:
        return 1.0 / (1.0 + math.exp(-2.0 * w)) / SIG

    want_a = torch.tensor([m(-1.0), m(2.0), m(0.5)])
    want_b = torch.tensor([(m(0.3) + m(-0.4)) / 2, 1.0, m(1.0)])  # mean of a row's masks; the empty row is left alone
    torch.testing.assert_close(out["a"], pooled["a"] * want_a[:, None])
    torch.testing.assert_close(out["b"], pooled["b"] * want_b[:, None])
    dense = torch.randn(3, 1)
    _, dense_out = seam(out, dense)
    torch.testing.assert_close(dense_out, dense * m(-0.25))
    expected = 1e-2 * sum(1.0 / (1.0 + math.exp(-2.0 * w)) for w in [0.5, -1.0, 0.2, 2.0, -0.1, 0.3, 0.0, -0.4, 1.0, -0.25])
    assert float(_seam(l1=1e-2).regularization().detach()) == pytest.approx(1e-2 * sum(
        1.0 / (1.0 + math.exp(-w)) for w in [0.5, -1.0, 0.2, 2.0, -0.1, 0.3, 0.0, -0.4, 1.0, -0.25]), rel=1e-6)  # T = 1
    seam.l1 = 1e-2
    assert float(seam.regularization().detach()) == pytest.approx(expected, rel=1e-6)


def test_counts_in_training_only_and_fields_score_by_occurrence_weighted_weight() -> None:
    seam = _seam()
    seam.eval()
    seam.transform_values({"a": torch.zeros(3, 3), "b": torch.zeros(3, 2)}, _kjt())
    assert float(seam.counts[0].sum()) == 0
    seam.train()
    for _ in range(2):
        seam.transform_values({"a": torch.zeros(3, 3), "b": torch.zeros(3, 2)}, _kjt())
    np.testing.assert_array_equal(seam.counts[0].numpy(), [2, 2, 0, 2, 0])
    scores, kept_share, kept = seam.field_scores()
    assert scores["a"] == pytest.approx((0.5 - 1.0 + 2.0) / 3)  # ids 2 and 4 never occurred
    assert scores["b"] == pytest.approx((0.3 - 0.4 + 1.0) / 3)
    assert kept_share["a"] == pytest.approx(2 / 3) and kept_share["b"] == pytest.approx(2 / 3)
    assert kept == {"a": 3, "b": 2, "d0": 0} and scores["d0"] == -0.25


def test_retraining_uses_the_hard_mask_without_parameters_or_penalty(tmp_path) -> None:  # noqa: ANN001
    path = _seam().save_mask(tmp_path / "mask.safetensors")
    seam = OptFSSeam(mask_file=str(path))
    seam.bind(["a", "b"], [3, 2], ["d0"])
    seam.bind_values([5, 4])
    assert not any(p.requires_grad for p in seam.parameters()) and float(seam.regularization()) == 0
    seam.train()
    out = seam.transform_values({"a": torch.ones(3, 3), "b": torch.ones(3, 2)}, _kjt())
    torch.testing.assert_close(out["a"][:, 0], torch.tensor([0.0, 1.0, 1.0]) / SIG)
    torch.testing.assert_close(out["b"][:, 0], torch.tensor([0.5, 1.0 * SIG, 1.0]) / SIG)  # w = 0 is dropped
    _, dense = seam({}, torch.ones(3, 1))
    assert float(dense.abs().sum()) == 0  # the dense column's weight is negative
    wrong = OptFSSeam(mask_file=str(path))
    wrong.bind(["a", "b"], [3, 2], ["d0"])
    with pytest.raises(ValueError, match="the mask of 'a' has 5 ids, the table 6"):
        wrong.bind_values([6, 4])
    missing = OptFSSeam(mask_file=str(path))
    missing.bind(["a", "c"], [3, 2], [])
    with pytest.raises(ValueError, match=r"no mask for \['c'\]"):
        missing.bind_values([5, 4])


def test_inside_a_model_every_id_is_masked_as_a_per_id_reference(tmp_path) -> None:  # noqa: ANN001
    from recsys.data.batching import make_batch
    from recsys.train.recipe import Recipe
    from tests.selection.conftest import tiny_config

    recipe = Recipe(tiny_config(n_rows=1_000, epochs=1), workdir=tmp_path, quiet=True)
    model = recipe.untrained(seed=0).model
    plain = {k: v.detach().clone() for k, v in model.sparse_arch(make_batch(
        recipe.datamodule.sample_rows("val", 64, seed=0), np.arange(64)).sparse_features).items()}
    seam = OptFSSeam()
    model.set_seam(seam)
    model.eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for w in seam.weights:
            w.copy_(torch.randn_like(w))
    batch = make_batch(recipe.datamodule.sample_rows("val", 64, seed=0), np.arange(64))
    emb, _ = model.embed(batch.dense_features, batch.sparse_features)
    features = batch.sparse_features.to_dict()
    for i, name in enumerate(seam.sparse_names):
        jt = features[name]
        masks = torch.sigmoid(seam.temperature * seam.weights[i].detach())[jt.values()] / SIG
        rows = torch.repeat_interleave(torch.arange(64), jt.lengths())
        mean = torch.zeros(64).index_add(0, rows, masks) / jt.lengths().clamp(min=1)
        want = plain[name] * torch.where(jt.lengths() > 0, mean, torch.ones(64))[:, None]
        torch.testing.assert_close(emb[name], want, msg=name)


def test_optfs_retrain_reports_the_masked_fit(tmp_path) -> None:  # noqa: ANN001
    from recsys.train.recipe import Recipe
    from tests.selection.conftest import tiny_config

    recipe = Recipe(tiny_config(n_rows=2_000, epochs=2), workdir=tmp_path, quiet=True)
    report = OptFS(retrain=True, tracking=False, l1=1e-2).rank(recipe)
    assert set(report.extras["kept_share"]) == set(report.ranking)
    assert 0.5 < report.extras["retrain_test_auc"] <= 1.0
    assert report.cost_seconds >= report.extras["retrain_seconds"] + report.extras["fit_seconds"] * 0.5
