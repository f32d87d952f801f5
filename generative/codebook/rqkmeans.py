"""``rq-kmeans``: residual k-means semantic IDs (§5.6), and the k-means they are built from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from generative.codebook.builder import CodebookBuilder
from recsys.kmeans import kmeans

__all__ = ["RQKMeans", "kmeans", "residual_kmeans"]

# one k-means for the whole project (iHAS clusters with it too); its defaults are the codebook's:
# k-means++ seeding from a torch generator, empty clusters refilled, an inertia tolerance


def residual_kmeans(
    x: Tensor, sizes: Sequence[int], generator: torch.Generator, iterations: int = 50, n_init: int = 1
) -> tuple[np.ndarray, list[Tensor], list[float], list[int]]:
    """Residual k-means: level ``l`` clusters ``x - Σ_{j<l} c_j`` into ``sizes[l]`` codes.

    Returns:
        codes ``[N, L]`` int64, the centroids per level (``[K_l, d]``, padded to ``sizes[l]``
        rows by repeating the last centroid when ``k`` was capped), the mean squared residual
        after each level, and the Lloyd iterations per level.
    """
    residual = x.clone()
    codes, books, mse, iters = [], [], [], []
    for size in sizes:
        c, assign, _, it = kmeans(residual, size, generator, iterations=iterations, n_init=n_init)
        residual = residual - c[assign]
        if len(c) < size:
            c = torch.cat([c, c[-1:].expand(size - len(c), -1)])
        codes.append(assign)
        books.append(c)
        mse.append(float((residual * residual).sum(1).mean()))
        iters.append(it)
    return torch.stack(codes, 1).cpu().numpy().astype(np.int64), books, mse, iters


@dataclass
class RQKMeans(CodebookBuilder):
    """Residual k-means semantic IDs (§5.6): k-means++ seeding, Lloyd iterations, empty
    clusters reseeded with the farthest points; ``k`` capped at the distinct residuals.

    Args:
        iterations: at most this many Lloyd iterations per level.
        n_init: k-means restarts per level (the lowest inertia is kept).
    """

    name: ClassVar[str] = "rq-kmeans"

    iterations: int = 50
    n_init: int = 1

    def _quantize(self, x: Tensor, sizes: list[int], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        gen = self._generator(seed)
        raw, _, mse, iters = residual_kmeans(
            x.to(self.device), sizes, gen, iterations=self.iterations, n_init=self.n_init
        )
        total = float(((x - x.mean(0)) ** 2).sum(1).mean())
        return raw, {"quantization_mse": mse, "input_variance": total, "kmeans_iterations": iters}
