"""Crash-resume of ``salience fit``: a rerun of a killed fit continues from its last checkpoint to
the metrics of an uninterrupted fit; its MLflow runs end ``FAILED``/``KILLED``, never ``RUNNING``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from mlflow import MlflowClient

from recsys.tracking import process_identity
from recsys.train.cli import FitState, SalienceCLI

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "experiments" / "configs" / "synthetic_dcnv2.yaml"


def fit_command(root: Path, rows: int = 10000, epochs: int = 4) -> list[str]:
    # dropout, whose draws a resumed fit must repeat; a learning rate at which the validation AUC
    # improves for the first epochs (Lightning 2.6 writes last.ckpt only with a new best checkpoint)
    return [
        sys.executable, "-m", "experiments.cli", "fit", "--config", str(CONFIG), "--model.optimizer.init_args.lr=0.0001",
        "--model.backbone={class_path: recsys.models.DCNv2, init_args: {cross_layers: 2, deep_mlp: [256, 128], dropout: 0.2, structure: parallel}}",
        f"--data.reader.init_args.n_rows={rows}", "--data.batch_size=256", f"--trainer.max_epochs={epochs}",
        "--model.early_stopping_patience=0", f"--trainer.default_root_dir={root}", "--after_fit.export=false",
        f"--data.cache_dir={root / 'cache'}", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow store with its tables made (copies of it spare each process seconds of migrations)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def new_db(empty_db: Path, path: Path) -> tuple[Path, MlflowClient]:
    shutil.copyfile(empty_db, path)
    return path, MlflowClient(f"sqlite:///{path}")


def start(command: list[str], db: Path, log: Path) -> subprocess.Popen[str]:
    """Run ``command`` logging to MLflow store ``db``, its output to ``log``."""
    # one intra-op thread: both processes of a comparison compute alike, and two fit at once on 2 cores
    # run in the log's folder: MLflow puts a new store's artifacts in ./mlruns, not in the checkout
    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{db}", "OMP_NUM_THREADS": "1",
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with log.open("w") as out:
        return subprocess.Popen(command, cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def state(root: Path) -> dict:
    return json.loads((root / FitState.FILE).read_text())


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the fit ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def last_epoch(root: Path) -> int:
    """The epoch of ``root``'s last checkpoint (-1 if none; Lightning replaces it atomically)."""
    last = root / "checkpoints" / "last.ckpt"
    return torch.load(last, map_location="cpu", weights_only=True)["epoch"] if last.is_file() else -1


def finish(proc: subprocess.Popen[str], log: Path, timeout: float = 120.0) -> str:
    """The output of ``proc``, which must end well."""
    proc.wait(timeout=timeout)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow  # a killed process; the resume itself: tests/recsys/train/test_cli.py::test_resume_from_checkpoint_equals_uninterrupted_run
def test_killed_fit_resumes_to_the_metrics_of_an_uninterrupted_fit(tmp_path: Path, empty_db: Path) -> None:
    run, straight_root = tmp_path / "run", tmp_path / "straight"
    db, client = new_db(empty_db, tmp_path / "mlflow.db")
    straight_db, straight_client = new_db(empty_db, tmp_path / "straight.db")
    straight = start(fit_command(straight_root), straight_db, tmp_path / "straight.log")
    killed = start(fit_command(run), db, tmp_path / "killed.log")
    wait_for(lambda: last_epoch(run) >= 1, killed, "the checkpoint of epoch 1")
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    first = state(run)
    assert first["status"] == "running" and Path(first["last_checkpoint"]).is_file()

    out = finish(start(fit_command(run), db, tmp_path / "resumed.log"), tmp_path / "resumed.log")
    assert f"resuming from {first['last_checkpoint']}" in out
    finish(straight, tmp_path / "straight.log")

    resumed = client.get_run(state(run)["run_id"])
    reference = straight_client.get_run(state(straight_root)["run_id"])
    for key in ("test_auc", "test_logloss"):
        assert resumed.data.metrics[key] == pytest.approx(reference.data.metrics[key], abs=1e-6), key
    assert state(run)["status"] == "finished"
    assert resumed.info.status == "FINISHED"
    assert resumed.data.tags["salience.resumed_from"] == first["run_id"]
    epochs = [m.step for m in client.get_metric_history(resumed.info.run_id, "train_loss_epoch")]
    assert min(epochs) >= 2  # it did not train epochs 0 and 1 again
    dead = client.get_run(first["run_id"])
    assert dead.info.status == "FAILED" and "died without ending the run" in dead.data.tags["salience.failure"]
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs if r.info.status == "RUNNING"] == []


def test_sigterm_ends_the_fit_and_its_run_killed(tmp_path: Path, empty_db: Path) -> None:
    run = tmp_path / "run"
    db, client = new_db(empty_db, tmp_path / "mlflow.db")
    fit = start(fit_command(run, rows=4000, epochs=100), db, tmp_path / "fit.log")
    wait_for(lambda: (run / FitState.FILE).is_file(), fit, "the fit to start")
    fit.send_signal(signal.SIGTERM)
    assert fit.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "fit.log").read_text()[-3000:]
    assert client.get_run(state(run)["run_id"]).info.status == "KILLED"
    assert state(run)["status"] == "running"  # so that the same command resumes it


# -- the resume decision, without training -------------------------------------------------------
def cli_args(root: Path, *extra: str) -> list[str]:
    return [
        "fit", "--config", str(CONFIG), "--data.reader.init_args.n_rows=400", f"--trainer.default_root_dir={root}",
        f"--data.cache_dir={root / 'cache'}", "--tracking.enabled=false", "--after_fit.test=false",
        "--after_fit.export=false", *extra,
    ]  # fmt: skip


@pytest.fixture
def fit_calls(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The ``ckpt_path`` of each ``Trainer.fit`` call (which trains nothing)."""
    calls: list[str | None] = []
    monkeypatch.setattr(pl.Trainer, "fit", lambda self, model, ckpt_path=None, **kw: calls.append(ckpt_path))
    return calls


def write_state(root: Path, config_sha: str, status: str = "running", **fields: str) -> Path:
    last = root / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True, exist_ok=True)
    torch.save({}, last)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    info = process_identity() | {"pid": dead.stdout.strip(), "pid_start": ""}
    state = {"status": status, **info, "config_sha": config_sha, "run_id": None, "last_checkpoint": str(last)}
    (root / FitState.FILE).write_text(json.dumps(state | fields))
    return last


def test_resume_decision(tmp_cwd: Path, fit_calls: list[str | None], caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_cwd / "run"
    sha = SalienceCLI(args=cli_args(root)).fit_state.config_sha
    assert fit_calls == [None]  # a new folder: fresh fit
    assert state(root)["status"] == "finished"
    assert SalienceCLI(args=cli_args(root, "--trainer.max_epochs=7")).fit_state.config_sha != sha

    write_state(root, sha, status="finished")
    SalienceCLI(args=cli_args(root))  # the previous fit finished: fresh fit
    last = write_state(root, sha)
    with caplog.at_level("INFO", logger="recsys.train.cli"):
        SalienceCLI(args=cli_args(root))  # unfinished, its process gone: resume
    assert fit_calls[-2:] == [None, str(last)]
    assert f"resuming from {last}" in caplog.text

    write_state(root, sha)
    SalienceCLI(args=cli_args(root, "--resume=false"))
    other = tmp_cwd / "other.ckpt"
    torch.save({}, other)
    write_state(root, sha)
    SalienceCLI(args=cli_args(root, f"--ckpt_path={other}"))  # an explicit checkpoint wins
    write_state(root, sha)
    SalienceCLI(args=cli_args(root, "--trainer.max_epochs=7"))  # another config: fresh fit
    assert fit_calls[-3:] == [None, str(other), None]


def test_resume_refuses_a_folder_whose_fit_still_runs(tmp_path: Path) -> None:
    fit_state = FitState(tmp_path, "abc")
    write_state(tmp_path, "abc")
    assert fit_state.resume_checkpoint() == (str(tmp_path / "checkpoints" / "last.ckpt"), None)
    (tmp_path / "checkpoints" / "last.ckpt").unlink()
    assert fit_state.resume_checkpoint() is None  # nothing to resume from
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as live:
        try:
            write_state(tmp_path, "abc", pid=str(live.pid))
            with pytest.raises(RuntimeError, match=f"still running \\(pid {live.pid}\\)"):
                fit_state.resume_checkpoint()
        finally:
            live.kill()
