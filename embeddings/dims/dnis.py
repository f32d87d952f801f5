"""DNIS: Differentiable Neural Input Search (Cheng et al.; methods.md section 3).

A soft selection mask ``alpha_f in [0, 1]^{n_b x K}`` per sparse feature scales every
(frequency block, dimension) cell of the feature's table; a bi-level search trains the tables
on training batches and the masks on validation batches; thresholding the masks gives
per-(feature, block) dims.

Search space (3.1). Vocabularies are ordered by descending frequency with the OOV id at row 0
(:mod:`recsys.data.encoders`), so a frequency block is a contiguous id range. ``blocks`` gives
the cut as fractions of the table (each block ``floor(fraction x N)`` rows, the last absorbing
the remainder; the DNIS MovieLens scripts use ``[0.1, 0.2, 0.2, 0.2, 0.3]``) or, when the
first entry exceeds 1, as absolute sizes (a trailing 0 = the rest, as the Criteo script's
frequency decades). Blocks that come out empty on a small table are dropped, so a 3-row table
has one block; a hashed feature (ids not frequency-ordered) always has one block;
``blocks=(1.0,)`` is the feature-level search. The mask is applied to the table *weight* with
``torch.nn.utils.parametrize``::

    E_masked = E * alpha[block_of_row]          # N x K, what the EmbeddingBag looks up

so single- and multi-hot (sum- or mean-pooled) bags look up masked rows, the sparse arch stays
a plain torchrec ``EmbeddingBagCollection`` and gradients reach both ``E`` and ``alpha``. The
FBGEMM-fused kernel keeps its tables inside the kernel and is refused; the search always
builds its own plain-kernel model whatever the recipe's ``model.embedding_kernel``.

Optimisation (3.2, first-order DARTS, the reference's run-script values as defaults):

1. warm start: ``warm_start_epochs`` of ordinary training (Adam at the recipe's
   ``model.optimizer``'s ``lr``, every parameter) with alpha fixed at 1;
2. per training batch: a *weight step* (fresh Adam, ``lr_w``) on the embedding tables only:
   the tower keeps its warm-start weights (``freeze_tower=True`` replicates the reference;
   methods.md 9.4), then an *alpha step* on the next validation batch: loss = BCE +
   ``l1 x sum|alpha|``, the alpha gradient divided by its mean absolute value per block row
   (+1e-8), plain SGD at ``lr_a``, alpha clamped to [0, 1].

Both phases are Lightning fits (:func:`recsys.train.manual.fit_split`, manual optimisation;
the second is :class:`DNISSearchTask`): epoch ``e`` of a phase walks the training split in the
seeded order of epoch ``e`` (the search's epochs numbered after the warm start's), and
``max_steps`` caps the training batches of each phase.
On a streaming data module (``data.streaming``/``data.shards``) both splits are read from their
shards (:mod:`recsys.data.streaming.split_view`, memory bounded by a few shards): training in the streamed
seeded order, the alpha steps' validation batches cycled from a streamed shuffle, every
validation AUC shard by shard.

Deviations, stated: an epoch is one pass over the *training* split with validation batches
cycled (the reference zips the loaders and stops at the shorter); the epoch counts are fixed
(no ReduceLROnPlateau stopping, no best-checkpoint reload).

Deriving dims (3.3): one global threshold ``t``; block ``b`` of feature ``f`` keeps
``d_fb = #{k : alpha_fbk >= t}`` dimensions, rounded *up* to a multiple of 4 (at least 4, at
most the search width). With a budget, ``t`` is the *smallest* threshold whose plan fits (the
most parameters within the budget); without one, the largest threshold of the sweep whose
hard-masked validation AUC is within ``auc_tolerance`` of the searched model's, or
``threshold`` when no tolerance is set. The sweep evaluates, at each threshold, the search
model with hard masks (each block row keeps its top-``d_fb`` alpha values, the rest zeroed),
without retraining.

::

    search = DNIS(warm_start_epochs=2, search_epochs=3)
    plan = search.search(recipe, budget=budget_of(recipe.schema, 16) // 2)
    plan.blocks["item"]                  # (FrequencyBlock(0, 120, 16), FrequencyBlock(120, None, 4))
    plan.extras["sweep"]                 # [{threshold, parameters, val_auc}, ...]
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from embeddings.dims.base import DimensionSearch
from embeddings.plan import ALIGNMENT, DimensionPlan, DimensionPlanError, FrequencyBlock, align_dim, check_budget
from recsys.config import optimizer_lr
from recsys.train.manual import ManualTask, bce_loss, fit_split

if TYPE_CHECKING:
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from recsys.data.schema import Schema
    from recsys.data.streaming.split_view import SplitData
    from recsys.models.base import RankingModel, SparseArch
    from recsys.train.recipe import Recipe

__all__ = [
    "DNIS",
    "BlockMask",
    "DNISSearchTask",
    "block_bounds",
    "derive_dims",
    "hard_alpha",
    "mask_tables",
    "normalize_alpha_grads",
    "plan_parameters",
    "replan",
]

#: added to the mean absolute gradient of a block row before dividing by it (reference value)
GRAD_EPS = 1e-8


def block_bounds(num_embeddings: int, spec: Sequence[float]) -> list[tuple[int, int]]:
    """Contiguous id ranges ``[(start, stop), ...]`` covering ``num_embeddings`` rows.

    Args:
        num_embeddings: table rows N.
        spec: fractions (each block ``floor(fraction x N)`` rows, the last block takes the
            remainder) or, when ``spec[0] > 1``, absolute block sizes (the last block, or a
            trailing 0, takes the remainder).

    Returns:
        the non-empty blocks in id order (at least one).
    """
    n = int(num_embeddings)
    spec = [float(s) for s in spec]
    if not spec or any(s < 0 or not math.isfinite(s) for s in spec):
        raise ValueError(f"blocks must be a non-empty list of non-negative numbers, got {spec}")
    if n < 1:
        raise ValueError(f"a table needs at least one row, got num_embeddings={n}")
    absolute = spec[0] > 1
    if not absolute and sum(spec) > 1 + 1e-9:
        raise ValueError(f"block fractions must sum to at most 1, got {spec} (sum {sum(spec)})")
    sizes = [int(s) if absolute else int(math.floor(s * n)) for s in spec[:-1]]
    bounds, start = [], 0
    for size in sizes:
        stop = min(start + size, n)
        if stop > start:
            bounds.append((start, stop))
        start = stop
    if start < n:
        bounds.append((start, n))
    return bounds


class BlockMask(nn.Module):
    """The soft selection layer of one table: ``weight -> weight * alpha[block_of_row]``.

    Registered on an ``nn.EmbeddingBag``'s ``weight`` with
    ``torch.nn.utils.parametrize.register_parametrization``.

    Args:
        bounds: the table's frequency blocks ``[(start, stop), ...]`` (contiguous from 0).
        dim: the table's width K.

    Attributes:
        alpha (nn.Parameter): n_b x K mask, initialised to ones.
        row_block (Tensor): N, the block of every row.
    """

    def __init__(self, bounds: Sequence[tuple[int, int]], dim: int) -> None:
        super().__init__()
        self.bounds = [(int(a), int(b)) for a, b in bounds]
        row_block = torch.cat([torch.full((b - a,), i, dtype=torch.long) for i, (a, b) in enumerate(self.bounds)])
        self.row_block: torch.Tensor
        self.register_buffer("row_block", row_block, persistent=False)
        self.alpha = nn.Parameter(torch.ones(len(self.bounds), int(dim)))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.alpha.index_select(0, self.row_block)


def _ebc(model: RankingModel) -> EmbeddingBagCollection:
    arch = model.sparse_arch
    if getattr(arch, "is_fused", False):
        raise ValueError(
            "DNIS masks the embedding tables' weights, which the FBGEMM-fused kernel keeps inside the kernel: "
            "build the search model with SparseArchConfig(kernel=EmbeddingKernel.PLAIN) (model.embedding_kernel: plain)"
        )
    ebc = getattr(arch, "embedding_bag_collection", None)
    if ebc is None:
        raise ValueError("the model has no sparse feature: there is no embedding table to search dims for")
    return cast("EmbeddingBagCollection", ebc)  # the plain kernel's torchrec EBC


def mask_tables(model: RankingModel, blocks: Sequence[float] = (1.0,), schema: Schema | None = None) -> dict[str, BlockMask]:
    """Install a :class:`BlockMask` on every embedding table of a plain-kernel model.

    Args:
        model: a ranking model with the plain kernel (its tables are ``t_<feature>``).
        blocks: frequency-block spec (see :func:`block_bounds`).
        schema: the model's schema (default ``model.schema``); hashed features get one block.

    Returns:
        feature -> its mask (the ``alpha`` parameters live inside the model, under
        ``...embedding_bags.t_<feature>.parametrizations.weight``).

    Raises:
        ValueError: a fused-kernel model (name the switch), a model without sparse features, or
            a table that already has a parametrization.
    """
    _ebc(model)  # a plain-kernel model with sparse features, or a clear error
    arch = cast("SparseArch", model.sparse_arch)
    schema = schema or model.schema
    masks: dict[str, BlockMask] = {}
    for name in model.sparse_names:
        bag = arch.table(name)
        if parametrize.is_parametrized(bag, "weight"):
            raise ValueError(f"the table of {name!r} is already masked (mask_tables was called twice)")
        n, dim = bag.weight.shape
        spec = (1.0,) if schema[name].hash_size is not None else blocks
        mask = BlockMask(block_bounds(n, spec), dim).to(bag.weight.device)
        parametrize.register_parametrization(bag, "weight", mask)
        masks[name] = mask
    return masks


def table_weights(model: RankingModel) -> list[nn.Parameter]:
    """The raw (unmasked) table weights ``E`` of a masked or unmasked plain-kernel model."""
    ebc = _ebc(model)
    out = []
    for bag in ebc.embedding_bags.values():
        out.append(bag.parametrizations.weight.original if parametrize.is_parametrized(bag, "weight") else bag.weight)
    return out


def normalize_alpha_grads(masks: dict[str, BlockMask] | Sequence[BlockMask]) -> None:
    """Divide each alpha gradient by its mean absolute value per block row (+1e-8), in place."""
    for mask in masks.values() if isinstance(masks, dict) else masks:
        g = mask.alpha.grad
        if g is not None:
            g.div_(g.abs().mean(dim=-1, keepdim=True) + GRAD_EPS)


def _block_dims(alpha: np.ndarray, threshold: float, width: int) -> np.ndarray:
    """Per block row of ``alpha`` (n_b x K): ``#{alpha >= t}`` rounded up to 4, in [4, align(K)]."""
    kept = (alpha >= threshold).sum(axis=-1)
    cap = align_dim(width)
    return np.minimum(np.maximum(ALIGNMENT * np.ceil(kept / ALIGNMENT), ALIGNMENT), cap).astype(int)


def derive_dims(alphas: dict[str, np.ndarray], threshold: float) -> dict[str, list[int]]:
    """Feature -> dim per frequency block at a global ``threshold`` (see the module docstring)."""
    return {n: _block_dims(np.asarray(a), threshold, np.asarray(a).shape[-1]).tolist() for n, a in alphas.items()}


def plan_parameters(dims: dict[str, list[int]], bounds: dict[str, list[tuple[int, int]]]) -> int:
    """Embedding parameters of per-block dims: sum of block rows x block dim."""
    return int(sum((b - a) * d for n in dims for (a, b), d in zip(bounds[n], dims[n])))


def hard_alpha(alpha: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """``alpha`` with only its top-``dims[b]`` values kept in each block row ``b`` (the rest 0):
    the masked table that a rebuilt block of width ``dims[b]`` starts from."""
    out = torch.zeros_like(alpha)
    order = torch.argsort(alpha, dim=-1, descending=True, stable=True)
    for b, d in enumerate(dims):
        keep = order[b, : int(d)]
        out[b, keep] = alpha[b, keep]
    return out


def _to_plan_blocks(bounds: list[tuple[int, int]], dims: list[int]) -> tuple[FrequencyBlock, ...]:
    """Frequency blocks with adjacent equal dims merged; the last block open-ended."""
    merged: list[list[int]] = []
    for (a, b), d in zip(bounds, dims):
        if merged and merged[-1][2] == d:
            merged[-1][1] = b
        else:
            merged.append([a, b, d])
    return tuple(FrequencyBlock(a, None if i == len(merged) - 1 else b, d) for i, (a, b, d) in enumerate(merged))


class DNISSearchTask(ManualTask):
    """The bi-level phase of DNIS (manual optimisation; 3.2 of methods.md).

    Per training batch: a *weight step* (``weight_optimizer``, BCE on the batch; the alpha
    gradient it leaves is discarded), then an *alpha step* on the next validation batch:
    loss = BCE + ``l1 x sum|alpha|``, each alpha gradient divided by its mean absolute value
    per block row (+1e-8, :func:`normalize_alpha_grads`), ``alpha_optimizer`` steps, alpha
    clamped to [0, 1].

    Args:
        model: the masked plain-kernel ranking model.
        masks: its masks (:func:`mask_tables`), feature -> :class:`BlockMask` (n_b x K alpha).
        weight_optimizer: optimizer of the weight step (Adam at ``lr_w``).
        alpha_optimizer: optimizer of the alpha step (SGD at ``lr_a``).
        val_batches: endless validation batches (one per training batch).
        l1: weight of ``sum |alpha|``.
    """

    def __init__(
        self,
        model: RankingModel,
        masks: dict[str, BlockMask],
        weight_optimizer: torch.optim.Optimizer,
        alpha_optimizer: torch.optim.Optimizer,
        val_batches: Iterator[Any],
        l1: float,
    ) -> None:
        super().__init__(model, [weight_optimizer, alpha_optimizer])
        self.masks = dict(masks)  # modules of ``model`` already (its tables' parametrizations)
        self.val_batches = val_batches
        self.l1 = float(l1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        weight_opt, alpha_opt = self.step_optimizers()
        self.take_step(weight_opt, bce_loss(self.model, batch))
        alpha_opt.zero_grad(set_to_none=True)
        alphas = [m.alpha for m in self.masks.values()]
        loss = bce_loss(self.model, next(self.val_batches)) + self.l1 * sum(a.abs().sum() for a in alphas)
        self.manual_backward(loss)
        normalize_alpha_grads(self.masks)
        alpha_opt.step()
        with torch.no_grad():
            for a in alphas:
                a.clamp_(0.0, 1.0)


@dataclass
class DNIS(DimensionSearch):
    """Differentiable Neural Input Search over (frequency block x dimension) masks.

    Args:
        blocks: frequency-block spec per table (fractions, or absolute sizes when the first
            entry exceeds 1; see :func:`block_bounds`); ``(1.0,)`` searches per feature.
        width: search width K of every table (default: each feature's dim in the recipe).
        warm_start_epochs: epochs of ordinary training with alpha fixed at 1.
        search_epochs: epochs of alternating weight / alpha steps.
        lr_w: Adam learning rate of the search's weight steps.
        lr_a: SGD learning rate of the alpha steps.
        l1: weight of ``sum |alpha|`` in the validation loss.
        freeze_tower: weight steps update the embedding tables only (the reference); False
            also trains the tower (dense and interaction layers) in the weight steps.
        batch_size: rows per batch (default: the recipe's ``data.batch_size``).
        threshold: the threshold used when neither a budget nor ``auc_tolerance`` is given.
        auc_tolerance: without a budget, take the largest swept threshold whose hard-masked
            validation AUC is at least the searched model's minus this.
        sweep_points: thresholds in the parameters-vs-AUC sweep (alpha quantiles).
        max_steps: cap on the steps of each phase (warm start, search); for tests.
        eval_rows: score the warm-start, searched and swept models on a seeded sample of at most
            this many validation rows (None: every row; the sweep evaluates ``sweep_points``
            models, each a whole pass over the split: 4.5M rows at Criteo-Kaggle scale).
        seed: seeds the search model's initialisation and the batch order.
    """

    name: ClassVar[str] = "dnis"

    blocks: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4)
    width: int | None = None
    warm_start_epochs: int = 2
    search_epochs: int = 5
    lr_w: float = 1e-3
    lr_a: float = 0.01
    l1: float = 1e-5
    freeze_tower: bool = True
    batch_size: int | None = None
    threshold: float = 0.5
    auc_tolerance: float | None = None
    sweep_points: int = 11
    max_steps: int | None = None
    eval_rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        self.blocks = tuple(float(b) for b in self.blocks)
        if self.eval_rows is not None and self.eval_rows < 1:
            raise ValueError(f"eval_rows must be >= 1 or None, got {self.eval_rows}")
        block_bounds(1000, self.blocks)  # validates the spec
        if self.width is not None and (int(self.width) < ALIGNMENT or int(self.width) % ALIGNMENT):
            raise ValueError(f"width must be a positive multiple of {ALIGNMENT}, got {self.width}")
        if self.warm_start_epochs < 0 or self.search_epochs < 1:
            raise ValueError("warm_start_epochs must be >= 0 and search_epochs >= 1")
        if self.lr_w <= 0 or self.lr_a <= 0 or self.l1 < 0:
            raise ValueError("lr_w and lr_a must be > 0 and l1 >= 0")
        if self.sweep_points < 2:
            raise ValueError(f"sweep_points must be >= 2, got {self.sweep_points}")

    # -- the search ------------------------------------------------------------------------
    def search(self, recipe: Recipe, budget: int | None = None) -> DimensionPlan:
        """Search masks on ``recipe``'s train/val splits and derive a plan.

        Returns:
            a plan with per-(feature, block) dims in ``blocks`` (features whose blocks all
            got one dim only in ``dims``) and ``extras``: ``alpha`` (feature -> n_b x K lists),
            ``block_bounds``, ``threshold``, ``sweep`` ([{threshold, parameters, val_auc}]),
            ``warm_start_val_auc``, ``searched_val_auc``, ``search_seconds``.

        Raises:
            DimensionPlanError: a budget below one dim of 4 per feature.
        """
        from recsys.data.schema import Schema
        from recsys.models.backbone import build_backbone
        from recsys.models.base import EmbeddingKernel, SparseArchConfig

        start = time.perf_counter()
        dm = recipe.datamodule
        schema = Schema.from_dict(dm.schema_dict)
        if not schema.sparse:
            raise DimensionPlanError("the recipe has no sparse feature: there is nothing to search dims for")
        if self.width is not None:
            schema = schema.with_uniform_dim(int(self.width))
        if budget is not None:
            budget = check_budget(schema, budget)
        model_cfg = dict(recipe.config.get("model") or {})
        train, val = dm.split_data("train"), dm.split_data("val")  # streamed views when streaming
        if train is None or val is None:
            raise ValueError("DNIS needs non-empty train and val splits (data.split)")
        batch_size = int(self.batch_size or dm.batch_size)

        torch.manual_seed(self.seed)
        model = build_backbone(model_cfg.get("backbone"), schema, SparseArchConfig(kernel=EmbeddingKernel.PLAIN))
        masks = mask_tables(model, self.blocks, schema)
        alphas = [m.alpha for m in masks.values()]
        phase: dict[str, Any] = {"batch_size": batch_size, "seed": self.seed, "max_batches": self.max_steps,
                                 "quiet": recipe.quiet, "root_dir": recipe.workdir}

        # 1. warm start: ordinary training, alpha fixed at 1
        for a in alphas:
            a.requires_grad_(False)
        others = [p for p in model.parameters() if all(p is not a for a in alphas)]
        warm = ManualTask(model, [torch.optim.Adam(others, lr=optimizer_lr(model_cfg))])
        fit_split(warm, train, epochs=self.warm_start_epochs, **phase)
        scored = val
        if self.eval_rows is not None and len(val) > self.eval_rows:
            from recsys.data.streaming.split_view import sample_rows

            scored = sample_rows(val, int(self.eval_rows), seed=self.seed)
        warm_auc = _evaluate(model, scored, 4 * batch_size)

        # 2. bi-level search: its epochs continue the warm start's batch order
        for a in alphas:
            a.requires_grad_(True)
        weights = table_weights(model)
        tower = [p for p in others if all(p is not w for w in weights)]
        if self.freeze_tower:
            for p in tower:
                p.requires_grad_(False)
        task = DNISSearchTask(
            model,
            masks,
            weight_optimizer=torch.optim.Adam(weights if self.freeze_tower else weights + tower, lr=self.lr_w),
            alpha_optimizer=torch.optim.SGD(alphas, lr=self.lr_a),
            val_batches=_cycle(val, batch_size, self.seed),
            l1=self.l1,
        )
        fit_split(task, train, epochs=self.search_epochs, epoch_offset=self.warm_start_epochs, **phase)
        for p in model.parameters():
            p.requires_grad_(True)
        searched_auc = _evaluate(model, scored, 4 * batch_size)
        return self._derive(model, masks, schema, scored, 4 * batch_size, budget, warm_auc, searched_auc, start)

    # -- deriving the plan -----------------------------------------------------------------
    def _derive(
        self,
        model: RankingModel,
        masks: dict[str, BlockMask],
        schema: Schema,
        val: SplitData,
        eval_batch: int,
        budget: int | None,
        warm_auc: float,
        searched_auc: float,
        start: float,
    ) -> DimensionPlan:
        alphas = {n: m.alpha.detach().clone() for n, m in masks.items()}
        alpha_np = {n: a.numpy().astype(np.float64) for n, a in alphas.items()}
        bounds = {n: m.bounds for n, m in masks.items()}
        values = np.unique(np.concatenate([a.ravel() for a in alpha_np.values()] + [np.zeros(1)]))

        def params(t: float) -> int:
            return plan_parameters(derive_dims(alpha_np, t), bounds)

        def auc_at(t: float) -> float:
            dims = derive_dims(alpha_np, t)
            with torch.no_grad():
                for n, m in masks.items():
                    m.alpha.copy_(hard_alpha(alphas[n], dims[n]))
            try:
                return _evaluate(model, val, eval_batch)
            finally:
                with torch.no_grad():
                    for n, m in masks.items():
                        m.alpha.copy_(alphas[n])

        # alpha quantiles, the last just above the largest alpha (every block at 4 dims)
        quantiles = np.quantile(values, np.linspace(0.0, 1.0, self.sweep_points))
        quantiles[-1] = np.nextafter(values[-1], np.inf)
        sweep_t = sorted({float(t) for t in quantiles})
        sweep = [{"threshold": t, "parameters": params(t), "val_auc": auc_at(t)} for t in sweep_t]
        if budget is not None:
            threshold = _threshold_for_budget(alpha_np, bounds, budget)
        elif self.auc_tolerance is not None:
            ok = [s["threshold"] for s in sweep if s["val_auc"] >= searched_auc - float(self.auc_tolerance)]
            threshold = max(ok) if ok else 0.0
        else:
            threshold = float(self.threshold)
        if all(abs(s["threshold"] - threshold) > 0 for s in sweep):
            sweep.append({"threshold": threshold, "parameters": params(threshold), "val_auc": auc_at(threshold)})
            sweep.sort(key=lambda s: s["threshold"])
        return _plan_at(
            alpha_np, bounds, threshold, self.name, schema.name,
            {f.name: int(f.num_embeddings or 0) for f in schema.sparse}, {**self.describe(), "budget": budget},
            extras={
                "alpha": {n: a.tolist() for n, a in alpha_np.items()},
                "block_bounds": {n: [list(b) for b in bl] for n, bl in bounds.items()},
                "threshold": threshold,
                "sweep": sweep,
                "warm_start_val_auc": warm_auc,
                "searched_val_auc": searched_auc,
                "search_seconds": time.perf_counter() - start,
            },
        )


def _threshold_for_budget(alpha: dict[str, np.ndarray], bounds: dict[str, list[tuple[int, int]]], budget: int) -> float:
    """The smallest mask threshold (most parameters) whose derived dims fit ``budget``.

    The parameter count does not grow with the threshold, so bisect over the sorted mask
    values; above them all every block has 4 dims (``check_budget`` guarantees that fits).
    """
    values = np.unique(np.concatenate([a.ravel() for a in alpha.values()] + [np.zeros(1)]))
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if plan_parameters(derive_dims(alpha, float(values[mid])), bounds) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo]) if lo < len(values) else float(np.nextafter(values[-1], np.inf))


def _plan_at(
    alpha: dict[str, np.ndarray],
    bounds: dict[str, list[tuple[int, int]]],
    threshold: float,
    method: str,
    dataset: str,
    num_embeddings: dict[str, int],
    config: dict[str, Any],
    extras: dict[str, Any],
) -> DimensionPlan:
    """The plan of searched masks cut at ``threshold`` (blocks only where dims differ)."""
    dims = derive_dims(alpha, threshold)
    plan_blocks = {n: _to_plan_blocks(bounds[n], dims[n]) for n in dims}
    return DimensionPlan(
        dims={n: max(d) for n, d in dims.items()},
        blocks={n: b for n, b in plan_blocks.items() if len(b) > 1},
        method=method,
        dataset=dataset,
        num_embeddings=num_embeddings,
        config=config,
        extras={**extras, "threshold": threshold},
    )


def replan(plan: DimensionPlan, budget: int) -> DimensionPlan:
    """The plan the same searched masks give under another ``budget`` (no new search).

    Uses the masks and block bounds a :class:`DNIS` search stored in ``plan.extras``; this is
    how the parameters-vs-AUC curve across thresholds is drawn with one search.
    """
    if "alpha" not in plan.extras or "block_bounds" not in plan.extras:
        raise ValueError("replan needs a DNIS plan (extras['alpha'] and extras['block_bounds'])")
    alpha = {n: np.asarray(a, dtype=np.float64) for n, a in plan.extras["alpha"].items()}
    bounds = {n: [tuple(b) for b in bl] for n, bl in plan.extras["block_bounds"].items()}
    minimum = plan_parameters({n: [4] * len(bounds[n]) for n in bounds}, bounds)
    if budget < minimum:
        raise DimensionPlanError(f"budget {budget:,} is below {minimum:,}, one dim of 4 per block; raise the budget")
    threshold = _threshold_for_budget(alpha, bounds, int(budget))
    return _plan_at(alpha, bounds, threshold, plan.method, plan.dataset, dict(plan.num_embeddings),
                    {**plan.config, "budget": int(budget)}, dict(plan.extras))


def _cycle(data: SplitData, batch_size: int, seed: int) -> Iterator[Any]:
    """Shuffled batches of ``data`` without end (epochs 10000, 10001, ... of the seeded order;
    streamed shard by shard for a view of the shards)."""
    from recsys.data.streaming.split_view import batch_dataset

    ds = batch_dataset(data, batch_size, shuffle=True, seed=seed)
    epoch = 0
    while True:
        ds.set_epoch(10_000 + epoch)
        yield from ds
        epoch += 1


def _evaluate(model: nn.Module, data: SplitData, batch_size: int) -> float:
    """Validation AUC of ``model`` on ``data`` (eval mode, no gradients)."""
    from recsys.train.evaluation import evaluate

    return evaluate(model, data, batch_size)["auc"]
