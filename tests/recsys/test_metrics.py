"""The shared one-shot AUC (:func:`recsys.metrics.binary_auc`) against a brute-force pairwise
reference and torchmetrics, with ties.

torchmetrics accumulates its ROC curve in float32 (``target * 1.0`` then a cumulative sum and a
trapezoid sum in the default dtype) whatever the input dtype, so it is exact, and agrees to
1e-12, only when every rate is a short dyadic fraction: class counts that are powers of two.
On general data it agrees to float32 accuracy (1e-6).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchmetrics.functional.classification import binary_auroc

from recsys.metrics import binary_auc


def pairwise_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(positive scores above negative), a tie counting one half, over every (pos, neg) pair."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def tied_scores(rng: np.random.Generator, n: int) -> np.ndarray:
    """Scores on a coarse grid: most values are shared by several rows."""
    return rng.integers(-4, 5, n).astype(np.float64) / 4.0


@pytest.mark.parametrize("seed", range(5))
def test_matches_the_pairwise_reference_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = tied_scores(rng, 300)
    labels = (rng.random(300) < 0.3).astype(np.int64)
    expected = pairwise_auc(scores, labels)
    assert binary_auc(scores, labels) == pytest.approx(expected, abs=1e-12)
    assert binary_auc(torch.from_numpy(scores).float(), torch.from_numpy(labels)) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from([-2.0, -0.5, 0.0, 0.25, 0.25, 1.0, 3.5]), st.booleans()), min_size=2, max_size=40
    )
)
def test_pairwise_reference_property(rows: list[tuple[float, bool]]) -> None:
    scores = np.array([s for s, _ in rows])
    labels = np.array([int(y) for _, y in rows])
    got = binary_auc(scores, labels)
    if labels.min() == labels.max():
        assert np.isnan(got)
    else:
        assert got == pytest.approx(pairwise_auc(scores, labels), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_torchmetrics_exactly_on_dyadic_class_counts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.r_[np.ones(64), np.zeros(128)]).astype(np.int64)
    scores = tied_scores(rng, len(labels)) + 0.5 * labels  # informative, heavily tied
    expected = float(binary_auroc(torch.from_numpy(scores), torch.from_numpy(labels)))
    assert binary_auc(scores, labels) == pytest.approx(expected, abs=1e-12)
    assert binary_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels), abs=1e-12)


def test_agrees_with_torchmetrics_on_logits_to_float32_accuracy() -> None:
    rng = np.random.default_rng(7)
    logits = torch.from_numpy(rng.normal(size=5000).round(2)).float()  # ties; outside [0, 1]: torchmetrics takes a sigmoid
    labels = (torch.rand(5000, generator=torch.Generator().manual_seed(7)) < torch.sigmoid(logits)).long()
    assert binary_auc(logits, labels) == pytest.approx(float(binary_auroc(logits, labels)), abs=1e-6)
    assert binary_auc(logits, labels) == binary_auc(torch.sigmoid(logits.double()), labels)  # rank-based


def test_inputs_shapes_and_degenerate_cases() -> None:
    assert binary_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert binary_auc(np.array([[0.1, 0.4], [0.35, 0.8]]), np.array([False, False, True, True])) == 0.75
    assert binary_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0.0, 0.0, 1.0, 1.0])) == 0.75
    read_only = np.array([0.1, 0.4, 0.35, 0.8])
    read_only.flags.writeable = False
    assert binary_auc(read_only, [0, 0, 1, 1]) == 0.75
    assert binary_auc([1.0, 1.0, 1.0], [0, 1, 1]) == 0.5  # all tied
    assert np.isnan(binary_auc([0.1, 0.2], [1, 1])) and np.isnan(binary_auc([0.1, 0.2], [0, 0]))
    assert np.isnan(binary_auc([0.1, float("nan")], [0, 1]))
    with pytest.raises(ValueError, match="3 scores but 2 labels"):
        binary_auc([0.1, 0.2, 0.3], [0, 1])


def test_the_old_names_are_the_shared_function() -> None:
    from recsys.data.synthetic import roc_auc
    from selection.model_based.permutation import binary_auc as permutation_auc

    assert roc_auc is binary_auc and permutation_auc is binary_auc
