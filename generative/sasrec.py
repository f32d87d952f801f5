"""SASRec: self-attentive sequential recommendation (Kang & McAuley, 2018), the ID-based baseline.

Every generative result is read against this model (methods.md 5.6 quotes TIGER's SASRec row on
Beauty: R@10 about 0.0605). Architecture, as in the paper and its PyTorch port:

* input ``x_t = E[h_t] * sqrt(D) + P[pos_t]``, then dropout: ``E`` is the item table
  ``[num_items + 1, D]`` (row 0 = padding, kept at zero), ``P`` a learned positional table
  ``[max_history, D]``;
* ``layers`` pre-norm causal self-attention blocks (:class:`torch.nn.TransformerEncoderLayer`,
  ``norm_first=True``, point-wise feed-forward of width ``ffn_dim``, ``D`` by default as in the
  paper), then a final LayerNorm;
* the state at the last column (the most recent item) scores every item through the *tied*
  item table: ``logits = h_T E^T`` ``[B, num_items + 1]``, padding column set to ``-inf``.

Histories are left-padded (:mod:`generative.base`), so positions are counted from the right:
the most recent item always sits at position ``max_history - 1``. Pad keys are masked out of
attention; every query may still attend to itself, so an all-padding row never sees a fully
masked softmax (no NaN) and a real position never looks at a pad. Together these make the
logits independent of how many pads precede the history. A history longer than
``max_history`` is cut to its last ``max_history`` items.

Loss, a stated deviation: the paper trains every position of a sequence with binary
cross-entropy against one sampled negative. Our leave-one-out split already turns every prefix
of a training sequence into its own example, so we train the last position with the full
softmax cross-entropy over items ``1..num_items`` (the issue's "full softmax"; the usual choice
of later SASRec re-implementations, which is a stronger baseline than sampled BCE).

::

    model = SASRec(num_items=12101)
    loss, logs = model.training_loss(history, target)   # history [B, T] int64, target [B]
    items, scores = model.recommend(history, k=10)      # [B, 10] item ids, log-probabilities
    scripted = torch.jit.script(model)                  # forward and recommend are scriptable
"""

# No ``from __future__ import annotations`` here: TorchScript reads the class attribute
# annotations below as real types (strings such as ``'int'`` are refused by ``torch.jit.script``).
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from generative.base import Catalog, NextItemModel

__all__ = ["SASRec"]


class SASRec(NextItemModel):
    """Causal self-attention over item-ID histories with a tied full-softmax output.

    Args:
        num_items (int): catalogue size ``N``; items are ``1..N``, ``0`` is padding.
        dim (int): embedding and hidden width ``D`` (must be divisible by ``heads``).
        layers (int): number of self-attention blocks.
        heads (int): attention heads per block.
        max_history (int): longest history read (positional table size).
        dropout (float): dropout on the input embeddings, attention weights and residuals.
        ffn_dim (int | None): feed-forward width; ``dim`` when ``None`` (the paper's choice).

    The CPU defaults (64 / 2 layers / 2 heads / 0.2 dropout / 20 items) are the paper's
    Amazon settings except the width (the paper uses 50).
    """

    name = "sasrec"  # model.arch (a plain class attribute: TorchScript reads the annotations below)

    num_items: int
    dim: int
    max_history: int

    def __init__(
        self,
        num_items: int,
        dim: int = 64,
        layers: int = 2,
        heads: int = 2,
        max_history: int = 20,
        dropout: float = 0.2,
        ffn_dim: int | None = None,
    ) -> None:
        super().__init__()
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1 (an empty catalogue cannot be ranked), got {num_items}")
        if dim < 1 or heads < 1 or dim % heads:
            raise ValueError(f"dim ({dim}) must be a positive multiple of heads ({heads})")
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        if max_history < 1:
            raise ValueError(f"max_history must be >= 1, got {max_history}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.num_items = int(num_items)
        self.dim = int(dim)
        self.heads = int(heads)
        self.max_history = int(max_history)
        self.item_embedding = nn.Embedding(num_items + 1, dim, padding_idx=0)
        self.position_embedding = nn.Embedding(max_history, dim)
        self.input_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model=dim,
                nhead=heads,
                dim_feedforward=ffn_dim or dim,
                dropout=dropout,
                activation="relu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(layers)
        )
        self.final_norm = nn.LayerNorm(dim)
        self.reset_parameters()

    @classmethod
    def from_catalog(cls, catalog: Catalog, loss: nn.Module | None = None, **options: Any) -> "SASRec":
        """An item-ID model over ``catalog.num_items`` items (no semantic IDs, no token weighting)."""
        if loss is not None:
            raise ValueError("SASRec trains with its own full-softmax loss; it takes no token weighting")
        return cls(catalog.num_items, **options)

    def reset_parameters(self) -> None:
        """Item and position tables ``N(0, 1/D)`` (unit-scale inputs after ``* sqrt(D)``); pad row 0."""
        std = self.dim**-0.5
        nn.init.normal_(self.item_embedding.weight, std=std)
        nn.init.normal_(self.position_embedding.weight, std=std)
        with torch.no_grad():
            self.item_embedding.weight[0].zero_()

    def _check_history(self, history: Tensor) -> Tensor:
        if history.dim() != 2:
            raise ValueError(f"history must be [B, T] item indices, got shape {list(history.shape)}")
        if history.dtype != torch.long:
            raise ValueError(f"history must be int64 item indices, got {history.dtype}")
        if history.numel() > 0:
            if bool((history < 0).any()) or bool((history > self.num_items).any()):
                raise ValueError(
                    f"history holds item ids outside 0..{self.num_items} "
                    f"(min {int(history.min())}, max {int(history.max())}); map unknown items first"
                )
        if history.size(1) > self.max_history:
            history = history[:, history.size(1) - self.max_history :]
        return history

    def encode(self, history: Tensor) -> Tensor:
        """Hidden state at the most recent position ``[B, D]`` of ``history`` ``[B, T]``."""
        history = self._check_history(history)
        batch, length = history.size(0), history.size(1)
        if length == 0:
            raise ValueError("history has no columns; pass at least one (all-padding) column")
        positions = torch.arange(self.max_history - length, self.max_history, device=history.device)
        real = history > 0  # [B, T]
        x = self.item_embedding(history) * math.sqrt(self.dim) + self.position_embedding(positions).unsqueeze(0)
        x = self.input_dropout(x) * real.unsqueeze(-1).to(x.dtype)
        # blocked[b, q, k]: query q may not attend to key k (future, or a pad that is not q itself)
        idx = torch.arange(length, device=history.device)
        future = idx.unsqueeze(0) > idx.unsqueeze(1)  # [T, T], True above the diagonal
        pad_key = ~real.unsqueeze(1)  # [B, 1, T]
        blocked = (future.unsqueeze(0) | pad_key) & ~torch.eye(length, dtype=torch.bool, device=history.device)
        mask = blocked.repeat_interleave(self.heads, dim=0)  # [B * heads, T, T]
        for block in self.blocks:
            x = block(x, src_mask=mask)
        return self.final_norm(x[:, length - 1]).reshape(batch, self.dim)

    def forward(self, history: Tensor) -> Tensor:
        """Next-item logits ``[B, num_items + 1]`` (column 0, padding, is ``-inf``)."""
        logits = self.encode(history) @ self.item_embedding.weight.t()
        return logits.index_fill(1, torch.zeros(1, dtype=torch.long, device=logits.device), float("-inf"))

    def training_loss(self, history: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Full-softmax cross-entropy of ``target`` ``[B]`` (items ``1..N``) given ``history`` ``[B, T]``."""
        if target.dim() != 1 or target.size(0) != history.size(0):
            raise ValueError(f"target must be [B] with B = {history.size(0)}, got shape {list(target.shape)}")
        if target.numel() and (bool((target < 1).any()) or bool((target > self.num_items).any())):
            raise ValueError(f"target holds ids outside 1..{self.num_items} (padding 0 is not a valid target)")
        logits = self.forward(history)[:, 1:]
        loss = F.cross_entropy(logits, target - 1)
        return loss, {"loss": float(loss.detach())}

    @torch.jit.export
    def recommend(self, history: Tensor, k: int, exclude_history: bool = False) -> tuple[Tensor, Tensor]:
        """Top-``k`` items ``[B, k]`` (best first) and their log-probabilities ``[B, k]``.

        ``exclude_history`` drops the items already in each history (off by default: the TIGER
        protocol scores every item, repeats included); an excluded item scores ``-inf``.
        """
        if k < 1 or k > self.num_items:
            raise ValueError(f"k must be in 1..num_items ({self.num_items}), got {k}")
        with torch.no_grad():
            scores = torch.log_softmax(self.forward(history), dim=-1)
            if exclude_history:
                scores = scores.scatter(1, history, float("-inf"))  # every item of the row, pads hit column 0
            scores, items = torch.topk(scores[:, 1:], k, dim=-1)
        return items + 1, scores
