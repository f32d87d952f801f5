"""Item content vectors: SVD, TF-IDF and PPMI against plain references, planted clusters, no leakage."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from generative.content import (
    AttributeContent,
    CollaborativeContent,
    ConcatContent,
    ItemContent,
    TextContent,
    truncated_svd,
)
from generative.content import text as text_content
from generative.data import SequenceData, leave_one_out, load_sequences, synthetic_sequences
from tests.conftest import require_dataset


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One intra-op thread: the small LAPACK calls are fast alone and slow under contention."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def synthetic() -> SequenceData:
    return synthetic_sequences()


def _gram(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float64) @ v.T.astype(np.float64)


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, n, out=np.zeros_like(x), where=n > 0)


def _check_layout(v: np.ndarray, num_items: int) -> None:
    assert v.dtype == np.float32 and v.shape[0] == num_items + 1
    assert not v[0].any()
    norms = np.linalg.norm(v[1:], axis=1)
    assert np.all((np.abs(norms - 1) < 1e-5) | (norms == 0))


def _cluster_separation(v: np.ndarray, data: SequenceData) -> tuple[float, float, float]:
    """(mean cosine within clusters, across clusters, nearest-neighbour same-cluster rate)."""
    cluster = np.array([int(a[0]) for a in data.item_attributes[1:]])
    sim = _gram(v[1:])
    same = cluster[:, None] == cluster[None, :]
    off = ~np.eye(len(cluster), dtype=bool)
    np.fill_diagonal(sim, -np.inf)
    nn_same = (cluster[sim.argmax(1)] == cluster).mean()
    np.fill_diagonal(sim, 0)
    return sim[same & off].mean(), sim[~same].mean(), nn_same


# ---------------------------------------------------------------------------------------------
# truncated SVD


def test_truncated_svd_matches_exact_and_is_deterministic() -> None:
    gen = torch.Generator().manual_seed(0)
    m, n, rank = 300, 200, 12
    low = torch.randn(m, rank, generator=gen, dtype=torch.float64) @ torch.randn(
        rank, n, generator=gen, dtype=torch.float64
    )
    a = low * torch.linspace(3, 1, n, dtype=torch.float64) + 0.01 * torch.randn(
        m, n, generator=gen, dtype=torch.float64
    )
    u, s, v = truncated_svd(a, 8, seed=1)  # randomised: 8 + 16 < 100
    u_exact, s_exact, vh_exact = torch.linalg.svd(a, full_matrices=False)
    torch.testing.assert_close(s, s_exact[:8], rtol=1e-8, atol=0)
    # signs fixed: the largest-magnitude entry of every U column is positive, so columns compare directly
    flip = torch.sign(u_exact[:, :8].gather(0, u_exact[:, :8].abs().argmax(0, keepdim=True)))
    torch.testing.assert_close(u, u_exact[:, :8] * flip, rtol=0, atol=1e-6)
    torch.testing.assert_close(v, vh_exact[:8].T * flip, rtol=0, atol=1e-6)
    u2, _, _ = truncated_svd(a.to_sparse(), 8, seed=1)  # sparse input, same seed: same answer
    torch.testing.assert_close(u2, u, rtol=0, atol=1e-8)
    assert truncated_svd(a, 500)[0].shape == (300, 200)  # k capped at min(m, n), exact path
    with pytest.raises(ValueError, match="dim >= 1"):
        truncated_svd(a, 0)


# ---------------------------------------------------------------------------------------------
# attributes


def _attribute_data(attrs: list[list[int]]) -> SequenceData:
    n = len(attrs)
    seq = [list(range(1, n + 1)) + [1, 2]]
    return SequenceData.from_raw("attrs", seq, attributes={i + 1: a for i, a in enumerate(attrs)})


def test_attributes_reference_tfidf() -> None:
    attrs = [[1], [1], [2], [], [1, 2, 2], [3, 5], [5, 1]]
    data = _attribute_data(attrs)
    content = AttributeContent(dim=64)
    v = content.vectors(data, leave_one_out(data))
    _check_layout(v, 7)
    # plain reference: binary multi-hot (ids 1, 2, 3, 5), smooth idf, unit rows
    ids = [1, 2, 3, 5]
    x = np.array([[float(a in set(r)) for a in ids] for r in attrs])
    idf = np.log((1 + 7) / (1 + x.sum(0))) + 1
    ref = _unit(x * idf)
    # dim >= #attributes: the SVD keeps every direction, so cosines equal those of the TF-IDF rows
    np.testing.assert_allclose(_gram(v[1:]), ref @ ref.T, atol=1e-6)
    assert v.shape[1] == 4
    assert content.report["items_without_attributes"] == 1 and content.report["num_attributes"] == 4
    np.testing.assert_array_equal(v[1], v[2])  # same attributes, same vector
    assert not v[4].any()  # no attributes: zero row


def test_attributes_truncated_keeps_leading_directions() -> None:
    data = synthetic_sequences(num_users=50, num_items=200, num_clusters=5)
    split = leave_one_out(data)
    full = AttributeContent(dim=500).vectors(data, split)
    small = AttributeContent(dim=8).vectors(data, split)
    assert small.shape[1] == 8 and full.shape[1] > 8
    np.testing.assert_array_equal(small, AttributeContent(dim=8).vectors(data, split))  # deterministic


def test_attributes_need_attributes() -> None:
    data = SequenceData.from_raw("bare", [[1, 2, 3]])
    with pytest.raises(ValueError, match="no item attributes"):
        AttributeContent().vectors(data, leave_one_out(data))
    data = SequenceData.from_raw("empty", [[1, 2, 3]], attributes={})
    with pytest.raises(ValueError, match="no item has any attribute"):
        AttributeContent().vectors(data, leave_one_out(data))


# ---------------------------------------------------------------------------------------------
# collaborative


def test_cooccurrence_golden() -> None:
    data = SequenceData.from_raw("tiny", [[1, 2, 3, 4, 5, 6]])  # training part [1, 2, 3, 4]; 5, 6 held out
    split = leave_one_out(data, max_history=3)
    rows, cols, counts = CollaborativeContent(window=2).cooccurrence(split)
    c = np.zeros((6, 6))
    c[rows, cols] = counts
    expected = np.zeros((6, 6))
    for a, b in [(1, 2), (1, 3), (2, 3), (2, 4), (3, 4)]:  # distance <= 2 inside [1, 2, 3, 4]
        expected[a - 1, b - 1] = expected[b - 1, a - 1] = 1
    np.testing.assert_array_equal(c, expected)
    with pytest.raises(ValueError, match="exceeds the split's max_history=3"):
        CollaborativeContent(window=4).cooccurrence(split)


def test_collaborative_reference_ppmi() -> None:
    data = synthetic_sequences(num_users=300, num_items=40, num_clusters=4, sub_clusters=2, seed=2)
    split = leave_one_out(data)
    content = CollaborativeContent(dim=64, window=3, alpha=0.75)
    v = content.vectors(data, split)
    _check_layout(v, 40)
    # plain reference: dense counts from the sequences' training parts, PPMI, exact SVD
    n = data.num_items
    c = np.zeros((n, n))
    for s in data.sequences:
        train = s[:-2]
        for i in range(len(train)):
            for j in range(i + 1, min(i + 4, len(train))):
                if train[i] != train[j]:
                    c[train[i] - 1, train[j] - 1] += 1
                    c[train[j] - 1, train[i] - 1] += 1
    row = c.sum(1)
    ctx = row**0.75 / (row**0.75).sum()
    with np.errstate(divide="ignore"):
        pmi = np.log(c / (row[:, None] * ctx[None, :]))
    ppmi = np.where(c > 0, np.maximum(pmi, 0), 0)
    u, s, _ = np.linalg.svd(ppmi)
    ref = _unit(u * np.sqrt(s))  # dim >= n: all directions kept
    np.testing.assert_allclose(_gram(v[1:]), ref @ ref.T, atol=1e-6)


def test_collaborative_ignores_valid_and_test_items(synthetic: SequenceData) -> None:
    split = leave_one_out(synthetic)
    rng = np.random.default_rng(0)
    changed = [np.concatenate([s[:-2], rng.integers(1, synthetic.num_items + 1, 2)]) for s in synthetic.sequences]
    other = SequenceData(
        synthetic.name, changed, synthetic.num_items, synthetic.item_labels, synthetic.item_attributes
    )
    other_split = leave_one_out(other)
    assert not np.array_equal(other_split.test_target, split.test_target)
    a = CollaborativeContent().vectors(synthetic, split)
    b = CollaborativeContent().vectors(other, other_split)
    np.testing.assert_array_equal(a, b)


def test_collaborative_zero_rows_for_unseen_items() -> None:
    data = SequenceData.from_raw("gap", [[1, 2, 3, 4, 5], [2, 1, 3, 4, 5]], catalogue=[1, 2, 3, 4, 5, 6])
    content = CollaborativeContent(dim=4, window=2)
    v = content.vectors(data, leave_one_out(data))
    # items 4 and 5 are only valid/test items, 6 never occurs: all zero
    assert not v[4:].any() and v[1:4].any()
    assert content.report["items_without_cooccurrence"] == 3


# ---------------------------------------------------------------------------------------------
# planted structure, registry, concat


@pytest.mark.parametrize("name", ["attributes", "collaborative", "concat"])
def test_planted_clusters(synthetic: SequenceData, name: str) -> None:
    split = leave_one_out(synthetic)
    v = ItemContent.create(name, dim=32).vectors(synthetic, split)
    _check_layout(v, synthetic.num_items)  # concat too: every item has both views here
    within, across, nn_same = _cluster_separation(v, synthetic)
    assert within > across + 0.2
    assert nn_same > 0.95


def test_registry_and_concat(synthetic: SequenceData) -> None:
    assert {"attributes", "collaborative", "text", "concat"} <= set(ItemContent.registered_names())
    with pytest.raises(ValueError, match="unknown item content 'bert'"):
        ItemContent.create("bert")
    split = leave_one_out(synthetic)
    content = ConcatContent(parts=("attributes", "collaborative"), dim=16)
    v = content.vectors(synthetic, split)
    assert v.shape == (synthetic.num_items + 1, 32) and v.dtype == np.float32
    np.testing.assert_allclose(v[:, :16] * np.sqrt(2), AttributeContent(dim=16).vectors(synthetic, split), atol=1e-6)
    assert content.report["dim"] == 32 and "collaborative.items_without_cooccurrence" in content.report
    with pytest.raises(ValueError, match="unknown item content 'nope'"):
        ConcatContent(parts=("attributes", "nope")).vectors(synthetic, split)
    assert AttributeContent(dim=8).describe() == {"dim": 8, "seed": 0}


# ---------------------------------------------------------------------------------------------
# text (optional extra)


def test_text_needs_titles() -> None:
    data = SequenceData.from_raw("bare", [[1, 2, 3]])
    with pytest.raises(ValueError, match="no item titles"):
        TextContent().vectors(data, leave_one_out(data))


def test_text_missing_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch, synthetic: SequenceData) -> None:
    split = leave_one_out(synthetic)
    monkeypatch.setattr(text_content, "TEXT_MODEL_PACKAGE", "no_such_package_xyz")
    with pytest.raises(ImportError, match=r"pip install salience\[text\]"):
        TextContent().vectors(synthetic, split)
    text_content._encoder.cache_clear()
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(ImportError, match=r"sentence-transformers is not installed.*salience\[text\]"):
        TextContent(model_dir="/nonexistent").vectors(synthetic, split)
    text_content._encoder.cache_clear()


def test_text_encoder() -> None:
    pytest.importorskip("sentence_transformers")
    data = synthetic_sequences(num_users=100, num_items=120, num_clusters=6, sub_clusters=2)
    content = TextContent()
    v = content.vectors(data, leave_one_out(data))
    _check_layout(v, data.num_items)
    assert v.shape[1] == 384 and content.report["items_without_title"] == 0
    within, across, _ = _cluster_separation(v, data)  # titles share the cluster's topic words
    assert within > across + 0.2


# ---------------------------------------------------------------------------------------------
# real data


@pytest.mark.data
def test_beauty_content(data_dir: Path) -> None:
    require_dataset(data_dir, "amazon-5core-s3rec")
    data = load_sequences("beauty", data_dir=data_dir)
    split = leave_one_out(data)
    attributes = AttributeContent(dim=64)
    v = attributes.vectors(data, split)
    _check_layout(v, 12101)
    assert v.shape[1] == 64 and attributes.report["items_without_attributes"] == 0
    assert (np.linalg.norm(v[1:], axis=1) > 0).all()
    collaborative = CollaborativeContent(dim=64)
    w = collaborative.vectors(data, split)
    _check_layout(w, 12101)
    # a few items occur only as some user's validation/test item: no training co-occurrence
    assert 0 < collaborative.report["items_without_cooccurrence"] < 100
    # items bought together in training are close in the collaborative space
    pair_cos = (w[split.train_history[:, -1]] * w[split.train_target]).sum(1)
    random_cos = (w[split.train_target] * w[np.random.default_rng(0).permutation(split.train_target)]).sum(1)
    assert pair_cos.mean() > random_cos.mean() + 0.2
