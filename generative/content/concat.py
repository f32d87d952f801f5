"""``concat``: several item contents side by side."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from generative.content.base import ItemContent
from generative.data import LeaveOneOut, SequenceData

__all__ = ["ConcatContent"]


@dataclass
class ConcatContent(ItemContent):
    """Several contents side by side, each block's rows unit norm and scaled by ``1/sqrt(#parts)``.

    A row then has norm 1 when the item has every view, less when a view is missing (its block
    is zero), so an item without attributes is still placed by its co-occurrence.

    Args:
        parts: registered content names, e.g. ``("attributes", "collaborative")``.
        dim: ``dim`` of every part that has one.
        seed: ``seed`` of every part that has one.
    """

    name: ClassVar[str] = "concat"
    parts: tuple[str, ...] = ("attributes", "collaborative")
    dim: int = 64
    seed: int = 0

    def vectors(self, data: SequenceData, split: LeaveOneOut) -> np.ndarray:
        if not self.parts or "concat" in self.parts:
            raise ValueError(f"concat needs one or more non-concat parts, got {list(self.parts)}")
        blocks = []
        report: dict[str, float] = {}
        for part in self.parts:
            cls = ItemContent._registry.get(part)
            if cls is None:
                raise ValueError(f"unknown item content {part!r}; available: {ItemContent.registered_names()}")
            names = {f.name for f in fields(cls) if f.init}  # type: ignore[arg-type]
            options = {k: v for k, v in (("dim", self.dim), ("seed", self.seed)) if k in names}
            content = ItemContent.create(part, **options)
            blocks.append(content.vectors(data, split))
            report.update({f"{part}.{k}": v for k, v in content.report.items()})
        out = np.concatenate(blocks, axis=1) / np.sqrt(len(blocks))
        self._report = {**report, "dim": int(out.shape[1])}
        return out.astype(np.float32)
