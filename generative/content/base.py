"""The interface of item contents: :class:`ItemContent`, and the linear algebra they share.

A content is one subclass with a ``name`` (registered for ``ItemContent.create(name)``,
``data.content`` in the configs); see :mod:`generative.content` for the conventions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from generative.data import LeaveOneOut, SequenceData
from recsys.registry import Registered

__all__ = ["ItemContent", "truncated_svd"]


class ItemContent(Registered, ABC):
    """Maps the catalogue of a dataset to item vectors; subclasses set ``name`` and :meth:`vectors`."""

    kind: ClassVar[str] = "item content"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    _report: dict[str, float] | None = None

    @property
    def report(self) -> dict[str, float]:
        """Counts and settings of the last :meth:`vectors` call (items without content, dim, ...)."""
        return dict(self._report or {})

    @abstractmethod
    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        """float32 ``[num_items + 1, d]``; row 0 zeros, other rows unit norm or zero (no content)."""


def truncated_svd(
    matrix: Tensor, dim: int, seed: int = 0, n_iter: int = 8, oversample: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``k`` singular triplets of ``matrix`` ``[m, n]`` (dense or sparse COO), ``k = min(dim, m, n)``.

    Exact when ``k + oversample >= min(m, n) / 2``; otherwise the randomised range finder of
    Halko et al. (``k + oversample`` probes, ``n_iter`` power iterations; the default
    ``oversample = max(16, k)`` keeps the top-64 subspace of a PPMI matrix within ~1e-3 of the
    exact one), its Gaussian start drawn from a generator seeded with ``seed``, so the result is
    deterministic. Computed in float64.

    Returns:
        ``U [m, k]``, ``S [k]`` (descending), ``V [n, k]`` with ``matrix ≈ U diag(S) Vᵀ``; the
        sign of every pair is fixed so that the largest-magnitude entry of each ``U`` column is
        positive.
    """
    m, n = matrix.shape
    k = min(dim, m, n)
    if k < 1:
        raise ValueError(f"truncated_svd: need dim >= 1 and a non-empty matrix, got dim={dim}, shape {(m, n)}")
    oversample = max(16, k) if oversample is None else oversample
    a = matrix.to(torch.float64)
    if k + oversample >= min(m, n) / 2:
        u, s, vh = torch.linalg.svd(a.to_dense() if a.is_sparse else a, full_matrices=False)
        u, s, v = u[:, :k], s[:k], vh[:k].T
    else:
        a = a.coalesce() if a.is_sparse else a
        at = a.t().coalesce() if a.is_sparse else a.T
        gen = torch.Generator().manual_seed(seed)
        q = torch.linalg.qr(a @ torch.randn(n, k + oversample, generator=gen, dtype=torch.float64)).Q
        for _ in range(n_iter):
            q = torch.linalg.qr(a @ torch.linalg.qr(at @ q).Q).Q
        ub, s, vh = torch.linalg.svd((at @ q).T, full_matrices=False)
        u, s, v = (q @ ub)[:, :k], s[:k], vh[:k].T
    flip = torch.sign(u.gather(0, u.abs().argmax(0, keepdim=True))).squeeze(0)
    flip[flip == 0] = 1.0
    return u * flip, s, v * flip


def unit_rows(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def with_pad_row(rows: np.ndarray) -> np.ndarray:
    """Prepend the zero padding row and return float32."""
    return np.concatenate([np.zeros((1, rows.shape[1]), rows.dtype), rows]).astype(np.float32)


def sparse_matrix(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> Tensor:
    index = torch.from_numpy(np.stack([rows, cols]).astype(np.int64))
    values_t = torch.from_numpy(values.astype(np.float64))
    return torch.sparse_coo_tensor(index, values_t, shape, check_invariants=False).coalesce()
