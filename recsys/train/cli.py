"""``salience fit|validate|test|predict --config FILE``: LightningCLI over RankingTask + CTRDataModule.

The constructor signatures of :class:`~recsys.train.module.RankingTask` and
:class:`~recsys.train.datamodule.CTRDataModule` are the config schema
(``salience fit --print_config`` prints a complete one). After ``fit``, the best checkpoint is
evaluated on the test split and exported to TorchScript; config, metrics, plots and the export
are logged to one MLflow run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from recsys.data.raw import DataError
from recsys.data.schema import SchemaError
from recsys.tracking import MlflowTracking
from recsys.train.datamodule import CTRDataModule
from recsys.train.module import RankingTask

__all__ = ["SalienceCLI", "TrackedCLI", "run_cli"]

log = logging.getLogger(__name__)

TRAINER_DEFAULTS: dict[str, Any] = {
    "max_epochs": 10,
    "logger": False,
    "default_root_dir": "runs",
    "deterministic": True,
    "num_sanity_val_steps": 0,
}


class TrackedCLI(LightningCLI):
    """LightningCLI whose MLflow run (the ``tracking`` callback) gets the resolved config and
    stays open across ``fit`` -> test -> export; :meth:`after_fit` runs those and finishes it
    (subclasses say whether they can test and export, and how to export)."""

    @property
    def subcommand_config(self) -> Any:
        """The parsed config of the running subcommand."""
        return self.config.get(str(self.subcommand), self.config)

    @property
    def tracking(self) -> MlflowTracking | None:
        return next((c for c in self.trainer.callbacks if isinstance(c, MlflowTracking)), None)

    def _attach_config(self) -> None:
        tracking = self.tracking
        if tracking is None:
            return
        import yaml

        text = self._parser(self.subcommand).dump(self.subcommand_config, skip_none=False)
        tracking.config = yaml.safe_load(text)

    def before_fit(self) -> None:
        self._attach_config()
        if self.tracking is not None:
            self.tracking.keep_open = True

    def before_validate(self) -> None:
        self._attach_config()

    def before_test(self) -> None:
        self._attach_config()

    @staticmethod
    def add_after_fit_arguments(parser: LightningArgumentParser, export_help: str) -> None:
        """The ``--after_fit.*`` switches read by :meth:`after_fit`."""
        parser.add_argument("--after_fit.test", type=bool, default=True, help="evaluate the best checkpoint on the test split")
        parser.add_argument("--after_fit.export", type=bool, default=True, help=export_help)
        parser.add_argument("--after_fit.export_dir", type=str | None, default=None, help="export folder (default: under the run folder)")
        parser.add_argument("--after_fit.verbose", type=bool, default=True, help="print the test metrics table")

    def can_test(self) -> bool:
        """Whether the data has a test split to evaluate after fit."""
        return True

    def can_export(self) -> bool:
        """Whether the trained model is one :meth:`_export` can export."""
        return True

    def _export(self, export_dir: str | None, tracking: MlflowTracking | None) -> None:
        raise NotImplementedError

    def after_fit(self) -> None:
        """Test the best checkpoint and export it (as ``--after_fit.*`` say), then close the run."""
        cfg = self.subcommand_config["after_fit"]
        tracking = self.tracking
        try:
            if self.trainer.interrupted:
                return
            ckpt = "best" if self.trainer.checkpoint_callback and self.trainer.checkpoint_callback.best_model_path else None
            if cfg["test"] and self.can_test():
                self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt, verbose=cfg["verbose"])
            if cfg["export"] and self.can_export():
                self._export(cfg["export_dir"], tracking)
        except BaseException:
            if tracking is not None:
                tracking.finish("FAILED")
            raise
        if tracking is not None:
            tracking.finish()


def launcher_trainer_defaults() -> dict[str, Any]:
    """``trainer.devices`` / ``num_nodes`` that follow ``torchrun`` (its ``LOCAL_WORLD_SIZE`` and
    ``WORLD_SIZE``), so ``torchrun --nproc_per_node N`` needs no matching ``--trainer.devices N``."""
    import os

    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if not local or not world or "TORCHELASTIC_RUN_ID" not in os.environ:
        return {}
    return {"devices": int(local), "num_nodes": max(1, int(world) // int(local))}


def check_accelerator(config: Any) -> None:
    """A CUDA config on a machine without CUDA: an error naming the key, not a stack trace."""
    import torch

    trainer = config.get("trainer", {}) if hasattr(config, "get") else {}
    accelerator = str(trainer.get("accelerator", "auto") or "auto")
    if accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={accelerator!r} but no CUDA device is visible on this machine; "
            "use --trainer.accelerator cpu (or auto, which picks CUDA when there is one)"
        )


class SalienceCLI(TrackedCLI):
    """LightningCLI with schema linking, MLflow tracking and test + export after fit."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        self.export_report: dict[str, Any] | None = None
        super().__init__(
            RankingTask,
            CTRDataModule,
            seed_everything_default=42,
            save_config_callback=None,  # the resolved config is logged to the MLflow run instead
            trainer_defaults=TRAINER_DEFAULTS | launcher_trainer_defaults(),
            args=args,
            run=run,
            parser_kwargs={"prog": "salience", "description": __doc__},
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data", "model.schema", compute_fn=lambda dm: dm.schema_dict, apply_on="instantiate")
        parser.add_lightning_class_args(MlflowTracking, "tracking")
        self.add_after_fit_arguments(parser, export_help="export the best model to TorchScript")
        parser.add_argument(
            "--predictions", type=str | None, default=None, help="CSV written by `predict` (default: <default_root_dir>/predictions.csv)"
        )

    def before_instantiate_classes(self) -> None:
        check_accelerator(self.subcommand_config)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as e:
            # jsonargparse wraps errors raised while linking data -> model.schema; surface the
            # original, which names the file, line or config key
            cause = e.__cause__
            if isinstance(cause, (SchemaError, DataError, OSError)):
                raise cause from None
            raise

    def can_test(self) -> bool:
        return self.datamodule.prepared.splits.get("test") is not None

    def before_predict(self) -> None:
        if self.trainer.world_size > 1:
            raise ValueError(
                "salience predict writes one CSV of the test split from one process: run it without the sharded "
                "strategy (--trainer.strategy auto); a sharded run's checkpoint holds full tables and loads in one process"
            )

    def after_predict(self) -> None:
        """Write the test-split scores (with labels) to a CSV."""
        import numpy as np
        import pandas as pd
        import torch

        from recsys.io import atomic_write_text

        out = Path(self.subcommand_config["predictions"] or Path(self.trainer.default_root_dir) / "predictions.csv")
        scores = torch.cat([p.reshape(-1) for p in self.trainer.predict_loop.predictions]).numpy()
        labels = self.datamodule.prepared.splits["test"].labels
        frame = pd.DataFrame({"row": np.arange(len(scores)), "label": labels[: len(scores)], "score": scores})
        atomic_write_text(out, frame.to_csv(index=False))
        print(f"wrote {len(frame):,} predictions of the test split to {out}")

    def _export(self, export_dir: str | None, tracking: MlflowTracking | None) -> None:
        """Export the (best) model, then check it against eager in a fresh process on real rows."""
        import numpy as np

        from recsys.data.batching import make_batch
        from recsys.export import check_parity_in_fresh_process, export_model
        from recsys.train.distributed import is_sharded

        tracker = tracking.tracker if tracking is not None else None
        model = self.model.model
        if is_sharded(model):
            # each process holds a part of the tables: rank 0 exports the (full) checkpoint
            model = self._unsharded_model()
            if model is None:
                return
        run_id = tracker.run_id if tracker is not None else "local"
        out = Path(export_dir) if export_dir else Path(self.trainer.default_root_dir) / "exports" / run_id
        export_model(
            model,
            self.datamodule.preprocessor,
            out,
            metadata={"arch": self.model.hparams.arch, "mlflow_run_id": run_id, "dataset": self.datamodule.dataset_name},
        )
        splits = self.datamodule.prepared.splits
        data = splits.get("test") or splits["val"]
        # batch sizes and rows that differ from anything the export saw
        rows = np.random.default_rng(0).permutation(len(data))
        batches = [make_batch(data, rows[:n]) for n in (1, 7, min(1024, len(data)))]
        diff = check_parity_in_fresh_process(out, model, batches)
        self.export_report = {"output_dir": str(out), "parity_max_abs_diff": diff}
        print(f"exported model: {out} (fresh-process parity: max |eager - exported| = {diff:.2e})")
        if tracker is not None:
            tracker.log_metrics({"export_parity_max_abs_diff": diff})
            tracker.log_artifact(out, "model")


    def _unsharded_model(self) -> Any:
        """The single-process model of a sharded run, from its best (else last) checkpoint, on
        rank 0 (None on the other ranks, which wait for it)."""
        from recsys.train.checkpoint import load_checkpoint

        trainer = self.trainer
        callback = trainer.checkpoint_callback
        path = (callback.best_model_path or callback.last_model_path) if callback is not None else ""
        if not path:
            raise ValueError("a sharded run exports from its checkpoint, and this run saved none (trainer.enable_checkpointing)")
        model = load_checkpoint(path).model if trainer.is_global_zero else None
        trainer.strategy.barrier("export")
        return model


def run_cli(args: list[str] | None = None) -> SalienceCLI:
    """Entry point of the Lightning subcommands (``fit``, ``validate``, ``test``, ``predict``)."""
    return SalienceCLI(args=args)
