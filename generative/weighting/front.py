"""``front``: Front-Greater weighting, each SID position weighs by the information it adds (methods.md §5.3)."""

from __future__ import annotations

import math
from enum import Enum, unique
from typing import Any

import numpy as np
from torch import Tensor

from generative.weighting.base import TokenWeighting, enum_option

__all__ = ["FrontGain", "FrontGreater", "dispersion_gains", "front_position_weights", "prefix_entropy_gains"]


def _prefix_groups(codes: np.ndarray) -> list[np.ndarray]:
    """Group id of every item at every depth: element ``k`` is ``[n]``, items sharing their first
    ``k`` tokens share an id (``k = 0..L``; depth 0 puts every item in group 0)."""
    n, num_levels = codes.shape
    groups = [np.zeros(n, dtype=np.int64)]
    for k in range(num_levels):
        pairs = np.stack([groups[-1], codes[:, k]], axis=1)
        _, inverse = np.unique(pairs, axis=0, return_inverse=True)
        groups.append(inverse.reshape(-1).astype(np.int64))
    return groups


def dispersion_gains(codes: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Reference-code gain per position (methods.md §5.3, ``codebook_dist.py``): ``g_k = D_{k-1} - D_k``.

    ``D_0`` is the mean Euclidean distance of the item vectors to their global centroid; ``D_k``
    is the size-weighted mean, over the groups of items sharing their first ``k`` tokens, of the
    mean distance to the group centroid (which equals the mean over items of the distance to
    their own group's centroid).

    Args:
        codes (np.ndarray): ``[n, L]`` codes of the ``n`` catalogue items (no padding row).
        vectors (np.ndarray): ``[n, d]`` item vectors, same row order.

    Returns:
        np.ndarray: ``[L]`` float64 gains, ``g_1..g_L`` (not necessarily positive or monotone).
    """
    codes = np.asarray(codes)
    vectors = np.asarray(vectors, dtype=np.float64)
    if codes.ndim != 2 or vectors.ndim != 2 or len(codes) != len(vectors) or len(codes) == 0:
        raise ValueError(
            f"codes [n, L] and vectors [n, d] must have the same n > 0 rows, got {codes.shape} and {vectors.shape}"
        )
    levels = []
    for group in _prefix_groups(codes):
        size = np.bincount(group).astype(np.float64)
        centroid = np.zeros((len(size), vectors.shape[1]))
        np.add.at(centroid, group, vectors)
        centroid /= size[:, None]
        levels.append(float(np.linalg.norm(vectors - centroid[group], axis=1).mean()))
    dispersion = np.asarray(levels)
    return dispersion[:-1] - dispersion[1:]


def prefix_entropy_gains(codes: np.ndarray, item_weights: np.ndarray) -> np.ndarray:
    """Paper-framing gain per position (methods.md §5.3 notes), in nats.

    ``g_k = H(items | prefix_{k-1}) - H(items | prefix_k)`` under the item prior
    ``p_i ∝ item_weights[i]``. Because a prefix is a function of the item, this is
    ``H(prefix_k) - H(prefix_{k-1})``, the entropy of token ``k`` given the tokens before it:
    the uncertainty over items that position ``k`` removes, on average over prefixes. The
    gains sum to ``H(prefix_L)`` (= ``H(items)`` when the codes are unique).

    Args:
        codes (np.ndarray): ``[n, L]`` codes of the ``n`` catalogue items (no padding row).
        item_weights (np.ndarray): ``[n]`` non-negative popularity (e.g. smoothed counts).

    Returns:
        np.ndarray: ``[L]`` float64 gains, each >= 0.
    """
    codes = np.asarray(codes)
    weights = np.asarray(item_weights, dtype=np.float64)
    if codes.ndim != 2 or weights.shape != (len(codes),) or len(codes) == 0:
        raise ValueError(f"codes [n, L] and item_weights [n] must agree on n > 0, got {codes.shape}, {weights.shape}")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("item_weights must be finite, non-negative and not all zero")
    p = weights / weights.sum()
    entropies = []
    for group in _prefix_groups(codes):
        mass = np.bincount(group, weights=p)
        mass = mass[mass > 0]
        entropies.append(float(-(mass * np.log(mass)).sum()))
    entropy = np.asarray(entropies)
    return np.maximum(entropy[1:] - entropy[:-1], 0.0)  # >= 0 up to rounding


def front_position_weights(gains: np.ndarray) -> np.ndarray:
    """``w_k = L · log(1 + max(g_k, 0)) / Σ_j log(1 + max(g_j, 0))``; all ones when every gain is <= 0.

    Args:
        gains (np.ndarray): ``[L]`` per-position gains.

    Returns:
        np.ndarray: ``[L]`` float64 weights summing to ``L``.
    """
    gains = np.asarray(gains, dtype=np.float64)
    if gains.ndim != 1 or len(gains) == 0 or not np.all(np.isfinite(gains)):
        raise ValueError(f"gains must be a finite non-empty vector, got {gains}")
    raw = np.log1p(np.maximum(gains, 0.0))
    if raw.sum() <= 1e-12:
        return np.ones_like(raw)
    return len(raw) * raw / raw.sum()


@unique
class FrontGain(str, Enum):
    """How Front-Greater measures the information each SID position adds (methods.md §5.3)."""

    DISPERSION = "dispersion"  # drop of the mean distance of item vectors to their prefix group's centroid (code)
    ENTROPY = "entropy"  # drop of H(items | prefix) under the item-popularity prior, in nats (paper framing)


class FrontGreater(TokenWeighting):
    """Front-Greater Weighting: each SID position weighs by the information it adds (methods.md §5.3).

    ``w_k = L · log(1 + max(g_k, 0)) / Σ_j log(1 + max(g_j, 0))`` (all 1 when every gain is 0),
    ``loss = Σ_{b,t} w_t CE_{b,t} / Σ_{b,t} w_t``. The gain ``g_k`` is

    * ``"dispersion"`` (the reference code): :func:`dispersion_gains` over the item vectors
      (``fit`` needs ``item_vectors``). Its scale follows the vectors' scale, and ``log(1+g)``
      is not scale-free, so the weights depend on how the vectors are normalised;
    * ``"entropy"`` (the paper's framing): :func:`prefix_entropy_gains` in nats, with the item
      prior ``count_i + smoothing`` where ``count_i`` is how often item ``i`` is a training
      target; the default ``smoothing = 1`` keeps never-seen catalogue items in the trie's
      entropy with a small mass (``smoothing = 0`` drops them).

    With a disambiguation level, its gain is the dispersion (or entropy) left inside collision
    groups, usually small, so that position gets a low weight.
    """

    name = "front"
    _data_buffers = ("position_weights", "gains")

    def __init__(self, gain: FrontGain | str = FrontGain.DISPERSION, smoothing: float = 1.0) -> None:
        super().__init__()
        self.position_weights: Tensor  # data buffers (registered by the base class, filled by fit)
        self.gains: Tensor
        self.gain = enum_option(FrontGain, gain, "gain")
        if smoothing < 0 or not math.isfinite(smoothing):
            raise ValueError(f"smoothing must be a finite value >= 0, got {smoothing}")
        self.smoothing = float(smoothing)

    def _fit(self, items: np.ndarray, level_sizes: list[int], targets: np.ndarray, vectors: np.ndarray | None) -> None:
        if self.gain is FrontGain.DISPERSION:
            if vectors is None:
                raise ValueError(
                    "FrontGreater(gain='dispersion') needs item_vectors in fit(); pass the item content vectors "
                    "used to build the codebook, or use gain='entropy'"
                )
            gains = dispersion_gains(items, vectors)
        else:
            counts = np.bincount(targets, minlength=len(items) + 1)[1:].astype(np.float64)
            if counts.sum() + self.smoothing * len(items) <= 0:
                raise ValueError("the entropy gain needs training targets or smoothing > 0")
            gains = prefix_entropy_gains(items, counts + self.smoothing)
        self._set_data_buffer("gains", gains)
        self._set_data_buffer("position_weights", front_position_weights(gains))

    def weighted(self, ce: Tensor, labels: Tensor) -> Tensor:
        w = self.position_weights.to(ce.dtype)  # [L]
        return (ce * w).sum() / (w.sum() * ce.shape[0])

    def weights_table(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gain": self.gain.value,
            "gains": self.gains.tolist(),
            "position_weights": self.position_weights.tolist(),
        }

    def _options(self) -> dict[str, Any]:
        return {"gain": self.gain.value, "smoothing": self.smoothing}
