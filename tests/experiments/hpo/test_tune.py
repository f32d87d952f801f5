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
from recsys.train.module import ARCHITECTURES
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


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_search_space_has_ten_typed_hyperparameters_that_map_to_valid_arch_args(arch: str) -> None:
    import inspect

    space = search_space(arch)
    assert len(space) >= 10
    assert len(set(space.names)) == len(space)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    allowed = set(inspect.signature(ARCHITECTURES[arch].__init__).parameters)
    for _ in range(5):
        trial = study.ask()
        params = space.suggest(trial)
        assert set(trial.distributions) == set(space.names)
        updates = space.config_updates(params, {"dropout": 0.9})
        assert set(updates["model.arch_args"]) <= allowed
        assert updates["model.arch_args"]["dropout"] == params["dropout"]  # sampled values win over the config's
        assert updates["model.embedding_kernel"] == "plain"
        assert updates["data.embedding_dim"] in (8, 16, 32)
    with pytest.raises(ValueError, match="no search space"):
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
    assert best["model"]["learning_rate"] == pytest.approx(result.best_params["learning_rate"])
    assert best["model"]["optimizer"] == result.best_params["optimizer"]
    assert best["model"]["arch_args"]["cross_layers"] == result.best_params["cross_layers"]
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


def test_workers_claim_exactly_the_missing_trials(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared-counter protocol of the worker processes, run in threads (spawned processes
    would not see the fake fit; the slow test below runs real ones)."""
    import threading

    import experiments.hpo.tune as tune_module
    from recsys.train.recipe import Recipe

    def threads(settings: Any, pruner: Any, remaining: int, workers: int) -> None:
        counter, lock = SimpleNamespace(value=0), threading.Lock()
        pool = [
            threading.Thread(target=tune_module._run_worker, args=(settings, pruner, remaining, i, counter, lock))
            for i in range(workers)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    monkeypatch.setattr(Recipe, "fit", _fake_fit)
    monkeypatch.setattr(tune_module, "_spawn_workers", threads)
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    result = tune(SYNTHETIC, sampler="random", n_trials=5, storage=url, workers=2, tracking=False)
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert sorted(t.number for t in study.trials) == list(range(5))
    assert result.n_complete == 5
    assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == 5  # workers draw different points


@pytest.mark.slow
def test_worker_processes_share_one_study(tmp_cwd: Path) -> None:
    url = f"sqlite:///{tmp_cwd / 'o.db'}"
    result = tune(
        SYNTHETIC, sampler="random", n_trials=3, storage=url, workers=2, max_epochs=1, overrides=TINY, pruner="none"
    )
    study = optuna.load_study(study_name=result.study_name, storage=url)
    assert sorted(t.number for t in study.trials) == [0, 1, 2]
    assert result.n_complete == 3
    assert all(t.user_attrs.get(RUN_ID_ATTR) for t in study.trials)
    assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == 3


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
