"""StudyTracker: one MLflow parent run per Optuna study holding a child run per trial, also with
several worker processes on one storage. Everything is checked through ``MlflowClient``."""

from __future__ import annotations

import json
import multiprocessing
import threading
from multiprocessing.synchronize import Barrier
from pathlib import Path

import mlflow
import optuna
import pytest
from mlflow import MlflowClient
from mlflow.entities import Run, ViewType

from experiments.hpo.gif import GROUP_ATTR, PHASE_ATTR, SCHEDULE_ATTR, Schedule
from experiments.hpo.study_tracking import PARENT_ATTR, RUN_ATTR, StudyTracker

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One MLflow store for the module (each test uses its own study names): a fresh sqlite
    store costs seconds of migrations."""
    return tmp_path_factory.mktemp("mlflow") / "mlflow.db"


@pytest.fixture
def uri(mlflow_db: Path, tmp_cwd: Path) -> str:
    return f"sqlite:///{mlflow_db}"


@pytest.fixture
def storage(tmp_cwd: Path) -> str:
    return f"sqlite:///{tmp_cwd / 'optuna.db'}"


def _objective(trial: optuna.Trial) -> float:
    """Trial 2 fails, trial 3 is pruned after two reports, the others complete."""
    x = trial.suggest_float("x", -3.0, 3.0)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    if trial.number == 2:
        raise ValueError("boom")
    if trial.number == 3:
        trial.report(x * x, step=0)
        trial.report(x * x / 2, step=1)
        raise optuna.TrialPruned()
    return (x - 1.0) ** 2 + (kind == "b")


def _parents(client: MlflowClient, name: str, view: int = ViewType.ACTIVE_ONLY) -> list[Run]:
    exp = client.get_experiment_by_name("hpo")
    runs = client.search_runs([exp.experiment_id], "tags.`salience.role` = 'study'", run_view_type=view)
    return [r for r in runs if r.data.tags["optuna.study_name"] == name]


def _children(client: MlflowClient, parent_id: str) -> list[Run]:
    exp = client.get_experiment_by_name("hpo")
    return client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'", max_results=1000)


def _number(run: Run) -> int:
    return int(run.data.tags["optuna.trial_number"])


def test_parent_holds_every_finished_trial(storage: str, uri: str) -> None:
    study = optuna.create_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    tracker = StudyTracker("s", storage=storage, tracking_uri=uri)
    study.optimize(_objective, n_trials=6, callbacks=[tracker], catch=(ValueError,))
    tracker.finalize(study)
    tracker.finalize(study)  # idempotent (several workers each call it)

    client = MlflowClient(uri)
    (parent,) = _parents(client, "s")
    pid = parent.info.run_id
    assert study.user_attrs[PARENT_ATTR] == pid == tracker.parent_run_id
    assert parent.info.run_name == "s" and parent.info.status == "FINISHED"
    assert parent.data.params == {"sampler": "RandomSampler", "direction": "minimize"}
    assert parent.data.metrics["n_complete"] == 4 and parent.data.metrics["n_fail"] == 1
    assert parent.data.metrics["n_pruned"] == 1 and parent.data.metrics["n_trials"] == 6

    children = {_number(r): r for r in _children(client, pid)}
    trials = study.get_trials()
    assert sorted(children) == [t.number for t in trials] == list(range(6))
    expected_status = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
    for t in trials:
        run = children[t.number]
        assert run.info.run_name == f"trial-{t.number}"
        assert run.data.tags["optuna.state"] == t.state.name and run.info.status == expected_status[t.state.name]
        assert "gif.phase" not in run.data.tags  # not a GIF study
        assert run.data.params == {"x": str(t.params["x"]), "kind": t.params["kind"]}
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert run.data.metrics["value"] == pytest.approx(t.value)
    pruned = client.get_metric_history(children[3].info.run_id, "intermediate_value")
    assert [m.step for m in pruned] == [0, 1]
    assert "value" not in children[2].data.metrics  # the failed trial has none

    best = client.get_metric_history(pid, "best_value")
    assert [m.step for m in best] == list(range(6))  # not doubled by the second finalize
    values = [m.value for m in best]
    assert values == sorted(values, reverse=True) and values[-1] == pytest.approx(study.best_value)
    artifacts = {a.path for a in client.list_artifacts(pid)}
    assert {"convergence.png", "incumbent_trace.json"} <= artifacts
    assert "gif_schedule.json" not in artifacts
    trace = json.loads(Path(client.download_artifacts(pid, "incumbent_trace.json")).read_text())
    assert [row["trial"] for row in trace["trace"]] == list(range(6))
    assert mlflow.active_run() is None  # nothing leaked into the fluent API


def test_gif_phases_and_schedule(uri: str) -> None:
    schedule = Schedule(
        n_warmup=2,
        importance={"x": 0.8, "kind": 0.2},
        groups=[["x"], ["kind"]],
        budgets=[1, 1],
        n_fallback=0,
        evaluator="ped-anova",
        assessed_trials=[0, 1],
    )

    def objective(trial: optuna.Trial) -> float:
        phase, group = schedule.phase_of(trial.number)  # what GIFSampler.before_trial records
        trial.storage.set_trial_system_attr(trial._trial_id, PHASE_ATTR, phase)
        trial.storage.set_trial_system_attr(trial._trial_id, GROUP_ATTR, group)
        return trial.suggest_float("x", 0.0, 1.0) + (trial.suggest_categorical("kind", ["a", "b"]) == "b")

    study = optuna.create_study(study_name="gif", sampler=optuna.samplers.RandomSampler(seed=1))  # in memory
    study._storage.set_study_system_attr(study._study_id, SCHEDULE_ATTR, schedule.to_dict())
    tracker = StudyTracker("gif", tracking_uri=uri)
    study.optimize(objective, n_trials=5, callbacks=[tracker])
    tracker.finalize(study)

    client = MlflowClient(uri)
    (parent,) = _parents(client, "gif")
    children = _children(client, parent.info.run_id)
    phases = {_number(r): (r.data.tags["gif.phase"], int(r.data.tags["gif.group"])) for r in children}
    assert phases == {0: ("warmup", -1), 1: ("warmup", -1), 2: ("group", 0), 3: ("group", 1), 4: ("fallback", -1)}
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    expected = {"gif_schedule.json", "importance.json", "importance_0.json", "importance.md", "importance.png"}
    assert expected | {"convergence.png"} <= artifacts
    logged = json.loads(Path(client.download_artifacts(parent.info.run_id, "gif_schedule.json")).read_text())
    assert logged == schedule.to_dict()
    table = Path(client.download_artifacts(parent.info.run_id, "importance.md")).read_text()
    assert "| 1 | x | 0.8000 | 0 |" in table
    assert parent.data.tags["gif.evaluator"] == "ped-anova" and parent.data.tags["gif.n_groups"] == "2"


def test_trial_with_its_own_run(storage: str, uri: str) -> None:
    """A trial's own training run (user attr ``mlflow_run_id``) is the child: no second run."""
    study = optuna.create_study(study_name="own", storage=storage, sampler=optuna.samplers.RandomSampler(seed=2))
    tracker = StudyTracker("own", storage=storage, tracking_uri=uri)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        client = tracker.client  # what recsys.tracking.RunTracker(..., parent_run_id=...) does
        tags = {"mlflow.parentRunId": tracker.parent_run_id}
        run_id = client.create_run(tracker.experiment_id, tags=tags, run_name=f"train-{trial.number}").info.run_id
        client.log_param(run_id, "lr", 0.1)
        client.set_terminated(run_id)
        trial.set_user_attr(RUN_ATTR, run_id)
        return x

    study.optimize(objective, n_trials=3, callbacks=[tracker])
    client = MlflowClient(uri)
    (parent,) = _parents(client, "own")
    children = {_number(r): r for r in _children(client, parent.info.run_id)}
    assert sorted(children) == [0, 1, 2]
    for t in study.trials:
        run = children[t.number]
        assert run.info.run_id == t.user_attrs[RUN_ATTR] and run.info.run_name == f"train-{t.number}"
        assert run.data.params == {"lr": "0.1", "x": str(t.params["x"])}
        assert run.data.metrics["value"] == pytest.approx(t.value) and run.info.status == "FINISHED"


def test_simultaneous_trackers_elect_one_parent(storage: str, uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trackers that all found no parent each create a candidate; all adopt one, the rest is deleted."""
    optuna.create_study(study_name="race", storage=storage)
    trackers = [StudyTracker("race", storage=storage, tracking_uri=uri) for _ in range(3)]
    barrier = threading.Barrier(len(trackers))
    create = StudyTracker._create_parent

    def create_together(self: StudyTracker, study: optuna.Study | None) -> Run:  # every candidate exists before any election
        run = create(self, study)
        barrier.wait()
        return run

    monkeypatch.setattr(StudyTracker, "_create_parent", create_together)
    monkeypatch.setattr(StudyTracker, "settle_s", 0.0)
    ids: list[str] = []

    def resolve(tracker: StudyTracker) -> None:
        ids.append(tracker.parent_run_id)

    threads = [threading.Thread(target=resolve, args=(t,)) for t in trackers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client = MlflowClient(uri)
    (parent,) = _parents(client, "race")
    assert ids == [parent.info.run_id] * 3
    assert len(_parents(client, "race", ViewType.DELETED_ONLY)) == 2
    assert optuna.load_study(study_name="race", storage=storage).user_attrs[PARENT_ATTR] == parent.info.run_id


def test_finalize_merges_a_duplicate_parent(storage: str, uri: str) -> None:
    """If a stalled worker left a second parent, finalize keeps the elected one and moves the
    other's children to it."""
    study = optuna.create_study(study_name="dup", storage=storage, sampler=optuna.samplers.RandomSampler(seed=3))
    tracker = StudyTracker("dup", storage=storage, tracking_uri=uri)
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=2, callbacks=[tracker])
    client = MlflowClient(uri)
    first = client.get_run(tracker.parent_run_id)
    tags = {"optuna.study_name": "dup", "salience.role": "study"}
    other = client.create_run(tracker.experiment_id, first.info.start_time - 1000, tags, "dup").info.run_id
    client.create_run(tracker.experiment_id, tags={"mlflow.parentRunId": other, "optuna.trial_number": "2"})

    tracker.finalize(study)
    (parent,) = _parents(client, "dup")
    assert parent.info.run_id == other == tracker.parent_run_id == study.user_attrs[PARENT_ATTR]  # earlier start wins
    assert sorted(_number(r) for r in _children(client, other)) == [0, 1, 2]


def test_finalize_merges_a_split_parent_that_already_finished(storage: str, uri: str) -> None:
    """Two workers that elected different parents (a create stalled past the settle time), the
    first of which already finished its study: the later finalize still merges into one parent."""
    study = optuna.create_study(study_name="split", storage=storage, sampler=optuna.samplers.RandomSampler(seed=4))
    first = StudyTracker("split", storage=storage, tracking_uri=uri)
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=2, callbacks=[first])
    first.finalize(study)  # its parent is FINISHED now
    second = StudyTracker("split", storage=storage, tracking_uri=uri)
    second._parent = second._create_parent(study).info.run_id  # the split election
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=2, callbacks=[second])
    second.finalize(study)
    client = MlflowClient(uri)
    (parent,) = _parents(client, "split")
    assert parent.info.run_id == first.parent_run_id == study.user_attrs[PARENT_ATTR]  # the earlier one
    assert sorted(_number(r) for r in _children(client, parent.info.run_id)) == [0, 1, 2, 3]


def test_finalize_when_another_worker_logs_the_params_first(
    storage: str, uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers finalizing at once both see the params missing; the one whose insert collides
    re-reads them instead of failing (the race CI once hit: UNIQUE constraint on params)."""
    from mlflow.exceptions import MlflowException

    study = optuna.create_study(study_name="race", storage=storage, sampler=optuna.samplers.RandomSampler(seed=1))
    tracker = StudyTracker("race", storage=storage, tracking_uri=uri)
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=2, callbacks=[tracker])
    log_batch = tracker.client.log_batch

    def the_other_worker_wins(run_id: str, metrics=(), params=(), tags=()):  # type: ignore[no-untyped-def]
        if params and not getattr(the_other_worker_wins, "done", False):
            the_other_worker_wins.done = True  # type: ignore[attr-defined]
            log_batch(run_id, params=params)  # the other worker's insert lands first ...
            raise MlflowException("UNIQUE constraint failed: params.key, params.run_uuid")
        return log_batch(run_id, metrics=metrics, params=params, tags=tags)

    monkeypatch.setattr(tracker.client, "log_batch", the_other_worker_wins)
    tracker.finalize(study)
    parent = MlflowClient(uri).get_run(tracker.parent_run_id)
    assert parent.data.params["direction"] == "minimize" and parent.info.status == "FINISHED"
    assert parent.data.metrics["n_trials"] == 2


def _worker(storage: str, uri: str, barrier: Barrier, n_trials: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="shared", storage=storage, sampler=optuna.samplers.RandomSampler())
    tracker = StudyTracker("shared", storage=storage, tracking_uri=uri)
    barrier.wait()  # resolve the parent at the same moment in both workers
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=n_trials, callbacks=[tracker])
    tracker.finalize(study)


def test_two_worker_processes_share_one_parent(storage: str, uri: str) -> None:
    """Run alone, this test also has the workers create the MLflow store at the same time."""
    optuna.create_study(study_name="shared", storage=storage)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    workers = [ctx.Process(target=_worker, args=(storage, uri, barrier, 4)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
        if w.is_alive():
            w.kill()
    assert [w.exitcode for w in workers] == [0, 0]

    client = MlflowClient(uri)
    (parent,) = _parents(client, "shared")
    assert len(_parents(client, "shared", ViewType.DELETED_ONLY)) <= 1
    numbers = sorted(_number(r) for r in _children(client, parent.info.run_id))
    assert numbers == list(range(8))  # every trial once, none lost to a deleted candidate
    study = optuna.load_study(study_name="shared", storage=storage)
    assert study.user_attrs[PARENT_ATTR] == parent.info.run_id
    assert client.get_run(parent.info.run_id).data.metrics["n_complete"] == 8


def test_unreachable_backend_is_a_clear_error(tmp_cwd: Path) -> None:
    (tmp_cwd / "file").touch()
    with pytest.raises(RuntimeError, match="unreachable"):
        StudyTracker("s", tracking_uri=f"sqlite:///{tmp_cwd / 'file' / 'mlflow.db'}")


def test_hpo_experiment_is_marked_as_model_training(uri: str) -> None:
    from experiments.hpo import tracking
    from recsys.tracking import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND

    assert (tracking.EXPERIMENT_KIND_TAG, tracking.MODEL_TRAINING_KIND) == (EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)

    StudyTracker("kind-study", experiment="hpo-kind", tracking_uri=uri)
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("hpo-kind").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    client.create_experiment("hpo-kind-old")
    StudyTracker("kind-study-2", experiment="hpo-kind-old", tracking_uri=uri)
    assert client.get_experiment_by_name("hpo-kind-old").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
