"""``collaborative``: item co-occurrence in the training sequences -> PPMI -> truncated SVD."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from generative.content.base import ItemContent, sparse_matrix, truncated_svd, unit_rows, with_pad_row
from generative.data import LeaveOneOut, SequenceData

__all__ = ["CollaborativeContent"]


@dataclass
class CollaborativeContent(ItemContent):
    """Training co-occurrence -> PPMI -> truncated SVD -> unit rows (an item2vec-like factorisation).

    Pairs: every training example ``(history, target)`` of ``split`` contributes
    ``(history[-j], target)`` for ``j = 1..window`` (non-padding, distinct items). Because the
    training examples are all prefixes of ``items[:-2]``, these are exactly the pairs at distance
    ``<= window`` inside each user's training part, each once; counts are symmetrised. Then

    ``PPMI[i, j] = max(0, log(P(i, j) / (P(i) · P_α(j)))) = max(0, log(C[i, j] / (C[i, ·] · P_α(j))))``,
    the context distribution smoothed as ``P_α(j) ∝ C[j, ·]^α`` (Levy et al.); the vector of item ``i`` is
    row ``i`` of ``U·sqrt(S)`` (top ``d = min(dim, N)``), L2-normalised. Items with no training
    co-occurrence get a zero row (``report["items_without_cooccurrence"]``).

    Args:
        dim: output width.
        window: largest distance between co-occurring items (at most ``split.max_history``).
        alpha: context-distribution smoothing exponent (1 = plain PMI).
        seed: seed of the randomised SVD.
    """

    name: ClassVar[str] = "collaborative"
    dim: int = 64
    window: int = 5
    alpha: float = 0.75
    seed: int = 0

    def cooccurrence(self, split: LeaveOneOut) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Symmetric training co-occurrence counts as COO ``(rows, cols, counts)`` over indices ``0..N-1``."""
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.window > split.max_history:
            raise ValueError(f"window={self.window} exceeds the split's max_history={split.max_history}")
        context = split.train_history[:, -self.window :]
        target = np.broadcast_to(split.train_target[:, None], context.shape)
        keep = (context > 0) & (context != target)
        a, b = context[keep] - 1, target[keep] - 1
        n = split.num_items
        keys, counts = np.unique(np.concatenate([a * n + b, b * n + a]), return_counts=True)
        return keys // n, keys % n, counts.astype(np.float64)

    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        if split.num_items != data.num_items:
            raise ValueError(f"split has {split.num_items} items but {data.name} has {data.num_items}")
        n = split.num_items
        rows, cols, counts = self.cooccurrence(split)
        if counts.size == 0:
            raise ValueError(
                f"{data.name}: no co-occurring training pairs (sequences too short for window "
                f"{self.window}); use another item content"
            )
        marginal = np.bincount(rows, weights=counts, minlength=n)  # C[i, ·]
        context = marginal**self.alpha
        context /= context.sum()
        pmi = np.log(counts / (marginal[rows] * context[cols]))
        keep = pmi > 0
        ppmi = sparse_matrix(rows[keep], cols[keep], pmi[keep], (n, n))
        u, s, _ = truncated_svd(ppmi, self.dim, seed=self.seed)
        out = unit_rows((u * s.sqrt()).numpy())
        self._report = {
            "items_without_cooccurrence": int((marginal == 0).sum()),
            "pairs": int(counts.sum()),
            "nonzero_ppmi": int(keep.sum()),
            "dim": int(out.shape[1]),
        }
        return with_pad_row(out)
