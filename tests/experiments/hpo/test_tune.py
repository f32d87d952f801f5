"""``salience tune``: search space, pruning, bad trials, storage errors, workers, Frappe."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import torch
import yaml

from experiments.hpo.tune import (
    FAIL_REASON_ATTR,
    RUN_ID_ATTR,
    NonFiniteMetricError,
    OptunaPruning,
    StorageError,
    search_space,
    tune,
)
from recsys.models import DLRM, DCNv2, DeepFM
from tests.conftest import require_dataset

CONFIGS = Path(__file__).resolve().parents[3] / "experiments" / "configs"
SYNTHETIC = CONFIGS / "synthetic_dcnv2.yaml"
#: a few thousand synthetic rows: one trial trains in about a second
TINY = [
    "--data.reader.init_args.n_rows=3000",
    "--data.reader.init_args.cardinality_scale=0.01",
    "--data.reader.init_args.n_noise=1",
    "--data.reader.init_args.n_noise_dense=0",
]


class PruneNumbers(optuna.pruners.BasePruner):
    """Prunes the given trial numbers at their first report."""

    def __init__(self, numbers: set[int]) -> None:
        self.numbers = numbers

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return trial.number in self.numbers


def _load_with_cli(path: str | Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Parse a config exactly as ``salience fit --config PATH`` would (``--print_config``)."""
    from recsys.train.cli import SalienceCLI

    with pytest.raises(SystemExit) as e:
        SalienceCLI(args=["fit", "--config", str(path), "--print_config"])
    assert e.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("backbone", [DCNv2, DeepFM, DLRM], ids=lambda cls: cls.__name__)
def test_search_space_has_ten_typed_hyperparameters_that_map_to_valid_backbone_args(backbone: type) -> None:
    import inspect

    space = search_space(backbone)
    assert len(space) >= 10
    assert len(set(space.names)) == len(space)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    allowed = set(inspect.signature(backbone.__init__).parameters)
    for _ in range(5):
        trial = study.ask()
        params = space.suggest(trial)
        assert set(trial.distributions) == set(space.names)
        updates = space.config_updates(params, {"dropout": 0.9})
        init_args = updates["model.backbone"]["init_args"]
        assert set(init_args) <= allowed
        assert init_args["dropout"] == params["dropout"]  # sampled values win over the config's
        assert updates["model.embedding_kernel"] == "plain"
        assert updates["data.embedding_dim"] in (8, 16, 32)
    with pytest.raises(ValueError, match="model.backbone"):
        search_space("wide-and-deep")


def _fake_trainer(value: float, callbacks: list[Any] | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        sanity_checking=False, callback_metrics={"val_auc": torch.tensor(value)}, callbacks=callbacks or []
    )


def test_pruning_callback_reports_each_validation_and_prunes_when_the_pruner_says_so() -> None:
    study = optuna.create_study(direction="maximize", pruner=PruneNumbers({1}))
    keep, prune = study.ask(), study.ask()
    cb = OptunaPruning.for_trial(keep)
    cb.on_validation_end(_fake_trainer(0.6), None)  # type: ignore[arg-type]
    cb.on_validation_end(_fake_trainer(0.7), None)  # type: ignore[arg-type]
    assert study._storage.get_trial(keep._trial_id).intermediate_values == {
        0: pytest.approx(0.6),
        1: pytest.approx(0.7),
    }
    with pytest.raises(optuna.TrialPruned, match="val_auc=0.5000"):
        OptunaPruning.for_trial(prune).on_validation_end(_fake_trainer(0.5), None)  # type: ignore[arg-type]
    with pytest.raises(NonFiniteMetricError, match="nan"):
        OptunaPruning.for_trial(study.ask()).on_validation_end(_fake_trainer(math.nan), None)  # type: ignore[arg-type]


def test_gif_warm_start_trials_are_not_pruned() -> None:
    study = optuna.create_study(direction="maximize", pruner=PruneNumbers({0, 1}))
    warm, other = study.ask(), study.ask()
    study._storage.set_trial_system_attr(warm._trial_id, "gif:phase", "warmup")
    study._storage.set_trial_system_attr(other._trial_id, "gif:phase", "group")
    OptunaPruning.for_trial(warm).on_validation_end(_fake_trainer(0.5), None)  # type: ignore[arg-type]
    with pytest.raises(optuna.TrialPruned):
        OptunaPruning.for_trial(other).on_validation_end(_fake_trainer(0.5), None)  # type: ignore[arg-type]
    OptunaPruning.for_trial(study.ask(), prune_warmup=True)  # the switch exists


def test_pruning_callback_rebuilds_its_trial_from_storage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for _ in range(5):  # the median pruner's startup trials, all at 0.9
        t = study.ask()
        t.report(0.9, 0)
        t.report(0.9, 1)
        study.tell(t, 0.9)
    study.ask()
    cb = OptunaPruning(storage=url, study_name="s", trial_number=5, pruner="median")
    cb.on_validation_end(_fake_trainer(0.55), None)  # type: ignore[arg-type]  # step 0: warm-up, never pruned
    with pytest.raises(optuna.TrialPruned):
        cb.on_validation_end(_fake_trainer(0.55), None)  # type: ignore[arg-type]
    assert study.trials[5].intermediate_values == {0: pytest.approx(0.55), 1: pytest.approx(0.55)}


def test_tune_end_to_end_prunes_and_writes_a_loadable_best_config(
    tmp_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_cwd / 'optuna.db'}"
    result = tune(
        SYNTHETIC, sampler="random", n_trials=2, storage=url, max_epochs=1, overrides=TINY, pruner=PruneNumbers({1})
    )
    assert (result.n_complete, result.n_pruned, result.n_failed) == (1, 1, 0)
    assert result.study_name == "synthetic_dcnv2-random"
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    for t in study.trials:  # every fit, the pruned one too, is a nested MLflow run of the study
        assert t.user_attrs.get(RUN_ID_ATTR)
        assert 0.0 <= t.intermediate_values[0] <= 1.0
    assert result.best_value == study.trials[0].value
    assert result.parent_run_id

    from mlflow import MlflowClient

    from recsys.tracking import tracking_uri

    client = MlflowClient(tracking_uri())
    pruned = client.get_run(study.trials[1].user_attrs[RUN_ID_ATTR])
    assert pruned.info.status == "KILLED"
    assert pruned.data.tags["mlflow.parentRunId"] == result.parent_run_id

    # the best config: original config + best hyperparameters + the overrides, loadable by `salience fit`
    best = _load_with_cli(result.best_config_path, capsys)  # type: ignore[arg-type]
    from experiments.hpo.space import OPTIMIZERS

    assert best["model"]["optimizer"]["class_path"] == OPTIMIZERS[result.best_params["optimizer"]]
    assert best["model"]["optimizer"]["init_args"]["lr"] == pytest.approx(result.best_params["learning_rate"])
    assert best["model"]["backbone"]["init_args"]["cross_layers"] == result.best_params["cross_layers"]
    assert best["data"]["embedding_dim"] == result.best_params["embedding_dim"]
    assert best["data"]["reader"]["init_args"]["n_rows"] == 3000
    assert best["trainer"]["max_epochs"] == 3  # the config's, not the per-trial budget
    assert not best["trainer"].get("callbacks")
    out = Path(result.output_dir)
    assert len((out / "trials.csv").read_text().strip().splitlines()) == 3
    assert len(json.loads((out / "summary.json").read_text())["space"]) >= 10
    assert not list((out / "fits").glob("**/*.ckpt"))  # checkpoints go once a trial is done


def test_nan_and_raising_trials_fail_cleanly_and_the_study_goes_on(
    tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recsys.train.recipe import FitResult, Recipe

    outcomes: list[Any] = [math.nan, RuntimeError("boom: out of memory"), 0.75, math.inf]

    def fake_fit(self: Recipe, **kwargs: Any) -> FitResult:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return FitResult(task=None, datamodule=None, metrics={"best_val_auc": outcome})  # type: ignore[arg-type]

    monkeypatch.setattr(Recipe, "fit", fake_fit)
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    first = tune(SYNTHETIC, sampler="random", n_trials=2, storage=url, tracking=False)
    assert (first.n_complete, first.n_failed, first.best_value, first.best_config_path) == (0, 2, None, None)
    # re-running the same command resumes the study: only the missing trials run
    result = tune(SYNTHETIC, sampler="random", n_trials=4, storage=url, tracking=False)
    assert not outcomes
    assert (result.n_complete, result.n_failed) == (1, 3)
    assert result.best_value == pytest.approx(0.75)
    assert result.values == [None, None, pytest.approx(0.75), None]
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    reasons = [t.user_attrs.get(FAIL_REASON_ATTR, "") for t in study.trials]
    assert "nan" in reasons[0] and "boom" in reasons[1] and "inf" in reasons[3]
    assert Path(result.best_config_path).is_file()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    ["sqlite:////nonexistent/dir/x.db", "postgresql://127.0.0.1:1/x", "optuna.db"],
)
def test_an_unreachable_or_invalid_storage_is_a_clear_error(tmp_cwd: Path, url: str) -> None:
    with pytest.raises(StorageError, match="storage") as e:
        tune(SYNTHETIC, sampler="random", n_trials=1, storage=url, tracking=False)
    assert url in str(e.value)


#: the server URL forms of docs/multi-worker-hpo.md, on a port where nothing listens
SERVER_URLS = [
    "postgresql+psycopg2://user:s3cret@127.0.0.1:1/optuna",
    "mysql+pymysql://user:s3cret@127.0.0.1:1/optuna",
]


@pytest.mark.parametrize("url", SERVER_URLS)
def test_a_server_storage_fails_clearly_and_its_password_is_never_shown(tmp_cwd: Path, url: str) -> None:
    with pytest.raises(StorageError, match=r"install the database driver|reachable") as e:
        tune(SYNTHETIC, sampler="random", n_trials=1, storage=url, tracking=False)
    assert "s3cret" not in str(e.value)
    assert "user:***@127.0.0.1:1/optuna" in str(e.value)


def test_the_trial_reaches_the_fit_as_an_object_and_the_storage_stays_out_of_its_config() -> None:
    """The objective hands the fit a pruning callback bound to the live trial (no process-global
    lookup, no storage URL in the fit config, which is saved with the run and logged to MLflow);
    the result table hides the storage password."""
    from experiments.hpo.tune import Objective, TrialSettings, TuneResult

    url = SERVER_URLS[0]
    settings = TrialSettings(
        config="c.yaml",
        overrides=[],
        storage=url,
        study_name="s",
        sampler="random",
        n_trials=1,
        seed=0,
        max_epochs=1,
        limit_train_batches=None,
        tracking=False,
        experiment="hpo",
        parent_run_id=None,
        workdir="w",
        keep_checkpoints=False,
        prune_warmup=False,
    )
    fits: list[dict[str, Any]] = []
    recipe = SimpleNamespace(fit=lambda **kwargs: fits.append(kwargs), workdir="w")
    objective = Objective(settings, recipe, search_space(DCNv2), {})  # type: ignore[arg-type]
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    objective.fit(trial, search_space(DCNv2).suggest(trial))
    (callback,) = fits[0]["callbacks"]
    assert isinstance(callback, OptunaPruning) and callback.trial is trial
    args = " ".join(fits[0]["extra_args"])
    assert "127.0.0.1" not in args and "s3cret" not in args and "callbacks" not in args
    callback.on_validation_end(_fake_trainer(0.7), None)  # type: ignore[arg-type]
    assert study.trials[0].intermediate_values == {0: pytest.approx(0.7)}
    table = TuneResult("s", url, None, {}, None, 0, 0, 0).table()
    assert "s3cret" not in table and "user:***@" in table


def test_cli_reports_bad_storage_and_bad_sampler(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    assert (
        main(["tune", "--config", str(SYNTHETIC), "--storage", "sqlite:////nonexistent/dir/x.db", "--no-tracking"])
        == 2
    )
    assert "sqlite:////nonexistent/dir/x.db" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune", "--config", str(SYNTHETIC), "--sampler", "grid"])
    with pytest.raises(SystemExit) as e:
        main(["tune", "--help"])
    assert e.value.code == 0
    assert "--n-trials" in capsys.readouterr().out


def _fake_fit(self: Any, **kwargs: Any) -> Any:
    from recsys.train.recipe import FitResult

    return FitResult(task=None, datamodule=None, metrics={"best_val_auc": 0.75})  # type: ignore[arg-type]


def _threaded_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tune(workers=W)`` runs its workers as threads of this process (spawned processes would
    not see a faked fit), with the same shared-counter protocol."""
    import threading

    import experiments.hpo.tune as tune_module

    def threads(settings: Any, pruner: Any, remaining: int, workers: int) -> None:
        counter, lock = SimpleNamespace(value=0), threading.Lock()
        pool = [
            threading.Thread(target=tune_module.run_worker, args=(settings, pruner, remaining, i, counter, lock))
            for i in range(workers)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    monkeypatch.setattr(tune_module, "spawn_workers", threads)


def test_workers_claim_exactly_the_missing_trials(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared-counter protocol of the worker processes, in threads (the real processes are
    tested below)."""
    from recsys.train.recipe import Recipe

    monkeypatch.setattr(Recipe, "fit", _fake_fit)
    _threaded_workers(monkeypatch)
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    result = tune(SYNTHETIC, sampler="random", n_trials=5, storage=url, workers=2, tracking=False)
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert sorted(t.number for t in study.trials) == list(range(5))
    assert result.n_complete == 5
    assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == 5  # workers draw different points


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_independent_commands_with_workers_share_the_budget_and_draw_different_points(
    tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch, sampler: str
) -> None:
    """Two ``salience tune --workers 2`` commands on one storage (two machines), in threads: they
    stop once the study holds ``n_trials`` (each command's counter alone would run ``n_trials``
    more), and the same ``--seed`` on both does not make them evaluate the same points."""
    import threading
    import time

    from recsys.train.recipe import FitResult, Recipe

    def slow_fit(self: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)  # let the four workers interleave
        return FitResult(task=None, datamodule=None, metrics={"best_val_auc": 0.75})  # type: ignore[arg-type]

    monkeypatch.setattr(Recipe, "fit", slow_fit)
    _threaded_workers(monkeypatch)
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    n_trials, errors = 8, []

    def command() -> None:
        try:
            tune(SYNTHETIC, sampler=sampler, n_trials=n_trials, storage=url, study_name="s", workers=2, tracking=False)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    commands = [threading.Thread(target=command) for _ in range(2)]
    for t in commands:
        t.start()
    for t in commands:
        t.join()
    assert not errors, errors
    trials = optuna.load_study(study_name="s", storage=url).trials
    # four workers in all: at most three start a trial at the moment the budget fills
    assert n_trials <= len(trials) <= n_trials + 3
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == len(trials)


def test_worker_processes_share_one_study(tmp_cwd: Path) -> None:
    """``salience tune --workers 2``: two spawned processes, one study, one MLflow parent run."""
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    result = tune(
        SYNTHETIC,
        sampler="random",
        n_trials=3,
        storage=url,
        workers=2,
        max_epochs=1,
        limit_train_batches=2,
        overrides=TINY,
        pruner="none",
    )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert sorted(t.number for t in study.trials) == [0, 1, 2]
    assert result.n_complete == 3
    assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == 3

    from mlflow import MlflowClient

    from recsys.tracking import tracking_uri

    client = MlflowClient(tracking_uri())
    for t in study.trials:  # every trial's fit is a child of the study's one parent run
        run = client.get_run(t.user_attrs[RUN_ID_ATTR])
        assert run.data.tags["mlflow.parentRunId"] == result.parent_run_id


# real processes on one storage: test_worker_processes_share_one_study; two commands' shared budget and
# distinct points: test_independent_commands_with_workers_share_the_budget_and_draw_different_points
@pytest.mark.slow
def test_independent_tune_commands_share_one_study(tmp_cwd: Path) -> None:
    """The same ``salience tune`` command started twice at once against one ``--storage``, as on
    two machines: one study holds every trial, each trial ran in exactly one of the commands, the
    budget holds (up to one trial of overshoot with two processes) and the two commands draw
    different points with one ``--seed``."""
    import os
    import re
    import subprocess
    import sys

    n_trials = 4
    url = f"sqlite:///{tmp_cwd / 'optuna.db'}"
    cmd = [sys.executable, "-m", "experiments.cli", "tune", "--config", str(SYNTHETIC), "--sampler", "random"]
    cmd += ["--n-trials", str(n_trials), "--storage", url, "--study-name", "shared", "--max-epochs", "1"]
    cmd += ["--limit-train-batches", "2", "--pruner", "none", "--no-tracking", *TINY]  # MLflow: the test above
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CONFIGS.parents[1]), env.get("PYTHONPATH")]))
    paths = [tmp_cwd / f"command-{i}.log" for i in range(2)]
    procs = []
    try:
        for path in paths:  # started together, as two machines would be
            with path.open("w") as out:
                procs.append(subprocess.Popen(cmd, cwd=tmp_cwd, env=env, stdout=out, stderr=subprocess.STDOUT))
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [path.read_text() for path in paths]
    for p, out in zip(procs, logs, strict=True):
        assert p.returncode == 0, out[-4000:]

    study = optuna.load_study(study_name="shared", storage=url)
    numbers = sorted(t.number for t in study.trials)
    assert n_trials <= len(numbers) <= n_trials + 1
    assert numbers == list(range(len(numbers)))
    assert all(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in study.trials)
    assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == len(numbers)
    # each trial was run by one command (with a storage each, both would run trials 0..3)
    ran = [{int(n) - 1 for n in re.findall(r"experiments\.hpo\.tune: trial (\d+)/\d+ ", out)} for out in logs]
    assert not ran[0] & ran[1], logs
    assert ran[0] | ran[1] == set(numbers), logs


def test_tune_on_frappe_through_the_cli(
    data_dir: Path, tmp_cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    require_dataset(data_dir, "frappe")
    from experiments.cli import main

    monkeypatch.setenv("SALIENCE_DATA_DIR", str(data_dir))
    code = main(
        [
            "tune",
            "--config",
            str(CONFIGS / "frappe_dcnv2.yaml"),
            "--sampler",
            "gif",
            "--n-trials",
            "2",
            "--max-epochs",
            "1",
            "--limit-train-batches",
            "5",
            "--no-tracking",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "best val_auc" in out
    best = tmp_cwd / "runs" / "tune" / "frappe_dcnv2-gif" / "best_config.yaml"
    config = _load_with_cli(best, capsys)
    assert config["data"]["reader"]["class_path"].endswith("FrappeReader")
    assert (tmp_cwd / "optuna.db").is_file()  # the default storage


def test_resuming_a_study_with_other_settings_is_refused_unless_asked(
    tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed study mixes its trials with the new ones only when asked: other epochs, seed,
    overrides, ... are refused (naming the settings and the two ways out); more trials are fine."""
    from experiments.hpo.tune import tune_main
    from recsys.train.recipe import FitResult, Recipe

    monkeypatch.setattr(Recipe, "fit", lambda self, **kw: FitResult(task=None, datamodule=None,  # type: ignore[arg-type]
                                                                     metrics={"best_val_auc": 0.7}))
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    tune(SYNTHETIC, sampler="random", n_trials=1, storage=url, study_name="s", max_epochs=1, tracking=False)
    with pytest.raises(ValueError, match=r"max_epochs: 1 then, 2 now.*--study-name.*--allow-changed-settings"):
        tune(SYNTHETIC, sampler="random", n_trials=2, storage=url, study_name="s", max_epochs=2, tracking=False)
    with pytest.raises(ValueError, match=r"overrides: \[\] then, \['--data.batch_size=64'\] now"):
        tune(SYNTHETIC, sampler="random", n_trials=2, storage=url, study_name="s", max_epochs=1, tracking=False,
             overrides=["--data.batch_size=64"])
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 1  # nothing ran
    more = tune(SYNTHETIC, sampler="random", n_trials=2, storage=url, study_name="s", max_epochs=1, tracking=False)
    assert len(more.values) == 2  # a larger budget with the same settings resumes
    mixed = tune(SYNTHETIC, sampler="random", n_trials=3, storage=url, study_name="s", max_epochs=2, tracking=False,
                 allow_changed_settings=True)
    assert len(mixed.values) == 3
    code = tune_main(["--config", str(SYNTHETIC), "--sampler", "random", "--n-trials", "4", "--storage", url,
                      "--study-name", "s", "--max-epochs", "3", "--no-tracking"])
    assert code == 2 and "--allow-changed-settings" in capsys.readouterr().err
