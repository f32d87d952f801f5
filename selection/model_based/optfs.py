"""OptFS: a learned mask per feature *value*, rolled up to fields (Lyu et al., "Optimizing
Feature Set for Click-Through Rate Prediction", WWW 2023; methods.md §7.2 verified against
ERASE's code).

Every id of every sparse feature has a mask weight ``w`` (initialised at 0.5). In the search
fit an id's embedding is multiplied by ``sigmoid(T·w) / sigmoid(0.5)`` and the loss gains
``l1 · Σ sigmoid(T·w)`` over every weight; the temperature ``T`` is multiplied at the start of
every epoch by ``γ^{1/(pretrain_epochs − 1)}`` (no cap), so the mask hardens as training goes on.
The weights train with the backbone, by its optimizer. Retraining keeps the ids with ``w > 0``
(the hard mask ``1[w > 0] / sigmoid(0.5)``).

[INF] Our additions, none of which ERASE has (its fields are single-valued and categorical, and
it exports no OptFS field ranking):

* a field's score is the mean of its ids' weights ``w``, each id weighted by how often it
  occurred in the search fit's training batches (``kept_share``, the share of occurrences
  whose id survives ``w > 0``, is reported too);
* a dense column is one value with one weight;
* a multi-valued row's pooled embedding is scaled by the mean mask of its ids (exact for
  single-valued fields; sum pooling of masked ids would need a weighted lookup);
* the L1 weight defaults to ERASE's MovieLens-1M value (1e-4), the size of our datasets rather
  than Criteo's 45M rows (1e-8).

    report = OptFS().rank(recipe)                 # one fit, ranking only
    report = OptFS(retrain=True).rank(recipe)     # + the retrain with the hard mask
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.models.seam import SeamTransform, field_index
from recsys.train.recipe import FitResult, Recipe
from selection.model_based.seam_selector import SeamSelector, trained_seam
from selection.report import ImportanceReport

__all__ = ["OptFS", "OptFSSeam"]

_SCALE = 1.0 + math.exp(-0.5)  # 1 / sigmoid(0.5): the mask is 1 at T = 1, w = 0.5


class OptFSSeam(SeamTransform):
    """Value-level masks: every id's embedding times its mask, every dense column times its own.

    Args:
        gamma: the temperature's growth over ``pretrain_epochs - 1`` epochs (ERASE: 2000).
        pretrain_epochs: sets the growth rate ``gamma^{1/(pretrain_epochs-1)}`` per epoch.
        l1: weight of ``Σ sigmoid(T·w)`` in the loss.
        init: the weights' initial value.
        mask_file: a hard mask saved by :meth:`save_mask` (safetensors): retrain mode, fixed
            ``1[w > 0] / sigmoid(0.5)`` masks, no parameters and no penalty.

    Call (per value, :meth:`transform_values`): ``pooled {name: B x D_f}`` and the batch's ids ->
    each row scaled by the mean mask of its ids; then (:meth:`forward`) dense B x D_dense times
    the columns' masks.
    """

    def __init__(self, gamma: float = 2000.0, pretrain_epochs: int = 5, l1: float = 1e-4, init: float = 0.5,
                 mask_file: str | None = None) -> None:
        super().__init__()
        if gamma < 1 or pretrain_epochs < 2 or l1 < 0:
            raise ValueError(f"OptFSSeam needs gamma >= 1, pretrain_epochs >= 2 and l1 >= 0; got {gamma}, {pretrain_epochs}, {l1}")
        self.gamma = float(gamma)
        self.pretrain_epochs = int(pretrain_epochs)
        self.l1 = float(l1)
        self.init = float(init)
        self.mask_file = mask_file
        self.field_names: list[str] = []
        self.sparse_names: list[str] = []
        self.dense_names: list[str] = []
        self.epoch = -1
        self.weights = nn.ParameterList()
        self.dense_weights = nn.Parameter(torch.zeros(0))
        self.dense_columns: torch.Tensor
        self.register_buffer("dense_columns", torch.zeros(0, dtype=torch.long), persistent=False)
        self.counts: list[torch.Tensor] = []

    # -- binding ------------------------------------------------------------------------------
    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        self.sparse_names = list(sparse_names)
        self.dense_names = list(dense_names)
        self.field_names = self.sparse_names + self.dense_names
        self.dense_weights = nn.Parameter(torch.full((len(dense_names),), self.init))
        # the dense feature of each dense column (a vector feature's D columns share one weight)
        self.register_buffer("dense_columns", field_index([1] * len(dense_names) if dense_dims is None else list(dense_dims)),
                             persistent=False)

    def bind_values(self, num_embeddings: list[int]) -> None:
        if self.mask_file is not None:
            self._load_mask(self.mask_file, num_embeddings)
            return
        self.weights = nn.ParameterList(nn.Parameter(torch.full((n,), self.init)) for n in num_embeddings)
        self.counts = [torch.zeros(n, dtype=torch.float64) for n in num_embeddings]

    def _load_mask(self, path: str, num_embeddings: list[int]) -> None:
        saved = load_file(path)
        missing = [n for n in self.field_names if n not in saved]
        if missing:
            raise ValueError(f"{path}: no mask for {missing}")
        for name, n in zip(self.sparse_names, num_embeddings):
            if saved[name].numel() != n:
                raise ValueError(f"{path}: the mask of {name!r} has {saved[name].numel()} ids, the table {n}")
        self.weights = nn.ParameterList(nn.Parameter(saved[n].float(), requires_grad=False) for n in self.sparse_names)
        self.dense_weights = nn.Parameter(torch.stack([saved[n].float().reshape(()) for n in self.dense_names])
                                          if self.dense_names else torch.zeros(0), requires_grad=False)
        self.counts = []

    @property
    def retraining(self) -> bool:
        return self.mask_file is not None

    # -- the mask -------------------------------------------------------------------------------
    @property
    def temperature(self) -> float:
        """T of the current epoch: ``growth^(epoch + 1)`` (ERASE multiplies on the first step of
        every epoch, the first included)."""
        growth = self.gamma ** (1.0 / (self.pretrain_epochs - 1))
        return growth ** (self.epoch + 1)

    def start_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def mask(self, w: torch.Tensor) -> torch.Tensor:
        """The mask of weights ``w``: soft ``sigmoid(T·w)`` in search, hard ``1[w > 0]`` in
        retraining, both over ``sigmoid(0.5)``."""
        if self.retraining:
            return (w > 0).to(w.dtype) * _SCALE
        return torch.sigmoid(self.temperature * w) * _SCALE

    def transform_values(self, pooled: dict[str, torch.Tensor], kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        features = kjt.to_dict()
        out = dict(pooled)
        for i, name in enumerate(self.sparse_names):
            ids, lengths = features[name].values(), features[name].lengths()
            if self.training and self.counts:
                self.counts[i].index_add_(0, ids.cpu(), torch.ones(ids.numel(), dtype=torch.float64))
            m = self.mask(self.weights[i])[ids]
            if bool((lengths == 1).all()):
                scale = m
            else:  # mean mask of each row's ids (an empty row keeps its zero embedding)
                rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=ids.device), lengths)
                total = torch.zeros(lengths.numel(), dtype=m.dtype, device=m.device).index_add(0, rows, m)
                scale = torch.where(lengths > 0, total / lengths.clamp(min=1).to(m.dtype), torch.ones_like(total))
            out[name] = pooled[name] * scale.unsqueeze(1).to(pooled[name].dtype)
        return out

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if dense.shape[1]:
            dense = dense * self.mask(self.dense_weights).index_select(0, self.dense_columns)
        return sparse, dense

    def regularization(self) -> torch.Tensor:
        if self.retraining or self.l1 == 0:
            return torch.zeros(())
        total = sum((torch.sigmoid(self.temperature * w).sum() for w in self.weights), torch.zeros(()))
        return self.l1 * (total + torch.sigmoid(self.temperature * self.dense_weights).sum())

    # -- read-out -------------------------------------------------------------------------------
    def field_scores(self) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
        """``(score, kept_share, kept ids)`` per field: the occurrence-weighted mean weight, the
        share of occurrences whose id has ``w > 0``, the number of ids with ``w > 0``.
        A field whose ids were never counted (no training batch) weighs its ids equally."""
        scores: dict[str, float] = {}
        kept_share: dict[str, float] = {}
        kept: dict[str, int] = {}
        for i, name in enumerate(self.sparse_names):
            w = self.weights[i].detach().double().cpu()
            c = self.counts[i] if self.counts and float(self.counts[i].sum()) > 0 else torch.ones_like(w)
            scores[name] = float((w * c).sum() / c.sum())
            kept_share[name] = float(((w > 0).double() * c).sum() / c.sum())
            kept[name] = int((w > 0).sum())
        for j, name in enumerate(self.dense_names):
            w_j = float(self.dense_weights[j].detach())
            scores[name], kept_share[name], kept[name] = w_j, float(w_j > 0), int(w_j > 0)
        return scores, kept_share, kept

    def save_mask(self, path: str | Path) -> Path:
        """Save every field's weights (safetensors) for a retraining seam (``mask_file``)."""
        tensors = {n: self.weights[i].detach().cpu().contiguous() for i, n in enumerate(self.sparse_names)}
        tensors.update({n: self.dense_weights[j].detach().cpu().reshape(1).contiguous() for j, n in enumerate(self.dense_names)})
        save_file(tensors, str(path))
        return Path(path)


_SEAM_PATH = f"{OptFSSeam.__module__}.{OptFSSeam.__name__}"  # ``model.seam.class_path`` of both fits


@dataclass
class OptFS(SeamSelector):
    """OptFS: one fit with :class:`OptFSSeam`; a field's score is its ids' occurrence-weighted
    mean mask weight.

    Args:
        gamma, pretrain_epochs, l1: see :class:`OptFSSeam`.
        retrain: also retrain with the hard mask (ids with ``w > 0``) and report that fit's AUCs
            (``retrain_test_auc``, ``retrain_best_val_auc``); doubles the cost.
        max_epochs, seed, tracking, leakage_threshold: see :class:`~selection.model_based.seam_selector.SeamSelector`.
    """

    name: ClassVar[str] = "optfs"
    gamma: float = 2000.0
    pretrain_epochs: int = 5
    l1: float = 1e-4
    retrain: bool = False

    def seam_spec(self) -> dict[str, Any]:
        return {"class_path": _SEAM_PATH,
                "init_args": {"gamma": self.gamma, "pretrain_epochs": self.pretrain_epochs, "l1": self.l1}}

    def field_scores(self, fit: FitResult) -> tuple[dict[str, float], dict[str, Any]]:
        seam = trained_seam(fit, OptFSSeam)
        scores, kept_share, kept = seam.field_scores()
        extras: dict[str, Any] = {"kept_share": kept_share, "kept_ids": kept, "final_temperature": seam.temperature}
        if self.retrain:
            seam.save_mask(self._mask_path)
        return scores, extras

    def rank(self, recipe: Recipe, run_name: str | None = None, parent_run_id: str | None = None) -> ImportanceReport:
        if not self.retrain:
            return super().rank(recipe, run_name, parent_run_id)
        with tempfile.TemporaryDirectory(prefix="optfs-") as tmp:
            self._mask_path = Path(tmp) / "mask.safetensors"  # written by field_scores
            report = super().rank(recipe, run_name, parent_run_id)
            features = [n for n in recipe.schema.names if n not in report.excluded] if report.excluded else None
            spec = {"class_path": _SEAM_PATH, "init_args": {"mask_file": str(self._mask_path)}}
            fit = recipe.fit(features=features, seam=spec, max_epochs=self.max_epochs, seed=self.seed,
                             run_name=f"{run_name or self.name}-retrain", parent_run_id=parent_run_id, tracking=self.tracking)
        report.extras.update(retrain_test_auc=fit.metrics.get("test_auc"), retrain_best_val_auc=fit.metrics.get("best_val_auc"),
                             retrain_run_id=fit.run_id, retrain_seconds=fit.seconds)
        report.cost_seconds += fit.seconds
        return report
