"""``salience tune``: hyperparameter search for a ranking model on validation AUC.

Every trial is an ordinary ``salience fit`` (through :class:`~recsys.train.recipe.Recipe`) of
the given config with the sampled hyperparameters applied as command-line overrides, a short
per-trial budget (``--max-epochs``, ``--limit-train-batches``) and the test pass off; its value
is the best validation AUC. The study lives in an Optuna RDB storage, so a killed search
resumes by re-running the same command and several worker processes share one study::

    salience tune --config experiments/configs/frappe_dcnv2.yaml --sampler gif --n-trials 60 --workers 2
    salience fit --config runs/tune/frappe_dcnv2-gif/best_config.yaml     # retrain the best

* **Search space** (:func:`search_space`): 13 hyperparameters for DCNv2 (optimizer, learning
  rate, dense and embedding weight decay, embedding dim, batch size, dropout, batch norm, deep
  MLP depth / width / shape, cross layers, structure); DLRM and DeepFM get the subset that
  applies (11 each). Trials train the embeddings with the dense optimizer
  (``model.embedding_kernel: plain``), which ``embedding_weight_decay`` and the optimizer
  choice need.
* **Pruning**: :class:`OptunaPruning` reports the validation AUC of every epoch to the trial
  and raises :class:`optuna.TrialPruned` when the pruner says so (default
  ``MedianPruner(n_startup_trials=5, n_warmup_steps=1)``). GIF's warm-start trials are never
  pruned: its importance assessment needs full evaluations.
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
* **MLflow**: one parent run per study (:class:`~experiments.hpo.tracking.StudyTracker`);
  every trial's fit is a nested child run whose id is the trial's ``mlflow_run_id``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from lightning.pytorch.callbacks import Callback
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from recsys.train.recipe import FitResult, Recipe

__all__ = [
    "DEFAULT_STORAGE",
    "Hyperparameter",
    "NonFiniteMetricError",
    "OptunaPruning",
    "SearchSpace",
    "StorageError",
    "TuneResult",
    "make_pruner",
    "open_storage",
    "search_space",
    "tune",
    "tune_main",
    "write_best_config",
]

log = logging.getLogger(__name__)

#: default Optuna storage: ``optuna.db`` in the working directory
DEFAULT_STORAGE = "sqlite:///optuna.db"
#: trial user attributes written by the objective
RUN_ID_ATTR = "mlflow_run_id"
FAIL_REASON_ATTR = "fail_reason"
#: seconds between trial heartbeats, and how long a silent RUNNING trial lives before it is failed
HEARTBEAT_INTERVAL = 15
GRACE_PERIOD = 60


class StorageError(RuntimeError):
    """The Optuna storage URL cannot be opened (bad URL, missing driver, unreachable server)."""


class NonFiniteMetricError(ValueError):
    """A trial's validation metric is NaN or infinite (training diverged)."""


# -- the search space ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Hyperparameter:
    """One tuned hyperparameter: its Optuna distribution and what it sets.

    Args:
        name: the Optuna parameter name.
        distribution: its Optuna distribution.
        help: one line on what it sets in the ``salience fit`` config.
    """

    name: str
    distribution: BaseDistribution
    help: str

    def suggest(self, trial: optuna.Trial) -> Any:
        d = self.distribution
        if isinstance(d, FloatDistribution):
            return trial.suggest_float(self.name, d.low, d.high, log=d.log, step=d.step)
        if isinstance(d, IntDistribution):
            return trial.suggest_int(self.name, d.low, d.high, log=d.log, step=d.step)
        if isinstance(d, CategoricalDistribution):
            return trial.suggest_categorical(self.name, d.choices)
        raise TypeError(f"unsupported distribution {type(d).__name__} of {self.name!r}")


def _float(low: float, high: float, log: bool = False) -> FloatDistribution:
    return FloatDistribution(low, high, log=log)


_COMMON: tuple[Hyperparameter, ...] = (
    Hyperparameter("optimizer", CategoricalDistribution(("adam", "adamw", "adagrad", "sgd")), "model.optimizer"),
    Hyperparameter("learning_rate", _float(1e-4, 1e-1, log=True), "model.learning_rate"),
    Hyperparameter("weight_decay", _float(1e-8, 1e-2, log=True), "model.weight_decay (dense parameters)"),
    Hyperparameter("embedding_weight_decay", _float(1e-6, 1e-1, log=True), "model.embedding_weight_decay"),
    Hyperparameter("embedding_dim", CategoricalDistribution((8, 16, 32)), "data.embedding_dim (every sparse feature)"),
    Hyperparameter("batch_size", CategoricalDistribution((256, 512, 1024, 2048, 4096)), "data.batch_size"),
    Hyperparameter("dropout", _float(0.0, 0.5), "model.arch_args.dropout"),
    Hyperparameter("batch_norm", CategoricalDistribution((False, True)), "model.arch_args.batch_norm"),
)
_MLP: tuple[Hyperparameter, ...] = (
    Hyperparameter("mlp_layers", IntDistribution(1, 4), "depth of the deep MLP"),
    Hyperparameter("mlp_width", CategoricalDistribution((64, 128, 256, 512)), "width of its first layer"),
    Hyperparameter(
        "mlp_shape", CategoricalDistribution(("constant", "funnel")), "constant width, or halving per layer"
    ),
)
_ARCH_PARAMS: dict[str, tuple[Hyperparameter, ...]] = {
    "dcnv2": (
        *_COMMON,
        *_MLP,
        Hyperparameter("cross_layers", IntDistribution(1, 5), "model.arch_args.cross_layers"),
        Hyperparameter("structure", CategoricalDistribution(("parallel", "stacked")), "model.arch_args.structure"),
    ),
    "dlrm": (*_COMMON, *_MLP),  # the MLP is DLRM's top (over) MLP
    "deepfm": (*_COMMON, *_MLP),
}
#: the arch_args key of the deep MLP per backbone
_MLP_KEY = {"dcnv2": "deep_mlp", "dlrm": "top_mlp", "deepfm": "deep_mlp"}


@dataclass(frozen=True)
class SearchSpace:
    """The typed search space of one backbone and how a sampled point becomes a config.

    Args:
        arch: backbone name (``dcnv2``, ``dlrm``, ``deepfm``).
        params: the hyperparameters.
    """

    arch: str
    params: tuple[Hyperparameter, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {p.name: p.distribution for p in self.params}

    def __len__(self) -> int:
        return len(self.params)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Sample every hyperparameter of the space on ``trial``."""
        return {p.name: p.suggest(trial) for p in self.params}

    def config_updates(self, params: Mapping[str, Any], arch_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{dotted config key: value}`` for a sampled point; ``arch_args`` (the config's
        ``model.arch_args``) is the base the sampled backbone arguments are merged into; the
        :attr:`fixed` hyperparameters fill the ones not sampled."""
        params = {**self.fixed, **params}
        missing = sorted(set(self.names) - set(params))
        if missing:
            raise ValueError(f"parameters {missing} of the {self.arch} search space are missing")
        args = dict(arch_args or {})
        args["dropout"] = float(params["dropout"])
        args["batch_norm"] = bool(params["batch_norm"])
        width, depth = int(params["mlp_width"]), int(params["mlp_layers"])
        halve = params["mlp_shape"] == "funnel"
        args[_MLP_KEY[self.arch]] = [max(16, width >> i) if halve else width for i in range(depth)]
        if self.arch == "dcnv2":
            args["cross_layers"] = int(params["cross_layers"])
            args["structure"] = str(params["structure"])
        return {
            "model.embedding_kernel": "plain",
            "model.optimizer": str(params["optimizer"]),
            "model.learning_rate": float(params["learning_rate"]),
            "model.weight_decay": float(params["weight_decay"]),
            "model.embedding_weight_decay": float(params["embedding_weight_decay"]),
            "model.arch_args": args,
            "data.embedding_dim": int(params["embedding_dim"]),
            "data.batch_size": int(params["batch_size"]),
        }


def search_space(arch: str, fixed: Mapping[str, Any] | None = None) -> SearchSpace:
    """The search space of a backbone (``dcnv2`` 13 hyperparameters, ``dlrm`` / ``deepfm`` 11).

    ``fixed`` holds hyperparameters taken out of the search at the given values (e.g.
    ``{"embedding_dim": 16}`` when a dimension plan sets the dims); an unknown name or a value
    outside its range is an error naming it.
    """
    if arch not in _ARCH_PARAMS:
        raise ValueError(f"no search space for model.arch={arch!r}; choose one of {sorted(_ARCH_PARAMS)}")
    params = _ARCH_PARAMS[arch]
    fixed = dict(fixed or {})
    known = {p.name: p for p in params}
    unknown = sorted(set(fixed) - set(known))
    if unknown:
        raise ValueError(f"fixed hyperparameters {unknown} are not in the {arch} search space {sorted(known)}")
    for name, value in fixed.items():
        dist = known[name].distribution
        try:
            inside = dist._contains(dist.to_internal_repr(value))
        except (ValueError, TypeError):
            inside = False
        if not inside:
            raise ValueError(f"fixed hyperparameter {name}={value!r} is outside its range {known[name].distribution}")
    return SearchSpace(arch, tuple(p for p in params if p.name not in fixed), fixed)


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".12e")  # always a YAML float (``1e-05`` would read as a string)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def _cli_args(updates: Mapping[str, Any]) -> list[str]:
    return [f"--{key}={_cli_value(value)}" for key, value in updates.items()]


# -- pruning ------------------------------------------------------------------------------------
#: trials being evaluated in this process, by (study name, trial number): the pruning callback,
#: built by the CLI from plain init args, finds its live trial here without a second connection
_LIVE_TRIALS: dict[tuple[str, int], optuna.Trial] = {}


class OptunaPruning(Callback):
    """Report the validation metric of every epoch to an Optuna trial; prune when told to.

    Built from plain arguments so that a ``salience fit`` config or command line can add it::

        --trainer.callbacks+={"class_path": "experiments.hpo.tune.OptunaPruning",
                              "init_args": {"storage": URL, "study_name": NAME, "trial_number": N}}

    The trial is the live one of this process when ``salience tune`` runs the fit, else it is
    rebuilt from the storage (with the pruner named by ``pruner``: Optuna does not store
    pruners). A non-finite metric raises :class:`NonFiniteMetricError` (the
    trial fails); a pruned trial's MLflow run ends ``KILLED`` with the tag ``optuna.state``.

    Args:
        storage: the study's storage URL.
        study_name: the study.
        trial_number: the trial's number in the study.
        monitor: metric reported each validation epoch.
        prune_warmup: also prune GIF warm-start trials (off: the importance assessment needs
            full evaluations).
        pruner: the pruner of a trial rebuilt from storage (see :func:`make_pruner`).
    """

    def __init__(
        self,
        storage: str | None = None,
        study_name: str | None = None,
        trial_number: int | None = None,
        monitor: str = "val_auc",
        prune_warmup: bool = False,
        pruner: str = "median",
    ) -> None:
        super().__init__()
        self.pruner = pruner
        self.storage = storage
        self.study_name = study_name
        self.trial_number = trial_number
        self.monitor = monitor
        self.prune_warmup = prune_warmup
        self._trial: optuna.Trial | None = None
        self._step = 0
        self._can_prune = True

    @classmethod
    def for_trial(cls, trial: optuna.Trial, monitor: str = "val_auc", prune_warmup: bool = False) -> OptunaPruning:
        """A callback bound to a live trial object (no storage lookup)."""
        cb = cls(
            study_name=trial.study.study_name, trial_number=trial.number, monitor=monitor, prune_warmup=prune_warmup
        )
        cb._bind(trial)
        return cb

    def _bind(self, trial: optuna.Trial) -> None:
        self._trial = trial
        if not self.prune_warmup:
            from experiments.hpo.gif import trial_phase

            # GIF writes the phase in before_trial, after the Trial object cached its state
            frozen = trial.study._storage.get_trial(trial._trial_id)
            self._can_prune = trial_phase(frozen)[0] != "warmup"

    @property
    def trial(self) -> optuna.Trial:
        if self._trial is None:
            if self.study_name is None or self.trial_number is None:
                raise ValueError("OptunaPruning needs study_name and trial_number")
            live = _LIVE_TRIALS.get((self.study_name, int(self.trial_number)))
            if live is None:
                if self.storage is None:
                    raise ValueError(
                        f"trial {self.trial_number} of study {self.study_name!r} is not live here; give the storage URL"
                    )
                study = optuna.load_study(
                    study_name=self.study_name,
                    storage=open_storage(self.storage, heartbeat=False),
                    pruner=make_pruner(self.pruner),
                )
                trial_id = study._storage.get_trial_id_from_study_id_trial_number(
                    study._study_id, int(self.trial_number)
                )
                live = optuna.trial.Trial(study, trial_id)
            self._bind(live)
        assert self._trial is not None
        return self._trial

    def _tracker(self, trainer: pl.Trainer) -> Any:
        from recsys.tracking import MlflowTracking

        tracking = next((c for c in trainer.callbacks if isinstance(c, MlflowTracking)), None)
        return tracking.tracker if tracking is not None else None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        tracker = self._tracker(trainer)  # started in setup; a pruned or failed fit keeps its id too
        if tracker is not None:
            self.trial.set_user_attr(RUN_ID_ATTR, tracker.run_id)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metric = trainer.callback_metrics.get(self.monitor)
        if metric is None:
            log.warning("OptunaPruning: no %r logged this validation; nothing reported", self.monitor)
            return
        value = float(metric)
        step, self._step = self._step, self._step + 1
        if not math.isfinite(value):
            raise NonFiniteMetricError(f"{self.monitor} is {value} after validation {step} (training diverged)")
        trial = self.trial
        trial.report(value, step)
        if self._can_prune and trial.should_prune():
            raise optuna.TrialPruned(f"pruned after validation {step}: {self.monitor}={value:.4f}")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        tracker = self._tracker(trainer)
        if isinstance(exception, optuna.TrialPruned) and tracker is not None:
            tracker.set_tags({"optuna.state": "PRUNED"})
            tracker.finish("KILLED")


def make_pruner(name: str | optuna.pruners.BasePruner | None) -> optuna.pruners.BasePruner:
    """``median`` (``MedianPruner(n_startup_trials=5, n_warmup_steps=1)``: a trial is pruned
    from its second epoch on when below the median of earlier trials at the same epoch, once
    5 trials finished), ``none``, or a pruner instance."""
    if isinstance(name, optuna.pruners.BasePruner):
        return name
    if name in (None, "none"):
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    raise ValueError(f"unknown pruner {name!r}; choose 'median' or 'none'")


# -- storage ------------------------------------------------------------------------------------
def _default_storage() -> str:
    return f"sqlite:///{Path.cwd() / 'optuna.db'}"


def _parsed_url(url: str) -> Any:
    """``url`` as SQLAlchemy's ``URL``, or None when it is not one (nothing to hide then)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        return None


def _shown_url(url: str) -> str:
    """``url`` with its password, if any, as ``***``: for messages, logs and ``summary.json``."""
    parsed = _parsed_url(url)
    return parsed.render_as_string(hide_password=True) if parsed is not None and parsed.password is not None else url


def _url_without_password(url: str) -> str:
    """``url`` less its password: what goes into every trial's fit config (which is saved with the
    run and logged to MLflow). Only a fit in another process needs it, and that one then finds
    the password where the driver looks without one (``PGPASSWORD``, ``~/.pgpass``, ...)."""
    parsed = _parsed_url(url)
    if parsed is None or not parsed.password:
        return url
    return parsed._replace(password=None).render_as_string(hide_password=False)


#: tries to open a storage whose tables another process is creating at the same moment
_INIT_ATTEMPTS = 5
_INIT_RACE_MESSAGES = ("already exists", "duplicate", "unique constraint", "database is locked")


def _init_race(error: BaseException) -> bool:
    """Whether ``error`` is another process initialising the same new database (a table that
    already exists, a duplicate version row, a locked sqlite file)."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    if not isinstance(error, (OperationalError, IntegrityError, ProgrammingError)):
        return False
    text = str(error).lower()
    return any(m in text for m in _INIT_RACE_MESSAGES)


def open_storage(url: str, heartbeat: bool = True) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage with trial heartbeats (a killed worker's trial is failed on resume).

    Several processes may open a new database at once (``salience tune`` started on several
    machines): whoever loses the race to create the tables retries.

    Raises:
        StorageError: naming the URL, when it is malformed, its driver is missing or the
            database cannot be reached.
    """
    if "://" not in url:
        raise StorageError(
            f"storage {url!r} is not a database URL; e.g. sqlite:///{url} (a file in the working directory)"
        )
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}  # several workers write to one file
    elif url.startswith(("postgresql", "mysql")):
        engine_kwargs["connect_args"] = {"connect_timeout": 10}
    hb = {"heartbeat_interval": HEARTBEAT_INTERVAL, "grace_period": GRACE_PERIOD} if heartbeat else {}
    import warnings

    attempt = 0
    try:
        while True:
            attempt += 1
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats
                    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **hb)
            except Exception as e:
                # processes opening a new database at once race to create its tables and version
                # rows; the loser finds them in place on a second try
                if attempt == _INIT_ATTEMPTS or not _init_race(e):
                    raise
                time.sleep(0.2 * attempt)
    except Exception as e:  # sqlalchemy's errors (ArgumentError, OperationalError), missing drivers
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ""
        if url.startswith("sqlite"):
            hint = " (does the folder of the database file exist and is it writable?)"
        elif isinstance(e, ImportError):
            hint = " (install the database driver)"
        else:
            hint = " (is the database server running and reachable?)"
        raise StorageError(
            f"cannot open the Optuna storage {_shown_url(url)!r}: {type(e).__name__}: {reason}{hint}"
        ) from e


# -- the objective ------------------------------------------------------------------------------
def _set_nested(config: dict[str, Any], dotted: str, value: Any) -> bool:
    node = config
    *parents, last = dotted.split(".")
    for key in parents:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            return False
        node = child
    node[last] = value
    return True


def _get_nested(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def _simple_overrides(overrides: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``--a.b=v`` / ``--a.b v`` command-line overrides -> ``{"a.b": v}`` (YAML-parsed), plus
    the ones that are not of that form."""
    import yaml

    out: dict[str, Any] = {}
    other: list[str] = []
    items = list(overrides)
    i = 0
    while i < len(items):
        item = items[i]
        if item.startswith("--") and "=" in item:
            key, value = item[2:].split("=", 1)
        elif item.startswith("--") and i + 1 < len(items) and not items[i + 1].startswith("--"):
            key, value = item[2:], items[i + 1]
            i += 1
        else:
            other.append(item)
            i += 1
            continue
        i += 1
        if key.endswith("+") or key in ("config", "print_config"):
            other.append(f"--{key}={value}")
            continue
        out[key] = yaml.safe_load(value)
    return out, other


def _resolved_config(config_path: Path, overrides: Sequence[str]) -> dict[str, Any]:
    import yaml

    config = yaml.safe_load(config_path.read_text()) or {}
    simple, _ = _simple_overrides(overrides)
    for key, value in simple.items():
        _set_nested(config, key, value)
    return config


@dataclass
class _TrialSettings:
    """What every worker needs to evaluate trials (picklable)."""

    config: str
    overrides: list[str]
    storage: str
    study_name: str
    sampler: str
    n_trials: int
    seed: int
    max_epochs: int
    limit_train_batches: float | None
    tracking: bool
    experiment: str
    parent_run_id: str | None
    workdir: str
    keep_checkpoints: bool
    prune_warmup: bool
    pruner_name: str = "median"
    fixed: dict[str, Any] = field(default_factory=dict)


class _Objective:
    """Trains one trial's config through the recipe; returns the best validation AUC."""

    def __init__(
        self, settings: _TrialSettings, recipe: Recipe, space: SearchSpace, arch_args: Mapping[str, Any]
    ) -> None:
        self.settings = settings
        self.recipe = recipe
        self.space = space
        self.arch_args = dict(arch_args)

    def extra_args(self, trial: optuna.Trial, params: Mapping[str, Any]) -> list[str]:
        s = self.settings
        args = _cli_args(self.space.config_updates(params, self.arch_args))
        pruning = {
            "class_path": f"{OptunaPruning.__module__}.{OptunaPruning.__qualname__}",
            "init_args": {
                "storage": _url_without_password(s.storage),
                "study_name": s.study_name,
                "trial_number": trial.number,
                "prune_warmup": s.prune_warmup,
                "pruner": s.pruner_name,
            },
        }
        args += [f"--trainer.callbacks+={json.dumps(pruning)}", "--after_fit.test=false"]
        if s.limit_train_batches is not None:
            args.append(f"--trainer.limit_train_batches={s.limit_train_batches}")
        if s.tracking:
            args.append(f"--tracking.experiment={s.experiment}")
        return args

    def fit(self, trial: optuna.Trial, params: Mapping[str, Any]) -> FitResult:
        s = self.settings
        return self.recipe.fit(
            max_epochs=s.max_epochs,
            seed=s.seed,
            run_name=f"trial-{trial.number:04d}",
            parent_run_id=s.parent_run_id,
            tracking=s.tracking,
            extra_args=self.extra_args(trial, params),
        )

    def __call__(self, trial: optuna.Trial) -> float:
        params = self.space.suggest(trial)
        key = (self.settings.study_name, trial.number)
        _LIVE_TRIALS[key] = trial
        start = time.perf_counter()
        try:
            result = self.fit(trial, params)
            if result.run_id:
                trial.set_user_attr(RUN_ID_ATTR, result.run_id)
            value = result.metrics.get("best_val_auc", result.metrics.get("val_auc"))
            if value is None:
                raise NonFiniteMetricError("the fit logged no val_auc (no validation ran?)")
            value = float(value)
            if not math.isfinite(value):
                raise NonFiniteMetricError(f"best val_auc is {value} (training diverged)")
            return value
        except optuna.TrialPruned:
            raise
        except Exception as e:
            trial.set_user_attr(FAIL_REASON_ATTR, f"{type(e).__name__}: {e}"[:2000])
            raise
        finally:
            _LIVE_TRIALS.pop(key, None)
            trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
            if not self.settings.keep_checkpoints:
                shutil.rmtree(Path(self.recipe.workdir) / f"trial-{trial.number:04d}", ignore_errors=True)


def _log_trial(n_trials: int) -> Any:
    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        try:
            best = f"best {study.best_value:.4f} (#{study.best_trial.number})"
        except ValueError:
            best = "no complete trial yet"
        if trial.state == TrialState.COMPLETE:
            what = f"val_auc {trial.value:.4f}"
        elif trial.state == TrialState.PRUNED:
            what = f"pruned at step {trial.last_step}"
        else:
            what = f"failed: {trial.user_attrs.get(FAIL_REASON_ATTR, 'see the log')}"[:160]
        seconds = trial.user_attrs.get("seconds")
        took = f" {seconds:.1f}s" if isinstance(seconds, (int, float)) else ""
        log.info("trial %d/%d %s%s; %s", trial.number + 1, n_trials, what, took, best)

    return callback


class _TrialSeededSampler(optuna.samplers.BaseSampler):
    """``make_sampler(name, seed=...)`` built afresh for every trial, seeded from ``(seed, trial
    number)``.

    A sampler seeded once draws the same sequence in every process, so ``--workers`` processes
    or ``salience tune`` commands on several machines sharing one study would evaluate the same
    points. Seeded per trial number, every trial gets its own draw wherever it runs, and a
    rerun of the study draws the same points again (for ``random``; TPE also depends on the
    trials finished so far). The samplers wrapped keep no state between trials but their random
    generator (TPE rebuilds its model from the study each trial).
    """

    def __init__(self, name: str, n_trials: int, seed: int) -> None:
        self.name = name
        self.n_trials = n_trials
        self.seed = seed
        self._samplers: dict[int, optuna.samplers.BaseSampler] = {}
        self._lock = threading.Lock()

    def _sampler(self, trial: FrozenTrial) -> optuna.samplers.BaseSampler:
        import warnings

        import numpy as np

        from experiments.hpo import make_sampler

        with self._lock:
            sampler = self._samplers.get(trial._trial_id)
            if sampler is None:
                seed = int(np.random.SeedSequence([self.seed % 2**32, trial.number]).generate_state(1)[0])
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # TPE's options
                    sampler = make_sampler(self.name, n_trials=self.n_trials, seed=seed)
                self._samplers[trial._trial_id] = sampler
            return sampler

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._sampler(trial).before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._sampler(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._sampler(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._sampler(trial).sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._sampler(trial).after_trial(study, trial, state, values)
        with self._lock:
            self._samplers.pop(trial._trial_id, None)

    def reseed_rng(self) -> None:  # every trial is seeded from its number
        pass


def _build_sampler(name: str, n_trials: int, seed: int) -> optuna.samplers.BaseSampler:
    from experiments.hpo import GIFSampler, make_sampler

    sampler = make_sampler(name, n_trials=n_trials, seed=seed)
    # GIF's decisions are functions of the seed, the trial number and the storage: one seed for
    # all workers; any other sampler would draw the same points in every process with one seed
    return sampler if isinstance(sampler, GIFSampler) else _TrialSeededSampler(name, n_trials, seed)


def _run_worker(
    settings: _TrialSettings,
    pruner: optuna.pruners.BasePruner,
    remaining: int,
    worker: int = 0,
    counter: Any = None,
    lock: Any = None,
) -> None:
    """Evaluate trials of the study until ``remaining`` are claimed (across workers when a
    shared ``counter``/``lock`` is given) or the study holds ``settings.n_trials`` trials."""
    from recsys.train.recipe import Recipe

    config = _resolved_config(Path(settings.config), settings.overrides)
    arch = str(_get_nested(config, "model.arch", "dcnv2"))
    space = search_space(arch, settings.fixed)
    recipe = Recipe(settings.config, settings.overrides, workdir=settings.workdir, quiet=True)
    objective = _Objective(settings, recipe, space, _get_nested(config, "model.arch_args", {}) or {})
    storage = open_storage(settings.storage)
    sampler = _build_sampler(settings.sampler, settings.n_trials, settings.seed)
    study = optuna.load_study(study_name=settings.study_name, storage=storage, sampler=sampler, pruner=pruner)
    callbacks: list[Any] = [
        optuna.study.MaxTrialsCallback(settings.n_trials, states=None),
        _log_trial(settings.n_trials),
    ]
    if settings.tracking:
        from experiments.hpo.tracking import StudyTracker

        callbacks.insert(
            0, StudyTracker(settings.study_name, storage=settings.storage, experiment=settings.experiment)
        )
    if counter is None:
        study.optimize(objective, n_trials=remaining, catch=(Exception,), callbacks=callbacks)
        return
    while True:
        with lock:
            # the counter shares the budget among this command's workers; the study's trial count
            # stops them when other commands (other machines) on the same storage filled it
            if counter.value >= remaining or len(study.get_trials(deepcopy=False)) >= settings.n_trials:
                return
            counter.value += 1
        study.optimize(objective, n_trials=1, catch=(Exception,), callbacks=callbacks)


def _worker_main(
    settings: _TrialSettings,
    pruner: optuna.pruners.BasePruner,
    remaining: int,
    worker: int,
    counter: Any,
    lock: Any,
    threads: int,
) -> None:
    """Entry point of a spawned worker process."""
    import torch

    from experiments.cli import configure_logging

    torch.set_num_threads(threads)
    configure_logging(f"%(levelname)s [worker {worker}] %(name)s: %(message)s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _run_worker(settings, pruner, remaining, worker, counter, lock)


# -- results ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuneResult:
    """The outcome of :func:`tune`.

    Args:
        study_name: the study.
        storage: its storage URL.
        best_value: best validation AUC (None when no trial completed).
        best_params: its hyperparameters.
        best_config_path: the written best config (None when no trial completed).
        n_complete: completed trials.
        n_pruned: pruned trials.
        n_failed: failed trials.
        values: value of every trial by number (None unless complete).
        best_trial: number of the best trial.
        output_dir: folder of ``trials.csv`` and ``summary.json``.
        parent_run_id: the study's MLflow parent run.
    """

    study_name: str
    storage: str
    best_value: float | None
    best_params: dict[str, Any]
    best_config_path: str | None
    n_complete: int
    n_pruned: int
    n_failed: int
    values: list[float | None] = field(default_factory=list)
    best_trial: int | None = None
    output_dir: str = ""
    parent_run_id: str | None = None

    def table(self) -> str:
        """A short text summary: counts, best value and the best hyperparameters."""
        lines = [
            f"study {self.study_name} ({_shown_url(self.storage)})",
            f"trials: {self.n_complete} complete, {self.n_pruned} pruned, {self.n_failed} failed",
        ]
        if self.best_value is None:
            lines.append("no trial completed: no best config")
            return "\n".join(lines)
        lines.append(f"best val_auc {self.best_value:.4f} (trial {self.best_trial})")
        width = max(len(k) for k in self.best_params) if self.best_params else 0
        lines.append(f"  {'param':<{width}}  value")
        for k, v in self.best_params.items():
            shown = f"{v:.4g}" if isinstance(v, float) else str(v)
            lines.append(f"  {k:<{width}}  {shown}")
        lines.append(f"best config: {self.best_config_path}")
        return "\n".join(lines)


def write_best_config(
    config: Mapping[str, Any], space: SearchSpace, params: Mapping[str, Any], path: Path, header: str = ""
) -> Path:
    """The config with the tuned hyperparameters applied, as YAML at ``path``."""
    import copy

    import yaml

    from recsys.io import atomic_write_text

    best = copy.deepcopy(dict(config))
    for key, value in space.config_updates(params, _get_nested(best, "model.arch_args", {}) or {}).items():
        _set_nested(best, key, value)
    atomic_write_text(path, header + yaml.safe_dump(best, sort_keys=False))
    return path


def _count(trials: Sequence[FrozenTrial], state: TrialState) -> int:
    return sum(t.state == state for t in trials)


# -- the entry points ---------------------------------------------------------------------------
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
) -> TuneResult:
    """Tune the hyperparameters of a ``salience fit`` config on validation AUC.

    Re-running with the same storage and study name resumes the study: only the trials missing
    to ``n_trials`` (of any state) run.

    Args:
        config: the ``salience fit`` YAML config (or the config as a dict).
        sampler: a name of :data:`experiments.hpo.SAMPLER_NAMES` (``gif``, ``tpe``, ``random``, ...).
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
        pruner: ``median``, ``none`` or an Optuna pruner.
        prune_warmup: let the pruner stop GIF warm-start trials too.
        keep_checkpoints: keep every trial's checkpoints (deleted after the trial by default).
        fixed: hyperparameters held at these values instead of searched (see :func:`search_space`).
        parent_run_id: nest the study's MLflow run under this run (a pipeline stage).

    Raises:
        StorageError: the storage cannot be opened.
    """
    if n_trials < 1:
        raise ValueError(f"n_trials must be at least 1, got {n_trials}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    from experiments.hpo import SAMPLER_NAMES

    if sampler not in SAMPLER_NAMES:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLER_NAMES)}")
    pruner_obj = make_pruner(pruner)
    storage_url = storage or _default_storage()
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
        import yaml

        from recsys.io import atomic_write_text

        config_path = out_dir / "config.yaml"
        atomic_write_text(
            config_path, yaml.safe_dump(json.loads(json.dumps(dict(config), default=str)), sort_keys=False)
        )
    resolved = _resolved_config(config_path, overrides)
    space = search_space(str(_get_nested(resolved, "model.arch", "dcnv2")), fixed)

    rdb = open_storage(storage_url)
    study = optuna.create_study(
        study_name=name,
        storage=rdb,
        sampler=optuna.samplers.RandomSampler(seed=seed),
        pruner=pruner_obj,
        direction="maximize",
        load_if_exists=True,
    )
    attrs = study.user_attrs
    for key, value in (
        ("sampler", sampler),
        ("config", str(config_path)),
        ("n_trials", n_trials),
        ("arch", space.arch),
    ):
        if key not in attrs:
            study.set_user_attr(key, value)
        elif attrs[key] != value:
            log.warning("study %s was created with %s=%r, now %r", name, key, attrs[key], value)
    done = len(study.get_trials(deepcopy=False, states=None))
    remaining = max(0, n_trials - done)
    if done:
        log.info("study %s: %d trial(s) already in %s; %d to go", name, done, _shown_url(storage_url), remaining)

    tracker = None
    outer_run_id, parent_run_id = parent_run_id, None
    if tracking:
        from experiments.hpo.tracking import StudyTracker

        tracker = StudyTracker(name, storage=storage_url, experiment=experiment, parent_run_id=outer_run_id)
        parent_run_id = tracker.parent_run_id
    settings = _TrialSettings(
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
        parent_run_id=parent_run_id,
        workdir=str(out_dir / "fits"),
        keep_checkpoints=keep_checkpoints,
        prune_warmup=prune_warmup,
        pruner_name=pruner if isinstance(pruner, str) else "none" if pruner is None else "median",
        fixed=dict(space.fixed),
    )
    workers = min(workers, remaining) if remaining else 1
    log.info(
        "tuning %s (%s, %d hyperparameters) with %s: %d trial(s), %d worker(s), %d epoch(s) each",
        stem,
        space.arch,
        len(space),
        sampler,
        remaining,
        workers,
        max_epochs,
    )
    try:
        if remaining and workers == 1:
            _run_worker(settings, pruner_obj, remaining)
        elif remaining:
            _spawn_workers(settings, pruner_obj, remaining, workers)
    except KeyboardInterrupt:
        log.warning("interrupted: re-run the same command to resume study %s", name)
        raise

    study = optuna.load_study(study_name=name, storage=rdb)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = max(complete, key=lambda t: float(t.value)) if complete else None  # type: ignore[arg-type]
    best_path: Path | None = None
    if best is not None:
        best_path = Path(output) if output is not None else out_dir / "best_config.yaml"
        header = (
            f"# Best of study {name} ({sampler}, {len(trials)} trials): val AUC {best.value:.4f} after "
            f"{max_epochs} epoch(s) per trial (trial {best.number}).\n"
            f"# Written by: salience tune --config {config_path} --sampler {sampler} --n-trials {n_trials}\n"
            f"# Retrain: salience fit --config {best_path}\n"
        )
        write_best_config(resolved, space, best.params, best_path, header)
    result = TuneResult(
        study_name=name,
        storage=storage_url,
        best_value=float(best.value) if best is not None else None,  # type: ignore[arg-type]
        best_params=dict(best.params) if best is not None else {},
        best_config_path=str(best_path) if best_path is not None else None,
        n_complete=len(complete),
        n_pruned=_count(trials, TrialState.PRUNED),
        n_failed=_count(trials, TrialState.FAIL),
        values=[float(t.value) if t.state == TrialState.COMPLETE else None for t in trials],  # type: ignore[arg-type]
        best_trial=best.number if best is not None else None,
        output_dir=str(out_dir),
        parent_run_id=parent_run_id,
    )
    _write_outputs(study, result, space, out_dir)
    if tracker is not None:
        tracker.finalize(study)
        if best_path is not None:
            from mlflow.exceptions import MlflowException

            try:
                tracker.client.log_artifact(str(parent_run_id), str(best_path), "tune")
            except (MlflowException, OSError) as e:  # the result is on disk either way
                log.warning("could not log the best config to MLflow: %s", e)
    return result


def _spawn_workers(settings: _TrialSettings, pruner: optuna.pruners.BasePruner, remaining: int, workers: int) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    counter = ctx.Value("i", 0)
    lock = ctx.Lock()
    threads = max(1, (os.cpu_count() or 1) // workers)
    procs = [
        ctx.Process(
            target=_worker_main, args=(settings, pruner, remaining, i, counter, lock, threads), name=f"tune-worker-{i}"
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except BaseException:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join()
        raise
    failed = [p.name for p in procs if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"tune worker(s) {failed} exited with an error (see their log above)")


def _write_outputs(study: optuna.Study, result: TuneResult, space: SearchSpace, out_dir: Path) -> None:
    from recsys.io import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    frame = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "duration"))
    atomic_write_text(out_dir / "trials.csv", frame.to_csv(index=False))
    summary = asdict(result) | {
        "storage": _shown_url(result.storage),
        "space": {
            p.name: {"distribution": optuna.distributions.distribution_to_json(p.distribution), "help": p.help}
            for p in space.params
        }
    }
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))


def _limit(text: str) -> float | int:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return int(value) if value >= 1 and value.is_integer() and "." not in text else value


def tune_main(argv: Sequence[str]) -> int:
    """``salience tune``: the command line of :func:`tune`."""
    from experiments.hpo import SAMPLER_NAMES
    from recsys.argv import split_passthrough

    parser = argparse.ArgumentParser(
        prog="salience tune",
        description="Tune a ranking model's hyperparameters on validation AUC (Optuna, with pruning) and write the "
        "best config for `salience fit`. Unknown --key=value arguments (and everything after `--`) are "
        "`salience fit` overrides applied to every trial.",
    )
    parser.add_argument("--config", required=True, help="a `salience fit` config (data + backbone + trainer)")
    parser.add_argument("--sampler", default="gif", choices=SAMPLER_NAMES, help="search strategy (default: gif)")
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
        "--pruner", default="median", choices=["median", "none"], help="prune bad trials (default: median)"
    )
    parser.add_argument(
        "--output", default=None, help="best config path (default: runs/tune/<study>/best_config.yaml)"
    )
    parser.add_argument("--experiment", default="hpo", help="MLflow experiment (default: hpo)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep every trial's checkpoints")
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
