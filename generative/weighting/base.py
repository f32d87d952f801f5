"""The interface of token weightings: :class:`TokenWeighting` and the per-token cross-entropy.

A weighting is one subclass with a ``name`` (registered for ``TokenWeighting.create(name)``,
``model.weighting`` in the configs); see :mod:`generative.weighting` for the conventions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recsys.registry import Registered

__all__ = ["TokenWeighting", "token_cross_entropy"]


def token_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-token cross-entropy ``[B, L]`` of ``logits [B, L, V]`` against ``labels [B, L]``.

    Half-precision logits are upcast to float32 first; ``-1e9`` padding entries give finite
    values (``log_softmax`` subtracts the row maximum).
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    if labels.dim() != 2 or tuple(labels.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"labels must be [B, L] = {tuple(logits.shape[:2])}, got shape {tuple(labels.shape)}")
    if labels.dtype != torch.long:
        raise ValueError(f"labels must be int64, got {labels.dtype}")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    b, n, v = logits.shape
    return F.cross_entropy(logits.reshape(b * n, v), labels.reshape(b * n), reduction="none").reshape(b, n)


def enum_option(enum: type[Enum], value: Any, argument: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{argument} must be one of {[m.value for m in enum]}, got {value!r}") from None


class TokenWeighting(Registered, nn.Module, ABC):
    """A loss over ``logits [B, L, V]`` and ``labels [B, L]`` whose token weights come from data.

    Subclasses set ``name`` and implement :meth:`weighted` (the loss from the per-token CE) and
    :meth:`weights_table`; those that need data override :meth:`_fit`. Buffers that :meth:`fit`
    creates are listed in ``_data_buffers``: a fresh (unfitted) instance can load a fitted
    instance's ``state_dict``.
    """

    kind: ClassVar[str] = "token weighting"
    _registry: ClassVar[dict[str, type[Registered]]] = {}
    _data_buffers: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        self.level_size: Tensor
        self.register_buffer("level_size", torch.zeros(0, dtype=torch.long))  # [L] once fit
        for buffer in self._data_buffers:
            self.register_buffer(buffer, torch.zeros(0))

    @property
    def num_levels(self) -> int | None:
        """``L`` once fit, else None."""
        return int(self.level_size.numel()) or None

    @property
    def level_sizes(self) -> list[int]:
        """Codes per level, as given to :meth:`fit` (empty before)."""
        return [int(s) for s in self.level_size.tolist()]

    # -- fitting ----------------------------------------------------------------------------

    def fit(
        self,
        codes: np.ndarray,
        level_sizes: list[int],
        train_targets: np.ndarray,
        item_vectors: np.ndarray | None = None,
    ) -> TokenWeighting:
        """Precompute the weights from the data.

        Args:
            codes (np.ndarray): int64 ``[num_items + 1, L]``; row ``i`` holds item ``i``'s code per
                level, row 0 (padding) is ignored.
            level_sizes (list[int]): ``L`` codebook sizes; ``codes[1:, l] < level_sizes[l]``.
            train_targets (np.ndarray): int64 ``[n]``, the item (1..num_items) of every
                training example's target.
            item_vectors (np.ndarray | None): float ``[num_items + 1, d]`` item content vectors
                (row 0 ignored); needed by the dispersion gain only.

        Returns:
            TokenWeighting: ``self``.
        """
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] < 2 or codes.shape[1] < 1:
            raise ValueError(f"codes must be [num_items + 1, L] with num_items >= 1, got shape {codes.shape}")
        if not np.issubdtype(codes.dtype, np.integer):
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        num_levels = codes.shape[1]
        sizes = [int(s) for s in level_sizes]
        if len(sizes) != num_levels or min(sizes) < 1:
            raise ValueError(f"level_sizes must hold {num_levels} positive sizes (one per code level), got {sizes}")
        items = codes[1:].astype(np.int64)
        for level, size in enumerate(sizes):
            bad = (items[:, level] < 0) | (items[:, level] >= size)
            if bad.any():
                item = int(np.flatnonzero(bad)[0]) + 1
                raise ValueError(
                    f"codes[{item}, {level}] = {items[item - 1, level]} is outside level {level}'s 0..{size - 1}"
                )
        targets = np.asarray(train_targets)
        if targets.ndim != 1 or not np.issubdtype(targets.dtype, np.integer):
            raise ValueError(f"train_targets must be a 1-D integer array, got {targets.dtype} {targets.shape}")
        if targets.size and (targets.min() < 1 or targets.max() > len(items)):
            raise ValueError(
                f"train_targets must be item indices in 1..{len(items)}, got {targets.min()}..{targets.max()}"
            )
        vectors = None
        if item_vectors is not None:
            vectors = np.asarray(item_vectors, dtype=np.float64)
            if vectors.ndim != 2 or len(vectors) != len(codes):
                raise ValueError(f"item_vectors must be [{len(codes)}, d] (a row per codes row), got {vectors.shape}")
            if not np.all(np.isfinite(vectors[1:])):
                raise ValueError("item_vectors must be finite")
            vectors = vectors[1:]
        self.level_size = torch.tensor(sizes, dtype=torch.long, device=self.level_size.device)
        self._fit(items, sizes, targets.astype(np.int64), vectors)
        return self

    def _fit(self, items: np.ndarray, level_sizes: list[int], targets: np.ndarray, vectors: np.ndarray | None) -> None:
        """Subclass hook: ``items [N, L]`` codes of items 1..N (row ``i-1`` is item ``i``),
        ``targets [n]`` item indices 1..N, ``vectors [N, d]`` or None."""

    def _set_data_buffer(self, name: str, value: np.ndarray) -> None:
        device = self.level_size.device  # fit() after .to(device) keeps the module on that device
        setattr(self, name, torch.as_tensor(np.asarray(value), dtype=torch.float32, device=device))

    def _check_fitted(self, labels: Tensor) -> None:
        for buffer in self._data_buffers:
            if getattr(self, buffer).numel() == 0:
                raise RuntimeError(f"{type(self).__name__} ({self.name!r}) must be fit(...) before computing a loss")
        fitted_levels = self.num_levels
        if fitted_levels is not None and labels.shape[1] != fitted_levels:
            raise ValueError(
                f"labels have {labels.shape[1]} positions but the weighting was fit on {fitted_levels} levels"
            )

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # data buffers are created by fit(): take their shape from the checkpoint
        for buffer in ("level_size", *self._data_buffers):
            key = prefix + buffer
            if key in state_dict:
                setattr(self, buffer, torch.empty_like(state_dict[key], device=getattr(self, buffer).device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- loss -------------------------------------------------------------------------------

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Scalar loss of ``logits [B, L, V]`` against ``labels [B, L]``."""
        ce = token_cross_entropy(logits, labels)
        self._check_fitted(labels)
        return self.weighted(ce, labels)

    @abstractmethod
    def weighted(self, ce: Tensor, labels: Tensor) -> Tensor:
        """Scalar loss from the per-token cross-entropy ``ce [B, L]`` and ``labels [B, L]``."""

    @abstractmethod
    def weights_table(self) -> dict[str, Any]:
        """The current weights as plain JSON-able values, for logging."""

    def describe(self) -> dict[str, Any]:
        """The constructor settings."""
        return {"name": self.name, **self._options()}

    def _options(self) -> dict[str, Any]:
        return {}
