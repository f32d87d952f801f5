"""Lightning training of next-item models: :class:`SequenceDataModule` + :class:`GenerativeTask`.

``salience gen fit --config experiments/configs/generative/beauty.yaml`` runs them through a
LightningCLI (:mod:`generative.cli`). The data module reads the sequences, splits them
leave-one-out, builds item content vectors and the semantic-ID codebook (or loads one written by
``salience sid build``); the task builds its model from that catalogue, so the YAML names only
settings, never data-derived sizes. Everything a model needs to be rebuilt (codes, training
targets, content vectors) is stored in its checkpoint: ``GenerativeTask.load_from_checkpoint``
works without the data.

The plug-ins are named as the ranking side names its backbone: the item content, the codebook
builder, the architecture and the token weighting each by a registered name (``content: concat``)
or by class path and constructor arguments (``codebook: {class_path: rq-kmeans, init_args:
{levels: 3}}``; any subclass of the base, registered or not, by ``module.Class``); the optimizer
the LightningCLI way (``optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.003}}``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.cli import OptimizerCallable
from torch.utils.data import DataLoader, TensorDataset

from generative.base import Catalog, NextItemModel
from generative.data import SequenceDataset
from recsys.config import as_spec, from_spec
from recsys.registry import Plugin, StrategySpec
from recsys.trainer_attrs import trainer_datamodule

__all__ = ["Catalog", "GenerativeTask", "SequenceDataModule", "metric_key"]

log = logging.getLogger(__name__)


def _register_plugin_type() -> None:
    """Let jsonargparse read a :class:`~recsys.registry.Plugin` from a config or the command line
    as one value (a later ``--model.arch={class_path: ...}`` replaces an earlier one whole)."""
    from jsonargparse.typing import register_type

    try:
        register_type(Plugin, Plugin.to_config, lambda value: Plugin.parse(value, text=True))
    except ValueError:  # registered already
        pass


_register_plugin_type()


def metric_key(name: str) -> str:
    """``recall@10`` -> ``recall_10``: MLflow metric names cannot hold ``@``."""
    return name.replace("@", "_")


class SequenceDataModule(pl.LightningDataModule):
    """Sequences, a leave-one-out split, item content vectors and the semantic-ID codebook.

    Args:
        dataset: ``beauty``, ``sports``, ``toys``, ``ml-100k`` (from ``$SALIENCE_DATA_DIR``) or
            ``synthetic`` (embedded).
        data_dir: data folder (default: ``$SALIENCE_DATA_DIR``).
        max_history: history length (most recent items).
        min_length: users with fewer interactions are dropped (and counted).
        content: the item content vectors: a registered :class:`~generative.content.ItemContent`
            (``attributes``, ``collaborative``, ``concat``, ``text``) or ``{class_path, init_args}``
            (e.g. ``{class_path: concat, init_args: {dim: 64}}``).
        codebook: the semantic-ID builder, a registered :class:`~generative.codebook.CodebookBuilder`
            (``rq-kmeans``, ``rq-vae``) or ``{class_path, init_args}`` (``levels``, ``codebook_size``, ...).
        codebook_path: load this codebook (written by ``salience sid build``) instead of building one.
        codebook_seed: seed of the codebook builder.
        batch_size: training batch size.
        eval_batch_size: validation/test batch size.
        val_users: validate on this many users (a fixed random subset; ``null`` = all) to keep
            per-epoch beam search cheap; the test split always uses every user.
        shuffle_seed: seed of the per-epoch shuffle.
    """

    def __init__(
        self,
        dataset: SequenceDataset = "synthetic",
        data_dir: str | None = None,
        max_history: int = 20,
        min_length: int = 3,
        content: StrategySpec = "attributes",
        codebook: StrategySpec = "rq-kmeans",
        codebook_path: str | None = None,
        codebook_seed: int = 0,
        batch_size: int = 256,
        eval_batch_size: int = 512,
        val_users: int | None = None,
        shuffle_seed: int = 0,
    ) -> None:
        super().__init__()
        self.dataset = dataset
        self.data_dir = data_dir
        self.max_history = max_history
        self.min_length = min_length
        from generative.codebook import CodebookBuilder
        from generative.content import ItemContent

        ItemContent.resolve_spec(content, "data.content")  # a bad name or argument fails before any data is read
        CodebookBuilder.resolve_spec(codebook, "data.codebook")
        self.content = content
        self.codebook_spec = codebook
        self.codebook_path = codebook_path
        self.codebook_seed = codebook_seed
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.val_users = val_users
        self.shuffle_seed = shuffle_seed
        self._data: Any = None
        self._split: Any = None
        self._vectors: np.ndarray | None = None
        self._codebook: Any = None

    # -- data ------------------------------------------------------------------------------
    @property
    def dataset_name(self) -> str:
        return self.dataset

    @property
    def data(self) -> Any:
        """The :class:`~generative.data.SequenceData` (read on first use)."""
        if self._data is None:
            from generative.data import load_sequences

            self._data = load_sequences(self.dataset, data_dir=self.data_dir, min_length=self.min_length)
        return self._data

    @property
    def split(self) -> Any:
        """The :class:`~generative.data.LeaveOneOut` split."""
        if self._split is None:
            from generative.data import leave_one_out

            self._split = leave_one_out(self.data, max_history=self.max_history)
        return self._split

    @property
    def item_vectors(self) -> np.ndarray:
        """Item content vectors ``[num_items + 1, d]`` (training data only)."""
        if self._vectors is None:
            from generative.content import ItemContent

            self._vectors = ItemContent.from_spec(self.content, "data.content").vectors(self.data, self.split)
        return self._vectors

    @property
    def codebook(self) -> Any:
        """The semantic-ID :class:`~generative.codebook.Codebook` (built or loaded on first use)."""
        if self._codebook is None:
            from generative.codebook import Codebook, CodebookBuilder

            if self.codebook_path:
                book = Codebook.load(self.codebook_path)
                if book.num_items != self.data.num_items:
                    raise ValueError(
                        f"data.codebook_path={self.codebook_path!r} holds {book.num_items} items but dataset "
                        f"{self.dataset!r} has {self.data.num_items}"
                    )
            else:
                builder = CodebookBuilder.from_spec(self.codebook_spec, "data.codebook")
                book = builder.fit(self.item_vectors, seed=self.codebook_seed)
            self._codebook = book
        return self._codebook

    def catalog(self, with_codes: bool = True) -> Catalog:
        """The :class:`Catalog` a model is built from (``with_codes`` builds the codebook)."""
        from generative.data import tail_items

        split = self.split
        cat = Catalog(
            dataset=self.dataset,
            num_items=int(split.num_items),
            train_targets=np.asarray(split.train_target, dtype=np.int64),
            tail=tail_items(split.item_counts),
        )
        if with_codes:
            book = self.codebook
            cat.codes = np.asarray(book.codes, dtype=np.int64)
            cat.level_sizes = [int(s) for s in book.level_sizes]
            cat.item_vectors = np.asarray(self.item_vectors, dtype=np.float32)
            cat.codebook_stats = dict(book.stats)
        return cat

    # -- loaders ---------------------------------------------------------------------------
    def _tensors(self, part: Literal["train", "valid", "test"]) -> TensorDataset:
        split = self.split
        history = torch.as_tensor(np.asarray(getattr(split, f"{part}_history")), dtype=torch.long)
        target = torch.as_tensor(np.asarray(getattr(split, f"{part}_target")), dtype=torch.long)
        if part == "valid" and self.val_users is not None and self.val_users < len(target):
            rows = torch.from_numpy(np.sort(np.random.default_rng(0).choice(len(target), self.val_users, replace=False)))
            history, target = history[rows], target[rows]
        return TensorDataset(history, target)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.shuffle_seed)
        return DataLoader(self._tensors("train"), batch_size=self.batch_size, shuffle=True, generator=generator)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._tensors("valid"), batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self._tensors("test"), batch_size=self.eval_batch_size)


class GenerativeTask(pl.LightningModule):
    """Trains a next-item model and evaluates Recall/NDCG@k (overall, head and tail items).

    Args:
        arch: the :class:`~generative.base.NextItemModel`: ``sid`` (semantic-ID generative model,
            trie-constrained beam search), ``sasrec`` (item-ID baseline with a full softmax), or
            ``{class_path, init_args}`` with the model's sizes and dropout as ``init_args``
            (e.g. ``{class_path: sid, init_args: {d_model: 64, heads: 4}}``).
        weighting: the token weighting of a semantic-ID model's loss: ``plain``, ``front``,
            ``frequency``, ``multi``, or ``{class_path, init_args}`` (e.g. ``{class_path: front,
            init_args: {gain: entropy}}``).
        optimizer: the optimizer, LightningCLI's ``{class_path, init_args}`` (default AdamW,
            lr 1e-3, weight decay 0.01). Its weight decay applies to matrices only (not norms,
            biases or the loss's parameters).
        weighting_learning_rate: learning rate of the loss's own parameters (the multi-target
            objective's log-precisions ``s``; no weight decay): Adam moves them about this much
            per step, so they need more than the network's rate to settle within a short run.
        warmup_steps: linear warm-up steps, then cosine decay to 0 over the run (``lr_schedule: cosine``).
        lr_schedule: ``cosine`` or ``constant``.
        beam_size: beam width of constrained decoding (semantic-ID models).
        eval_k: length of the recommended lists that are evaluated (metrics at 5 and 10).
        monitor: validation metric that picks the best checkpoint.
        early_stopping_patience: epochs without improvement before stopping (0 = off).
    """

    def __init__(
        self,
        arch: StrategySpec = "sid",
        weighting: StrategySpec = "plain",
        optimizer: OptimizerCallable = torch.optim.AdamW,
        weighting_learning_rate: float = 0.01,
        warmup_steps: int = 100,
        lr_schedule: Literal["cosine", "constant"] = "cosine",
        beam_size: int = 20,
        eval_k: int = 10,
        monitor: str = "val_ndcg_10",
        early_stopping_patience: int = 0,
    ) -> None:
        super().__init__()
        from generative.weighting import TokenWeighting

        self.model_class, self.model_options = NextItemModel.resolve_spec(arch, "model.arch", init="__init__")
        TokenWeighting.resolve_spec(weighting, "model.weighting")
        if eval_k < 10:
            raise ValueError(f"model.eval_k={eval_k} must be at least 10 (metrics are reported at 5 and 10)")
        self.save_hyperparameters()
        # the plug-ins' config form in the hyperparameters (a checkpoint holds plain containers)
        self.hparams["arch"] = Plugin.parse(arch).to_config()
        self.hparams["weighting"] = Plugin.parse(weighting).to_config()
        self.hparams["optimizer"] = as_spec(optimizer)
        self.optimizer_factory = from_spec(optimizer, "model.optimizer")
        self.recommender: NextItemModel | None = None
        self.catalog: Catalog | None = None
        self._outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.weight_history: list[dict[str, Any]] = []
        #: after a test pass: each test user's target rank (``eval_k`` when missed) and target ``[n]``
        self.test_ranks: tuple[np.ndarray, np.ndarray] | None = None

    # -- model -----------------------------------------------------------------------------
    def build(self, catalog: Catalog) -> NextItemModel:
        """Build the model from ``catalog`` (idempotent)."""
        if self.recommender is not None:
            return self.recommender
        hp = self.hparams
        model_cls = self.model_class
        loss = None
        if model_cls.uses_semantic_ids:
            from generative.weighting import TokenWeighting

            if catalog.codes is None or catalog.level_sizes is None:
                raise ValueError(f"model.arch={model_cls.name!r} needs a codebook; the catalogue has none")
            loss = TokenWeighting.from_spec(hp["weighting"], "model.weighting")
            loss.fit(catalog.codes, catalog.level_sizes, catalog.train_targets, item_vectors=catalog.item_vectors)
        model = model_cls.from_catalog(catalog, loss=loss, **self.model_options)
        self.catalog = catalog
        self.recommender = model
        return model

    def configure_model(self) -> None:
        if self.recommender is None and self._trainer is not None:  # without a trainer: from a checkpoint
            dm = trainer_datamodule(self.trainer)
            if dm is None:
                raise RuntimeError("GenerativeTask needs a SequenceDataModule (or a checkpoint) to build its model")
            self.build(dm.catalog(with_codes=self.model_class.uses_semantic_ids))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        assert self.catalog is not None
        checkpoint["salience_catalog"] = self.catalog.to_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.recommender is None:
            self.build(Catalog.from_state(checkpoint["salience_catalog"]))

    # -- training --------------------------------------------------------------------------
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        assert self.recommender is not None
        history, target = batch
        loss, logs = self.recommender.training_loss(history, target)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(target))
        for key, value in logs.items():
            if key != "loss":
                self.log(f"train_{key}", float(value), on_step=False, on_epoch=True, batch_size=len(target))
        return loss

    def on_train_epoch_end(self) -> None:
        table = getattr(getattr(self.recommender, "loss_fn", None), "weights_table", None)
        if callable(table):
            self.weight_history.append({"epoch": self.current_epoch, "step": self.global_step, **table()})

    def _eval_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        assert self.recommender is not None
        history, target = batch
        options = {"beam_size": self.hparams["beam_size"]} if self.recommender.uses_semantic_ids else {}
        items, _ = self.recommender.recommend(history, self.hparams["eval_k"], **options)
        self._outputs.append((items.cpu(), target.cpu()))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch)

    def _eval_end(self, prefix: str) -> dict[str, float]:
        from generative.ranking_metrics import hit_ranks, ranking_metrics

        assert self.catalog is not None
        items = torch.cat([o[0] for o in self._outputs]).numpy()
        targets = torch.cat([o[1] for o in self._outputs]).numpy()
        self._outputs.clear()
        metrics = ranking_metrics(items, targets, ks=(5, 10), tail=self.catalog.tail)
        if prefix == "test":  # per user, in test order: the units of paired comparisons
            self.test_ranks = (hit_ranks(items, targets), targets)
        out = {f"{prefix}_{metric_key(k)}": float(v) for k, v in metrics.items() if not k.startswith("n_")}
        self.log_dict(out, prog_bar=False)
        return out

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    def configure_optimizers(self) -> Any:
        assert self.recommender is not None
        hp = self.hparams
        loss = getattr(self.recommender, "loss_fn", None)
        loss_ids = {id(p) for p in loss.parameters()} if isinstance(loss, torch.nn.Module) else set()
        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        own: list[torch.nn.Parameter] = []
        for p in self.recommender.parameters():
            if p.requires_grad:
                (own if id(p) in loss_ids else no_decay if p.ndim < 2 else decay).append(p)
        groups = [
            {"params": decay},  # the optimizer's own weight decay
            {"params": no_decay, "weight_decay": 0.0},
            {"params": own, "weight_decay": 0.0, "lr": hp["weighting_learning_rate"]},
        ]
        optimizer = self.optimizer_factory([g for g in groups if g["params"]])  # type: ignore[index]
        if hp["lr_schedule"] == "constant":
            return optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = min(hp["warmup_steps"], total // 2)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / max(1, warmup)
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1.0 + float(np.cos(np.pi * min(1.0, progress))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_callbacks(self) -> list[Callback]:
        from recsys.train.module import latest_checkpoint

        monitor = self.hparams["monitor"]
        callbacks: list[Callback] = [
            ModelCheckpoint(monitor=monitor, mode="max", save_last=True, filename="best-{epoch}-{" + monitor + ":.4f}"),
            latest_checkpoint(),
        ]
        patience = self.hparams["early_stopping_patience"]
        if patience > 0:
            callbacks.append(EarlyStopping(monitor=monitor, mode="max", patience=patience))
        return callbacks


def load_task(checkpoint: str | Path) -> GenerativeTask:
    """A trained :class:`GenerativeTask` from a checkpoint, on CPU, in eval mode (no data needed).

    Loaded with ``weights_only=True`` (no pickled objects are executed, whatever
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says).
    """
    task = GenerativeTask.load_from_checkpoint(str(checkpoint), map_location="cpu", weights_only=True)
    return task.eval()
