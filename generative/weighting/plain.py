"""``plain``: every token weighs the same (the baseline)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from generative.weighting.base import TokenWeighting

__all__ = ["PlainCE"]


class PlainCE(TokenWeighting):
    """Mean token cross-entropy over the ``B·L`` tokens: every token weighs the same."""

    name = "plain"

    def weighted(self, ce: Tensor, labels: Tensor) -> Tensor:
        return ce.mean()

    def weights_table(self) -> dict[str, Any]:
        levels = self.num_levels
        return {"name": self.name, "position_weights": None if levels is None else [1.0] * levels}
