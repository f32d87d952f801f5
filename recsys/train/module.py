"""LightningModule that trains a ranking model on CTR batches."""

from __future__ import annotations

import warnings
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from torchmetrics.classification import BinaryAUROC
from torchrec.datasets.utils import Batch

from recsys.config import as_spec
from recsys.data.schema import Schema
from recsys.models import DCNv2, RankingModel
from recsys.models.backbone import Backbone
from recsys.models.base import (
    DenseInit,
    EmbeddingKernel,
    FusedOptimizer,
    SparseArch,
    SparseArchConfig,
    init_dense_layers,
)
from recsys.models.grouped import GroupedEmbeddingBags
from recsys.models.seam import SeamTransform
from recsys.train.sharded import (
    ShardedStrategy,
    collective_device,
    full_fused_optimizer_state,
    is_sharded,
    load_full_fused_optimizer_state,
    replica_optimizer,
    unwrap,
)

__all__ = ["RankingTask", "latest_checkpoint"]


def latest_checkpoint() -> ModelCheckpoint:
    """``latest.ckpt``, rewritten after every epoch: what a crashed fit resumes from. (The best
    callback's ``last.ckpt`` is written only in epochs that also save a new best checkpoint.)
    Listed after the best callback, so ``trainer.checkpoint_callback`` stays the best one."""
    return ModelCheckpoint(filename="latest", enable_version_counter=False)


class _LogLoss:
    """Streaming mean binary log loss."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        loss = nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double(), reduction="sum")
        self.total += float(loss)
        self.count += int(labels.numel())

    def compute(self) -> float:
        """The mean over every process of a distributed run (the local mean otherwise)."""
        total, count = self.total, self.count
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            both = torch.tensor([total, float(count)], dtype=torch.float64, device=collective_device())
            torch.distributed.all_reduce(both)
            total, count = float(both[0]), int(both[1])
        return total / max(count, 1)


class RankingTask(pl.LightningModule):
    """Trains a ranking backbone (DLRM / DCNv2 / DeepFM / any ``RankingModel``) with BCE loss;
    reports AUC and log loss.

    Args:
        backbone: the ranking model, ``{class_path: recsys.models.DCNv2, init_args: {...}}``
            (see :mod:`recsys.models.backbone`); jsonargparse resolves it into a factory that
            this task calls with the fitted schema and the embedding settings below.
        schema: fitted schema as a dict; the CLI links it from the datamodule.
        embedding_kernel: ``fused`` (FBGEMM, optimizer in backward; the default, measured faster
            in ``experiments/results/train_throughput.md``), ``plain`` (torchrec EBC updated by
            the dense optimizer, which allows Adam and ``embedding_weight_decay``; one lookup per
            table per step) or ``grouped`` (the fused kernel's training on torch ops, the tables of
            one width stacked into one lookup: hundreds of tables without FBGEMM, e.g. on a GPU with
            only the CPU build of fbgemm-gpu; the rows a batch touched are updated in the backward
            by ``fused_optimizer`` at ``fused_lr``, as FBGEMM does; see ``experiments/results/wide.md``).
        fused_optimizer: optimizer of fused and grouped tables (applied in the backward).
        fused_lr: learning rate of fused and grouped tables.
        optimizer: optimizer of the dense (and plain embedding) parameters, LightningCLI's
            ``{class_path: torch.optim.Adam, init_args: {lr: 0.001, weight_decay: 0.0}}``; its
            ``weight_decay`` applies to the dense (non-embedding) parameters only.
        embedding_weight_decay: L2 penalty of plain embedding tables only (FuxiCTR's
            ``embedding_regularizer``; coupled L2 in the gradient, so with Adam it acts like
            the explicit penalty ``0.5 * wd * ||E||^2``).
        lr_plateau_factor: multiply the learning rate by this when validation AUC stops
            improving (FuxiCTR's ``reduce_lr_on_plateau``); 1.0 turns it off.
        lr_plateau_patience: validation epochs without AUC gain before the learning rate drops.
        early_stopping_patience: validation epochs without AUC gain before stopping (0 = off).
        embedding_blocks: frequency blocks (DNIS): feature -> ``[[start, stop, dim], ...]``,
            contiguous id ranges from 0 (stop -1 or null on the last block = to the end of the
            table); each block gets its own table of ``stop - start`` rows and ``dim`` columns.
            The widest block must equal the feature's ``data.embedding_dims`` entry; the fused
            kernel needs block dims that are multiples of 4. A ``DimensionPlan``'s
            ``to_config_overrides()`` sets both.
        embedding_rows: fewer rows than ids (:mod:`recsys.models.rows`): feature ->
            ``{scheme: qr, buckets: M, combine: sum|product|concat}`` (quotient-remainder
            compositional embeddings) or ``{scheme: hash, rows: R}`` (the hashing trick).
        embedding_init_std: start the tables at N(0, std) instead of TorchRec's uniform(+-sqrt(1 /
            rows)); FuxiCTR's default, 1e-4, is what closes the gap to it on Frappe
            (``experiments/results/peers.md``). Null keeps TorchRec's.
        dense_init: ``xavier_normal`` re-initialises every linear layer outside the tables
            (Xavier-normal weights, zero biases; FuxiCTR's default); ``default`` keeps torch's.
        seam: optional transform at the seam, ``{class_path: selection.LeAPSeam, init_args:
            {...}}``; its parameters get their own optimizer group (learning rate
            ``seam.learning_rate`` when the transform defines one, no weight decay).
    """

    def __init__(
        self,
        backbone: Backbone = DCNv2,
        schema: dict[str, Any] | None = None,
        # Literals of the Enums' values (EmbeddingKernel, FusedOptimizer): jsonargparse reads an Enum
        # by member name, configs hold the values; tests/test_project.py keeps the two in step
        embedding_kernel: Literal["plain", "fused", "grouped"] = "fused",
        fused_optimizer: Literal["sgd", "adagrad", "rowwise_adagrad"] = "adagrad",
        fused_lr: float = 0.05,
        optimizer: OptimizerCallable = torch.optim.Adam,
        embedding_weight_decay: float = 0.0,
        lr_plateau_factor: float = 1.0,
        lr_plateau_patience: int = 0,
        early_stopping_patience: int = 2,
        seam: SeamTransform | None = None,
        embedding_blocks: dict[str, list[list[int | None]]] | None = None,
        embedding_rows: dict[str, dict[str, Any]] | None = None,
        embedding_init_std: float | None = None,
        dense_init: DenseInit = "default",
    ) -> None:
        super().__init__()
        if schema is None:
            raise ValueError("model.schema is missing: it comes from the data module (salience fit links it)")
        if embedding_kernel != "plain" and embedding_weight_decay > 0:
            raise ValueError(
                "model.embedding_weight_decay needs model.embedding_kernel: plain "
                f"(the {embedding_kernel} kernel updates the tables inside the backward, without weight decay)"
            )
        with warnings.catch_warnings():
            # a seam built in Python is an nn.Module; its config form replaces it just below
            warnings.filterwarnings("ignore", message=r".*Attribute 'seam' is an instance of `nn.Module`.*")
            self.save_hyperparameters()
        # built outside the CLI, the hyperparameters hold the objects themselves: keep their
        # config form, so a checkpoint stays plain containers (loaded with weights_only=True)
        for key in ("backbone", "optimizer", "seam"):
            self.hparams[key] = as_spec(self.hparams[key])
        self.schema = Schema.from_dict(schema)
        self.optimizer_factory = optimizer
        self.model: RankingModel = backbone(
            self.schema,
            SparseArchConfig(
                kernel=EmbeddingKernel(embedding_kernel),
                fused_optimizer=FusedOptimizer(fused_optimizer),
                fused_lr=fused_lr,
                blocks=embedding_blocks,
                blocks_key="model.embedding_blocks",
                rows=embedding_rows,
                rows_key="model.embedding_rows",
                init_std=embedding_init_std,
            ),
        )
        init_dense_layers(self.model, dense_init)
        if not isinstance(self.model, RankingModel):
            raise ValueError(f"model.backbone built a {type(self.model).__name__}, not a RankingModel")
        if seam is not None:
            self.model.set_seam(seam)
        self.val_auc = BinaryAUROC()
        self.test_auc = BinaryAUROC()
        #: the optimizer of a sharded model's data-parallel tables (set by configure_optimizers)
        self._replica_optimizer: torch.optim.Optimizer | None = None
        self._logloss: dict[str, _LogLoss] = {}
        self._test_rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        #: the last test pass's (labels N, probabilities N) in test-split order, for paired
        #: comparisons of two models on the same rows (recsys.stats.delong); one process only
        self.test_scores: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def backbone_name(self) -> str:
        """The backbone's class name in lower case (``dcnv2``): run names and export metadata."""
        return type(self.ranking_model).__name__.lower()

    @property
    def ranking_model(self) -> RankingModel:
        """The model itself, also when it is wrapped by TorchRec's ``DistributedModelParallel``
        (``recsys.train.sharded.ShardedStrategy``)."""
        return unwrap(self.model)  # type: ignore[return-value]

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.model(batch.dense_features, batch.sparse_features)

    def setup(self, stage: str) -> None:
        """Before Lightning moves the model to its device: FBGEMM's fused tables are rebuilt on
        a CUDA device (they cannot be moved); the sharded strategy builds its own."""
        strategy = self.trainer.strategy
        place = getattr(self.ranking_model.sparse_arch, "place_fused_tables", None)  # None: a dense-only model
        if place is not None and not isinstance(strategy, ShardedStrategy) and not is_sharded(self.model):
            place(strategy.root_device)

    # -- training --------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        dataset = getattr(self.trainer.train_dataloader, "dataset", None)
        if dataset is not None and hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.current_epoch)
        self.ranking_model.seam.start_epoch(self.current_epoch)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        logits = self(batch)
        bce = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        loss = bce + self.ranking_model.seam.regularization().to(bce)
        distributed = self.trainer.world_size > 1 if self._trainer is not None else False
        self.log("train_loss", bce, on_step=True, on_epoch=True, prog_bar=True, batch_size=batch.labels.numel(), sync_dist=distributed)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        seam = self.ranking_model.seam
        seam.after_optimizer_step()
        every = int(getattr(seam, "controller_every", 0) or 0)
        if every and batch_idx % every == 0:
            val = self._controller_batch()
            if val is not None:
                seam.controller_step(lambda: self._seam_loss(val))

    def _controller_batch(self) -> Batch | None:
        """The next validation batch for a bi-level seam controller (the loader restarts when it
        runs out); None without validation data."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is None or not hasattr(datamodule, "val_dataloader"):
            return None
        for _ in range(2):
            if getattr(self, "_controller_iter", None) is None:
                self._controller_iter = iter(datamodule.val_dataloader())
            try:
                batch = next(self._controller_iter)
            except StopIteration:
                self._controller_iter = None
                continue
            return self.transfer_batch_to_device(batch, self.device, 0)
        return None

    def _seam_loss(self, batch: Batch) -> torch.Tensor:
        """BCE of ``batch`` differentiable in the seam and interaction only: the embedding
        lookups run without gradients, so fused tables (which update inside the backward) never
        learn from the batch."""
        model = self.ranking_model
        with torch.no_grad():
            pooled = model.sparse_arch(batch.sparse_features)
        sparse, dense = model.seam(dict(pooled), batch.dense_features)
        return nn.functional.binary_cross_entropy_with_logits(model.interact(sparse, dense), batch.labels)

    # -- evaluation ------------------------------------------------------------------------
    def _eval_step(self, batch: Batch, stage: str) -> None:
        logits = self(batch)
        labels = batch.labels
        real = labels >= 0  # sharded evaluation pads its last batch with rows labelled -1
        if not bool(real.all()):
            logits, labels = logits[real], labels[real]
        auc = self.val_auc if stage == "val" else self.test_auc
        probs = torch.sigmoid(logits)
        auc.update(probs, labels.long())
        self._logloss.setdefault(stage, _LogLoss()).update(logits, labels)
        if stage == "test" and self._keeps_test_rows():
            self._test_rows.append((labels.detach().to("cpu", torch.float32), probs.detach().to("cpu", torch.float32)))

    def _eval_epoch_end(self, stage: str) -> None:
        auc = self.val_auc if stage == "val" else self.test_auc
        logloss = self._logloss.pop(stage, _LogLoss()).compute()
        with warnings.catch_warnings():
            # both are already over every process (torchmetrics and _LogLoss synchronise):
            # Lightning's advice to sync_dist them would average equal numbers
            warnings.filterwarnings("ignore", message=r".*self\.log\('(val|test)_(auc|logloss)'.*sync_dist=True")
            self.log(f"{stage}_auc", auc.compute(), prog_bar=True)
            self.log(f"{stage}_logloss", logloss, prog_bar=True)
        auc.reset()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_start(self) -> None:
        self._test_rows = []
        self.test_scores = None

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")
        if self._test_rows:
            labels, probs = (torch.cat(parts).numpy() for parts in zip(*self._test_rows, strict=True))
            self.test_scores = (labels, probs)
        self._test_rows = []

    def _keeps_test_rows(self) -> bool:
        """Scores are kept in one process (a multi-process test pass splits the rows)."""
        return self._trainer is None or self.trainer.world_size == 1

    def predict_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return torch.sigmoid(self(batch))

    # -- optimisation ----------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        hp = self.hparams
        model = self.ranking_model
        embedding_ids = {id(p) for p in model.sparse_arch.parameters()}
        seam_ids = {id(p) for p in model.seam.parameters()}
        controller_ids = {id(p) for p in model.seam.controller_parameters()}  # stepped by the seam itself
        params = [p for p in model.dense_parameters() if id(p) not in controller_ids]
        seam_lr = getattr(model.seam, "learning_rate", None)
        seam_group: dict[str, Any] = {"params": [p for p in params if id(p) in seam_ids], "weight_decay": 0.0}
        if seam_lr is not None:
            seam_group["lr"] = float(seam_lr)
        groups = [
            {"params": [p for p in params if id(p) not in embedding_ids | seam_ids]},  # the optimizer's weight_decay
            {"params": [p for p in params if id(p) in embedding_ids], "weight_decay": hp["embedding_weight_decay"]},
            seam_group,
        ]
        optimizer = self.optimizer_factory([g for g in groups if g["params"]])
        self._replica_optimizer = self._make_replica_optimizer()
        if hp["lr_plateau_factor"] >= 1.0:
            return optimizer
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=hp["lr_plateau_factor"], patience=hp["lr_plateau_patience"]
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_auc", "interval": "epoch"}}

    def _make_replica_optimizer(self) -> torch.optim.Optimizer | None:
        """The embedding optimizer of data-parallel tables of a sharded model: they are
        replicas whose gradients DDP all-reduces after the backward, so they cannot update
        inside it like the sharded tables; they take the same optimizer, stepped after it."""
        return replica_optimizer(self.model, FusedOptimizer(self.hparams["fused_optimizer"]), self.hparams["fused_lr"])

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._replica_optimizer is not None:
            self._replica_optimizer.step()
            self._replica_optimizer.zero_grad()

    def configure_callbacks(self) -> list[Callback]:
        callbacks: list[Callback] = [
            ModelCheckpoint(monitor="val_auc", mode="max", save_last=True, filename="best-{epoch}-{val_auc:.4f}"),
            latest_checkpoint(),
        ]
        patience = self.hparams["early_stopping_patience"]
        if patience > 0:
            callbacks.append(EarlyStopping(monitor="val_auc", mode="max", patience=patience))
        return callbacks

    # -- fused optimizer state travels with the checkpoint -----------------------------------
    # (a sharded run keeps it gathered to full tensors under "sharded_fused_optimizer", so it
    # resumes on any plan; a single-process model loads the weights and starts that state anew)
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if is_sharded(self.model):
            state = full_fused_optimizer_state(self.model)  # collective; full on rank 0
            if state is not None:
                checkpoint["sharded_fused_optimizer"] = state
            if self._replica_optimizer is not None:
                checkpoint["replica_optimizer"] = self._replica_optimizer.state_dict()
        else:
            arch = self.model.sparse_arch
            if isinstance(arch, SparseArch) and arch.is_fused:
                checkpoint["fused_optimizer"] = arch.fused_optimizer().state_dict()
            elif isinstance(arch, SparseArch) and isinstance(arch.embedding_bag_collection, GroupedEmbeddingBags):
                checkpoint["grouped_optimizer"] = arch.embedding_bag_collection.optimizer_state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning loads the weights before the data module's state: check the encoders first,
        # so a changed vocabulary is the data module's clear error, not a tensor size mismatch
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        data_state = checkpoint.get(type(datamodule).__qualname__) if datamodule is not None else None
        if datamodule is not None and data_state is not None:
            datamodule.load_state_dict(data_state)
        if is_sharded(self.model):
            if "sharded_fused_optimizer" in checkpoint:
                load_full_fused_optimizer_state(self.model, checkpoint["sharded_fused_optimizer"])
            if self._replica_optimizer is not None and "replica_optimizer" in checkpoint:
                self._replica_optimizer.load_state_dict(checkpoint["replica_optimizer"])
        else:
            arch = self.model.sparse_arch
            if isinstance(arch, SparseArch) and arch.is_fused and "fused_optimizer" in checkpoint:
                arch.fused_optimizer().load_state_dict(checkpoint["fused_optimizer"])
            grouped = getattr(arch, "embedding_bag_collection", None)
            if isinstance(grouped, GroupedEmbeddingBags) and "grouped_optimizer" in checkpoint:
                grouped.load_optimizer_state_dict(checkpoint["grouped_optimizer"])
