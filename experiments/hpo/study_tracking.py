"""MLflow tracking of Optuna studies: one parent run per study, one nested child run per trial.

    tracker = StudyTracker("gif-sphere", storage="sqlite:///optuna.db")
    study.optimize(objective, n_trials=100, callbacks=[tracker])
    tracker.finalize(study)

Layout (experiment ``hpo`` by default; all through ``MlflowClient``, never the active run):

* parent run ``<study name>``, tags ``optuna.study_name`` and ``salience.role=study``. After
  :meth:`StudyTracker.finalize`: params ``sampler`` and ``direction``; metrics ``n_trials`` and
  ``n_<state>``; the incumbent trace as metric history ``best_value`` (step = trial number) and
  ``incumbent_trace.json``; ``convergence.png``; for GIF studies ``gif_schedule.json``,
  ``importance.json``, ``importance_<i>.json`` per assessment, ``importance.md`` and
  ``importance.png``.
* child run ``trial-<number>`` per finished trial: tags ``optuna.trial_number``,
  ``optuna.state``, ``gif.phase`` and ``gif.group`` (GIF trials only); the trial's params;
  metric ``value`` and the ``intermediate_value`` history. A trial whose user attr
  ``mlflow_run_id`` names its own run (a training run nested under the parent) is logged onto
  that run instead.

Several worker processes may share one study. The parent's id is kept in the study (user attr
``mlflow_parent_run_id``). Workers that start together and find no id each create a candidate
parent, wait ``settle_s`` so that every candidate is visible, and elect the same one: the
earliest started, then the smallest run id. Losers delete their candidate before logging any
child. :meth:`StudyTracker.finalize` repeats the election (over the live candidates and the
finished parents tagged with the same Optuna study id) and moves the children of any leftover
duplicate, so the layout converges even if a write stalled past the settle time.
Opening a local sqlite store is serialised across processes (MLflow migrates a new store on
first use, and concurrent migrations break it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.storages import InMemoryStorage
from optuna.trial import FrozenTrial, TrialState

from experiments.hpo.gif import Schedule, read_schedule, trial_phase

try:
    import fcntl
except ImportError:  # Windows: no cross-process lock
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mlflow import MlflowClient
    from mlflow.entities import Run

__all__ = ["PARENT_ATTR", "RUN_ATTR", "StudyTracker"]

#: study user attr holding the parent run id
PARENT_ATTR = "mlflow_parent_run_id"
#: trial user attr naming a run the objective already tracks for the trial
RUN_ATTR = "mlflow_run_id"

#: ``recsys.tracking.EXPERIMENT_KIND_TAG`` and ``MODEL_TRAINING_KIND`` (the MLflow UI opens the experiment
#: on its runs table), repeated because importing ``recsys.tracking`` imports Lightning (slow; a
#: tracker of a plain Optuna study does not need it); tests/experiments/hpo/test_study_tracking.py checks both
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
_STATUS = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED", TrialState.FAIL: "FAILED"}
_PHASE_COLORS = {"warmup": "tab:gray", "group": "tab:blue", "fallback": "tab:orange"}
_RACE_WINDOW_MS = 60_000  # candidates further apart than this belong to different study instances


class StudyTracker:
    """Tracks an Optuna study in MLflow; pass it as a callback to ``study.optimize``.

    Args:
        study_name: name of the Optuna study.
        storage: the study's Optuna storage (used to share the parent run id across workers).
        experiment: MLflow experiment (created if missing).
        tracking_uri: MLflow tracking URI (default: :func:`recsys.tracking.tracking_uri`).
        log_trials: create a child run per trial; when off, only trials with a
            ``mlflow_run_id`` user attr are logged (onto that run).
        parent_run_id: nest the study's run under this run (e.g. a pipeline stage).

    Raises:
        RuntimeError: the MLflow backend is unreachable or the experiment is deleted.
    """

    #: seconds a worker that created a candidate parent waits before the election
    settle_s: float = 0.5

    def __init__(
        self,
        study_name: str,
        storage: str | None = None,
        experiment: str = "hpo",
        tracking_uri: str | None = None,
        log_trials: bool = True,
        parent_run_id: str | None = None,
    ) -> None:
        self.study_name = study_name
        self.outer_run_id = parent_run_id
        self.storage = storage
        self.log_trials = log_trials
        if tracking_uri is None:
            from recsys.tracking import tracking_uri as default_uri  # imports lightning: only when needed

            tracking_uri = default_uri()
        self.uri = tracking_uri
        self.client, self.experiment_id = _connect(self.uri, experiment)
        self._parent: str | None = None
        self._lock = threading.Lock()  # Optuna's n_jobs threads share one tracker

    # -- parent run ---------------------------------------------------------------------------
    @property
    def parent_run_id(self) -> str:
        """Id of the study's parent run, created on first use; the same in every worker."""
        return self._resolve(None)

    def _resolve(self, study: optuna.Study | None) -> str:
        with self._lock:
            if self._parent is not None and self._alive(self._parent):
                return self._parent
            if study is None and self.storage is not None:
                study = optuna.load_study(study_name=self.study_name, storage=self.storage)
            known = study.user_attrs.get(PARENT_ATTR) if study is not None else None
            if known is not None and self._alive(known):
                self._parent = known
            elif study is None or isinstance(study._storage, InMemoryStorage):
                self._parent = self._create_parent(study).info.run_id  # no other process shares the study
            else:
                own = self._create_parent(study)
                time.sleep(self.settle_s)
                self._parent = _elect(self._candidates(own), own.info.run_id)
                if self._parent != own.info.run_id:
                    self.client.delete_run(own.info.run_id)
            if study is not None and study.user_attrs.get(PARENT_ATTR) != self._parent:
                study.set_user_attr(PARENT_ATTR, self._parent)
            return self._parent

    def _create_parent(self, study: optuna.Study | None) -> Run:
        tags = {"optuna.study_name": self.study_name, "salience.role": "study"}
        if self.outer_run_id:
            tags["mlflow.parentRunId"] = self.outer_run_id
        if study is not None:
            tags["optuna.study_id"] = str(study._study_id)
        return self.client.create_run(self.experiment_id, run_name=self.study_name, tags=tags)

    def _alive(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except MlflowException:  # unknown id, e.g. the MLflow store was wiped
            return False

    def _candidates(self, own: Run) -> list[Run]:
        """Parents of this study started near ``own``: ``own``, the unfinished ones, and the
        finished ones of the same Optuna study (a worker that finished first); a finished parent
        of another study id belongs to an earlier study of the same name."""
        lo, hi = own.info.start_time - _RACE_WINDOW_MS, own.info.start_time + _RACE_WINDOW_MS
        window = f"attributes.start_time >= {lo} and attributes.start_time <= {hi}"
        runs = self._search(f"tags.`salience.role` = 'study' and {window}")
        study_id = own.data.tags.get("optuna.study_id")
        return [
            run
            for run in runs
            if run.data.tags.get("optuna.study_name") == self.study_name
            and (
                run.info.status == "RUNNING"
                or run.info.run_id == own.info.run_id
                or (study_id is not None and run.data.tags.get("optuna.study_id") == study_id)
            )
        ]

    def _reconcile(self, study: optuna.Study) -> str:
        """Elect the parent again; move the children of every other candidate to it and delete
        that candidate."""
        parent = self.client.get_run(self._resolve(study))
        candidates = self._candidates(parent)
        winner = _elect(candidates, parent.info.run_id)
        for run in candidates:
            if run.info.run_id != winner:
                for child in self._search(f"tags.`mlflow.parentRunId` = '{run.info.run_id}'"):
                    self.client.set_tag(child.info.run_id, "mlflow.parentRunId", winner)
                self.client.delete_run(run.info.run_id)
        with self._lock:
            self._parent = winner
        if study.user_attrs.get(PARENT_ATTR) != winner:
            study.set_user_attr(PARENT_ATTR, winner)
        return winner

    def _search(self, filter_string: str) -> list[Run]:
        runs: list[Run] = []
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string, max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    # -- trials ------------------------------------------------------------------------------
    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Log a finished trial as a child of the parent run (Optuna callback)."""
        from mlflow.entities import Metric, Param, RunTag

        own_run: str | None = trial.user_attrs.get(RUN_ATTR)
        if trial.state not in _STATUS or (own_run is None and not self.log_trials):
            return
        parent = self._resolve(study)
        tags = {
            "mlflow.parentRunId": parent,
            "salience.role": "trial",
            "optuna.study_name": self.study_name,
            "optuna.trial_number": str(trial.number),
            "optuna.state": trial.state.name,
        }
        phase, group = trial_phase(trial)
        if phase is not None:
            tags |= {"gif.phase": phase, "gif.group": str(group)}
        params = {name: str(value)[:6000] for name, value in trial.params.items()}
        if own_run is None:
            run = self.client.create_run(self.experiment_id, _ms(trial.datetime_start), tags, f"trial-{trial.number}")
            run_id = run.info.run_id
        else:  # the objective's own run: its params stand, the trial's fill the gaps
            run_id = own_run
            logged = self.client.get_run(run_id).data.params
            params = {name: value for name, value in params.items() if name not in logged}
        end = _ms(trial.datetime_complete)
        values = trial.values or []
        names = ["value"] if len(values) == 1 else [f"value_{i}" for i in range(len(values))]
        metrics = [Metric(name, float(v), end, 0) for name, v in zip(names, values, strict=True)]
        steps = sorted(trial.intermediate_values.items())
        metrics += [Metric("intermediate_value", float(v), end, step) for step, v in steps]
        self.client.log_batch(
            run_id,
            metrics=metrics,
            params=[Param(k, v) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        if own_run is None:
            self.client.set_terminated(run_id, _STATUS[trial.state], end_time=end)

    # -- study summary -----------------------------------------------------------------------
    def finalize(self, study: optuna.Study) -> None:
        """Log the study summary, GIF schedule, incumbent trace and convergence plot on the
        parent run and mark it finished. Idempotent; every worker may call it (the last call's
        artifacts stand)."""
        from mlflow.entities import Metric

        parent = self._reconcile(study)
        trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
        now = int(time.time() * 1000)
        logged = self.client.get_run(parent).data.params
        direction = ",".join(d.name.lower() for d in study.directions)
        # the sampler the study was run with (a study loaded to finalize carries a default one)
        sampler = study.user_attrs.get("sampler") or type(study.sampler).__name__
        params = {"sampler": str(sampler), "direction": direction}
        metrics = [Metric("n_trials", len(trials), now, 0)]
        metrics += [Metric(f"n_{s.name.lower()}", sum(t.state == s for t in trials), now, 0) for s in TrialState]
        if len(study.directions) == 1:
            trace = _incumbent_trace(trials, study.direction == optuna.study.StudyDirection.MINIMIZE)
            metrics += [Metric("best_value", r["best"], r["completed_ms"], r["trial"]) for r in _settled(trace)]
            self.client.log_dict(parent, {"direction": direction, "trace": trace}, "incumbent_trace.json")
            self.client.log_figure(parent, _convergence_figure(trials, trace, self.study_name), "convergence.png")
        self.client.log_batch(parent, metrics=metrics)
        self._log_params_once(parent, params, logged)
        schedule = read_schedule(study)
        if schedule is not None:
            self._log_schedule(parent, schedule)
        self.client.set_terminated(parent, "FINISHED")

    def _log_params_once(self, run_id: str, params: dict[str, str], logged: dict[str, str]) -> None:
        """Log the params not yet on the run. MLflow params are immutable, and two workers that
        finalize at once may both see a param missing: the loser re-reads and logs what is left."""
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        for attempt in range(3):
            missing = [Param(k, v) for k, v in params.items() if k not in logged]
            if not missing:
                return
            try:
                self.client.log_batch(run_id, params=missing)
                return
            except MlflowException:
                if attempt == 2:
                    raise
                logged = self.client.get_run(run_id).data.params

    def _log_schedule(self, run_id: str, schedule: Schedule) -> None:
        data = schedule.to_dict()
        self.client.log_dict(run_id, data, "gif_schedule.json")
        self.client.log_dict(run_id, schedule.importance, "importance.json")
        latest = {k: data[k] for k in ("evaluator", "assessed_trials", "importance")}
        for i, assessment in enumerate(data.get("assessments") or [latest]):
            self.client.log_dict(run_id, assessment, f"importance_{i}.json")
        table = schedule.table()
        lines = ["| rank | param | importance | group |", "|---:|---|---:|---:|"]
        lines += [f"| {r['rank']} | {r['param']} | {r['importance']:.4f} | {r['group']} |" for r in table]
        self.client.log_text(run_id, "\n".join(lines) + "\n", "importance.md")
        if table:
            self.client.log_figure(run_id, _importance_figure(table, schedule.evaluator), "importance.png")
        self.client.set_tag(run_id, "gif.evaluator", schedule.evaluator)
        self.client.set_tag(run_id, "gif.n_groups", str(len(schedule.groups)))
        if schedule.note:
            self.client.set_tag(run_id, "gif.note", schedule.note)


def _connect(uri: str, experiment: str) -> tuple[MlflowClient, str]:
    """A client on ``uri`` and the id of ``experiment`` (created if missing), marked as a
    model-training experiment as :func:`recsys.tracking.experiment_id` does."""
    from mlflow import MlflowClient

    try:
        with _store_lock(uri):
            client = MlflowClient(uri)
            exp = client.get_experiment_by_name(experiment)
            if exp is None:
                try:
                    kind_tag = {EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND}
                    return client, client.create_experiment(experiment, tags=kind_tag)
                except Exception:  # created by a worker on another host meanwhile
                    exp = client.get_experiment_by_name(experiment)
                    if exp is None:
                        raise
            kind = exp.tags.get(EXPERIMENT_KIND_TAG)
            if exp.lifecycle_stage == "active" and (kind is None or kind.endswith("_inferred")):
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    except Exception as exc:
        raise RuntimeError(
            f"MLflow tracking backend {uri!r} is unreachable ({type(exc).__name__}: {exc}); "
            "pass tracking_uri or set MLFLOW_TRACKING_URI"
        ) from exc
    if exp.lifecycle_stage != "active":
        raise RuntimeError(f"MLflow experiment {experiment!r} is deleted: restore it or pick another name")
    return client, exp.experiment_id


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Serialise opening a local sqlite store across processes by an ``flock`` on its folder (no
    lock file); a no-op for other backends."""
    if not uri.startswith("sqlite:///") or fcntl is None:
        yield
        return
    folder = Path(uri.removeprefix("sqlite:///").split("?")[0]).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _elect(candidates: Sequence[Run], default: str) -> str:
    """The parent among candidates: earliest start, then smallest run id."""
    if not candidates:
        return default
    return min(candidates, key=lambda run: (run.info.start_time, run.info.run_id)).info.run_id


def _ms(when: datetime | None) -> int:
    return int((when.timestamp() if when is not None else time.time()) * 1000)


def _incumbent_trace(trials: Sequence[FrozenTrial], minimize: bool) -> list[dict[str, Any]]:
    """Per trial in number order: state, value and the best value so far (``None`` before the
    first complete trial)."""
    best: float | None = None
    trace = []
    for t in trials:
        if t.state == TrialState.COMPLETE and t.value is not None:
            best = t.value if best is None else (min if minimize else max)(best, t.value)
        value = t.value if t.state == TrialState.COMPLETE else None
        row = {"trial": t.number, "state": t.state.name, "value": value, "best": best}
        trace.append(row | {"completed_ms": _ms(t.datetime_complete)})
    return trace


def _settled(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace rows that can no longer change: up to the first unfinished trial."""
    rows = []
    for row in trace:
        if not TrialState[row["state"]].is_finished():
            break
        if row["best"] is not None:
            rows.append(row)
    return rows


def _convergence_figure(trials: Sequence[FrozenTrial], trace: list[dict[str, Any]], title: str) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.add_subplot()
    done = [
        (trial_phase(t)[0], t.number, t.value)
        for t in trials
        if t.state == TrialState.COMPLETE and t.value is not None
    ]
    for phase in dict.fromkeys(p for p, _, _ in done):
        xs = [n for p, n, _ in done if p == phase]
        ys = [v for p, _, v in done if p == phase]
        ax.scatter(xs, ys, s=14, color=_PHASE_COLORS.get(phase or "", "tab:green"), label=phase or "trial")
    steps = [row for row in trace if row["best"] is not None]
    xs, ys = [r["trial"] for r in steps], [r["best"] for r in steps]
    ax.step(xs, ys, where="post", color="k", lw=1.2, label="best so far")
    ax.set(xlabel="trial", ylabel="objective", title=f"Convergence: {title}")
    if done:
        ax.legend(fontsize=8)
    return fig


def _importance_figure(table: list[dict[str, Any]], evaluator: str) -> Figure:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 0.3 * len(table) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    palette = colormaps["tab10"]
    colors = [palette(r["group"] % 10) if r["group"] >= 0 else "lightgray" for r in table]
    ax.barh([r["param"] for r in table][::-1], [r["importance"] for r in table][::-1], color=colors[::-1])
    ax.set(xlabel=f"importance ({evaluator})", title="Parameter importance (colour = group)")
    return fig
