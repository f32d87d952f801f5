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

__all__ = ["FieldSeam", "IdentitySeam", "SeamTransform", "field_index", "step_on"]


class SeamTransform(nn.Module):
    """Base class of transforms at the seam.

    ``forward`` takes and returns:

    * ``sparse``: ``Dict[str, Tensor]``, feature name -> pooled embedding B x D_f, in the
      model's sparse feature order;
    * ``dense``: B x D_dense float tensor (D_dense may be 0): the dense features' columns, one
      per scalar and D per vector feature (a vector is one field of width D).

    Subclasses may add a training penalty through :meth:`regularization`; the training module
    adds it to the loss.
    """

    def forward(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        """Called by the model once its features are known (before any optimizer is built):
        the place to create per-feature parameters. A no-op by default.

        Args:
            sparse_names: sparse features in seam order.
            sparse_dims: their pooled widths D_f.
            dense_names: dense features (scalars and vectors), in the column order of the dense tensor.
            dense_dims: their widths, the columns each takes (None: 1 each).
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


def field_index(widths: list[int]) -> torch.Tensor:
    """Column -> field of fields of ``widths`` laid side by side: C = Σ widths, int64."""
    if not widths:
        return torch.zeros(0, dtype=torch.long)
    return torch.repeat_interleave(torch.arange(len(widths)), torch.tensor(widths, dtype=torch.long))


class FieldSeam(SeamTransform):
    """A seam transform that weighs whole fields, with the seam as one B x C matrix.

    Fields are the sparse features (width D_f) then the dense features (width 1, or D for a
    vector feature). :meth:`bind` records the layout; :meth:`columns` concatenates the seam
    (one op), :meth:`expand` maps per-field values (F or B x F) to the C columns through a
    column -> field index, and :meth:`split` cuts a B x C matrix back into the seam's dict and
    dense block. A transform written this way costs the same few tensor ops at any F, instead
    of one op per field per step.

    Subclasses that add per-field parameters override :meth:`bind` and call
    ``self.bind_fields(...)`` first.
    """

    def __init__(self) -> None:
        super().__init__()
        # empty lists built as `list[str]()`: TorchScript infers the bound type (see LeAPSeam)
        self.sparse_names = list[str]()
        self.dense_names = list[str]()
        self.field_names = list[str]()
        self.field_widths = list[int]()
        self.offsets = [0]  # column offsets of the fields in the concatenated seam
        self.num_sparse = 0
        self.num_dense = 0
        self.column_fields: torch.Tensor
        self.register_buffer("column_fields", torch.zeros(0, dtype=torch.long), persistent=False)

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        self.bind_fields(sparse_names, sparse_dims, dense_names, dense_dims)

    def bind_fields(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
                    dense_dims: list[int] | None = None) -> None:
        """Record the seam layout (see :meth:`SeamTransform.bind` for the arguments)."""
        dense_dims = [1] * len(dense_names) if dense_dims is None else [int(d) for d in dense_dims]
        if len(dense_dims) != len(dense_names):
            raise ValueError(f"{len(dense_names)} dense features but {len(dense_dims)} dense widths")
        self.sparse_names = list(sparse_names)
        self.dense_names = list(dense_names)
        self.field_names = self.sparse_names + self.dense_names
        self.num_sparse = len(self.sparse_names)
        self.num_dense = len(self.dense_names)
        self.field_widths = [int(d) for d in sparse_dims] + dense_dims
        offsets = [0]
        for w in self.field_widths:
            offsets.append(offsets[-1] + w)
        self.offsets = offsets
        self.register_buffer("column_fields", field_index(self.field_widths), persistent=False)

    def columns(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        """The seam as one B x C matrix: the sparse fields' columns in seam order, then dense."""
        parts = [sparse[n] for n in self.sparse_names]
        if self.num_dense > 0:
            parts.append(dense)
        return torch.cat(parts, dim=1)

    def expand(self, per_field: torch.Tensor) -> torch.Tensor:
        """Per-field values (F, or B x F) repeated over each field's columns (C, or B x C)."""
        return per_field.index_select(per_field.dim() - 1, self.column_fields)

    def split(self, x: torch.Tensor, sparse: dict[str, torch.Tensor], dense: torch.Tensor
              ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A B x C matrix back into the seam layout; dtypes follow ``sparse`` and ``dense``."""
        sparse_width = self.offsets[self.num_sparse]
        out: dict[str, torch.Tensor] = {}
        if self.num_sparse > 0:
            parts = torch.split(x[:, :sparse_width], self.field_widths[: self.num_sparse], dim=1)
            for i, name in enumerate(self.sparse_names):
                out[name] = parts[i].to(sparse[name].dtype)
        dense_out = x[:, sparse_width:].to(dense.dtype) if self.num_dense > 0 else dense
        return out, dense_out

    def scale(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor, gains: torch.Tensor
              ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Every field times its gain (gains F, or B x F per row)."""
        return self.split(self.columns(sparse, dense) * self.expand(gains), sparse, dense)
