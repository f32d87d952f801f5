"""iHAS: instance-wise Hierarchical Architecture Search (methods.md section 4).

Three stages over the recipe's splits (in memory or streamed from shards, see :class:`IHAS`); the training ones are Lightning fits with manual
optimisation (:func:`recsys.train.manual.fit_split`, as :mod:`embeddings.dims.dnis`):

1. **Search.** An :class:`IHASGate` at the seam gives every instance ``i`` and sparse field
   ``f`` gate probabilities ``pi_{i,f} = sigmoid(W_f e_{i,f} + b_f)`` in ``(0, 1)^{D_f}`` (one
   small linear layer per field, on the field's own pooled embedding). Training multiplies
   the embedding by a sampled gate ``z``; the loss is::

       L = BCE + sparsity * mean(pi) + polarization * mean(pi * (1 - pi))

   (expected-L0 surrogate + bi-polarisation, maximal at 0.5, zero at 0 or 1; the means run
   over every (instance, field, dim) cell of the batch).
2. **Clustering.** Deterministic gates ``z* = 1[pi > 0.5]`` on the training split, concatenated
   over fields (N x sum D_f, binary), are grouped by a seeded K-means (:func:`kmeans`,
   k-means++ start + Lloyd's iterations, :mod:`recsys.kmeans`). We cluster the *binary masks*, not the
   masked embeddings that the Bohrium summary names: masked embeddings are dominated by the
   id's own values, so their clusters group ids rather than dimension usage, while the masks
   cluster exactly the quantity a cluster's dims are derived from, and routing then costs one
   gate pass plus a K x sum D_f distance. Cluster ``c`` gets, per field,
   ``d_{c,f} = mean_{i in c} ||z*_{i,f}||_0`` rounded *up* to a multiple of 4 (at least 4, at
   most the aligned search width). With a parameter budget (counting every cluster's model),
   dims are instead ``#{k : r_{c,f,k} >= t}`` for the activation rates ``r`` of each
   (cluster, field, dim), with the smallest global threshold ``t`` that fits (rounded the
   same way). A cluster that ends up empty (K-means can leave one when masks repeat) is
   dropped and the rest renumbered 0..K'-1, with a log line; the plan refuses empty clusters.
3. **Retraining + routing.** :meth:`IHAS.retrain` builds one model per cluster from
   ``plan.apply_cluster(schema, c)`` and trains it on the training rows the router sends to
   ``c``; :class:`IHASRoutedModel` routes each instance to its nearest centroid with the
   frozen search model's sparse arch and gate (:class:`IHASRouter`) and returns that cluster
   model's logit. Deviation, stated: cluster models start from a fresh initialisation, not
   from the searched weights truncated to the kept dims (the kept dims are not a prefix).

Gate sampling: two of 4.2's options are implemented (:class:`GateSampling`):

* ``straight_through``: ``z ~ Bernoulli(pi)`` in the forward, ``dz/dpi = 1`` in the backward;
* ``relaxed``: ``z = sigmoid((logit(pi) + log u - log(1 - u)) / tau)``, ``u ~ U(0, 1)``,
  ``tau`` annealed geometrically from ``tau_start`` (1) to ``tau_end`` (0.1) over the search.

Kept: **straight-through** (the default), measured on the planted synthetic recipe
(``tiny_config(n_rows=8000)``, width 16, 12 search epochs, K=3, ``sparsity=polarization=0.1``,
seeds 0-3; :func:`compare_sampling` reruns one seed of it):

=================  =====================  ================  ===========================
sampling           det. val AUC (mean)    active dims/208   informative - noise dims
=================  =====================  ================  ===========================
straight-through   0.655 (4/4 seeds ok)   63                7.0
relaxed            0.665 on 3 seeds;      52 (3 seeds)      4.7 (3 seeds)
                   seed 3 collapsed to
                   all gates closed (0.46)
=================  =====================  ================  ===========================

Relaxed gates reached a slightly higher AUC with fewer dims when they did not collapse, but
one seed in four closed every gate (likely: fractional gates let the sparsity term win before
the annealed temperature hardens them); straight-through trains on the hard 0/1 masks that
clustering and routing use, never collapsed, and separated the planted noise fields from the
informative ones by more dims. Stability and the planted separation decided.

Penalty scale: both penalties are *means* over the B x sum D_f cells, so their gradient per
cell is ``1 / (B sum D_f)`` of the weight; methods.md's starting values (1e-4-1e-3) closed no
gate at all here (measured: ``sparsity=1e-3``, ``polarization=1e-2``, gates starting open at ``pi = 0.88``
kept 16/16 dims of every field), hence the
defaults ``sparsity = polarization = 0.1`` and gates starting at ``pi = 0.5``
(``init_bias = 0``), where the bi-polarisation term pushes each gate away from 0.5.

::

    search = IHAS(num_clusters=2, search_epochs=6)
    plan, gate_model = search.search_with_model(recipe)
    plan.clusters                      # {0: {"item_id": 12, ...}, 1: {...}}
    routed = search.retrain(recipe, plan, gate_model)
    logits = routed(batch.dense_features, batch.sparse_features)
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from enum import Enum, unique
from typing import TYPE_CHECKING, Any, ClassVar, List

import numpy as np
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings.dims.base import DimensionSearch
from embeddings.plan import ALIGNMENT, DimensionPlan, DimensionPlanError, align_dim, check_budget, min_budget
from recsys.config import optimizer_lr
from recsys.kmeans import kmeans as shared_kmeans
from recsys.models.seam import SeamTransform
from recsys.train.manual import ManualTask, bce_loss, fit_split

if TYPE_CHECKING:
    from recsys.data.encoders import EncodedData
    from recsys.data.schema import Schema
    from recsys.data.streaming.split_view import SplitData
    from recsys.models.base import RankingModel
    from recsys.train.recipe import Recipe

__all__ = [
    "GateSampling",
    "IHAS",
    "IHASGate",
    "IHASRoutedModel",
    "IHASRouter",
    "IHASSearchTask",
    "cluster_dims",
    "kmeans",
]

log = logging.getLogger(__name__)

#: training rows whose gates a streamed split clusters when ``IHAS.cluster_rows`` is None
STREAM_CLUSTER_ROWS = 200_000


@unique
class GateSampling(str, Enum):
    """How training samples the gates ``z`` from ``pi``."""

    STRAIGHT_THROUGH = "straight_through"  # z ~ Bernoulli(pi) forward, identity gradient to pi
    RELAXED = "relaxed"  # binary Concrete / Gumbel-sigmoid at temperature tau


class IHASGate(SeamTransform):
    """Instance-wise Bernoulli gates over the dims of every sparse field, at the seam.

    Args:
        sampling: ``straight_through`` or ``relaxed`` (see the module docstring).
        sparsity: weight ``lambda_s`` of ``mean(pi)``.
        polarization: weight ``lambda_p`` of ``mean(pi * (1 - pi))``.
        temperature: ``tau`` of the relaxed gate (the search anneals it).
        init_bias: initial gate logit bias (0: every gate starts at ``pi ~ 0.5``).

    Call (training): ``e_f * z_f`` with sampled ``z_f``; (eval) ``e_f * 1[pi_f > 0.5]``;
    dense features pass through. Returns the same ``(sparse B x D_f dict, dense)`` layout.
    """

    __annotations__ = {"names": List[str]}  # noqa: RUF012, UP006 - real types for TorchScript

    def __init__(
        self,
        sampling: GateSampling | str = GateSampling.STRAIGHT_THROUGH,
        sparsity: float = 0.1,
        polarization: float = 0.1,
        temperature: float = 1.0,
        init_bias: float = 0.0,
    ) -> None:
        super().__init__()
        self.sampling = GateSampling(sampling).value
        self.relaxed: bool = self.sampling == GateSampling.RELAXED.value
        if sparsity < 0 or polarization < 0 or temperature <= 0:
            raise ValueError("sparsity and polarization must be >= 0 and temperature > 0")
        self.sparsity = float(sparsity)
        self.polarization = float(polarization)
        self.temperature: float = float(temperature)
        self.init_bias = float(init_bias)
        self.names: list[str] = []
        self.gates = nn.ModuleDict()
        self._last_probs: list[torch.Tensor] = []

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str],
             dense_dims: list[int] | None = None) -> None:
        self.names = list(sparse_names)
        gates = {}
        for name, dim in zip(sparse_names, sparse_dims):
            layer = nn.Linear(int(dim), int(dim))
            with torch.no_grad():
                layer.weight.mul_(0.1)
                layer.bias.fill_(self.init_bias)
            gates[name] = layer
        self.gates = nn.ModuleDict(gates)

    def probabilities(self, sparse: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Gate probabilities ``pi_f`` (B x D_f) per field, in the bound field order."""
        out: list[torch.Tensor] = []
        for name, layer in self.gates.items():
            out.append(torch.sigmoid(layer(sparse[name])))
        return out

    def masks(self, sparse: dict[str, torch.Tensor]) -> torch.Tensor:
        """Deterministic gates ``z* = 1[pi > 0.5]`` concatenated over fields: B x sum D_f float."""
        return torch.cat([(p > 0.5).to(p.dtype) for p in self.probabilities(sparse)], dim=1)

    def _sample(self, pi: torch.Tensor) -> torch.Tensor:
        if self.relaxed:
            u = torch.rand_like(pi).clamp(1e-6, 1.0 - 1e-6)
            logit = torch.log(pi) - torch.log1p(-pi)
            return torch.sigmoid((logit + torch.log(u) - torch.log1p(-u)) / self.temperature)
        z = torch.bernoulli(pi.detach())
        return z + (pi - pi.detach())  # exactly z in the forward, identity gradient to pi

    def forward(
        self, sparse: dict[str, torch.Tensor], dense: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        probs: list[torch.Tensor] = []
        for name, layer in self.gates.items():
            e = sparse[name]
            pi = torch.sigmoid(layer(e))
            probs.append(pi)
            z = self._sample(pi) if self.training else (pi > 0.5).to(e.dtype)
            out[name] = e * z
        for name, e in sparse.items():  # fields the gate was not bound to pass through
            if name not in out:
                out[name] = e
        if not torch.jit.is_scripting():
            self._record(probs)
        return out, dense

    @torch.jit.unused
    def _record(self, probs: list[torch.Tensor]) -> None:
        self._last_probs = probs if self.training else []

    @torch.jit.unused
    def regularization(self) -> torch.Tensor:
        """``sparsity * mean(pi) + polarization * mean(pi (1 - pi))`` of the last training
        forward (zero before one, and in eval mode)."""
        if not self._last_probs:
            return torch.zeros(())
        pi = torch.cat([p.reshape(-1) for p in self._last_probs])
        return self.sparsity * pi.mean() + self.polarization * (pi * (1 - pi)).mean()


# -- clustering ---------------------------------------------------------------------------------


def kmeans(x: np.ndarray, k: int, seed: int = 0, iterations: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Seeded K-means (k-means++ start, Lloyd's iterations); deterministic for a seed.

    :func:`recsys.kmeans.kmeans` in float64, with the k-means++ centres drawn from the distinct
    rows by ``numpy.random.default_rng(seed)``, no refill of an emptied cluster, and no inertia
    tolerance (it stops when the assignments settle).

    Args:
        x: N x D points.
        k: clusters (capped at the number of distinct points).
        seed: seeds the k-means++ draws.
        iterations: Lloyd's iterations at most (stops when assignments settle).

    Returns:
        (centroids k' x D float64, labels N int64, the first centroid on ties, as
        :class:`IHASRouter`); a centroid may end up with no point only when points repeat: the
        caller drops such clusters.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"kmeans needs a non-empty N x D array, got shape {x.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    result = shared_kmeans(
        torch.tensor(x), k, np.random.default_rng(seed), iterations=iterations, tol=None,
        seed_from_distinct=True, reseed_empty=False,
    )  # fmt: skip
    return result.centroids.numpy(), result.assign.numpy()


def cluster_dims(
    masks: np.ndarray, labels: np.ndarray, field_dims: list[int], threshold: float | None = None
) -> dict[int, list[int]]:
    """Per-cluster per-field dims from binary masks.

    Args:
        masks: N x sum D_f binary deterministic gates.
        labels: N cluster ids (every id in 0..K-1 present).
        field_dims: D_f per field, in the mask's column order.
        threshold: ``None``: the mean active dims of the cluster's instances; a number ``t``:
            the dims active in at least a share ``t`` of the cluster's instances.

    Returns:
        cluster -> dims per field, rounded up to a multiple of 4, in ``[4, align(D_f)]``.
    """
    bounds = np.cumsum([0, *field_dims])
    out: dict[int, list[int]] = {}
    for c in sorted(int(v) for v in np.unique(labels)):
        rates = masks[labels == c].mean(0)
        dims = []
        for f, d in enumerate(field_dims):
            r = rates[bounds[f] : bounds[f + 1]]
            kept = float(r.sum()) if threshold is None else float((r >= threshold).sum())
            aligned = ALIGNMENT * math.ceil(round(kept, 9) / ALIGNMENT)
            dims.append(int(min(max(aligned, ALIGNMENT), align_dim(d))))
        out[c] = dims
    return out


# -- routing ------------------------------------------------------------------------------------


class IHASRouter(nn.Module):
    """Nearest-centroid routing on the frozen search model's deterministic gates.

    Args:
        sparse_arch: the search model's sparse arch (embedding lookup).
        gate: its :class:`IHASGate` (evaluated deterministically).
        centroids: K x sum D_f.

    Call:
        kjt: KeyedJaggedTensor with the search model's sparse keys.

    Returns:
        cluster index per row, B int64 (the first centroid on ties).
    """

    def __init__(self, sparse_arch: nn.Module, gate: IHASGate, centroids: torch.Tensor) -> None:
        super().__init__()
        self.sparse_arch = sparse_arch
        self.gate = gate
        # float64, as the K-means that found them: binary masks are often equidistant from two
        # centroids, and the first-index tie break must match the search's assignment
        self.centroids: torch.Tensor
        self.register_buffer("centroids", torch.as_tensor(centroids, dtype=torch.float64).clone())
        for p in self.parameters():
            p.requires_grad_(False)
        self.eval()

    def assign(self, masks: torch.Tensor) -> torch.Tensor:
        """Nearest centroid of each mask row (B x sum D_f) -> B int64."""
        c = self.centroids
        masks = masks.to(c.dtype)
        d2 = (masks * masks).sum(1, keepdim=True) - 2 * masks @ c.t() + (c * c).sum(1).unsqueeze(0)
        return torch.argmin(d2, dim=1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.assign(self.gate.masks(self.sparse_arch(kjt)))

    def train(self, mode: bool = True) -> IHASRouter:
        """The router is frozen: it stays in eval mode (deterministic gates)."""
        return super().train(False)


class IHASRoutedModel(nn.Module):
    """The router plus one ranking model per cluster, as one module.

    Args:
        router: :class:`IHASRouter` with K centroids.
        models: K ranking models, model ``c`` built from ``plan.apply_cluster(schema, c)``.

    Call:
        dense: B x D_dense float; sparse: KJT with the schema's sparse keys.

    Returns:
        logits B: row ``i`` is cluster ``router(sparse)[i]``'s model's logit. Every cluster
        model runs on the whole batch and the routed logit is gathered per row (simple and
        scriptable; K times the tower compute).
    """

    def __init__(self, router: IHASRouter, models: list[RankingModel] | nn.ModuleList) -> None:
        super().__init__()
        if len(models) != router.centroids.shape[0]:
            raise ValueError(f"{len(models)} cluster models for {router.centroids.shape[0]} centroids")
        self.router = router
        self.models = nn.ModuleList(list(models))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        cluster = self.router(sparse)
        outs: list[torch.Tensor] = []
        for model in self.models:
            outs.append(model(dense, sparse))
        return torch.stack(outs, dim=1).gather(1, cluster.unsqueeze(1)).squeeze(1)


# -- the search ---------------------------------------------------------------------------------


class IHASSearchTask(ManualTask):
    """The gated training of the iHAS search (manual optimisation).

    Per training batch ``s`` (0-based): the gate temperature becomes
    ``tau_start * (tau_end / tau_start) ** (s / max(total_steps - 1, 1))`` (geometric
    annealing; only the relaxed gate uses it), then one step of ``optimizer`` on
    ``BCE + gate.regularization()``.

    Args:
        model: the search model, ``gate`` at its seam.
        gate: the :class:`IHASGate`.
        optimizer: optimizer of every parameter (the gate layers in their own group).
        total_steps: training batches of the whole search.
        tau_start: temperature at the first batch.
        tau_end: temperature at the last.
    """

    def __init__(self, model: RankingModel, gate: IHASGate, optimizer: torch.optim.Optimizer, total_steps: int,
                 tau_start: float, tau_end: float) -> None:
        super().__init__(model, [optimizer])
        self.gate = gate
        self.total_steps = int(total_steps)
        self.tau_start = float(tau_start)
        self.tau_end = float(tau_end)
        self.steps = 0

    def training_step(self, batch: Any, batch_idx: int) -> None:
        progress = self.steps / max(self.total_steps - 1, 1)
        self.gate.temperature = self.tau_start * (self.tau_end / self.tau_start) ** progress
        loss = bce_loss(self.model, batch) + self.gate.regularization()
        self.take_step(self.step_optimizers()[0], loss)
        self.steps += 1


@dataclass
class IHAS(DimensionSearch):
    """Instance-wise gates, K-means over deterministic gates, per-cluster dims.

    Args:
        num_clusters: K of K-means (clusters left empty are dropped).
        sampling: gate sampling (``straight_through``, kept; or ``relaxed``).
        sparsity: ``lambda_s`` of ``mean(pi)``.
        polarization: ``lambda_p`` of ``mean(pi (1 - pi))``.
        tau_start: initial temperature of the relaxed gate.
        tau_end: final temperature (geometric annealing over the search steps).
        gate_lr: Adam learning rate of the gate layers (the rest: ``model.optimizer``'s ``lr``).
        init_bias: initial gate logit bias (``pi = sigmoid(init_bias)`` at the start).
        width: search width of every table (default: the recipe's dims).
        search_epochs: epochs of gated training.
        retrain_epochs: epochs of each cluster model's training in :meth:`retrain` (with
            ``retrain_patience``: the most epochs).
        retrain_patience: 0 trains ``retrain_epochs`` epochs; N > 0 trains the cluster models
            epoch by epoch in lockstep to the routed model's validation plateau: stop after N
            epochs without a better validation AUC and keep the best epoch's weights (as
            ``salience fit``'s early stopping on ``val_auc``).
        batch_size: rows per batch (default: the recipe's ``data.batch_size``).
        max_steps: cap on the steps of the search (and of each retraining); for tests.
        seed: seeds initialisation, batch order, gate sampling and K-means.
        cluster_rows: cluster the gates of a seeded uniform sample of at most this many
            training rows (:func:`~recsys.data.streaming.split_view.sample_rows`; the masks are
            N x sum D_f floats). None: every row of a split in memory, and
            :data:`STREAM_CLUSTER_ROWS` rows of a streamed one.

    On a streaming data module (``data.streaming``/``data.shards``) nothing loads a whole split:
    the search trains in the streamed seeded order, the validation AUCs are computed shard by
    shard, the clustering sees the sample above, and :meth:`retrain` routes the training
    shards once (one int per row) and trains each cluster model on a streamed view of its rows.
    """

    name: ClassVar[str] = "ihas"

    num_clusters: int = 2
    sampling: GateSampling | str = GateSampling.STRAIGHT_THROUGH
    sparsity: float = 0.1
    polarization: float = 0.1
    tau_start: float = 1.0
    tau_end: float = 0.1
    gate_lr: float = 0.01
    init_bias: float = 0.0
    width: int | None = None
    search_epochs: int = 5
    retrain_epochs: int = 2
    retrain_patience: int = 0
    batch_size: int | None = None
    max_steps: int | None = None
    seed: int = 0
    cluster_rows: int | None = None

    def __post_init__(self) -> None:
        self.sampling = GateSampling(self.sampling)
        if self.num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {self.num_clusters}")
        if self.width is not None and (int(self.width) < ALIGNMENT or int(self.width) % ALIGNMENT):
            raise ValueError(f"width must be a positive multiple of {ALIGNMENT}, got {self.width}")
        if self.search_epochs < 1 or self.retrain_epochs < 1:
            raise ValueError("search_epochs and retrain_epochs must be >= 1")
        if self.retrain_patience < 0:
            raise ValueError(f"retrain_patience must be >= 0, got {self.retrain_patience}")
        if not 0 < self.tau_end <= self.tau_start:
            raise ValueError(f"need 0 < tau_end <= tau_start, got {self.tau_end}, {self.tau_start}")

    def search(self, recipe: Recipe, budget: int | None = None) -> DimensionPlan:
        """Search gates, cluster the training instances and derive per-cluster dims.

        Returns:
            a cluster plan (``clusters``, ``cluster_sizes``, ``dims`` = widest per feature)
            with ``extras``: ``centroids`` (K x sum D_f lists), ``field_order``,
            ``field_widths``, ``cluster_share``, ``active_dims`` (cluster -> feature -> mean
            active dims), ``gate_stats`` (per feature: mean pi, share of pi within 0.1 of 0
            or 1, mean active dims), ``threshold`` (None, or the budget's rate threshold),
            ``dropped_clusters``, ``searched_val_auc`` (deterministic gates),
            ``stochastic_val_auc`` (sampled gates), ``search_seconds``.

        Raises:
            DimensionPlanError: no sparse feature, or a budget below 4 dims per feature in
                every cluster model.
        """
        return self.search_with_model(recipe, budget)[0]

    def search_with_model(self, recipe: Recipe, budget: int | None = None) -> tuple[DimensionPlan, RankingModel]:
        """:meth:`search`, also returning the gated search model (eval mode) for routing."""
        start = time.perf_counter()
        schema, train, val, batch_size, model_cfg = self._setup(recipe)
        if budget is not None:
            budget = check_budget(schema, budget)
            need = self.num_clusters * min_budget(schema)
            if budget < need:
                raise DimensionPlanError(
                    f"budget {budget} is below {need}, 4 dims per feature in each of the {self.num_clusters} "
                    "cluster models: raise the budget or lower num_clusters"
                )
        model, gate = self._search_model(schema, model_cfg)
        total_steps = self.search_epochs * math.ceil(len(train) / batch_size)
        if self.max_steps is not None:
            total_steps = min(total_steps, self.max_steps)
        gate_ids = {id(p) for p in gate.parameters()}
        groups: list[dict[str, Any]] = [
            {"params": [p for p in model.parameters() if id(p) not in gate_ids]},
            {"params": list(gate.parameters()), "lr": self.gate_lr},
        ]
        task = IHASSearchTask(model, gate, torch.optim.Adam(groups, lr=optimizer_lr(model_cfg)),
                              total_steps, self.tau_start, self.tau_end)
        fit_split(task, train, batch_size=batch_size, epochs=self.search_epochs, seed=self.seed,
                  max_batches=total_steps, quiet=recipe.quiet, root_dir=recipe.workdir)
        model.eval()
        searched_auc = _evaluate(model, val, 4 * batch_size)
        torch.manual_seed(self.seed)
        stochastic_auc = _evaluate(model, val, 4 * batch_size, train_mode=True)
        masks, probs = _gate_outputs(model, gate, self._cluster_sample(train), 4 * batch_size)
        plan = self._derive(schema, gate, masks, probs, budget, searched_auc, stochastic_auc, start)
        return plan, model

    def _cluster_sample(self, train: SplitData) -> EncodedData:
        """The training rows whose gates are clustered (see ``cluster_rows``)."""
        from recsys.data.streaming.split_view import SplitView, sample_rows

        cap = self.cluster_rows if self.cluster_rows is not None else (
            STREAM_CLUSTER_ROWS if isinstance(train, SplitView) else len(train))
        if cap < len(train):
            log.info("iHAS clusters the gates of %d sampled training rows of %d", cap, len(train))
        return sample_rows(train, max(int(cap), 1), seed=self.seed)

    def _setup(self, recipe: Recipe) -> tuple[Schema, SplitData, SplitData, int, dict[str, Any]]:
        from recsys.data.schema import Schema

        dm = recipe.datamodule
        schema = Schema.from_dict(dm.schema_dict)
        if not schema.sparse:
            raise DimensionPlanError("the recipe has no sparse feature: there is nothing to search dims for")
        if self.width is not None:
            schema = schema.with_uniform_dim(int(self.width))
        train, val = dm.split_data("train"), dm.split_data("val")  # streamed views when streaming
        if train is None or val is None:
            raise ValueError("iHAS needs non-empty train and val splits (data.split)")
        return schema, train, val, int(self.batch_size or dm.batch_size), dict(recipe.config.get("model") or {})

    def _search_model(self, schema: Schema, model_cfg: dict[str, Any]) -> tuple[RankingModel, IHASGate]:
        from recsys.models.backbone import build_backbone
        from recsys.models.base import EmbeddingKernel, SparseArchConfig

        torch.manual_seed(self.seed)
        model = build_backbone(model_cfg.get("backbone"), schema, SparseArchConfig(kernel=EmbeddingKernel.PLAIN))
        gate = IHASGate(self.sampling, self.sparsity, self.polarization, self.tau_start, self.init_bias)
        model.set_seam(gate)
        return model, gate

    def _derive(
        self,
        schema: Schema,
        gate: IHASGate,
        masks: np.ndarray,
        probs: np.ndarray,
        budget: int | None,
        searched_auc: float,
        stochastic_auc: float,
        start: float,
    ) -> DimensionPlan:
        names = list(gate.names)
        widths = [int(schema[n].embedding_dim) for n in names]
        centroids, labels = kmeans(masks, self.num_clusters, seed=self.seed)
        used = sorted(int(c) for c in np.unique(labels))
        dropped = [c for c in range(len(centroids)) if c not in used]
        if dropped:
            log.info("iHAS: K-means left cluster(s) %s empty; dropped, the rest renumbered", dropped)
        centroids = centroids[used]
        labels = np.searchsorted(np.asarray(used), labels)
        sizes = np.bincount(labels, minlength=len(used))
        rows = {n: int(schema[n].num_embeddings or 0) for n in names}

        def params(dims: dict[int, list[int]]) -> int:
            return sum(rows[n] * d for ds in dims.values() for n, d in zip(names, ds))

        threshold: float | None = None
        dims = cluster_dims(masks, labels, widths)
        if budget is not None:
            # the smallest rate threshold (most parameters) whose plan fits; above every rate
            # each dim is 4, which the budget check guaranteed fits
            rates = np.unique(np.concatenate([masks[labels == c].mean(0) for c in range(len(used))] + [np.zeros(1)]))
            candidates = [*rates.tolist(), float(np.nextafter(rates[-1], np.inf))]
            lo, hi = 0, len(candidates) - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if params(cluster_dims(masks, labels, widths, candidates[mid])) <= budget:
                    hi = mid
                else:
                    lo = mid + 1
            threshold = candidates[lo]
            dims = cluster_dims(masks, labels, widths, threshold)
        bounds = np.cumsum([0, *widths])
        active = {
            c: {n: float(masks[labels == c][:, bounds[f] : bounds[f + 1]].sum(1).mean()) for f, n in enumerate(names)}
            for c in range(len(used))
        }
        gate_stats = {
            n: {
                "mean_pi": float(probs[:, bounds[f] : bounds[f + 1]].mean()),
                "polarized_share": float((np.abs(probs[:, bounds[f] : bounds[f + 1]] - 0.5) > 0.4).mean()),
                "mean_active_dims": float(masks[:, bounds[f] : bounds[f + 1]].sum(1).mean()),
            }
            for f, n in enumerate(names)
        }
        clusters = {c: dict(zip(names, ds)) for c, ds in dims.items()}
        return DimensionPlan(
            dims={n: max(clusters[c][n] for c in clusters) for n in names},
            clusters=clusters,
            cluster_sizes={c: int(sizes[c]) for c in clusters},
            method=self.name,
            dataset=schema.name,
            num_embeddings=rows,
            config={**self.describe(), "budget": budget},
            extras={
                "centroids": centroids.tolist(),
                "field_order": names,
                "field_widths": widths,
                "cluster_share": {c: float(sizes[c] / len(labels)) for c in clusters},
                "active_dims": active,
                "gate_stats": gate_stats,
                "threshold": threshold,
                "dropped_clusters": dropped,
                "searched_val_auc": searched_auc,
                "stochastic_val_auc": stochastic_auc,
                "search_seconds": time.perf_counter() - start,
            },
        )

    # -- retraining ----------------------------------------------------------------------------
    def router(self, plan: DimensionPlan, gate_model: RankingModel) -> IHASRouter:
        """The router of ``plan``'s centroids on a frozen copy of the search model."""
        frozen = copy.deepcopy(gate_model).eval()
        if not isinstance(frozen.seam, IHASGate):
            raise ValueError("the search model has no IHASGate at its seam: pass search_with_model's model")
        centroids = torch.tensor(plan.extras["centroids"], dtype=torch.float64)
        if sorted(plan.clusters) != list(range(len(centroids))):
            raise DimensionPlanError(f"plan clusters {sorted(plan.clusters)} do not match {len(centroids)} centroids")
        return IHASRouter(frozen.sparse_arch, frozen.seam, centroids)

    def retrain(self, recipe: Recipe, plan: DimensionPlan, gate_model: RankingModel) -> IHASRoutedModel:
        """Train one model per cluster on the training rows routed to it; return the routed model.

        Args:
            recipe: the recipe searched on.
            plan: :meth:`search`'s plan.
            gate_model: the search model from :meth:`search_with_model`.

        Raises:
            DimensionPlanError: a cluster with no training row under the router (name given).
        """
        return self.retrain_with_record(recipe, plan, gate_model)[0]

    def retrain_with_record(
        self, recipe: Recipe, plan: DimensionPlan, gate_model: RankingModel
    ) -> tuple[IHASRoutedModel, dict[str, Any]]:
        """:meth:`retrain`, also returning how it went: ``epochs_run``, ``best_epoch`` (1-based, the
        weights kept) and ``best_val_auc`` (the routed model's; None without ``retrain_patience``)."""
        from recsys.data.streaming.split_view import SplitView
        from recsys.models.backbone import build_backbone
        from recsys.models.base import EmbeddingKernel, SparseArchConfig

        schema, train, val, batch_size, model_cfg = self._setup(recipe)
        router = self.router(plan, gate_model)
        if isinstance(train, SplitView):  # route shard by shard; train on a streamed view per cluster
            per_shard = [_route(router, train.load(i), 4 * batch_size) if n else np.zeros(0, dtype=np.int64)
                         for i, n in enumerate(train.shard_rows())]
        else:
            assigned = _route(router, train, 4 * batch_size)
        tasks: list[tuple[ManualTask, SplitData]] = []
        models: list[RankingModel] = []
        for c in sorted(plan.clusters):
            part: SplitData
            if isinstance(train, SplitView):
                part = train.subset([np.flatnonzero(a == c) for a in per_shard])
            else:
                part = train.take(np.flatnonzero(assigned == c))
            if len(part) == 0:
                raise DimensionPlanError(f"cluster {c} gets no training row under the router: search again or use fewer clusters")
            torch.manual_seed(self.seed + 1 + c)
            model = build_backbone(model_cfg.get("backbone"), plan.apply_cluster(schema, c), SparseArchConfig(kernel=EmbeddingKernel.PLAIN))
            task = ManualTask(model, [torch.optim.Adam(model.parameters(), lr=optimizer_lr(model_cfg))])
            if not self.retrain_patience:  # a fixed budget: each cluster model trains its epochs in turn
                fit_split(task, part, batch_size=batch_size, epochs=self.retrain_epochs, seed=self.seed + c,
                          max_batches=self.max_steps, quiet=recipe.quiet, root_dir=recipe.workdir)
            tasks.append((task, part))
            models.append(model)
        routed = IHASRoutedModel(router, models)
        if not self.retrain_patience:
            return routed.eval(), {"epochs_run": self.retrain_epochs, "best_epoch": self.retrain_epochs, "best_val_auc": None}
        record = self._retrain_to_plateau(routed, tasks, val, batch_size, recipe)
        return routed.eval(), record

    def _retrain_to_plateau(self, routed: IHASRoutedModel, tasks: list[tuple[ManualTask, SplitData]],
                            val: SplitData, batch_size: int, recipe: Recipe) -> dict[str, Any]:
        """Epoch ``e`` of every cluster model in turn, then the routed model's validation AUC; stop
        after ``retrain_patience`` epochs without a better one and load the best epoch's weights."""
        best_auc, best_epoch, best_state, stale = -math.inf, 0, None, 0
        left: list[int | None] = [self.max_steps] * len(tasks)  # batch caps (tests)
        epoch = 0
        for epoch in range(1, self.retrain_epochs + 1):
            for c, (task, part) in enumerate(tasks):
                cap = left[c]
                used = fit_split(task, part, batch_size=batch_size, epochs=1, seed=self.seed + c, epoch_offset=epoch - 1,
                                 max_batches=cap, quiet=recipe.quiet, root_dir=recipe.workdir)
                left[c] = None if cap is None else cap - used
            auc = _evaluate(routed, val, 4 * batch_size)
            if auc > best_auc:
                best_auc, best_epoch, best_state, stale = auc, epoch, copy.deepcopy(routed.models.state_dict()), 0
            else:
                stale += 1
            if stale >= self.retrain_patience or all(n is not None and n <= 0 for n in left):
                break
        if best_state is not None:
            routed.models.load_state_dict(best_state)
        return {"epochs_run": epoch, "best_epoch": best_epoch, "best_val_auc": None if best_state is None else best_auc}


def compare_sampling(recipe: Recipe, **options: Any) -> dict[str, dict[str, Any]]:
    """Run the search with each :class:`GateSampling` and report the deterministic-gate
    validation AUC and per-feature mean active dims (the measurement behind the default)."""
    out = {}
    for sampling in GateSampling:
        plan = IHAS(sampling=sampling.value, **options).search(recipe)
        out[sampling.value] = {
            "searched_val_auc": plan.extras["searched_val_auc"],
            "stochastic_val_auc": plan.extras["stochastic_val_auc"],
            "mean_active_dims": {n: s["mean_active_dims"] for n, s in plan.extras["gate_stats"].items()},
        }
    return out


# -- helpers ------------------------------------------------------------------------------------


def _evaluate(model: nn.Module, data: SplitData, batch_size: int, train_mode: bool = False) -> float:
    """AUC of ``model`` on ``data`` without gradients (``train_mode``: sampled gates)."""
    from recsys.train.evaluation import evaluate

    return evaluate(model, data, batch_size, train_mode)["auc"]


def _gate_outputs(model: RankingModel, gate: IHASGate, data: EncodedData, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic masks and probabilities on every row of ``data``: N x sum D_f each."""
    from recsys.data.batching import BatchDataset

    masks, probs = [], []
    model.eval()
    with torch.no_grad():
        for batch in BatchDataset(data, batch_size):
            pi = torch.cat(gate.probabilities(model.sparse_arch(batch.sparse_features)), dim=1)
            probs.append(pi.numpy())
            masks.append((pi > 0.5).numpy().astype(np.float64))
    return np.concatenate(masks), np.concatenate(probs).astype(np.float64)


def _route(router: IHASRouter, data: EncodedData, batch_size: int) -> np.ndarray:
    from recsys.data.batching import BatchDataset

    with torch.no_grad():
        return np.concatenate([router(b.sparse_features).numpy() for b in BatchDataset(data, batch_size)])
