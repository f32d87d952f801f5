"""Ranking metrics (:mod:`generative.ranking_metrics`): hand-computed Recall/NDCG and head/tail split,
a per-row loop as the reference on random lists, tensor/numpy parity, bad input, the
model-evaluation helper, and the markdown table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

from generative.base import NextItemModel
from generative.ranking_metrics import evaluate_model, metrics_table, ranking_metrics, summarize

# Four rows over items 1..6; tail items are 5 and 6.
TOP = np.array(
    [
        [5, 1, 2],  # target 5 (tail) at rank 0 -> ndcg 1
        [1, 3, 2],  # target 2 (head) at rank 2 -> ndcg 1/log2(4) = 0.5
        [1, 2, 3],  # target 6 (tail) missed     -> 0
        [2, 1, 4],  # target 1 (head) at rank 1 -> ndcg 1/log2(3)
    ]
)
TARGETS = np.array([5, 2, 6, 1])
TAIL = np.array([False, False, False, False, False, True, True])
R1 = 1 / math.log2(3)


def test_golden_overall() -> None:
    m = ranking_metrics(TOP, TARGETS, ks=(1, 2, 3))
    assert m == pytest.approx(
        {
            "recall@1": 1 / 4,
            "ndcg@1": 1 / 4,
            "recall@2": 2 / 4,
            "ndcg@2": (1 + R1) / 4,
            "recall@3": 3 / 4,
            "ndcg@3": (1 + 0.5 + R1) / 4,
        }
    )


def test_golden_head_tail() -> None:
    m = ranking_metrics(TOP, TARGETS, ks=(1, 3), tail=TAIL)
    assert m["n_head"] == 2 and m["n_tail"] == 2
    assert m["recall@1_head"] == 0.0 and m["recall@1_tail"] == 0.5
    assert m["recall@3_head"] == 1.0 and m["recall@3_tail"] == 0.5
    assert m["ndcg@3_head"] == pytest.approx((0.5 + R1) / 2)
    assert m["ndcg@3_tail"] == pytest.approx(0.5)
    assert m["ndcg@1_tail"] == pytest.approx(0.5)
    # the overall numbers are unchanged by the split
    assert m["recall@3"] == pytest.approx(3 / 4)


def test_empty_group_is_nan() -> None:
    m = ranking_metrics(TOP, TARGETS, ks=(3,), tail=np.zeros(7, dtype=bool))
    assert m["n_tail"] == 0 and m["n_head"] == 4
    assert math.isnan(m["recall@3_tail"]) and math.isnan(m["ndcg@3_tail"])
    assert m["recall@3_head"] == pytest.approx(3 / 4)


def test_matches_loop_reference_and_tensor_input() -> None:
    rng = np.random.default_rng(0)
    n, n_items, big_k = 500, 40, 12
    top = np.stack([rng.permutation(n_items)[:big_k] + 1 for _ in range(n)])
    targets = rng.integers(1, n_items + 1, n)
    tail = rng.random(n_items + 1) < 0.3
    tail[0] = False
    got = ranking_metrics(torch.from_numpy(top), torch.from_numpy(targets), ks=(5, 10), tail=tail)
    assert got == ranking_metrics(top, targets, ks=(5, 10), tail=tail)
    for k in (5, 10):
        for suffix, rows in (("", range(n)), ("_tail", [i for i in range(n) if tail[targets[i]]])):
            hits, gains = [], []
            for i in rows:
                row = list(top[i, :k])
                hit = targets[i] in row
                hits.append(float(hit))
                gains.append(1 / math.log2(row.index(targets[i]) + 2) if hit else 0.0)
            assert got[f"recall@{k}{suffix}"] == pytest.approx(np.mean(hits))
            assert got[f"ndcg@{k}{suffix}"] == pytest.approx(np.mean(gains))


def test_first_occurrence_counts() -> None:
    m = ranking_metrics(np.array([[3, 7, 7]]), np.array([7]), ks=(3,))
    assert m["ndcg@3"] == pytest.approx(1 / math.log2(3))


@pytest.mark.parametrize(
    ("top", "targets", "kwargs", "match"),
    [
        (TOP, TARGETS, {"ks": (5,)}, "K = 3 columns, fewer than max"),
        (TOP, TARGETS[:3], {}, "targets must be"),
        (TOP[0], TARGETS, {}, r"top_items must be \[n, K\]"),
        (TOP, np.array([5, 0, 6, 1]), {"ks": (3,)}, "0 is padding"),
        (TOP, TARGETS, {"ks": (3,), "tail": TAIL[:6]}, "tail covers items 0..5"),
        (TOP, TARGETS, {"ks": (3,), "tail": TAIL.astype(int)}, "bool mask"),
        (TOP, TARGETS, {"ks": (0,)}, "positive cut-offs"),
        (TOP.astype(float), TARGETS, {"ks": (3,)}, "integer item indices"),
        (TOP[:0], TARGETS[:0], {"ks": (3,)}, "no rows"),
    ],
)
def test_bad_input(top: np.ndarray, targets: np.ndarray, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ranking_metrics(top, targets, **kwargs)


class _FixedOrder(NextItemModel):
    """Recommends items ``1..k`` in that order for every row (a test double)."""

    def __init__(self, num_items: int) -> None:
        super().__init__()
        self.num_items = num_items

    def training_loss(self, history: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        raise NotImplementedError

    def recommend(self, history: Tensor, k: int) -> tuple[Tensor, Tensor]:
        items = torch.arange(1, k + 1).expand(len(history), k)
        return items, -items.float()


def test_evaluate_model_batches() -> None:
    history = np.zeros((7, 4), dtype=np.int64)
    targets = np.array([1, 2, 3, 9, 9, 9, 9])
    m = evaluate_model(_FixedOrder(10), history, targets, ks=(1, 3), batch_size=3)
    assert m["recall@1"] == pytest.approx(1 / 7) and m["recall@3"] == pytest.approx(3 / 7)
    assert m["ndcg@3"] == pytest.approx((1 + R1 + 0.5) / 7)


def test_summarize_and_table() -> None:
    runs = [{"recall@10": 0.1, "n_tail": 5.0}, {"recall@10": 0.3, "n_tail": 5.0}]
    summary = summarize(runs)
    assert summary["recall@10"] == pytest.approx((0.2, math.sqrt(0.02)))
    assert summarize(runs[:1])["recall@10"] == (0.1, 0.0)
    table = metrics_table({"sasrec": summary, "plain": {"recall@10": 0.05}}, keys=["recall@10", "n_tail"])
    assert table.splitlines() == [
        "| arm | recall@10 | n_tail |",
        "|---|---|---|",
        "| sasrec | 0.2000 ± 0.1414 | 5 |",
        "| plain | 0.0500 | - |",
    ]
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def test_per_row_metrics_average_to_ranking_metrics() -> None:
    """The per-user units of a paired comparison: their means are :func:`ranking_metrics`."""
    from generative.ranking_metrics import hit_ranks, per_row_metrics

    rng = np.random.default_rng(3)
    top = np.stack([rng.permutation(50)[:10] + 1 for _ in range(400)])
    targets = rng.integers(1, 51, 400)
    ranks = hit_ranks(top, targets)
    assert ranks.shape == (400,) and ranks.max() <= 10
    assert (ranks[ranks < 10] == np.argmax(top == targets[:, None], axis=1)[ranks < 10]).all()
    expected = ranking_metrics(top, targets, ks=(5, 10))
    for k in (5, 10):
        rows = per_row_metrics(ranks, k)
        assert rows[f"recall@{k}"].mean() == pytest.approx(expected[f"recall@{k}"])
        assert rows[f"ndcg@{k}"].mean() == pytest.approx(expected[f"ndcg@{k}"])
    with pytest.raises(ValueError, match="targets"):
        hit_ranks(top, targets[:-1])
