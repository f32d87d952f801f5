"""The interface of semantic-ID builders: :class:`CodebookBuilder` (item vectors -> :class:`Codebook`).

A builder is one subclass with a ``name`` that implements ``_quantize`` (registered for
``CodebookBuilder.create(name)``, ``data.codebook`` in the configs); the capacity check, the
TIGER collision level and the statistics are shared here.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from generative.codebook.artifact import (
    Codebook,
    code_perplexity,
    collision_groups,
    collision_stats,
    min_codebook_size,
)
from recsys.registry import Registered

__all__ = ["CodebookBuilder", "builder_names"]


@dataclass
class CodebookBuilder(Registered, ABC):
    """Item vectors -> :class:`Codebook` (see the module docstring for the collision and
    capacity rules).

    Args:
        levels: quantisation levels before the collision token (TIGER: 3).
        codebook_size: codes per level, one int for all levels or one per level (TIGER: 256).
        disambiguate: append the TIGER collision level.
        max_group_size: most items one code tuple may hold when disambiguating (the collision
            token's vocabulary); default: the largest level size.
        device: torch device of the fit.
    """

    kind: ClassVar[str] = "codebook builder"
    _registry: ClassVar[dict[str, type[Registered]]] = {}

    levels: int = 3
    codebook_size: int | list[int] = 256
    disambiguate: bool = True
    max_group_size: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 1:
            raise ValueError(f"levels must be an integer >= 1, got {self.levels!r}")
        sizes = self.level_sizes()
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"codebook_size must be integers >= 1, got {self.codebook_size!r}")
        if self.max_group_size is not None and self.max_group_size < 1:
            raise ValueError(f"max_group_size must be >= 1, got {self.max_group_size}")

    def level_sizes(self) -> list[int]:
        """Codes per quantisation level (without the collision level)."""
        if isinstance(self.codebook_size, (list, tuple)):
            if len(self.codebook_size) != self.levels:
                raise ValueError(f"codebook_size lists {len(self.codebook_size)} sizes for {self.levels} levels")
            return list(self.codebook_size)
        return [self.codebook_size] * self.levels

    def slots(self) -> int:
        """Items one code tuple may hold: ``max_group_size`` (default: the largest level size)
        with disambiguation, else 1."""
        if not self.disambiguate:
            return 1
        return int(self.max_group_size or max(self.level_sizes()))

    def check_capacity(self, num_items: int) -> None:
        """Refuse a catalogue larger than ``Π sizes × slots`` (see the module docstring).

        Raises:
            ValueError: with the smallest ``codebook_size`` that fits.
        """
        if num_items < 1:
            raise ValueError("empty catalogue: there are no items to encode (vectors has only the padding row 0)")
        sizes, slots = self.level_sizes(), self.slots()
        capacity = math.prod(sizes) * slots
        if num_items > capacity:
            need = min_codebook_size(num_items, self.levels, slots)
            what = f"{' x '.join(map(str, sizes))} codes"
            what += f" x {slots} collision slots" if self.disambiguate else ""
            raise ValueError(
                f"codebook too small for the catalogue: {what} hold {capacity} distinct IDs but there are "
                f"{num_items} items; the minimum codebook_size for {self.levels} levels is {need}"
                + (f" (with max_group_size={slots})" if self.disambiguate else " (disambiguate=False)")
                + ", or add levels"
            )

    def fit(self, vectors: np.ndarray, seed: int = 0) -> Codebook:
        """Build the codebook of items ``1..N``.

        Args:
            vectors: float ``[N + 1, d]`` item vectors; row 0 (padding) is ignored.
            seed: the fit is a deterministic function of ``(vectors, settings, seed)``.

        Returns:
            a :class:`Codebook` whose ``stats`` hold ``collision_rate_before`` (fraction of
            items whose tuple before disambiguation is shared with another item),
            ``num_collision_groups``, ``max_group_size``, ``distinct_prefixes`` (per depth),
            ``usage`` and ``perplexity`` per level of the final codes, plus the builder's own
            entries (``quantization_mse``; RQ-VAE losses and per-epoch ``training`` curves).

        Raises:
            ValueError: empty catalogue, non-finite vectors, codebook too small, or a collision
                group larger than ``max_group_size``.
        """
        x = self._check_vectors(vectors)
        self.check_capacity(len(x))
        raw, extra = self._quantize(x, self.level_sizes(), int(seed))
        return self._assemble(raw, extra, x.shape[1], int(seed))

    @abstractmethod
    def _quantize(self, x: Tensor, sizes: list[int], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Codes ``[N, levels]`` of the item vectors ``x`` ``[N, d]`` and builder statistics."""

    # -- shared steps ----------------------------------------------------------------------------
    @staticmethod
    def _check_vectors(vectors: np.ndarray) -> Tensor:
        arr = np.asarray(vectors)
        if arr.ndim != 2:
            raise ValueError(f"vectors must be a [num_items + 1, d] array, got shape {arr.shape}")
        if arr.shape[0] < 2:
            raise ValueError("empty catalogue: vectors has no item rows (row 0 is the padding item)")
        if arr.shape[1] < 1:
            raise ValueError("vectors has dimension 0")
        if not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"vectors must be numeric, got dtype {arr.dtype}")
        body = arr[1:].astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(body).all(axis=1))
        if len(bad):
            raise ValueError(f"vectors of item {int(bad[0]) + 1} are not finite ({len(bad)} items with NaN/inf)")
        return torch.from_numpy(np.ascontiguousarray(body))

    def _assemble(self, raw: np.ndarray, extra: dict[str, Any], dim: int, seed: int) -> Codebook:
        sizes = self.level_sizes()
        stats = collision_stats(raw)
        _, _, rank = collision_groups(raw)
        if self.disambiguate:
            if stats["max_group_size"] > self.slots():
                raise ValueError(
                    f"the largest collision group holds {stats['max_group_size']} items, more than "
                    f"max_group_size={self.slots()}; use a larger codebook_size or more levels, "
                    "or raise max_group_size"
                )
            raw = np.concatenate([raw, rank[:, None]], axis=1)
            sizes = sizes + [int(stats["max_group_size"])]
        codes = np.concatenate([np.full((1, raw.shape[1]), -1, dtype=np.int64), raw.astype(np.int64)])
        per_level = [code_perplexity(codes[1:, lvl], s) for lvl, s in enumerate(sizes)]
        stats["usage"] = [u for u, _ in per_level]
        stats["perplexity"] = [p for _, p in per_level]
        stats.update(extra)
        config = {"name": self.name, **self.describe(), "seed": seed, "input_dim": dim}
        return Codebook(codes, sizes, method=self.name, disambiguated=self.disambiguate, stats=stats, config=config)

    def _generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed)
        return gen


def builder_names() -> list[str]:
    """Registered codebook builders."""
    return CodebookBuilder.registered_names()
