"""AutoField: a keep/drop choice per field learned DARTS-style on validation batches (Wang et
al., "AutoField: Automating Feature Selection in Deep Recommender Systems", WWW 2022;
methods.md §7.2 verified against ERASE's code).

Each seam field has two logits (drop, keep), both initialised at 0.5. In training, the field is
multiplied by the keep share of a soft Gumbel-softmax over its logits (one draw per field and
batch, as ERASE does); the temperature τ starts at 1.0 and falls by 5e-5 on every
training-mode forward pass (controller passes included) to a floor of 0.01. The logits are
the *controller*: the backbone's optimizer never sees them; every ``controller_every`` (10)
training steps they take an Adam step on the loss of one validation batch (first-order
DARTS), through the seam and interaction only (:meth:`recsys.models.seam.SeamTransform.controller_step`).
Fields are ranked by their keep logit.

[INF] Outside training the keep share is the noise-free ``softmax(logits / τ)`` (ERASE draws
Gumbel noise in evaluation too).

    report = AutoField().rank(recipe)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from recsys.models.seam import FieldSeam, step_on
from recsys.train.recipe import FitResult
from selection.model_based.seam_selector import SeamSelector, trained_seam

__all__ = ["AutoField", "AutoFieldSeam"]


class AutoFieldSeam(FieldSeam):
    """Every seam field times its soft Gumbel-softmax keep share.

    Args:
        learning_rate: the controller's Adam learning rate.
        controller_every: training steps between controller steps (ERASE: 10).
        init: initial value of both logits.
        temperature: τ at the start; ``temperature_step`` is subtracted per training forward,
            down to ``min_temperature``.
    """

    def __init__(self, learning_rate: float = 1e-3, controller_every: int = 10, init: float = 0.5,
                 temperature: float = 1.0, temperature_step: float = 5e-5, min_temperature: float = 0.01) -> None:
        super().__init__()
        if learning_rate <= 0 or controller_every < 1 or not 0 < min_temperature <= temperature or temperature_step < 0:
            raise ValueError("AutoFieldSeam needs learning_rate > 0, controller_every >= 1, "
                             "0 < min_temperature <= temperature and temperature_step >= 0")
        self.learning_rate = float(learning_rate)
        self.controller_every = int(controller_every)
        self.init = float(init)
        self.temperature = float(temperature)
        self.temperature_step = float(temperature_step)
        self.min_temperature = float(min_temperature)
        self.logits = nn.Parameter(torch.zeros(0, 2))
        self._optimizer: torch.optim.Optimizer | None = None
        self.controller_steps = 0

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        self.bind_fields(sparse_names, sparse_dims, dense_names, dense_dims)
        self.logits = nn.Parameter(torch.full((len(self.field_names), 2), self.init))
        self._optimizer = None

    def keep(self) -> torch.Tensor:
        """F keep shares: a soft Gumbel-softmax draw in training, its noise-free mean outside."""
        if self.training:
            return nn.functional.gumbel_softmax(self.logits, tau=self.temperature, hard=False, dim=-1)[:, 1]
        return torch.softmax(self.logits / self.temperature, dim=-1)[:, 1]

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if self.training:
            self.temperature = max(self.temperature - self.temperature_step, self.min_temperature)
        return self.scale(sparse, dense, self.keep())

    def controller_parameters(self) -> list[nn.Parameter]:
        return [self.logits]

    def controller_step(self, loss: Callable[[], torch.Tensor]) -> None:
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam([self.logits], lr=self.learning_rate)
        step_on(self._optimizer, [self.logits], loss())
        self.controller_steps += 1


@dataclass
class AutoField(SeamSelector):
    """AutoField: one fit with :class:`AutoFieldSeam`; a field's score is its keep logit.

    Args:
        learning_rate, controller_every: the controller (see :class:`AutoFieldSeam`).
        max_epochs, seed, tracking, leakage_threshold: see :class:`~selection.model_based.seam_selector.SeamSelector`.
    """

    name: ClassVar[str] = "autofield"
    learning_rate: float = 1e-3
    controller_every: int = 10

    def seam_spec(self) -> dict[str, Any]:
        return {"class_path": f"{AutoFieldSeam.__module__}.{AutoFieldSeam.__name__}",
                "init_args": {"learning_rate": self.learning_rate, "controller_every": self.controller_every}}

    def field_scores(self, fit: FitResult) -> tuple[dict[str, float], dict[str, Any]]:
        seam = trained_seam(fit, AutoFieldSeam)
        logits = seam.logits.detach()
        keep = torch.softmax(logits, dim=-1)[:, 1].tolist()
        return dict(zip(seam.field_names, logits[:, 1].tolist())), {
            "keep_probability": dict(zip(seam.field_names, keep)), "controller_steps": seam.controller_steps,
            "final_temperature": seam.temperature,
        }
