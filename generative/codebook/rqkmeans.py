"""``rq-kmeans``: residual k-means semantic IDs (§5.6), and the k-means they are built from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from generative.codebook.builder import CodebookBuilder

__all__ = ["RQKMeans", "kmeans", "residual_kmeans"]

#: rows per chunk of a distance computation (bounds the ``[chunk, K]`` distance matrix)
_CHUNK = 32768


def _nearest(x: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Nearest centroid: ``x`` ``[N, d]``, ``c`` ``[K, d]`` -> index ``[N]`` and squared
    distance ``[N]`` (ties -> lowest index), computed in row chunks."""
    c_sq = (c * c).sum(1)
    idx, dist = [], []
    for i in range(0, len(x), _CHUNK):
        xb = x[i : i + _CHUNK]
        d = (xb * xb).sum(1, keepdim=True) - 2.0 * xb @ c.T + c_sq
        m, j = d.min(1)
        idx.append(j)
        dist.append(m.clamp_min(0.0))
    return torch.cat(idx), torch.cat(dist)


def _kmeans_pp(x: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """k-means++ seeding: first centre uniform, then each new centre drawn ∝ D² (``[k, d]``)."""
    n = len(x)
    first = int(torch.randint(n, (1,), generator=gen, device=gen.device).item())
    centres = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = d2.sum()
        if not bool(total > 0):
            break
        j = int(torch.multinomial((d2 / total).double().cpu(), 1, generator=gen).item())
        centres.append(x[j])
        d2 = torch.minimum(d2, ((x - x[j]) ** 2).sum(1))
    return torch.stack(centres)


def kmeans(
    x: Tensor, k: int, generator: torch.Generator, iterations: int = 50, tol: float = 1e-6, n_init: int = 1
) -> tuple[Tensor, Tensor, float, int]:
    """Lloyd's k-means with k-means++ seeding, deterministic for a generator state.

    ``k`` is capped at the number of distinct rows of ``x`` (the rest of a level's vocabulary
    then stays unused). A cluster that empties is reseeded with the point farthest from its
    centroid. Stops when no assignment changes or the inertia improves by less than ``tol``
    (relative). With ``n_init > 1`` the run with the lowest inertia is kept.

    Args:
        x: ``[N, d]`` float points, ``N >= 1``.
        k: clusters wanted.
        generator: the random source (a CPU ``torch.Generator``).

    Returns:
        ``centroids`` ``[k_eff, d]``, ``assign`` ``[N]`` int64, inertia (mean squared distance
        to the assigned centroid) and the Lloyd iterations of the kept run.
    """
    if len(x) == 0:
        raise ValueError("kmeans: no points")
    k_eff = min(int(k), int(len(torch.unique(x, dim=0))))
    best: tuple[Tensor, Tensor, float, int] | None = None
    for _ in range(max(1, n_init)):
        c = _kmeans_pp(x, k_eff, generator)
        assign, dist = _nearest(x, c)
        inertia = float(dist.mean())
        it = 0
        for it in range(1, iterations + 1):
            counts = torch.bincount(assign, minlength=len(c))
            empty = torch.nonzero(counts == 0).flatten()
            if len(empty):
                far = torch.argsort(dist, descending=True, stable=True)
                taken = 0
                for j in empty.tolist():
                    while taken < len(far) and counts[assign[far[taken]]] <= 1:
                        taken += 1  # keep singleton clusters; take points from larger ones
                    if taken == len(far):
                        break
                    p = far[taken]
                    counts[assign[p]] -= 1
                    counts[j] = 1
                    assign[p] = j
                    taken += 1
            sums = torch.zeros_like(c).index_add_(0, assign, x)
            counts = torch.bincount(assign, minlength=len(c)).to(x.dtype)
            filled = counts > 0
            c = torch.where(filled[:, None], sums / counts.clamp_min(1.0)[:, None], c)
            new_assign, dist = _nearest(x, c)
            new_inertia = float(dist.mean())
            changed = bool((new_assign != assign).any())
            assign = new_assign
            done = not changed or (inertia - new_inertia) <= tol * max(inertia, 1e-30)
            inertia = new_inertia
            if done:
                break
        if best is None or inertia < best[2]:
            best = (c, assign, inertia, it)
    assert best is not None
    return best


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
