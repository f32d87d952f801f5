"""AdaFS: instance-wise field weights from a controller trained with the model (Lin et al.,
"AdaFS: Adaptive Feature Selection in Deep Recommender System", KDD 2022; methods.md §7.2).

As ERASE runs it (its non-DARTS path): every seam field goes through a batch norm over its
dimensions; an MLP controller (one hidden layer of ``hidden`` units, ReLU, dropout) reads the
concatenated normalised fields and outputs a softmax over the F fields for each row; each
field is multiplied by its row's weight. Backbone and controller train together on the
training batches, by the backbone's optimizer. The ranking is each field's weight averaged
over the validation rows (ERASE exports no AdaFS ranking; this is the issue's definition).

[INF] Mixed widths: one batch norm per field over its own D_f dimensions (ERASE's fields all
share one width and one ``BatchNorm1d(E)``); a dense column is a field of width 1.

    report = AdaFS().rank(recipe)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from recsys.data.batching import ordered_batches
from recsys.models.seam import FieldSeam
from recsys.train.recipe import FitResult
from selection.model_based.seam_selector import SeamSelector

__all__ = ["AdaFS", "AdaFSSeam"]


class AdaFSSeam(FieldSeam):
    """Batch-normalised fields reweighted per row by a softmax controller.

    Args:
        hidden: controller hidden units (ERASE: 16).
        dropout: controller dropout (ERASE: 0.2).

    Call: ``(sparse {name: B x D_f}, dense B x D_dense) -> same shapes``, field f scaled by
    ``w[:, f]``, ``w = softmax(MLP(concat of normalised fields))`` (B x F).
    """

    def __init__(self, hidden: int = 16, dropout: float = 0.2) -> None:
        super().__init__()
        if hidden < 1 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"AdaFSSeam needs hidden >= 1 and dropout in [0, 1), got {hidden}, {dropout}")
        self.hidden = int(hidden)
        self.dropout = float(dropout)
        self.norm: nn.Module = nn.Identity()
        self.controller = nn.Sequential()

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        self.bind_fields(sparse_names, sparse_dims, dense_names, dense_dims)
        width = self.offsets[-1]
        # batch norm is per column, so one BatchNorm1d over the C seam columns is every field's own
        self.norm = nn.BatchNorm1d(width)
        self.controller = nn.Sequential(nn.Linear(width, self.hidden), nn.ReLU(), nn.Dropout(self.dropout),
                                        nn.Linear(self.hidden, len(self.field_names)))

    def field_weights(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(the normalised seam B x C, the fields' weights B x F)``."""
        normed = self.norm(self.columns(sparse, dense))
        return normed, torch.softmax(self.controller(normed), dim=1)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        normed, w = self.field_weights(sparse, dense)
        return self.split(normed * self.expand(w), sparse, dense)


@dataclass
class AdaFS(SeamSelector):
    """AdaFS: one fit with :class:`AdaFSSeam`; a field's score is its mean weight over up to
    ``max_rows`` validation rows.

    Args:
        hidden, dropout: the controller (see :class:`AdaFSSeam`).
        max_rows: validation rows the weights are averaged over.
        max_epochs, seed, tracking, leakage_threshold: see :class:`~selection.model_based.seam_selector.SeamSelector`.
    """

    name: ClassVar[str] = "adafs"
    hidden: int = 16
    dropout: float = 0.2
    max_rows: int = 100_000

    def seam_spec(self) -> dict[str, Any]:
        return {"class_path": f"{AdaFSSeam.__module__}.{AdaFSSeam.__name__}",
                "init_args": {"hidden": self.hidden, "dropout": self.dropout}}

    def field_scores(self, fit: FitResult) -> tuple[dict[str, float], dict[str, Any]]:
        model = fit.task.model
        seam = model.seam
        if not isinstance(seam, AdaFSSeam):
            raise TypeError(f"the fit's seam is {type(seam).__name__}, not AdaFSSeam")
        split = "val" if fit.datamodule.has_split("val") else "train"
        data = fit.datamodule.sample_rows(split, self.max_rows, seed=self.seed)
        total = torch.zeros(len(seam.field_names), dtype=torch.float64)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for batch in ordered_batches(data, 4096):
                    _, w = seam.field_weights(model.sparse_arch(batch.sparse_features), batch.dense_features)
                    total += w.double().sum(0)
        finally:
            model.train(was_training)
        mean = (total / max(len(data), 1)).tolist()
        return dict(zip(seam.field_names, mean)), {"split": split, "rows": len(data)}
