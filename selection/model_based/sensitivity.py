"""Sensitivity-based selectors at the seam: SHARK and SFS (ERASE's sensitivity baselines besides
permutation importance; methods.md §7.4).

Both read the gradient of the loss with respect to each seam field: for a batch of B rows,
field f's pooled embedding ``e_f`` (B x D_f; a dense column is a field of width 1) and
``g_f = ∂L/∂e_f`` with the loss summed over the rows, so ``g_f[b]`` is row b's own gradient
(the model runs in eval mode: no dropout, batch norm with running statistics, rows independent).
:func:`seam_gradients` yields both, batch by batch, for any backbone and either kernel (only
the seam is differentiated; the tables are not).

* **SHARK** (Zhang et al., "SHARK: A Lightweight Model Compression Approach for Large-scale
  Recommender Systems", CIKM 2023, arXiv:2308.09395): its F-Permutation scores a field by the
  first-order Taylor estimate of the loss change when the field is replaced by its expectation,
  ``S_f = mean_rows |g_f[b] · (μ_f − e_f[b])|``, ``μ_f`` the mean of ``e_f`` over the scored
  rows, on a trained model. One training run plus two passes over held-out rows (ERASE reads
  the test split; here the validation split, so the test split stays unread).
* **SFS** (Wang et al., "Single-shot Feature Selection for Multi-task Recommendations", SIGIR
  2023): a mask ``c_f = 1`` multiplies every field of the model *at initialisation*; a field
  scores the magnitude of the mask's gradient, ``|∂L/∂c_f| = |Σ_rows g_f[b] · e_f[b]|`` (mean
  loss), averaged over ``batches`` training batches and normalised to sum to 1 (a SNIP-style
  connection sensitivity). No training at all: the cheapest selector of the benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from recsys.data.batching import ordered_batches
from recsys.data.encoders import EncodedData
from recsys.models.base import RankingModel
from recsys.train.recipe import Recipe
from selection.base import ImportanceMethod, method_report, screen_leakage
from selection.model_based.permutation import seam_fields
from selection.report import ImportanceReport


def _left_out(leaks: dict[str, str]) -> dict[str, str]:
    return {f: f"{reason} (left out)" for f, reason in leaks.items()}

__all__ = ["SFS", "SHARK", "seam_gradients", "sfs_scores", "shark_scores"]


def _split_dense(dense: torch.Tensor, model: RankingModel) -> dict[str, torch.Tensor]:
    """The model's dense tensor as dense feature -> its columns (B x 1, B x D for a vector)."""
    parts = torch.split(dense, list(model.schema.dense_widths), dim=1) if model.schema.dense_names else []
    return dict(zip(model.schema.dense_names, parts))


def seam_gradients(
    model: RankingModel, data: EncodedData, batch_size: int = 4096
) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]]:
    """Per batch of ``data``'s rows: ``(e, g, rows)``, ``e[f]`` the seam input of field f
    (B x D_f, detached) and ``g[f]`` the gradient of the *summed* BCE loss with respect to it.

    The model is put in eval mode for the passes (its mode is restored after).
    """
    was_training = model.training
    model.eval()
    dense_names = list(model.schema.dense_names)
    try:
        for batch in ordered_batches(data, batch_size):
            with torch.no_grad():
                pooled = model.sparse_arch(batch.sparse_features)
            fields = {n: pooled[n].detach().float().requires_grad_(True) for n in model.sparse_names}
            dense = batch.dense_features.float()
            dense_cols = {n: c.detach().clone().requires_grad_(True) for n, c in _split_dense(dense, model).items()}
            dense_in = torch.cat([dense_cols[n] for n in dense_names], dim=1) if dense_names else dense
            sparse_out, dense_out = model.seam(fields, dense_in)
            logits = model.interact(sparse_out, dense_out).reshape(-1)
            loss = F.binary_cross_entropy_with_logits(logits, batch.labels.float().reshape(-1), reduction="sum")
            inputs = {**fields, **dense_cols}
            grads = torch.autograd.grad(loss, list(inputs.values()), allow_unused=True)
            g = {n: (gr if gr is not None else torch.zeros_like(inputs[n])) for n, gr in zip(inputs, grads)}
            yield {n: t.detach() for n, t in inputs.items()}, g, len(batch.labels)
    finally:
        model.train(was_training)


def shark_scores(model: RankingModel, data: EncodedData, batch_size: int = 4096) -> dict[str, float]:
    """SHARK's ``mean_rows |g_f · (μ_f − e_f)|`` of every seam field over the rows of ``data``."""
    names = seam_fields(model)
    sums: dict[str, torch.Tensor] = {}
    n = 0
    with torch.no_grad():  # pass 1: the expectation of every field over the scored rows
        for batch in ordered_batches(data, batch_size):
            pooled = model.sparse_arch(batch.sparse_features)
            parts = {**{f: pooled[f].float() for f in model.sparse_names},
                     **_split_dense(batch.dense_features.float(), model)}
            for f, t in parts.items():
                sums[f] = sums.get(f, torch.zeros(t.shape[1], dtype=torch.float64)) + t.double().sum(0)
            n += len(batch.labels)
    mean = {f: (s / max(n, 1)).float() for f, s in sums.items()}
    total = dict.fromkeys(names, 0.0)
    for e, g, _ in seam_gradients(model, data, batch_size):  # pass 2: the first-order terms
        for f in names:
            total[f] += float(((mean[f] - e[f]) * g[f]).sum(dim=1).abs().double().sum())
    return {f: total[f] / max(n, 1) for f in names}


def sfs_scores(model: RankingModel, data: EncodedData, batch_size: int) -> dict[str, float]:
    """SFS's mask sensitivity of every seam field: ``|Σ_rows g_f · e_f| / B`` per batch (the
    gradient of the mean loss with respect to a field mask at 1), averaged over the batches of
    ``data`` and normalised to sum to 1."""
    names = seam_fields(model)
    acc = dict.fromkeys(names, 0.0)
    batches = 0
    for e, g, rows in seam_gradients(model, data, batch_size):
        for f in names:
            acc[f] += abs(float((e[f] * g[f]).double().sum())) / rows
        batches += 1
    total = sum(acc.values())
    return {f: (v / total if total > 0 else 0.0) for f, v in acc.items()} if batches else acc


@dataclass
class SHARK(ImportanceMethod):
    """SHARK's F-Permutation: one training run, then the first-order Taylor score of every
    field on up to ``max_rows`` validation rows (see the module docstring).

    Args:
        max_rows: validation rows scored (a seeded uniform sample).
        batch_size: rows per gradient pass.
        max_epochs: override the recipe's ``trainer.max_epochs`` (None: the recipe's).
        seed: seed of the fit and of the row sample.
        tracking: log the fit to MLflow.
        leakage_threshold: as in the other model-based methods (0 turns the screen off).
        id_screen: rank ID-like features with no signal beyond chance on the training rows
            after all the others (:func:`~selection.base.screen_memorisable`).
    """

    name: ClassVar[str] = "shark"
    max_rows: int = 100_000
    batch_size: int = 4096
    max_epochs: int | None = None
    seed: int = 0
    tracking: bool = True
    leakage_threshold: float = 0.9
    id_screen: bool = True

    def rank(self, recipe: Recipe, run_name: str = "shark", parent_run_id: str | None = None) -> ImportanceReport:
        start = time.perf_counter()
        leaks = screen_leakage(recipe, self.leakage_threshold) if self.leakage_threshold > 0 else {}
        fit = recipe.fit(features=[n for n in recipe.schema.names if n not in leaks] if leaks else None,
                         max_epochs=self.max_epochs, seed=self.seed, run_name=run_name, parent_run_id=parent_run_id,
                         tracking=self.tracking)
        split = "val" if fit.datamodule.has_split("val") else "train"
        data = fit.datamodule.sample_rows(split, self.max_rows, seed=self.seed)
        scored = time.perf_counter()
        scores = shark_scores(fit.task.model, data, self.batch_size)
        return method_report(self, recipe, scores, start, _left_out(leaks), {
            "split": split, "rows": len(data), "fit_seconds": fit.seconds, "score_seconds": time.perf_counter() - scored,
            "test_auc": fit.metrics.get("test_auc"), "best_val_auc": fit.metrics.get("best_val_auc"), "run_id": fit.run_id,
        }, id_screen=self.id_screen)


@dataclass
class SFS(ImportanceMethod):
    """Single-shot feature selection: mask sensitivities of the untrained model on ``batches``
    training batches (see the module docstring).

    Args:
        batches: training batches the gradients are averaged over (ERASE's ``num_batch_sampling``).
        batch_size: rows per batch.
        seed: seed of the initialisation and of the row sample.
        leakage_threshold: as in the other methods (0 turns the screen off).
        id_screen: rank ID-like features with no signal beyond chance on the training rows
            after all the others (:func:`~selection.base.screen_memorisable`).
    """

    name: ClassVar[str] = "sfs"
    batches: int = 20
    batch_size: int = 2048
    seed: int = 0
    leakage_threshold: float = 0.9
    id_screen: bool = True

    def __post_init__(self) -> None:
        if self.batches < 1 or self.batch_size < 1:
            raise ValueError(f"SFS needs batches >= 1 and batch_size >= 1, got {self.batches}, {self.batch_size}")

    def rank(self, recipe: Recipe) -> ImportanceReport:
        start = time.perf_counter()
        leaks = screen_leakage(recipe, self.leakage_threshold) if self.leakage_threshold > 0 else {}
        model = recipe.untrained(seed=self.seed).model
        data = recipe.datamodule.sample_rows("train", self.batches * self.batch_size, seed=self.seed)
        kept = [f for f in seam_fields(model) if f not in leaks]
        scores = {f: s for f, s in sfs_scores(model, data, self.batch_size).items() if f in kept}
        return method_report(self, recipe, scores, start, _left_out(leaks), {"rows": len(data), "batches": -(-len(data) // self.batch_size)},
                             id_screen=self.id_screen)
