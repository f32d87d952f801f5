"""Ranking metrics for next-item recommendation with one relevant item (methods.md 5.2).

With a single relevant item per test row, ``Recall@k`` is the hit rate (the target is in the
top ``k``) and ``NDCG@k = 1 / log2(rank + 2)`` for a hit at 0-based ``rank < k`` (IDCG = 1),
0 otherwise. Both are averaged over rows. With a ``tail`` mask (``generative.data.tail_items``:
the least popular items covering 20% of training interactions) the same metrics are also
computed over the rows whose *target* is a head item and over those whose target is a tail
item::

    top, _ = model.recommend_batched(split.test_history, k=10)
    ranking_metrics(top, split.test_target, ks=(5, 10), tail=tail_items(split.item_counts))
    # {"recall@5": ..., "ndcg@5": ..., "recall@10": ..., "ndcg@10": ...,
    #  "recall@10_head": ..., "recall@10_tail": ..., ..., "n_head": 4021.0, "n_tail": 1012.0}

A group with no rows (no tail targets, say) gets ``nan`` metrics and a count of 0.

>>> ranking_metrics([[3, 1, 2], [2, 3, 1]], [1, 4], ks=(1, 2))   # user 1 hit at rank 2, user 2 missed
{'recall@1': 0.0, 'ndcg@1': 0.0, 'recall@2': 0.5, 'ndcg@2': 0.31546487678572877}
>>> per_row_metrics(hit_ranks([[3, 1, 2], [2, 3, 1]], [1, 4]), 2)["recall@2"].tolist()
[1.0, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from generative.base import NextItemModel

__all__ = ["evaluate_model", "hit_ranks", "metrics_table", "per_row_metrics", "ranking_metrics", "summarize"]

ArrayLike = np.ndarray | Tensor | Sequence[int]


def _as_numpy(x: ArrayLike, name: str) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer item indices, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _hit_ranks(top_items: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """0-based rank of each target in its row ``[n]``; ``K`` (one past the end) when absent."""
    match = top_items == targets[:, None]  # [n, K]
    return np.where(match.any(axis=1), match.argmax(axis=1), top_items.shape[1])


def hit_ranks(top_items: ArrayLike, targets: ArrayLike) -> np.ndarray:
    """0-based rank of each row's target in its list ``[n]`` int64, ``K`` when the target is absent."""
    top = _as_numpy(top_items, "top_items")
    tgt = _as_numpy(targets, "targets")
    if top.ndim != 2 or tgt.shape != (len(top),):
        raise ValueError(f"top_items must be [n, K] and targets [n], got {list(top.shape)} and {list(tgt.shape)}")
    return _hit_ranks(top, tgt).astype(np.int64)


def per_row_metrics(ranks: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """Each row's ``recall@k`` (0/1) and ``ndcg@k`` ``[n]`` float64 from :func:`hit_ranks`: the
    units of a paired comparison of two models on the same users (their means are
    :func:`ranking_metrics`)."""
    ranks = np.asarray(ranks)
    hit = ranks < k
    return {f"recall@{k}": hit.astype(np.float64), f"ndcg@{k}": np.where(hit, 1.0 / np.log2(ranks + 2.0), 0.0)}


def _group_metrics(ranks: np.ndarray, ks: Sequence[int], suffix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in ks:
        hit = ranks < k
        gain = np.where(hit, 1.0 / np.log2(ranks + 2.0), 0.0)
        out[f"recall@{k}{suffix}"] = float(hit.mean()) if len(ranks) else math.nan
        out[f"ndcg@{k}{suffix}"] = float(gain.mean()) if len(ranks) else math.nan
    return out


def ranking_metrics(
    top_items: ArrayLike,
    targets: ArrayLike,
    ks: Sequence[int] = (5, 10),
    tail: np.ndarray | None = None,
) -> dict[str, float]:
    """Recall@k and NDCG@k of ranked lists against one target item per row.

    Args:
        top_items (np.ndarray | Tensor): ``[n, K]`` int item indices, best first, ``K >= max(ks)``.
        targets (np.ndarray | Tensor): ``[n]`` the held-out item of each row (``>= 1``).
        ks (Sequence[int]): cut-offs.
        tail (np.ndarray | None): bool ``[num_items + 1]``, ``True`` for tail items; adds the
            ``*_head`` / ``*_tail`` metrics (split by the row's target) and ``n_head`` / ``n_tail``.

    Returns:
        dict[str, float]: ``recall@k``, ``ndcg@k`` per ``k`` (and the split keys with ``tail``).
    """
    top = _as_numpy(top_items, "top_items")
    tgt = _as_numpy(targets, "targets")
    if top.ndim != 2:
        raise ValueError(f"top_items must be [n, K], got shape {list(top.shape)}")
    if tgt.ndim != 1 or len(tgt) != len(top):
        raise ValueError(f"targets must be [n] with n = {len(top)} (rows of top_items), got shape {list(tgt.shape)}")
    if len(tgt) == 0:
        raise ValueError("no rows to evaluate (top_items and targets are empty)")
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive cut-offs, got {ks}")
    if top.shape[1] < max(ks):
        raise ValueError(f"top_items has K = {top.shape[1]} columns, fewer than max(ks) = {max(ks)}")
    if tgt.min() < 1:
        raise ValueError(f"targets must be item indices >= 1 (0 is padding), got min {tgt.min()}")
    ranks = _hit_ranks(top, tgt)
    out = _group_metrics(ranks, ks, "")
    if tail is not None:
        tail = np.asarray(tail)
        if tail.ndim != 1 or tail.dtype != np.bool_:
            raise ValueError(f"tail must be a bool mask [num_items + 1], got {tail.dtype} {list(tail.shape)}")
        if tgt.max() >= len(tail):
            raise ValueError(f"targets hold item {tgt.max()} but tail covers items 0..{len(tail) - 1}")
        is_tail = tail[tgt]
        out.update(_group_metrics(ranks[~is_tail], ks, "_head"))
        out.update(_group_metrics(ranks[is_tail], ks, "_tail"))
        out["n_head"] = float((~is_tail).sum())
        out["n_tail"] = float(is_tail.sum())
    return out


def evaluate_model(
    model: NextItemModel,
    history: ArrayLike,
    targets: ArrayLike,
    ks: Sequence[int] = (5, 10),
    tail: np.ndarray | None = None,
    batch_size: int = 256,
) -> dict[str, float]:
    """:func:`ranking_metrics` of ``model.recommend_batched(history, max(ks))`` (eval mode, no grad)."""
    hist = torch.as_tensor(_as_numpy(history, "history"))
    items, _ = model.recommend_batched(hist, max(ks), batch_size=batch_size)
    return ranking_metrics(items, targets, ks=ks, tail=tail)


def summarize(runs: Sequence[Mapping[str, float]]) -> dict[str, tuple[float, float]]:
    """Mean and sample standard deviation (0 for one run) of each key over runs (e.g. seeds)."""
    if not runs:
        raise ValueError("summarize needs at least one run")
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    out: dict[str, tuple[float, float]] = {}
    for key in keys:
        vals = np.array([float(r[key]) for r in runs])
        out[key] = (float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0)
    return out


def metrics_table(
    rows: Mapping[str, Mapping[str, float | tuple[float, float]]],
    keys: Sequence[str] | None = None,
    digits: int = 4,
) -> str:
    """A markdown table, one row per arm: floats as ``0.0123``, ``(mean, std)`` as ``0.0123 ± 0.0010``.

    ``keys`` picks and orders the columns (default: the first row's keys); a missing value is ``-``;
    columns named ``n_*`` are counts, shown as integers.
    """
    if not rows:
        raise ValueError("metrics_table needs at least one row")
    cols = list(keys) if keys is not None else list(next(iter(rows.values())))

    def cell(col: str, value: float | tuple[float, float] | None) -> str:
        if value is None:
            return "-"
        if col.startswith("n_"):  # counts (n_head, n_tail); the same on every seed as a rule
            mean, std = value if isinstance(value, tuple) else (value, 0.0)
            return str(int(mean)) if std == 0 and float(mean).is_integer() else f"{mean:.1f} ± {std:.1f}"
        if isinstance(value, tuple):
            return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"
        return f"{value:.{digits}f}"

    lines = ["| arm | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {name} | " + " | ".join(cell(c, vals.get(c)) for c in cols) + " |" for name, vals in rows.items()]
    return "\n".join(lines) + "\n"
