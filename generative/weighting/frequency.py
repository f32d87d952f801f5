"""``frequency``: Frequency weighting, rare tokens weigh more (methods.md §5.4)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from generative.weighting.base import TokenWeighting

__all__ = ["Frequency", "effective_number_weights"]


def effective_number_weights(counts: np.ndarray, beta: float) -> np.ndarray:
    """Class-balanced weights of Cui et al.: ``(1 - β) / (1 - β^f)``; unseen (``f = 0``) -> 1.

    One occurrence gives 1; frequent tokens tend to ``1 - β``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    out = np.ones_like(counts)
    seen = counts > 0
    out[seen] = (1.0 - beta) / (1.0 - np.power(beta, counts[seen]))
    return out


class Frequency(TokenWeighting):
    """Frequency Weighting: rare tokens weigh more (methods.md §5.4).

    ``f[l, c]`` counts how often code ``c`` is the level-``l`` token of a training target;
    ``w[l, c] = (1 - β) / (1 - β^f)`` (unseen -> 1). A sample's weights are gathered by its
    labels and rescaled to sum to ``L``; ``loss = Σ w·CE / Σ w``. Counting per ``(level, code)``
    matches the reference, whose SID tokens are distinct vocabulary entries per level.
    """

    name = "frequency"
    _data_buffers = ("token_weights", "token_counts")

    def __init__(self, beta: float = 0.9) -> None:
        super().__init__()
        self.token_weights: Tensor  # data buffers (registered by the base class, filled by fit)
        self.token_counts: Tensor
        if not 0.0 < beta < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {beta}")
        self.beta = float(beta)

    def _fit(self, items: np.ndarray, level_sizes: list[int], targets: np.ndarray, vectors: np.ndarray | None) -> None:
        width = max(level_sizes)
        counts = np.zeros((len(level_sizes), width))
        target_codes = items[targets - 1] if targets.size else np.zeros((0, len(level_sizes)), dtype=np.int64)
        for level, size in enumerate(level_sizes):
            counts[level, :size] = np.bincount(target_codes[:, level], minlength=size)
        self._set_data_buffer("token_counts", counts)
        self._set_data_buffer("token_weights", effective_number_weights(counts, self.beta))

    def sample_weights(self, labels: Tensor) -> Tensor:
        """Per-token weights ``[B, L]`` of ``labels [B, L]``, each row summing to ``L``."""
        table = self.token_weights  # [L, max level size]
        if int(labels.max()) >= table.shape[1] or int(labels.min()) < 0:
            raise ValueError(f"labels must be codes in 0..{table.shape[1] - 1}")
        levels = torch.arange(labels.shape[1], device=labels.device)
        w = table[levels.unsqueeze(0), labels]
        return w * (labels.shape[1] / w.sum(dim=1, keepdim=True))

    def weighted(self, ce: Tensor, labels: Tensor) -> Tensor:
        w = self.sample_weights(labels).to(ce.dtype)
        return (w * ce).sum() / w.sum()

    def weights_table(self) -> dict[str, Any]:
        sizes = self.level_sizes
        weights = [self.token_weights[level, :size].tolist() for level, size in enumerate(sizes)]
        counts = [self.token_counts[level, :size] for level, size in enumerate(sizes)]
        return {
            "name": self.name,
            "beta": self.beta,
            "token_weights": weights,
            "per_level": [
                {
                    "unseen_codes": int((c == 0).sum()),
                    "min_weight": float(min(w)),
                    "max_weight": float(max(w)),
                    "target_weighted_mean": float((c * torch.tensor(w)).sum() / c.sum()) if c.sum() > 0 else None,
                }
                for c, w in zip(counts, weights)
            ],
        }

    def _options(self) -> dict[str, Any]:
        return {"beta": self.beta}
