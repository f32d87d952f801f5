"""The seam: pooled per-feature embeddings + dense features, between sparse arch and interaction.

Every importance method is a :class:`SeamTransform`: LeAP mixes fields with shuffled replicas,
DNIS masks dimensions, iHAS gates instance-wise, permutation importance shuffles one field.
A backbone calls ``sparse, dense = seam(sparse, dense)`` before its interaction, so any
backbone works with any transform.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

__all__ = ["IdentitySeam", "SeamTransform", "step_on"]


class SeamTransform(nn.Module):
    """Base class of transforms at the seam.

    ``forward`` takes and returns:

    * ``sparse``: ``Dict[str, Tensor]``, feature name -> pooled embedding B x D_f, in the
      model's sparse feature order;
    * ``dense``: B x D_dense float tensor (D_dense may be 0).

    Subclasses may add a training penalty through :meth:`regularization`; the training module
    adds it to the loss.
    """

    def forward(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str]) -> None:
        """Called by the model once its features are known (before any optimizer is built):
        the place to create per-feature parameters. A no-op by default.

        Args:
            sparse_names: sparse features in seam order.
            sparse_dims: their pooled widths D_f.
            dense_names: dense features, in the column order of the dense tensor.
        """

    def bind_values(self, num_embeddings: list[int]) -> None:
        """Called by the model right after :meth:`bind` with each sparse feature's number of ids
        (its table rows, in seam order): the place to create per-value parameters. A no-op by
        default."""

    def transform_values(self, pooled: dict[str, torch.Tensor], kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        """The per-value hook, before :meth:`forward`: the pooled embeddings (feature -> B x D_f)
        with the batch's ids (``kjt``, the model's input), for transforms that act on feature
        values rather than fields (OptFS's value masks). Returns ``pooled`` unchanged by default."""
        return pooled

    def start_epoch(self, epoch: int) -> None:
        """Called by the training module at the start of every training epoch (0-based), for
        schedules counted in epochs; a no-op by default."""

    def regularization(self) -> torch.Tensor:
        """Extra loss term (scalar); zero by default."""
        return torch.zeros(())

    def after_optimizer_step(self) -> None:
        """Called after every training step's optimizer update (a proximal step on the
        transform's parameters, for example); a no-op by default."""

    #: a bi-level transform (DARTS-style): every this many training steps the training module
    #: calls :meth:`controller_step` with the loss of one validation batch; 0 never does
    controller_every: int = 0

    def controller_parameters(self) -> list[nn.Parameter]:
        """Parameters only :meth:`controller_step` updates (left out of the model's optimizer)."""
        return []

    def controller_step(self, loss: Callable[[], torch.Tensor]) -> None:
        """One controller update on ``loss()``, a validation batch's loss differentiable in the
        seam and the interaction (not in the embedding tables); a no-op by default."""


def step_on(optimizer: torch.optim.Optimizer, parameters: list[nn.Parameter], objective: torch.Tensor) -> None:
    """One ``optimizer`` step of ``parameters`` on ``objective``'s gradient, computed for them
    alone (``torch.autograd.grad``): a controller step leaves no gradient on the model's own
    parameters for its next training step to pick up."""
    grads = torch.autograd.grad(objective, parameters)
    optimizer.zero_grad()
    for p, g in zip(parameters, grads, strict=True):
        p.grad = g
    optimizer.step()
    for p in parameters:
        p.grad = None


class IdentitySeam(SeamTransform):
    """The default: passes everything through unchanged."""

    def forward(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return sparse, dense
