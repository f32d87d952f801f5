"""``Recipe``: a ``salience fit`` config that can be re-trained on any feature subset.

Importance methods and dimension searches need to train the same backbone many times with
one thing changed (the kept features, a seam transform, the embedding dims). A recipe holds
the config (a YAML path or a dict) plus command-line style overrides and runs every fit
through the same :class:`~recsys.train.cli.SalienceCLI` path users run, so the selection
curve's runs are ordinary, tracked ``salience fit`` runs::

    recipe = Recipe("experiments/configs/frappe_dcnv2.yaml", ["--trainer.max_epochs=5"])
    recipe.schema                     # fitted schema of all features
    recipe.raw_split("train")         # raw training rows (for model-free methods)
    result = recipe.fit(features=["user", "item", "daytime"], run_name="top-3")
    result.metrics["test_auc"]
"""

from __future__ import annotations

import atexit
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recsys.data.raw import RawData
from recsys.data.schema import Schema

if TYPE_CHECKING:
    import numpy as np
    from lightning.pytorch.callbacks import Callback

    from recsys.data.prepare import SplitName
    from recsys.train.datamodule import CTRDataModule
    from recsys.train.module import RankingTask

__all__ = ["RAW_SAMPLE_ROWS", "FitResult", "Recipe", "quiet_lightning"]

#: raw rows :meth:`Recipe.raw_split` samples from a streamed split (the model-free methods' input)
RAW_SAMPLE_ROWS = 1_000_000

log = logging.getLogger(__name__)


@dataclass
class FitResult:
    """One finished fit.

    Args:
        task: the trained module, holding the best checkpoint's weights when a test ran.
        datamodule: its data.
        metrics: ``test_auc``, ``test_logloss``, ``best_val_auc`` (and whatever else was logged).
        seconds: wall time of the fit (including the test pass).
        run_id: MLflow run id (None with tracking off).
        root_dir: the run folder (checkpoints).
        export: ``output_dir`` and fresh-process ``parity_max_abs_diff`` of the export (None
            when the fit did not export).
        test_scores: (labels N, probabilities N) of the test pass in test-split order (None
            without a test pass, or on several processes): two fits of one data config score the
            same rows in the same order, for paired comparisons (:func:`recsys.stats.delong`).
        epochs_run: training epochs completed (fewer than ``trainer.max_epochs`` when early
            stopping ended the fit at its validation plateau).
    """

    task: RankingTask
    datamodule: CTRDataModule
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    run_id: str | None = None
    root_dir: str = ""
    export: dict[str, Any] | None = None
    test_scores: tuple[np.ndarray, np.ndarray] | None = None
    epochs_run: int = 0


class Recipe:
    """A training config plus overrides, re-trainable with one thing changed.

    Args:
        config: path of a ``salience fit`` YAML config, or the config as a dict.
        overrides: extra command-line arguments applied to every fit
            (e.g. ``["--trainer.max_epochs=3"]``).
        workdir: folder for run folders and a materialised dict config (default: a temporary
            folder, removed when the process exits).
        quiet: turn off progress bars and model summaries in fits.
        keep_checkpoints: keep each fit's ``checkpoints/`` folder; False deletes it once the fit
            has been tested (search fits whose results are their metrics: a checkpoint of
            large tables is 3x their size, three files per fit).
    """

    def __init__(
        self,
        config: str | Path | Mapping[str, Any],
        overrides: Sequence[str] = (),
        workdir: str | Path | None = None,
        quiet: bool = False,
        keep_checkpoints: bool = True,
    ) -> None:
        if workdir is None:  # a temporary folder of this process: removed when the process exits
            self.workdir = Path(tempfile.mkdtemp(prefix="salience-recipe-"))
            atexit.register(shutil.rmtree, self.workdir, ignore_errors=True)
        else:
            self.workdir = Path(workdir)
        if isinstance(config, Mapping):
            from recsys.io import write_config

            self.workdir.mkdir(parents=True, exist_ok=True)
            self.config_path = write_config(self.workdir / "recipe_config.yaml", dict(config))
        else:
            self.config_path = Path(config)
            if not self.config_path.is_file():
                raise FileNotFoundError(f"config file not found: {self.config_path}")
        self.overrides = list(overrides)
        self.quiet = quiet
        self.keep_checkpoints = keep_checkpoints
        #: parent MLflow run of every fit that does not name one (a ``salience rank`` run)
        self.parent_run_id: str | None = None
        self._datamodule: CTRDataModule | None = None
        self._raw: RawData | None = None
        self._fits = 0

    # -- data ------------------------------------------------------------------------------
    @property
    def datamodule(self) -> CTRDataModule:
        """The data module of the config (data prepared on first access, cached on disk).

        The CLI builds the config's model too; it is built on the meta device (no memory, no
        initialisation: 0.6 GB of tables at the 45M-row scale benchmark) and dropped."""
        if self._datamodule is None:
            import torch

            from recsys.train.cli import SalienceCLI

            with quiet_lightning(self.quiet), _own_argv(), torch.device("meta"):
                cli = SalienceCLI(args=["--config", str(self.config_path), *self.overrides], run=False)
            self._datamodule = cli.datamodule
            _release(cli)
        return self._datamodule

    @property
    def schema(self) -> Schema:
        """The fitted schema of every feature the config trains on."""
        return self.datamodule.schema

    @property
    def dataset_name(self) -> str:
        return self.datamodule.dataset_name

    @property
    def config(self) -> dict[str, Any]:
        """The config file's content (without the overrides)."""
        import yaml

        return yaml.safe_load(self.config_path.read_text()) or {}

    def raw_split(self, split: SplitName = "train", max_rows: int | None = None) -> RawData:
        """Raw (unencoded) rows of one split, with the config's feature selection applied.

        A streaming data module (``data.streaming`` or ``data.shards``) never reads the whole
        file: the rows are a seeded sample of at most ``max_rows`` (default
        :data:`RAW_SAMPLE_ROWS`, fewer where they would pass
        :data:`~recsys.data.streaming.chunking.SAMPLE_BYTES` of frame: ~40k rows at 1,000 wide columns)
        rows of the split, read in chunks
        (:func:`recsys.data.streaming.raw_sample.sample_raw_split`; every row when the split has no
        more). In memory, ``max_rows`` None keeps every row, else a seeded sample of the split's
        rows is kept (in order).
        """
        from recsys.data.prepare import raw_split

        dm = self.datamodule
        if dm.streaming:
            from recsys.data.streaming.chunking import sample_rows
            from recsys.data.streaming.raw_sample import sample_raw_split

            rows = sample_rows(self.schema, RAW_SAMPLE_ROWS) if max_rows is None else int(max_rows)
            log.info("reading a sample of at most %d raw %s rows of %s in chunks", rows, split, dm.dataset_name)
            return sample_raw_split(dm.reader, dm.split, split, rows, seed=dm.split.seed,
                                    features=dm.features, drop_features=dm.drop_features)
        if self._raw is None:
            self._raw = dm.reader.read()
        raw = raw_split(self._raw, dm.split, split, dm.features, dm.drop_features)
        if max_rows is not None and max_rows < len(raw):
            import numpy as np

            keep = np.sort(np.random.default_rng(dm.split.seed).choice(len(raw), int(max_rows), replace=False))
            raw = RawData(raw.frame.iloc[keep], raw.schema, raw.report)
        return raw

    # -- training ----------------------------------------------------------------------------
    def untrained(self, seed: int | None = None) -> RankingTask:
        """The config's module at initialisation (no training step), seeded by ``seed`` (default:
        the config's ``seed_everything``): what single-shot methods score."""
        from recsys.train.cli import SalienceCLI

        args = ["--config", str(self.config_path), *self.overrides]
        if seed is not None:
            args.append(f"--seed_everything={int(seed)}")
        with quiet_lightning(self.quiet), _own_argv():
            cli = SalienceCLI(args=args, run=False)
        if self._datamodule is None:
            self._datamodule = cli.datamodule
        model = cli.model
        _release(cli)
        return model

    def fit(
        self,
        *,
        features: Sequence[str] | None = None,
        seam: Mapping[str, Any] | None = None,
        max_epochs: int | None = None,
        seed: int | None = None,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        tracking: bool = True,
        export: bool = False,
        extra_args: Sequence[str] = (),
        callbacks: Sequence[Callback] = (),
    ) -> FitResult:
        """Train once through ``salience fit`` with the given changes; test the best checkpoint.

        Args:
            features: train on these features only (``data.features``).
            seam: seam transform spec (``model.seam``), e.g. ``{"class_path":
                "selection.LeAPSeam", "init_args": {...}}``.
            max_epochs: override ``trainer.max_epochs``.
            seed: override ``seed_everything``.
            run_name: MLflow run name and run-folder name.
            parent_run_id: nest the MLflow run under this one.
            tracking: log to MLflow.
            export: export the best model after the fit.
            extra_args: further command-line arguments.
            callbacks: callback objects added to this fit's trainer, before the config's
                tracking callback (e.g. one bound to a live Optuna trial).
        """
        from recsys.train.cli import SalienceCLI
        from recsys.trainer_attrs import model_checkpoint

        self._fits += 1
        name = run_name or f"fit-{self._fits}"
        root = self.workdir / _slug(name)
        n = 2
        while root.exists():  # never mix checkpoints of two fits
            root = self.workdir / f"{_slug(name)}-{n}"
            n += 1
        args = ["fit", "--config", str(self.config_path), *self.overrides]
        args.append(f"--trainer.default_root_dir={root}")
        if features is not None:
            args.append(f"--data.features={json.dumps(list(features))}")
        if seam is not None:
            args.append(f"--model.seam={json.dumps(dict(seam))}")
        if max_epochs is not None:
            args.append(f"--trainer.max_epochs={int(max_epochs)}")
        if seed is not None:
            args.append(f"--seed_everything={int(seed)}")
        parent_run_id = parent_run_id or self.parent_run_id
        if tracking:
            args.append(f"--tracking.run_name={name}")
            if parent_run_id:
                args.append(f"--tracking.parent_run_id={parent_run_id}")
        else:
            args.append("--tracking.enabled=false")
        args.append(f"--after_fit.export={'true' if export else 'false'}")
        if self.quiet:
            args += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--after_fit.verbose=false"]
        args += list(extra_args)
        _collect_dropped_fits()
        start = time.perf_counter()
        with quiet_lightning(self.quiet), _own_argv():
            cli = SalienceCLI(args=args, callbacks=callbacks)
        seconds = time.perf_counter() - start
        metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if v.numel() == 1}
        ckpt = model_checkpoint(cli.trainer)
        if ckpt is not None and ckpt.best_model_score is not None:
            metrics["best_val_auc"] = float(ckpt.best_model_score)
        tracker = cli.tracking.tracker if cli.tracking is not None else None
        if not self.keep_checkpoints:
            shutil.rmtree(root / "checkpoints", ignore_errors=True)
        result = FitResult(
            task=cli.model,
            datamodule=cli.datamodule,
            metrics=metrics,
            seconds=seconds,
            run_id=tracker.run_id if tracker is not None else None,
            root_dir=str(root),
            export=getattr(cli, "export_report", None),
            test_scores=getattr(cli.model, "test_scores", None),
            epochs_run=int(cli.trainer.current_epoch),
        )
        _release(cli)
        return result


@contextmanager
def _own_argv() -> Iterator[None]:
    """LightningCLI warns when it gets ``args`` while ``sys.argv`` holds another command's
    arguments (``salience select ...``): hide them while a recipe builds its CLI."""
    import sys

    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


@contextmanager
def quiet_lightning(quiet: bool) -> Iterator[None]:
    """Lightning's per-fit INFO lines (seed, devices, tips, checkpoint restores) off while quiet."""
    if not quiet:
        yield
        return
    import warnings

    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning_fabric", "torch.fx._symbolic_trace")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR if lg.name.startswith("torch") else logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in (".*LeafSpec.*", ".*IterableDataset.*has `__len__`.*", ".*does not have many workers.*"):
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "fit"


def _collect_dropped_fits() -> None:
    """Free the models of earlier fits that their callers dropped, before the next one is built.

    A trained module and its trainer reference each other, so a dropped :class:`FitResult` is
    freed by Python's cyclic collector, whose passes follow object counts, not bytes: without
    this, the previous model and its optimizer state (1.2 GB at 45M Criteo rows) could still be
    alive while the next fit builds and trains its own (the selection curve's fits, LeAP's fit
    before them, the pipeline's stages).
    """
    import gc

    from recsys.runtime import release_freed_memory

    gc.collect()
    release_freed_memory()


def _release(cli: Any) -> None:
    """Drop a finished CLI's references to its model, trainer and data module.

    The parser's instantiators keep the last CLI reachable after it goes out of scope, so what it
    built would otherwise live until the next CLI replaces it: during a fit, the previous fit's
    model and optimizer state (2.4 GB at 45M rows), and after ``datamodule``, a model nobody
    uses. What the caller took (a :class:`FitResult`, the data module) lives as long as it does.
    """
    import gc

    from recsys.runtime import release_freed_memory

    vars(cli).clear()  # model, trainer, data module, config, callbacks (their bound methods)
    gc.collect()
    release_freed_memory()
