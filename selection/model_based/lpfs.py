"""LPFS++: a smoothed-L0 gate per field with a proximal step (Guo et al., "LPFS: Learnable
Polarizing Feature Selection for Click-Through Rate Prediction", arXiv:2206.00267, 2022;
methods.md §7.2 verified against ERASE's code).

Each seam field is multiplied by ``g(x_f)``, one parameter per field initialised at 1::

    g(x) = x²/(x² + ε) + α ε^{1/τ} arctan(x)      (x > 0)
    g(x) = α ε^{1/τ} arctan(x) − x²/(x² + ε)      (x ≤ 0)

with α = 10, τ = 2; ε starts at 0.1 and is multiplied by 0.9978 every 100 training steps, so
the gate polarises towards 0 or ±1 as training goes on. After every optimizer step the gate
parameters take a proximal L1 step, ``x ← sign(x) max(|x| − λ·lr, 0)`` (λ = 0.01). Fields are
ranked by the raw parameter x, as ERASE does.

[INF] ERASE also advances ε on evaluation passes; here only training steps count.

    report = LPFS().rank(recipe)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from recsys.models.seam import FieldSeam
from recsys.train.recipe import FitResult
from selection.model_based.seam_selector import SeamSelector, trained_seam

__all__ = ["LPFS", "LPFSSeam", "lpfs_gate"]


def lpfs_gate(x: torch.Tensor, epsilon: float, alpha: float = 10.0, tau: float = 2.0) -> torch.Tensor:
    """The LPFS++ gate ``g(x)`` (odd in x; see the module docstring)."""
    square = x * x / (x * x + epsilon)
    slope = alpha * epsilon ** (1.0 / tau) * torch.atan(x)
    return torch.where(x > 0, slope + square, slope - square)


class LPFSSeam(FieldSeam):
    """Every seam field times ``lpfs_gate(x_f, ε_t)``.

    Args:
        learning_rate: the gates' learning rate (their own optimizer group; ERASE: 1e-3).
        epsilon: ε at the first step.
        decay: ε's factor every ``decay_every`` training steps.
        decay_every: steps between ε decays.
        alpha, tau: the gate's shape.
        proximal: λ of the proximal step (the threshold is ``λ · learning_rate``).
    """

    def __init__(self, learning_rate: float = 1e-3, epsilon: float = 0.1, decay: float = 0.9978, decay_every: int = 100,
                 alpha: float = 10.0, tau: float = 2.0, proximal: float = 0.01) -> None:
        super().__init__()
        if epsilon <= 0 or not 0 < decay <= 1 or decay_every < 1 or learning_rate <= 0 or proximal < 0:
            raise ValueError("LPFSSeam needs epsilon > 0, 0 < decay <= 1, decay_every >= 1, learning_rate > 0 and proximal >= 0")
        self.learning_rate = float(learning_rate)
        self.epsilon0 = float(epsilon)
        self.decay = float(decay)
        self.decay_every = int(decay_every)
        self.alpha = float(alpha)
        self.tau = float(tau)
        self.proximal = float(proximal)
        self.x = nn.Parameter(torch.zeros(0))
        self.steps = 0

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        self.bind_fields(sparse_names, sparse_dims, dense_names, dense_dims)
        self.x = nn.Parameter(torch.ones(len(self.field_names)))

    @property
    def epsilon(self) -> float:
        return self.epsilon0 * self.decay ** (self.steps // self.decay_every)

    def gates(self) -> torch.Tensor:
        """F gate values at the current ε."""
        return lpfs_gate(self.x, self.epsilon, self.alpha, self.tau)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if self.training:
            self.steps += 1
        return self.scale(sparse, dense, self.gates())

    def after_optimizer_step(self) -> None:
        with torch.no_grad():
            threshold = self.proximal * self.learning_rate
            self.x.copy_(torch.sign(self.x) * torch.clamp(self.x.abs() - threshold, min=0.0))


@dataclass
class LPFS(SeamSelector):
    """LPFS++: one fit with :class:`LPFSSeam`; a field's score is its gate parameter x.

    Args:
        learning_rate, epsilon, proximal: see :class:`LPFSSeam`.
        max_epochs, seed, tracking, leakage_threshold: see :class:`~selection.model_based.seam_selector.SeamSelector`.
    """

    name: ClassVar[str] = "lpfs"
    learning_rate: float = 1e-3
    epsilon: float = 0.1
    proximal: float = 0.01

    def seam_spec(self) -> dict[str, Any]:
        return {"class_path": f"{LPFSSeam.__module__}.{LPFSSeam.__name__}",
                "init_args": {"learning_rate": self.learning_rate, "epsilon": self.epsilon, "proximal": self.proximal}}

    def field_scores(self, fit: FitResult) -> tuple[dict[str, float], dict[str, Any]]:
        seam = trained_seam(fit, LPFSSeam)
        x = seam.x.detach().tolist()
        gates = seam.gates().detach().tolist()
        return dict(zip(seam.field_names, x)), {"gates": dict(zip(seam.field_names, gates)), "final_epsilon": seam.epsilon,
                                                "steps": seam.steps}
