"""MLflow conventions: where runs go, how they are laid out, and a Lightning callback.

* Tracking URI: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db`` in the working directory
  (MLflow 3 refuses the plain ``./mlruns`` file store by default).
* One experiment per dataset; one run per fit; nested runs for stages/trials (``parent_run_id``).
* A run of a process that raised is marked ``FAILED`` (``KILLED`` when it was stopped: Ctrl-C,
  SIGTERM), never left ``RUNNING``. A process killed outright (``kill -9``, OOM killer) cannot end
  its run, so every run records its process (tags ``salience.host``, ``salience.pid``,
  ``salience.pid_start``, ``salience.pid_ns``) and :func:`fail_orphaned_runs` ends the runs of
  dead processes of this host as ``FAILED`` whenever a :class:`RunTracker` opens a run in their
  experiment.
* Every experiment Salience creates or opens is tagged ``mlflow.experimentKind:
  custom_model_development`` (:func:`experiment_id`), so the MLflow UI opens it on its runs table
  rather than the GenAI overview.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from recsys.trainer_attrs import model_checkpoint, trainer_datamodule

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mlflow import MlflowClient

__all__ = [
    "DEFAULT_TRACKING_URI",
    "EXPERIMENT_KIND_TAG",
    "MODEL_TRAINING_KIND",
    "MlflowTracking",
    "RunEndStatus",
    "RunTracker",
    "end_status",
    "experiment_id",
    "fail_orphaned_runs",
    "fail_run",
    "flatten",
    "process_alive",
    "process_identity",
    "tracking_uri",
]

log = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"

#: the MLflow status a run ends with
RunEndStatus = Literal["FINISHED", "FAILED", "KILLED"]


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``mlflow.db`` in the working directory.

    The default is made absolute, so a process that changes directory keeps one store (MLflow
    caches stores by URI string).
    """
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> ``{"a.b.c": "value"}`` with MLflow-sized string values."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            text = json.dumps(value, default=str) if not isinstance(value, str) else value
            out[name] = text[:6000]
    return out


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/<pid>/stat`` field 22); ``""``
    for a zombie; None where ``/proc`` does not know it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return "" if fields[0] in ("Z", "X") else fields[19]


def process_identity(pid: int | None = None) -> dict[str, str]:
    """This process (or process ``pid`` of this host): ``host``, ``pid``, and where ``/proc`` has
    them ``pid_start`` (its start time, so that a later process with a reused pid is not taken for
    it) and ``pid_ns`` (its pid namespace: containers that share a host name do not share pids)."""
    pid = pid or os.getpid()
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        namespace = ""
    return {"host": socket.gethostname(), "pid": str(pid), "pid_start": _start_time(pid) or "", "pid_ns": namespace}


def process_alive(pid: int, pid_start: str = "") -> bool:
    """Whether process ``pid`` of this host (started at ``pid_start``, when known) still runs."""
    started = _start_time(pid)
    if started is not None:
        return started != "" and (not pid_start or started == pid_start)
    if Path("/proc/self/stat").exists():
        return False  # /proc has no such process
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def end_status(exc: BaseException) -> RunEndStatus:
    """The MLflow status of a run ended by ``exc``: ``KILLED`` when the process was stopped
    (Ctrl-C, or SIGTERM: Lightning's ``SIGTERMException`` and the ``salience`` handler raise
    ``SystemExit``), else ``FAILED``."""
    return "KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "FAILED"


def fail_run(client: MlflowClient, run_id: str, reason: str) -> bool:
    """End run ``run_id`` as ``FAILED`` with tag ``salience.failure=reason`` if it is still
    ``RUNNING``; whether it was."""
    from mlflow.exceptions import MlflowException

    try:
        if client.get_run(run_id).info.status != "RUNNING":
            return False
    except MlflowException:  # not a run of this store
        return False
    client.set_tag(run_id, "salience.failure", reason)
    client.set_terminated(run_id, status="FAILED")
    return True


def fail_orphaned_runs(client: MlflowClient, experiment_ids: list[str]) -> list[str]:
    """End as ``FAILED`` the ``RUNNING`` runs of these experiments whose process (of this host and
    pid namespace, by the run's ``salience.*`` tags) is gone; the ids of those runs. One search.

    Runs of other hosts or containers, of live processes and without the tags are left alone.
    """
    me = process_identity()
    runs = client.search_runs(
        experiment_ids, f"attributes.status = 'RUNNING' and tags.`salience.host` = '{me['host']}'", max_results=1000
    )
    failed = []
    for run in runs:
        tags = run.data.tags
        pid = tags.get("salience.pid", "")
        if tags.get("salience.pid_ns", "") != me["pid_ns"] or not pid.isdigit():
            continue
        if process_alive(int(pid), tags.get("salience.pid_start", "")):
            continue
        if fail_run(client, run.info.run_id, f"process {pid} died without ending the run (found by pid {me['pid']})"):
            failed.append(run.info.run_id)
    if failed:
        log.info("marked %d run(s) of dead processes FAILED: %s", len(failed), ", ".join(failed))
    return failed


#: MLflow's experiment tag that chooses what the UI shows first, and Salience's value: model
#: training (the runs table), not GenAI development (the traces overview)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"


def experiment_id(client: MlflowClient, name: str) -> str:
    """The id of experiment ``name`` (created if missing), marked as a model-training experiment.

    An existing experiment gets the tag when it has none or only one the UI inferred
    (``*_inferred``); a kind someone chose is left alone.
    """
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})
    kind = exp.tags.get(EXPERIMENT_KIND_TAG)
    if exp.lifecycle_stage == "active" and (kind is None or kind.endswith("_inferred")):
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    return exp.experiment_id


class RunTracker:
    """A thin handle on one MLflow run through ``MlflowClient`` (no global active-run state).

    The run is tagged with its process (:func:`process_identity`); opening it first ends the
    orphaned runs of its experiment (:func:`fail_orphaned_runs`).

    Args:
        experiment: experiment name (created if missing).
        run_name: display name of the run.
        tags: run tags.
        parent_run_id: makes this a nested child run.
        uri: tracking URI (default: :func:`tracking_uri`).
    """

    def __init__(
        self,
        experiment: str,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
        uri: str | None = None,
    ) -> None:
        from mlflow import MlflowClient

        self.uri = uri or tracking_uri()
        self.client: MlflowClient = MlflowClient(self.uri)
        self.experiment_id = experiment_id(self.client, experiment)
        try:
            fail_orphaned_runs(self.client, [self.experiment_id])
        except Exception as e:  # housekeeping: never stops a new run
            log.warning("could not look for orphaned MLflow runs: %s", e)
        all_tags = {f"salience.{k}": v for k, v in process_identity().items() if v} | dict(tags or {})
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        self.run_id: str = run.info.run_id
        self.finished = False

    @classmethod
    def attach(cls, run_id: str, client: MlflowClient | None = None) -> RunTracker:
        """A tracker on an existing run (a resumed pipeline's parent), set ``RUNNING`` and
        recorded as this process's run (so it is not taken for an orphan of the old process)."""
        from mlflow import MlflowClient

        self = cls.__new__(cls)
        self.client = client or MlflowClient(tracking_uri())
        self.uri = str(self.client.tracking_uri)
        run = self.client.get_run(run_id)
        self.experiment_id = run.info.experiment_id
        self.run_id = run_id
        self.finished = False
        self.set_tags({f"salience.{k}": v for k, v in process_identity().items() if v})
        self.client.update_run(run_id, status="RUNNING")
        return self

    # -- logging ---------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        flat = [Param(k, v) for k, v in flatten(params).items()]
        for i in range(0, len(flat), 100):
            self.client.log_batch(self.run_id, params=flat[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, obj, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_figure(self, figure: Figure, artifact_file: str) -> None:
        self.client.log_figure(self.run_id, figure, artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def artifact_uri(self) -> str:
        return self.client.get_run(self.run_id).info.artifact_uri

    def finish(self, status: RunEndStatus = "FINISHED") -> None:
        """End the run (``FINISHED``, ``FAILED`` or ``KILLED``); idempotent."""
        if not self.finished:
            self.client.set_terminated(self.run_id, status=status)
            self.finished = True

    def __enter__(self) -> RunTracker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        """Finish the run: ``FINISHED``, or as :func:`end_status` says when the block raised."""
        self.finish("FINISHED" if exc is None else end_status(exc))


def _training_curve(history: list[dict[str, float]]) -> Figure:
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(9, 3.2))
    epochs = [h["epoch"] for h in history]
    for key, label in (("train_loss_epoch", "train"), ("val_logloss", "validation")):
        ys = [h.get(key) for h in history]
        if any(y is not None for y in ys):
            ax_loss.plot(epochs, ys, marker="o", label=label)
    ax_loss.set(xlabel="epoch", ylabel="log loss", title="Loss")
    ax_loss.legend()
    ax_auc.plot(epochs, [h.get("val_auc") for h in history], marker="o", color="tab:green")
    ax_auc.set(xlabel="epoch", ylabel="AUC", title="Validation AUC")
    fig.tight_layout()
    return fig


class MlflowTracking(Callback):
    """Logs a Lightning run to MLflow: config, params, data summary, per-epoch metrics, a
    training-curve plot and test metrics; marks the run ``FAILED`` if training raises.

    Args:
        enabled: turn tracking off.
        experiment: experiment name (default: the dataset name).
        run_name: run name (default: ``<arch>-<dataset>``).
        parent_run_id: log as a nested child of this run (selection curves, HPO trials).
    """

    def __init__(
        self, enabled: bool = True, experiment: str | None = None, run_name: str | None = None, parent_run_id: str | None = None
    ) -> None:
        super().__init__()
        self.enabled = enabled
        self.experiment = experiment
        self.run_name = run_name
        self.parent_run_id = parent_run_id
        self.tracker: RunTracker | None = None
        self.config: dict[str, Any] | None = None  # resolved CLI config, set by the CLI
        self.keep_open = False  # the CLI keeps the run open across fit -> test -> export
        self.resumed_from: str | None = None  # run of the unfinished fit this one resumes, set by the CLI
        self.history: list[dict[str, float]] = []

    def start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> RunTracker | None:
        if not self.enabled or self.tracker is not None:
            return self.tracker
        dm = trainer_datamodule(trainer)
        dataset = getattr(dm, "dataset_name", None) or "salience"
        arch = getattr(pl_module, "backbone_name", type(pl_module).__name__)
        tags = {"salience.dataset": dataset, "salience.arch": str(arch)}
        if self.resumed_from:
            tags["salience.resumed_from"] = self.resumed_from
        name = self.run_name or f"{arch}-{dataset}"
        self.tracker = RunTracker(self.experiment or dataset, name, tags, self.parent_run_id)
        if self.resumed_from:  # already ended if its process died on this host
            reason = f"the fit did not finish; resumed by {self.tracker.run_id}"
            fail_run(self.tracker.client, self.resumed_from, reason)
        params = {k: v for k, v in pl_module.hparams.items() if k != "schema"}
        self.tracker.log_params({"model": params, "trainer.max_epochs": trainer.max_epochs, "seed": os.environ.get("PL_GLOBAL_SEED", "")})
        if self.config is not None:
            self.tracker.log_dict(self.config, "config.yaml")
        schema = pl_module.hparams.get("schema")
        if schema is not None:
            self.tracker.log_dict(schema, "schema.json")
        # the preparation's summary (a streaming data module's comes from its shard set: reading
        # ``prepared`` there would load the whole splits)
        summary = getattr(dm, "summary", None) if hasattr(type(dm), "prepared") else None
        if summary:
            self.tracker.log_dict(summary, "data_summary.json")
            read = summary["read"]
            parts = [read] if "rows_read" in read else list(read.values())  # a files split: per split
            self.tracker.log_params(
                {
                    "data.rows_read": sum(r["rows_read"] for r in parts),
                    "data.rows_skipped": sum(r["rows_skipped"] for r in parts),
                    **{f"data.{k}": v for k, v in summary["split"].items()},
                }
            )
            self.tracker.log_metrics(
                {f"data.oov.{split}": sum(s["oov"].values()) for split, s in summary["encode"].items()}
                | {f"data.dense_filled.{split}": sum(s["dense_filled"].values()) for split, s in summary["encode"].items()}
            )
        embedding_params = getattr(getattr(pl_module, "model", None), "embedding_parameters", None)
        if embedding_params is not None:
            self.tracker.log_metrics({"embedding_parameters": embedding_params()})
        return self.tracker

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            self.start(trainer, pl_module)

    def _metrics(self, trainer: pl.Trainer, prefix: tuple[str, ...]) -> dict[str, float]:
        return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefix) and v.numel() == 1}

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # *_end hooks run after the module's epoch-end logging, so the metrics are this epoch's
        if self.tracker is not None and not trainer.sanity_checking:
            self.tracker.log_metrics(self._metrics(trainer, ("val_",)), step=trainer.current_epoch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.tracker is None:
            return
        metrics = self._metrics(trainer, ("train_loss_epoch", "val_"))
        self.tracker.log_metrics({k: v for k, v in metrics.items() if k.startswith("train")}, step=trainer.current_epoch)
        self.history.append({"epoch": trainer.current_epoch, **metrics})

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.tracker is None:
            return
        if self.history:
            import matplotlib.pyplot as plt

            fig = _training_curve(self.history)
            self.tracker.log_figure(fig, "training_curve.png")
            plt.close(fig)
        ckpt = model_checkpoint(trainer)
        if ckpt is not None and ckpt.best_model_score is not None:
            self.tracker.log_metrics({"best_val_auc": float(ckpt.best_model_score)})
            self.tracker.set_tags({"salience.best_checkpoint": ckpt.best_model_path})

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.tracker is not None:
            self.tracker.log_metrics(self._metrics(trainer, ("test_",)))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.tracker is not None:
            self.tracker.set_tags({"salience.error": f"{type(exception).__name__}: {exception}"[:5000]})
            self.tracker.finish(end_status(exception))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.tracker is not None and not self.keep_open:
            self.tracker.finish()

    def finish(self, status: RunEndStatus = "FINISHED") -> None:
        if self.tracker is not None:
            self.tracker.finish(status)
