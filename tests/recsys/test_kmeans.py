"""The shared k-means (:mod:`recsys.kmeans`): each caller's settings reproduce the k-means it
replaced, bit for bit, plus the switches on their own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import recsys.kmeans as km
from recsys.kmeans import KMeansResult, kmeans, kmeans_plus_plus, nearest_centroid


def reference_distinct_numpy_kmeans(x: np.ndarray, k: int, seed: int, iterations: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """The iHAS k-means as it was written in numpy: k-means++ over the distinct rows with
    ``default_rng(seed)``, Lloyd's iterations until the labels settle, empty clusters kept."""
    distinct = np.unique(x, axis=0)
    k = min(k, len(distinct))
    rng = np.random.default_rng(seed)
    centroids = [distinct[rng.integers(len(distinct))]]
    for _ in range(1, k):
        d2 = ((distinct[:, None, :] - np.asarray(centroids)[None]) ** 2).sum(-1).min(1)
        centroids.append(distinct[rng.choice(len(distinct), p=d2 / d2.sum())])
    c = np.asarray(centroids)

    def nearest(c: np.ndarray) -> np.ndarray:
        return ((x * x).sum(1, keepdims=True) - 2 * x @ c.T + (c * c).sum(1)[None]).argmin(1)

    labels = np.full(len(x), -1)
    for _ in range(iterations):
        new = nearest(c)
        if np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            if (labels == j).any():
                c[j] = x[labels == j].mean(0)
    return c, nearest(c)


def binary_masks(seed: int, n: int = 400, d: int = 24, groups: int = 3) -> np.ndarray:
    """iHAS-like gates: rows of 0/1 with a per-group rate per column (many repeated rows, ties)."""
    g = np.random.default_rng(seed)
    rates = g.random((groups, d)) ** 2
    return (g.random((n, d)) < rates[g.integers(0, groups, n)]).astype(np.float64)


@pytest.mark.parametrize("seed", range(8))
def test_ihas_settings_reproduce_the_numpy_kmeans_exactly(seed: int) -> None:
    x = binary_masks(seed, d=[3, 24, 60][seed % 3])
    for k in (1, 3, 6):
        want_c, want_labels = reference_distinct_numpy_kmeans(x, k, seed)
        got = kmeans(torch.tensor(x), k, np.random.default_rng(seed), tol=None, seed_from_distinct=True, reseed_empty=False)
        np.testing.assert_array_equal(got.assign.numpy(), want_labels)
        np.testing.assert_array_equal(got.centroids.numpy(), want_c)


def test_ihas_wrapper_is_the_shared_kmeans() -> None:
    from embeddings.dims.ihas import kmeans as ihas_kmeans

    x = binary_masks(11)
    c, labels = ihas_kmeans(x, 4, seed=3)
    want_c, want_labels = reference_distinct_numpy_kmeans(x, 4, 3)
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(c, want_c)
    assert c.dtype == np.float64 and labels.dtype == np.int64


@pytest.mark.parametrize("seed", range(3))
def test_defaults_reproduce_the_codebook_kmeans(seed: int) -> None:
    from generative.codebook import kmeans as codebook_kmeans

    g = np.random.default_rng(seed)
    x = torch.from_numpy(np.vstack([g.normal(size=(50, 4)) + 6 * i for i in range(4)]).astype(np.float32))
    want = codebook_kmeans(x, 6, torch.Generator().manual_seed(seed), n_init=2)
    got = kmeans(x, 6, torch.Generator().manual_seed(seed), n_init=2)
    assert torch.equal(got.centroids, want[0]) and torch.equal(got.assign, want[1])
    assert got.inertia == want[2] and got.iterations == want[3]


def test_result_is_seeded_and_finds_planted_blobs() -> None:
    g = np.random.default_rng(0)
    x = torch.from_numpy(np.vstack([g.normal(size=(40, 2)), 10 + g.normal(size=(60, 2))]))
    one = kmeans(x, 2, torch.Generator().manual_seed(5))
    two = kmeans(x, 2, torch.Generator().manual_seed(5))
    assert isinstance(one, KMeansResult) and torch.equal(one.assign, two.assign) and torch.equal(one.centroids, two.centroids)
    assert len(set(one.assign[:40].tolist())) == 1 and len(set(one.assign[40:].tolist())) == 1
    assert one.assign[0] != one.assign[40] and one.centroids.dtype == torch.float64
    assert one.inertia == pytest.approx(float(((x - one.centroids[one.assign]) ** 2).sum(1).mean()))


def test_k_is_capped_at_distinct_rows_and_errors() -> None:
    x = torch.tensor(np.repeat(np.eye(2), 5, axis=0))
    got = kmeans(x, 4, np.random.default_rng(0), seed_from_distinct=True)
    assert len(got.centroids) == 2 and sorted(torch.bincount(got.assign).tolist()) == [5, 5]
    with pytest.raises(ValueError, match="k must be >= 1"):
        kmeans(x, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="non-empty N x d"):
        kmeans(torch.zeros(0, 2), 2, np.random.default_rng(0))


def test_empty_cluster_is_refilled_or_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    g = np.random.default_rng(0)
    x = torch.from_numpy(np.vstack([g.normal(size=(10, 2)), 20 + g.normal(size=(10, 2))]))
    seeds = torch.tensor([[0.0, 0.0], [1000.0, 1000.0], [20.0, 20.0]], dtype=torch.float64)  # the middle one attracts nothing
    monkeypatch.setattr(km, "kmeans_plus_plus", lambda x, k, gen: seeds.clone())
    refilled = kmeans(x, 3, torch.Generator().manual_seed(0))
    assert torch.bincount(refilled.assign, minlength=3).min() >= 1 and (refilled.centroids.abs() < 100).all()
    kept = kmeans(x, 3, torch.Generator().manual_seed(0), reseed_empty=False)
    assert torch.bincount(kept.assign, minlength=3)[1] == 0 and torch.equal(kept.centroids[1], seeds[1])


def test_tolerance_stops_early_and_none_runs_to_convergence() -> None:
    g = np.random.default_rng(1)
    x = torch.from_numpy(g.normal(size=(500, 3)))
    loose = kmeans(x, 8, torch.Generator().manual_seed(0), tol=1.0)  # any improvement is "too small"
    exact = kmeans(x, 8, torch.Generator().manual_seed(0), tol=None)
    assert loose.iterations == 1 and exact.iterations > 1
    again, _ = nearest_centroid(x, exact.centroids)
    assert torch.equal(again, exact.assign)  # converged: the assignment is a fixed point


def test_kmeans_plus_plus_draws_rows_and_stops_when_all_are_centres() -> None:
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    centres = kmeans_plus_plus(x, 5, torch.Generator().manual_seed(0))
    assert sorted(map(tuple, centres.tolist())) == sorted(map(tuple, x.tolist()))
    np_centres = kmeans_plus_plus(x, 2, np.random.default_rng(0))
    assert all(any(torch.equal(c, r) for r in x) for c in np_centres)


def test_nearest_centroid_breaks_ties_to_the_lowest_index_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(km, "CHUNK", 3)
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [1.0], [3.0]])
    c = torch.tensor([[2.0], [0.0], [2.0], [4.0]])
    idx, dist = nearest_centroid(x, c)
    assert idx.tolist() == [1, 0, 0, 0, 3, 0, 0]  # 1 is as near to 0.0 as to 2.0: centroid 0 wins
    assert dist.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
