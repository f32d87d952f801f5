"""SHARK and SFS against plain-PyTorch references: a literal field-mask parameter (SFS) and one
row at a time with the whole embedding table's gradient (SHARK, as ERASE computes it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from recsys.data.batching import make_batch
from recsys.models.seam import SeamTransform
from recsys.train.recipe import Recipe
from selection.model_based.permutation import seam_fields
from selection.model_based.sensitivity import SFS, seam_gradients, sfs_scores, shark_scores
from tests.selection.conftest import tiny_config


class _Mask(SeamTransform):
    """A literal mask c_f = 1 multiplying every seam field (SFS's construction)."""

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str]) -> None:
        self.names = list(sparse_names) + list(dense_names)
        self.n_sparse = len(sparse_names)
        self.mask = torch.nn.Parameter(torch.ones(len(self.names)))

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        out = {n: t * self.mask[i] for i, (n, t) in enumerate(sparse.items())}
        return out, dense * self.mask[self.n_sparse:] if dense.shape[1] else dense


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    root = tmp_path_factory.mktemp("sensitivity")
    return Recipe(tiny_config(n_rows=4_000, epochs=1, n_noise_dense=2), workdir=root / "fits", quiet=True)


def test_sfs_equals_the_gradient_of_a_literal_field_mask(recipe: Recipe) -> None:
    model = recipe.untrained(seed=0).model
    data = recipe.datamodule.sample_rows("train", 600, seed=0)
    got = sfs_scores(model, data, batch_size=200)
    masked = recipe.untrained(seed=0).model  # the same initialisation
    masked.set_seam(_Mask())
    masked.eval()
    names = seam_fields(masked)
    acc = np.zeros(len(names))
    for start in range(0, 600, 200):
        batch = make_batch(data, np.arange(start, start + 200))
        masked.zero_grad()
        loss = F.binary_cross_entropy_with_logits(masked(batch.dense_features, batch.sparse_features).reshape(-1),
                                                  batch.labels.reshape(-1))
        loss.backward()
        acc += masked.seam.mask.grad.abs().numpy()
    want = acc / acc.sum()
    np.testing.assert_allclose([got[n] for n in names], want, rtol=1e-4, atol=1e-7)
    assert sum(got.values()) == pytest.approx(1.0)


def test_shark_equals_the_one_row_at_a_time_table_gradient(recipe: Recipe) -> None:
    fit = recipe.fit(tracking=False, max_epochs=1)
    model = fit.task.model
    model.eval()
    data = fit.datamodule.sample_rows("val", 64, seed=0)
    got = shark_scores(model, data, batch_size=16)
    names = seam_fields(model)
    # expectation of every field over the rows, then each row alone: g . (mu - e) per field
    rows_e = {n: [] for n in names}
    for e, _, _ in seam_gradients(model, data, batch_size=64):
        for n in names:
            rows_e[n].append(e[n])
    mu = {n: torch.cat(rows_e[n]).mean(0) for n in names}
    total = dict.fromkeys(names, 0.0)
    dense_names = list(model.schema.dense_names)
    for i in range(len(data)):
        batch = make_batch(data, np.array([i]))
        pooled = {k: v.detach().requires_grad_(True) for k, v in model.sparse_arch(batch.sparse_features).items()}
        dense = batch.dense_features.clone().requires_grad_(True)
        s, d = model.seam(pooled, dense)
        loss = F.binary_cross_entropy_with_logits(model.interact(s, d).reshape(-1), batch.labels.reshape(-1))
        loss.backward()
        for n in model.sparse_names:
            total[n] += abs(float(((mu[n] - pooled[n][0].detach()) * pooled[n].grad[0]).sum()))
        for j, n in enumerate(dense_names):
            total[n] += abs(float((mu[n][0] - dense[0, j].detach()) * dense.grad[0, j]))
    for n in names:
        assert got[n] == pytest.approx(total[n] / len(data), rel=1e-4, abs=1e-8), n


def test_seam_gradients_restore_the_training_mode(recipe: Recipe) -> None:
    model = recipe.untrained(seed=0).model
    model.train()
    data = recipe.datamodule.sample_rows("train", 50, seed=0)
    e, g, rows = next(seam_gradients(model, data, batch_size=50))
    assert model.training and rows == 50
    assert set(e) == set(g) == set(seam_fields(model))
    assert all(e[n].shape == g[n].shape and e[n].shape[0] == 50 for n in e)


def test_sfs_refuses_empty_sampling(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batches >= 1"):
        SFS(batches=0)
