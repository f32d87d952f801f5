"""MLflow runs of processes that died or were stopped end ``FAILED``/``KILLED``, never ``RUNNING``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from recsys.runtime import Terminated, sigterm_raises
from recsys.tracking import RunTracker, fail_orphaned_runs, process_alive, process_identity

REPO = Path(__file__).resolve().parents[2]
OPEN_A_RUN = (  # a process that opens a run and never ends it
    "import time; from recsys.tracking import RunTracker; print(RunTracker('orphans').run_id, flush=True); "
    "time.sleep(60)"
)


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the module (a new one costs seconds of migrations); each test has its experiments."""
    return tmp_path_factory.mktemp("mlflow") / "mlflow.db"


@pytest.fixture
def uri(mlflow_db: Path, tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{mlflow_db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_runs_of_killed_processes_end_failed_when_a_run_opens(uri: str) -> None:
    client = MlflowClient(uri)
    exp = client.create_experiment("orphans")
    env = os.environ | {"MLFLOW_TRACKING_URI": uri}
    killed = subprocess.Popen([sys.executable, "-c", OPEN_A_RUN], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    killed_run = killed.stdout.readline().strip()
    tags = client.get_run(killed_run).data.tags
    assert tags["salience.pid"] == str(killed.pid) and tags["salience.host"] == process_identity()["host"]
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    with subprocess.Popen(["sleep", "60"]) as live:  # e.g. a parallel worker
        try:
            alive = client.create_run(exp, tags={f"salience.{k}": v for k, v in process_identity(live.pid).items()})
            other_host = client.create_run(exp, tags={"salience.host": "elsewhere", "salience.pid": str(killed.pid)})
            untagged = client.create_run(exp)  # e.g. an Optuna trial's run
            assert client.get_run(killed_run).info.status == "RUNNING"

            with RunTracker("orphans", "next"):
                pass

            run = client.get_run(killed_run)
            assert run.info.status == "FAILED"
            reason = f"process {killed.pid} died without ending the run (found by pid {os.getpid()})"
            assert run.data.tags["salience.failure"] == reason
            for other in (alive, other_host, untagged):
                assert client.get_run(other.info.run_id).info.status == "RUNNING"
            assert fail_orphaned_runs(client, [exp]) == []  # nothing left to end
        finally:
            live.kill()


def test_a_reused_pid_is_not_the_process_of_the_run() -> None:
    me = process_identity()
    assert process_alive(os.getpid(), me["pid_start"])
    assert not process_alive(os.getpid(), str(int(me["pid_start"]) - 1))  # same pid, started earlier: gone
    with subprocess.Popen([sys.executable, "-c", "pass"]) as done:
        done.wait()
    assert not process_alive(done.pid)


def test_sigterm_raises_and_ends_the_run_killed(uri: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as stopped, sigterm_raises(), RunTracker("stops", "stopped") as tracker:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted
    assert stopped.value.code == 128 + signal.SIGTERM
    assert MlflowClient(uri).get_run(tracker.run_id).info.status == "KILLED"
    assert signal.getsignal(signal.SIGTERM) is before


def test_experiments_are_marked_as_model_training(uri: str) -> None:
    """The MLflow UI opens a model-training experiment on its runs table, not the GenAI overview."""
    from recsys.tracking import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND

    client = MlflowClient(uri)
    RunTracker("kind-new").finish()
    assert client.get_experiment_by_name("kind-new").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    client.create_experiment("kind-old")  # made before the tag existed
    client.create_experiment("kind-inferred", tags={EXPERIMENT_KIND_TAG: "genai_development_inferred"})
    client.create_experiment("kind-chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    for name in ("kind-old", "kind-inferred", "kind-chosen"):
        RunTracker(name).finish()
    assert client.get_experiment_by_name("kind-old").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    assert client.get_experiment_by_name("kind-inferred").tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    assert client.get_experiment_by_name("kind-chosen").tags[EXPERIMENT_KIND_TAG] == "genai_development"  # the user's
