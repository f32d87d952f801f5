"""``salience fit|validate|test|predict --config FILE``: LightningCLI over RankingTask + CTRDataModule.

The constructor signatures of :class:`~recsys.train.module.RankingTask` and
:class:`~recsys.train.datamodule.CTRDataModule` are the config schema
(``salience fit --print_config`` prints a complete one). After ``fit``, the best checkpoint is
evaluated on the test split and exported to TorchScript; config, metrics, plots and the export
are logged to one MLflow run.

A ``fit`` that did not finish (the process was killed, stopped or raised) resumes when the same
command runs again: the run folder (``trainer.default_root_dir``) keeps ``fit_state.json`` (the
process, its MLflow run, a fingerprint of the config and the last checkpoint), and a rerun with
the same config continues from that checkpoint (epoch, step, optimizer, scheduler, early
stopping, checkpoint and RNG state) to the metrics an uninterrupted run reaches; the killed run is
marked ``FAILED`` and the new one tagged ``salience.resumed_from``. ``--resume false`` starts
over instead; an explicit ``--ckpt_path`` always wins. A folder whose last fit finished, or
holds a fit of another config, starts a fresh fit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from recsys.data.raw import DataError
from recsys.data.schema import SchemaError
from recsys.io import atomic_path, atomic_write_json
from recsys.runtime import import_optuna
from recsys.tracking import MlflowTracking, end_status, process_alive, process_identity
from recsys.train.datamodule import CTRDataModule
from recsys.train.module import RankingTask
from recsys.trainer_attrs import model_checkpoint, model_checkpoints, trainer_callbacks

import_optuna()  # before any CLI parse imports it: else its import errors keep a CLI and its model alive

__all__ = ["FileCheckpointIO", "FitState", "SalienceCLI", "TrackedCLI", "run_cli"]

log = logging.getLogger(__name__)

TRAINER_DEFAULTS: dict[str, Any] = {
    "max_epochs": 10,
    "logger": False,
    "default_root_dir": "runs",
    "deterministic": True,
    "num_sanity_val_steps": 0,
}


class FitState(Callback):
    """``<default_root_dir>/fit_state.json``: whether the folder's last fit finished and, while it
    runs, its process, MLflow run, config fingerprint and last checkpoint (rewritten atomically
    when the fit starts and as checkpoints are saved, by the global-zero process). Also keeps the
    torch RNG state in the fit's checkpoints (Lightning's keep none), so a resumed fit draws the
    dropout masks an uninterrupted one would.

    Args:
        root: the run folder.
        config_sha: fingerprint of the fit's config (a rerun resumes only the same config).
    """

    FILE = "fit_state.json"

    def __init__(self, root: str | Path, config_sha: str) -> None:
        self.path = Path(root) / self.FILE
        self.config_sha = config_sha
        self.state: dict[str, Any] = {}
        #: best checkpoint path -> the global step it was written at (this process's saves)
        self.best_steps: dict[str, int] = {}

    def read(self) -> dict[str, Any] | None:
        """The state left by the folder's previous fit (None if there was none)."""
        return json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else None

    def resume_checkpoint(self) -> tuple[str, str | None] | None:
        """``(last checkpoint, MLflow run id)`` of the folder's unfinished fit of this config, or
        None to start afresh. Raises if that fit's process still runs on this host."""
        previous = self.read()
        if not previous or previous.get("status") != "running":
            return None
        me = process_identity()
        if (
            all(previous.get(k) == me[k] for k in ("host", "pid_ns"))
            and previous.get("pid") != me["pid"]
            and process_alive(int(previous["pid"]), previous.get("pid_start", ""))
        ):
            raise RuntimeError(
                f"{self.path.parent} holds a fit that is still running (pid {previous['pid']}): "
                "wait for it, or choose another --trainer.default_root_dir"
            )
        if previous.get("config_sha") != self.config_sha:
            log.info("%s holds an unfinished fit of another config: starting a fresh fit", self.path.parent)
            return None
        last = previous.get("last_checkpoint")
        if not last or not Path(last).is_file():
            return None  # it stopped before its first checkpoint
        return last, previous.get("run_id")

    def _write(self, trainer: pl.Trainer, **state: Any) -> None:
        if trainer.is_global_zero and state != self.state:
            atomic_write_json(self.path, state)
            self.state = state

    def _record(self, trainer: pl.Trainer) -> None:
        tracking = next((c for c in trainer_callbacks(trainer) if isinstance(c, MlflowTracking)), None)
        # the monitor-less callback's file is rewritten every epoch (module.latest_checkpoint);
        # its path is set before the file is written, so it names this save
        latest = next((c for c in model_checkpoints(trainer) if c.monitor is None), None)
        path = latest.best_model_path if latest is not None else getattr(trainer.checkpoint_callback, "last_model_path", "")
        self._write(
            trainer,
            status="running",
            **process_identity(),
            config_sha=self.config_sha,
            run_id=tracking.tracker.run_id if tracking is not None and tracking.tracker is not None else None,
            last_checkpoint=path or None,
        )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._record(trainer)  # ModelCheckpoint names the last checkpoint before it writes it
        best = model_checkpoint(trainer)  # its best path, too, is set before the file is written
        if best is not None and best.best_model_path:
            self.best_steps.setdefault(best.best_model_path, trainer.global_step)
        checkpoint["rng"] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_initialized():
            checkpoint["rng"]["cuda"] = torch.cuda.get_rng_state()

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        rng = checkpoint.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])

    def best_is_in_memory(self, trainer: pl.Trainer) -> bool:
        """Whether the best checkpoint was written by this process at the trainer's current step:
        the model in memory then holds its weights, and testing it needs no reload (which maps
        the whole checkpoint into memory: 1.1 GB of tables and optimizer state at the 45M-row
        scale benchmark)."""
        best = model_checkpoint(trainer)
        path = best.best_model_path if best is not None else ""
        return bool(path) and self.best_steps.get(path) == trainer.global_step

    def mark_finished(self, trainer: pl.Trainer) -> None:
        self._write(trainer, **(self.state | {"status": "finished"}))


class FileCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, writing local checkpoints straight to a file.

    Lightning's own serialises the whole checkpoint into memory first (``io.BytesIO``) and then
    writes the buffer, so every save holds the checkpoint twice in RAM: with embedding tables of
    gigabytes, that is the fit's peak memory. This one ``torch.save``-s into a temporary file in
    the checkpoint's folder and renames it into place (a crash still never leaves a half-written
    checkpoint), and loads local checkpoints memory-mapped. Remote paths (``scheme://``) keep
    Lightning's way.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with atomic_path(path) as tmp:
            torch.save(checkpoint, tmp)

    def load_checkpoint(self, path: Any, map_location: Any | None = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's loader, memory-mapping a local checkpoint (``torch.load(mmap=True)``): its
        tensors are read from the page cache while they are copied into the model, instead of
        being a second in-memory copy of every embedding table during the restore. Always
        weights-only: the project never unpickles a checkpoint (tests/test_no_pickles.py)."""
        if "://" in str(path):
            return super().load_checkpoint(path, map_location, weights_only)
        if not Path(path).is_file():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return torch.load(path, map_location=map_location, weights_only=True, mmap=True)


class TrackedCLI(LightningCLI):
    """LightningCLI whose MLflow run (the ``tracking`` callback) gets the resolved config and
    stays open across ``fit`` -> test -> export; :meth:`after_fit` runs those and finishes it
    (subclasses say whether they can test and export, and how to export)."""

    fit_state: FitState  # the run folder's, set by :meth:`fit`

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> pl.Trainer:
        trainer = super()._instantiate_trainer(config, callbacks)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # not one the config chose
            trainer.strategy.checkpoint_io = FileCheckpointIO()
        return trainer

    @property
    def subcommand_config(self) -> Any:
        """The parsed config of the running subcommand."""
        return self.config.get(str(self.subcommand), self.config)

    @property
    def tracking(self) -> MlflowTracking | None:
        return next((c for c in trainer_callbacks(self.trainer) if isinstance(c, MlflowTracking)), None)

    def _resolved_config(self) -> dict[str, Any]:
        import yaml

        return yaml.safe_load(self._parser(self.subcommand).dump(self.subcommand_config, skip_none=False))

    def _attach_config(self) -> None:
        if self.tracking is not None:
            self.tracking.config = self._resolved_config()

    def before_fit(self) -> None:
        self._attach_config()
        if self.tracking is not None:
            self.tracking.keep_open = True

    def fit(self, model: pl.LightningModule, ckpt_path: str | None = None, **kwargs: Any) -> None:
        """``trainer.fit`` that keeps the run folder's :class:`FitState` and, unless ``--ckpt_path``
        is given or ``--resume`` is false (or missing: a subclass opts in by adding it), resumes
        the folder's unfinished fit of this config."""
        config = {k: v for k, v in self._resolved_config().items() if k not in ("ckpt_path", "resume")}
        sha = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.fit_state = FitState(self.trainer.default_root_dir, sha)
        auto = ckpt_path is None and self.subcommand_config.get("resume")
        resume = self.fit_state.resume_checkpoint() if auto else None
        if resume is not None:
            ckpt_path, previous_run = resume
            log.info("resuming from %s (the previous fit in this folder did not finish)", ckpt_path)
            if self.tracking is not None:
                self.tracking.resumed_from = previous_run
        trainer_callbacks(self.trainer).append(self.fit_state)
        kwargs.pop("weights_only", None)  # checkpoints hold tensors and plain containers: never unpickle code
        self.trainer.fit(model, ckpt_path=ckpt_path, weights_only=True, **kwargs)

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
                if tracking is not None:
                    tracking.finish("KILLED")
                return
            best = model_checkpoint(self.trainer)
            ckpt = "best" if best is not None and best.best_model_path else None
            if self.fit_state.best_is_in_memory(self.trainer):
                ckpt = None  # nothing trained since the best checkpoint: test the model as it is
            if cfg["test"] and self.can_test():
                with warnings.catch_warnings():
                    # "best" is the first ModelCheckpoint by construction (RankingTask.configure_callbacks);
                    # the second only keeps latest.ckpt for resuming
                    warnings.filterwarnings("ignore", message=r".*configured with multiple `ModelCheckpoint` callbacks.*")
                    fit_callbacks = list(trainer_callbacks(self.trainer))
                    self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt, verbose=cfg["verbose"],
                                      weights_only=True)
                    # the module's configure_callbacks replaced the fit's checkpoint callbacks for
                    # the test; without a reload nothing restored their best path: keep the fit's
                    trainer_callbacks(self.trainer)[:] = fit_callbacks
            if cfg["export"] and self.can_export():
                self._export(cfg["export_dir"], tracking)
        except BaseException as e:
            if tracking is not None:
                tracking.finish(end_status(e))
            raise
        if tracking is not None:
            tracking.finish()
        self.fit_state.mark_finished(self.trainer)


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
    trainer = config.get("trainer", {}) if hasattr(config, "get") else {}
    accelerator = str(trainer.get("accelerator", "auto") or "auto")
    if accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={accelerator!r} but no CUDA device is visible on this machine; "
            "use --trainer.accelerator cpu (or auto, which picks CUDA when there is one)"
        )


class SalienceCLI(TrackedCLI):
    """LightningCLI with schema linking, MLflow tracking and test + export after fit."""

    def __init__(self, args: list[str] | None = None, run: bool = True, callbacks: Sequence[Callback] = ()) -> None:
        self.export_report: dict[str, Any] | None = None
        #: callback objects given to this run beside the configured ones (not part of the config)
        self.given_callbacks = list(callbacks)
        super().__init__(
            RankingTask,
            CTRDataModule,
            seed_everything_default=42,
            save_config_callback=None,  # the resolved config is logged to the MLflow run instead
            trainer_defaults=TRAINER_DEFAULTS | launcher_trainer_defaults(),
            args=args,
            run=run,
            parser_kwargs={"prog": "salience", "description": __doc__},
            auto_configure_optimizers=False,  # the optimizer is model.optimizer (RankingTask)
        )

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> pl.Trainer:
        # the given callbacks run after the configured ones and before the CLI's own (tracking),
        # as the last of ``--trainer.callbacks`` would: a pruning callback stops a fit before
        # tracking logs the epoch, and ends the run KILLED before tracking would end it FAILED
        return super()._instantiate_trainer(config, [*self.given_callbacks, *callbacks])

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data", "model.schema", compute_fn=lambda dm: dm.schema_dict, apply_on="instantiate")
        parser.add_lightning_class_args(MlflowTracking, "tracking")
        self.add_after_fit_arguments(parser, export_help="export the best model to TorchScript")
        parser.add_argument(
            "--resume", type=bool, default=True, help="fit: resume an unfinished fit of this run folder and config"
        )
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
        return self.datamodule.has_split("test")

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

        from recsys.io import atomic_write_text

        out = Path(self.subcommand_config["predictions"] or Path(self.trainer.default_root_dir) / "predictions.csv")
        scores = torch.cat([p.reshape(-1) for p in self.trainer.predict_loop.predictions]).numpy()
        labels = self.datamodule.split_labels("test")
        frame = pd.DataFrame({"row": np.arange(len(scores)), "label": labels[: len(scores)], "score": scores})
        atomic_write_text(out, frame.to_csv(index=False))
        print(f"wrote {len(frame):,} predictions of the test split to {out}")

    def _export(self, export_dir: str | None, tracking: MlflowTracking | None) -> None:
        """Export the (best) model, then check it against eager in a fresh process on real rows."""
        import numpy as np

        from recsys.data.batching import make_batch
        from recsys.export import check_parity_in_fresh_process, export_model
        from recsys.train.sharded import is_sharded

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
            metadata={"arch": self.model.backbone_name, "mlflow_run_id": run_id, "dataset": self.datamodule.dataset_name},
        )
        # batch sizes and rows that differ from anything the export saw
        data = self.datamodule.split_sample("test" if self.datamodule.has_split("test") else "val", 1024)
        batches = [make_batch(data, np.arange(min(n, len(data)))) for n in (1, 7, 1024)]
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
        callback = model_checkpoint(trainer)
        path = (callback.best_model_path or callback.last_model_path) if callback is not None else ""
        if not path:
            raise ValueError("a sharded run exports from its checkpoint, and this run saved none (trainer.enable_checkpointing)")
        model = load_checkpoint(path).model if trainer.is_global_zero else None
        trainer.strategy.barrier("export")
        return model


def run_cli(args: list[str] | None = None) -> SalienceCLI:
    """Entry point of the Lightning subcommands (``fit``, ``validate``, ``test``, ``predict``)."""
    return SalienceCLI(args=args)
