"""``salience tune``: hyperparameter search for a ranking model on validation AUC.

Every trial is an ordinary ``salience fit`` (through :class:`~recsys.train.recipe.Recipe`) of
the given config with the sampled hyperparameters applied as command-line overrides, a short
per-trial budget (``--max-epochs``, ``--limit-train-batches``) and the test pass off; its value
is the best validation AUC. The study lives in an Optuna RDB storage, so a killed search
resumes by re-running the same command and several worker processes share one study::

    salience tune --config experiments/configs/frappe_dcnv2.yaml --sampler gif --n-trials 60 --workers 2
    salience fit --config runs/tune/frappe_dcnv2-gif/best_config.yaml     # retrain the best

* **Search space** (:func:`~experiments.hpo.space.search_space`): 13 hyperparameters for DCNv2 (optimizer, learning
  rate, dense and embedding weight decay, embedding dim, batch size, dropout, batch norm, deep
  MLP depth / width / shape, cross layers, structure); DLRM and DeepFM get the subset that
  applies (11 each). Trials train the embeddings with the dense optimizer
  (``model.embedding_kernel: plain``), which ``embedding_weight_decay`` and the optimizer
  choice need.
* **Pruning**: :class:`~experiments.hpo.pruning.OptunaPruning`, bound to the live trial and
  handed to the fit, reports the validation AUC of every epoch to the trial and raises
  :class:`optuna.TrialPruned` when the pruner says so (default
  ``MedianPruner(n_startup_trials=5, n_warmup_steps=1)``). GIF's warm-start trials are never
  pruned: its importance assessment needs full evaluations.
* **Samplers and pruners** are chosen by name from registries
  (:class:`~experiments.hpo.samplers.SamplerChoice`,
  :class:`~experiments.hpo.pruning.PrunerChoice`): adding one is one new class. Worker
  processes are spawned, so a sampler they run must be registered in an importable module.
* **Bad trials**: an exception or a non-finite AUC fails the trial (state ``FAIL``, the reason in
  the user attribute ``fail_reason``); the study goes on.
* **Budget**: ``--n-trials`` is the study's total (trials of every state); workers claim trials
  from a shared counter, so ``W`` workers run exactly the missing trials between them. The same
  command run on several machines against one storage shares the study too: each stops once
  the study holds ``--n-trials`` trials, which processes starting a trial at the same moment can
  overshoot by at most one trial per extra process (``docs/multi-worker-hpo.md``).
* **Seeds**: GIF's decisions are functions of ``--seed`` and the storage, so every process
  follows one schedule; the other samplers are seeded per trial from ``(seed, trial number)``,
  so processes sharing a study do not repeat each other's draws.
* **Output** (``runs/tune/<study>/``): ``best_config.yaml`` (the config with the best
  hyperparameters applied, ready for ``salience fit``), ``trials.csv``, ``summary.json``.
* **MLflow**: one parent run per study (:class:`~experiments.hpo.study_tracking.StudyTracker`);
  every trial's fit is a nested child run whose id is the trial's ``mlflow_run_id``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from experiments.hpo.fit_config import resolved_config
from experiments.hpo.objective import Objective, TrialSettings
from experiments.hpo.pruning import (
    FAIL_REASON_ATTR,
    RUN_ID_ATTR,
    NonFiniteMetricError,
    OptunaPruning,
    PrunerChoice,
    make_pruner,
)
from experiments.hpo.results import TuneResult, best_trial, write_best_config, write_outputs
from experiments.hpo.samplers import SamplerChoice
from experiments.hpo.space import Hyperparameter, SearchSpace, backbone_spec, search_space
from experiments.hpo.storage import (
    DEFAULT_STORAGE,
    GRACE_PERIOD,
    HEARTBEAT_INTERVAL,
    StorageError,
    default_storage,
    open_storage,
    shown_url,
)
from experiments.hpo.workers import run_worker, spawn_workers

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from experiments.hpo.study_tracking import StudyTracker

__all__ = [
    "DEFAULT_STORAGE",
    "FAIL_REASON_ATTR",
    "GRACE_PERIOD",
    "HEARTBEAT_INTERVAL",
    "RUN_ID_ATTR",
    "Hyperparameter",
    "NonFiniteMetricError",
    "Objective",
    "OptunaPruning",
    "SearchSpace",
    "StorageError",
    "TrialSettings",
    "TuneResult",
    "make_pruner",
    "open_storage",
    "search_space",
    "tune",
    "tune_main",
    "write_best_config",
]

log = logging.getLogger(__name__)


def tune(
    config: str | Path | Mapping[str, Any],
    *,
    sampler: str = "gif",
    n_trials: int = 20,
    storage: str | None = None,
    study_name: str | None = None,
    workers: int = 1,
    seed: int = 0,
    max_epochs: int = 3,
    limit_train_batches: float | None = None,
    overrides: Sequence[str] = (),
    output: str | Path | None = None,
    tracking: bool = True,
    experiment: str = "hpo",
    pruner: str | optuna.pruners.BasePruner | None = "median",
    prune_warmup: bool = False,
    keep_checkpoints: bool = False,
    fixed: Mapping[str, Any] | None = None,
    parent_run_id: str | None = None,
    allow_changed_settings: bool = False,
) -> TuneResult:
    """Tune the hyperparameters of a ``salience fit`` config on validation AUC.

    Re-running with the same storage and study name resumes the study: only the trials missing
    to ``n_trials`` (of any state) run.

    Args:
        config: the ``salience fit`` YAML config (or the config as a dict).
        sampler: a registered sampler name (:class:`~experiments.hpo.samplers.SamplerChoice`:
            ``gif``, ``tpe``, ``random``, ``sg``, the ``gif-*`` ablations, ...).
        n_trials: the study's total trial budget.
        storage: Optuna RDB URL (default ``sqlite:///optuna.db`` in the working directory).
        study_name: default ``<config stem>-<sampler>``.
        workers: worker processes sharing the study (each uses ``cpu_count // workers`` threads).
        seed: seed of the sampler and of every trial's fit.
        max_epochs: epochs per trial.
        limit_train_batches: training batches per epoch (int) or fraction (float) per trial.
        overrides: ``salience fit`` command-line overrides applied to every trial (and written
            into the best config when they are ``--key=value``).
        output: the best config's path (default ``runs/tune/<study>/best_config.yaml``); ``trials.csv``
            and ``summary.json`` go to the same folder.
        tracking: MLflow parent run of the study, one nested run per trial.
        experiment: MLflow experiment of the study and its trials.
        pruner: a registered pruner name (``median``, ``none``) or an Optuna pruner.
        prune_warmup: let the pruner stop GIF warm-start trials too.
        keep_checkpoints: keep every trial's checkpoints (deleted after the trial by default).
        fixed: hyperparameters held at these values instead of searched (see :func:`search_space`).
        parent_run_id: nest the study's MLflow run under this run (a pipeline stage).
        allow_changed_settings: resume a study that was created with other settings (sampler,
            config, architecture, seed, epochs, batches, overrides, fixed values), mixing its
            trials with the new ones; without it such a resume is refused (a larger
            ``n_trials`` is always fine).

    Raises:
        StorageError: the storage cannot be opened.
        ValueError: a resumed study was created with other settings (and
            ``allow_changed_settings`` is off).
    """
    _check_arguments(sampler, n_trials, workers)
    pruner_obj = make_pruner(pruner)
    storage_url = storage or default_storage()
    config_path, name, out_dir = _study_files(config, sampler, study_name, output)
    resolved = resolved_config(config_path, overrides)
    space = search_space(backbone_spec(resolved)[0], fixed)
    attrs = {"sampler": sampler, "config": str(config_path), "n_trials": n_trials, "arch": space.arch, "seed": seed,
             "max_epochs": max_epochs, "limit_train_batches": limit_train_batches, "overrides": list(overrides),
             "fixed": json.loads(json.dumps(dict(fixed or {}), default=str))}
    rdb, remaining = _open_study(storage_url, name, seed, pruner_obj, attrs, allow_changed_settings)
    tracker = _study_tracker(name, storage_url, experiment, parent_run_id) if tracking else None
    settings = TrialSettings(
        config=str(config_path),
        overrides=list(overrides),
        storage=storage_url,
        study_name=name,
        sampler=sampler,
        n_trials=n_trials,
        seed=seed,
        max_epochs=max_epochs,
        limit_train_batches=limit_train_batches,
        tracking=tracking,
        experiment=experiment,
        parent_run_id=tracker.parent_run_id if tracker is not None else None,
        workdir=str(out_dir / "fits"),
        keep_checkpoints=keep_checkpoints,
        prune_warmup=prune_warmup,
        fixed=dict(space.fixed),
    )
    _evaluate(settings, space, pruner_obj, remaining, min(workers, remaining) if remaining else 1)
    study = optuna.load_study(study_name=name, storage=rdb)
    trials = study.get_trials(deepcopy=False)
    best_path = _write_best_config(trials, settings, resolved, space, output, out_dir)
    result = TuneResult.of(name, storage_url, trials, best_path, out_dir, settings.parent_run_id)
    write_outputs(study, result, space, out_dir)
    if tracker is not None:
        _finish_tracking(tracker, study, best_path)
    return result


# -- the steps of tune() ------------------------------------------------------------------------
def _check_arguments(sampler: str, n_trials: int, workers: int) -> None:
    if n_trials < 1:
        raise ValueError(f"n_trials must be at least 1, got {n_trials}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if sampler not in SamplerChoice.registered_names():
        raise ValueError(f"unknown sampler {sampler!r}; available: {SamplerChoice.registered_names()}")


def _study_files(
    config: str | Path | Mapping[str, Any], sampler: str, study_name: str | None, output: str | Path | None
) -> tuple[Path, str, Path]:
    """``(config file, study name, output folder)``; a config given as a dict is written to
    ``config.yaml`` in the output folder."""
    if isinstance(config, Mapping):
        stem = "config"
    else:
        config_path = Path(config)
        if not config_path.is_file():
            raise FileNotFoundError(f"config file not found: {config_path}")
        stem = config_path.stem
    name = study_name or f"{stem}-{sampler}"
    out_dir = Path(output).parent if output is not None else Path("runs") / "tune" / name
    if isinstance(config, Mapping):
        from recsys.io import write_config

        config_path = write_config(out_dir / "config.yaml", dict(config))
    return config_path, name, out_dir


#: settings a study may change on resume without mixing unlike trials
RESUMABLE_CHANGES = ("n_trials",)


def _open_study(
    storage_url: str, name: str, seed: int, pruner: optuna.pruners.BasePruner, attrs: Mapping[str, Any],
    allow_changed_settings: bool = False,
) -> tuple[optuna.storages.RDBStorage, int]:
    """Create or load the study and record ``attrs``; a resumed study created with other
    settings is refused (``allow_changed_settings``: a warning per setting, then resumed).
    Returns the storage and the trials missing to ``attrs["n_trials"]``."""
    rdb = open_storage(storage_url)
    study = optuna.create_study(
        study_name=name,
        storage=rdb,
        sampler=optuna.samplers.RandomSampler(seed=seed),
        pruner=pruner,
        direction="maximize",
        load_if_exists=True,
    )
    stored = study.user_attrs
    changed = {k: (stored[k], v) for k, v in attrs.items() if k in stored and stored[k] != v and k not in RESUMABLE_CHANGES}
    if changed and not allow_changed_settings:
        listed = "; ".join(f"{k}: {old!r} then, {new!r} now" for k, (old, new) in changed.items())
        raise ValueError(
            f"study {name!r} in {shown_url(storage_url)} was created with other settings ({listed}); resuming it would "
            f"mix trials of both. Name a new study (--study-name) or pass --allow-changed-settings to mix them"
        )
    for key, (old, new) in changed.items():
        log.warning("study %s was created with %s=%r, now %r (mixed: --allow-changed-settings)", name, key, old, new)
    for key, value in attrs.items():
        if key not in stored or key in RESUMABLE_CHANGES:
            study.set_user_attr(key, value)
    done = len(study.get_trials(deepcopy=False, states=None))
    remaining = max(0, int(attrs["n_trials"]) - done)
    if done:
        log.info("study %s: %d trial(s) already in %s; %d to go", name, done, shown_url(storage_url), remaining)
    return rdb, remaining


def _study_tracker(name: str, storage_url: str, experiment: str, parent_run_id: str | None) -> StudyTracker:
    """The study's MLflow parent run (nested under ``parent_run_id`` when given)."""
    from experiments.hpo.study_tracking import StudyTracker

    return StudyTracker(name, storage=storage_url, experiment=experiment, parent_run_id=parent_run_id)


def _evaluate(
    settings: TrialSettings, space: SearchSpace, pruner: optuna.pruners.BasePruner, remaining: int, workers: int
) -> None:
    """Run the ``remaining`` trials in this process or in ``workers`` worker processes."""
    log.info(
        "tuning %s (%s, %d hyperparameters) with %s: %d trial(s), %d worker(s), %d epoch(s) each",
        Path(settings.config).stem,
        space.arch,
        len(space),
        settings.sampler,
        remaining,
        workers,
        settings.max_epochs,
    )
    try:
        if remaining and workers == 1:
            run_worker(settings, pruner, remaining)
        elif remaining:
            spawn_workers(settings, pruner, remaining, workers)
    except KeyboardInterrupt:
        log.warning("interrupted: re-run the same command to resume study %s", settings.study_name)
        raise


def _write_best_config(
    trials: Sequence[FrozenTrial],
    settings: TrialSettings,
    resolved: Mapping[str, Any],
    space: SearchSpace,
    output: str | Path | None,
    out_dir: Path,
) -> Path | None:
    """``best_config.yaml`` (or ``output``) from the best trial, with a header saying where it
    came from; None when no trial completed."""
    best = best_trial(trials)
    if best is None:
        return None
    path = Path(output) if output is not None else out_dir / "best_config.yaml"
    s = settings
    header = (
        f"# Best of study {s.study_name} ({s.sampler}, {len(trials)} trials): val AUC {best.value:.4f} after "
        f"{s.max_epochs} epoch(s) per trial (trial {best.number}).\n"
        f"# Written by: salience tune --config {s.config} --sampler {s.sampler} --n-trials {s.n_trials}\n"
        f"# Retrain: salience fit --config {path}\n"
    )
    return write_best_config(resolved, space, best.params, path, header)


def _finish_tracking(tracker: StudyTracker, study: optuna.Study, best_path: Path | None) -> None:
    """Summarise the study on its parent run and log the best config there."""
    tracker.finalize(study)
    if best_path is None:
        return
    from mlflow.exceptions import MlflowException

    try:
        tracker.client.log_artifact(str(tracker.parent_run_id), str(best_path), "tune")
    except (MlflowException, OSError) as e:  # the result is on disk either way
        log.warning("could not log the best config to MLflow: %s", e)


# -- the command line ---------------------------------------------------------------------------
def _limit(text: str) -> float | int:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return int(value) if value >= 1 and value.is_integer() and "." not in text else value


def tune_main(argv: Sequence[str]) -> int:
    """``salience tune``: the command line of :func:`tune`."""
    from recsys.argv import split_passthrough

    parser = argparse.ArgumentParser(
        prog="salience tune",
        description="Tune a ranking model's hyperparameters on validation AUC (Optuna, with pruning) and write the "
        "best config for `salience fit`. Unknown --key=value arguments (and everything after `--`) are "
        "`salience fit` overrides applied to every trial.",
    )
    parser.add_argument("--config", required=True, help="a `salience fit` config (data + backbone + trainer)")
    parser.add_argument(
        "--sampler", default="gif", choices=SamplerChoice.registered_names(), help="search strategy (default: gif)"
    )
    parser.add_argument(
        "--n-trials", type=int, default=20, help="total trials of the study (a resumed study runs the missing ones)"
    )
    parser.add_argument(
        "--storage", default=None, help=f"Optuna storage URL (default: {DEFAULT_STORAGE} in the working directory)"
    )
    parser.add_argument("--study-name", default=None, help="default: <config stem>-<sampler>")
    parser.add_argument("--workers", type=int, default=1, help="worker processes sharing the study")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler and of every fit")
    parser.add_argument("--max-epochs", type=int, default=3, help="epochs per trial (default: 3)")
    parser.add_argument(
        "--limit-train-batches", type=_limit, default=None, help="training batches (int) or fraction per epoch"
    )
    parser.add_argument(
        "--pruner",
        default="median",
        choices=PrunerChoice.registered_names(),
        help="prune bad trials (default: median)",
    )
    parser.add_argument(
        "--output", default=None, help="best config path (default: runs/tune/<study>/best_config.yaml)"
    )
    parser.add_argument("--experiment", default="hpo", help="MLflow experiment (default: hpo)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep every trial's checkpoints")
    parser.add_argument("--allow-changed-settings", action="store_true",
                        help="resume a study created with other settings, mixing its trials with the new ones "
                             "(refused by default; a larger --n-trials is always fine)")
    own, passthrough = split_passthrough(argv)
    args, overrides = parser.parse_known_args(own)
    overrides += passthrough
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial comes from our callback
    try:
        result = tune(
            args.config,
            sampler=args.sampler,
            n_trials=args.n_trials,
            storage=args.storage,
            study_name=args.study_name,
            workers=args.workers,
            seed=args.seed,
            max_epochs=args.max_epochs,
            limit_train_batches=args.limit_train_batches,
            overrides=overrides,
            output=args.output,
            tracking=not args.no_tracking,
            experiment=args.experiment,
            pruner=args.pruner,
            keep_checkpoints=args.keep_checkpoints,
            allow_changed_settings=args.allow_changed_settings,
        )
    except (StorageError, FileNotFoundError, ValueError) as e:
        print(f"salience tune: error: {e}", file=sys.stderr)
        return 2
    print(result.table())
    print(
        f"trials: {Path(result.output_dir) / 'trials.csv'}"
        + (f"   MLflow parent run: {result.parent_run_id}" if result.parent_run_id else "")
    )
    return 0 if result.best_value is not None else 1
