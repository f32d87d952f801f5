"""GIFSampler: the schedule and phases, planted importance, bad input, parallel workers on one
sqlite storage, and resuming a killed study."""

from __future__ import annotations

import math
import multiprocessing as mp
import time
import warnings
from pathlib import Path

import numpy as np
import optuna
import pytest
from scipy.stats import spearmanr

from experiments.hpo import GIFSampler, SequentialGroupingSampler, make_sampler, read_schedule, trial_phase
from experiments.hpo.gif import PROBE_ATTR, SCHEDULE_ATTR

optuna.logging.set_verbosity(optuna.logging.WARNING)
# multivariate TPE, QMC and storage heartbeats are marked experimental by Optuna
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

SCALES = np.array([4.0, 2.0, 1.0, 0.5, 0.25, 0.1])  # planted importance of x0..x5


def weighted_sphere(trial: optuna.trial.BaseTrial) -> float:
    x = np.array([trial.suggest_float(f"x{j}", -1.0, 1.0) for j in range(len(SCALES))])
    return float(np.sum((SCALES * (x - 0.3)) ** 2))


def _run(n_trials: int = 60, **kwargs) -> optuna.Study:
    study = optuna.create_study(sampler=GIFSampler(n_trials, seed=0, **kwargs))
    study.optimize(weighted_sphere, n_trials=n_trials)
    return study


def _check_phases(study: optuna.Study) -> None:
    """Every trial's recorded phase is the schedule's phase of its number."""
    schedule = read_schedule(study)
    assert schedule is not None
    for t in study.trials:
        assert trial_phase(t) == schedule.phase_of(t.number), t.number


def test_schedule_phases_and_planted_importance() -> None:
    study = _run(60)
    s = read_schedule(study)
    assert s is not None and not s.note
    # Latin hypercube of max(5, ceil(0.05 B)) = 5 trials, then one probe per parameter
    assert s.n_warmup == 5 + 6
    assert s.evaluator == "elementary-effects"
    assert s.n_warmup + sum(s.budgets) + s.n_fallback == 60
    assert s.n_fallback == math.ceil(0.15 * 60)
    assert len(set(s.budgets)) == 1 or max(s.budgets) - min(s.budgets) <= 1  # uniform allocation
    assert s.groups[0][0] == "x0" and sorted(p for g in s.groups for p in g) == [f"x{j}" for j in range(6)]
    rho = spearmanr([s.importance[f"x{j}"] for j in range(6)], SCALES).statistic
    assert rho > 0.9
    assert sum(s.importance.values()) == pytest.approx(1.0)
    _check_phases(study)
    trials = study.trials
    # probes: the best Latin-hypercube trial with exactly the probed parameter changed
    base = min(trials[:5], key=lambda t: t.value)
    for t in trials[5:11]:
        changed = [p for p in t.params if t.params[p] != base.params[p]]
        assert changed == [t.system_attrs[PROBE_ATTR]]
    # group trials: every parameter outside the group is the incumbent's value at that time
    for t in trials[s.n_warmup :]:
        phase, group = trial_phase(t)
        if phase != "group":
            continue
        best = min(trials[: t.number], key=lambda u: (u.value, u.number))
        for p in t.params:
            if p not in s.groups[group]:
                assert t.params[p] == best.params[p], (t.number, p)
    assert study.best_value < min(t.value for t in trials[: s.n_warmup])  # the groups made progress


def test_latin_hypercube_warm_start_stratifies_each_parameter() -> None:
    study = _run(40, warmup="lhs", n_warmup=10)
    for j in range(6):
        values = [t.params[f"x{j}"] for t in study.trials[:10]]
        strata = sorted(int((v + 1.0) / 2.0 * 10) for v in values)
        assert strata == list(range(10))
    s = read_schedule(study)
    assert s.evaluator == "ped-anova" and s.n_warmup == 10


@pytest.mark.parametrize("allocation", ["uniform", "proportional"])
def test_allocation_fills_the_budget(allocation: str) -> None:
    s = read_schedule(_run(80, allocation=allocation, min_group_trials=4))
    assert s.n_warmup + sum(s.budgets) + s.n_fallback == 80
    assert min(s.budgets) >= 4
    if allocation == "proportional":
        weights = [sum(s.importance[p] for p in g) for g in s.groups]
        assert s.budgets == sorted(s.budgets, reverse=True) and weights == sorted(weights, reverse=True)


def test_ablation_switches_and_sequential_grouping() -> None:
    no_fb = read_schedule(_run(50, fallback=0.0))
    assert no_fb.n_fallback == 0 and no_fb.n_warmup + sum(no_fb.budgets) == 50
    rand = read_schedule(_run(50, grouping="random"))
    assert rand.evaluator == "none" and len(set(rand.importance.values())) == 1
    study = optuna.create_study(sampler=SequentialGroupingSampler(50, seed=0))
    study.optimize(weighted_sphere, n_trials=50)
    sg = read_schedule(study)
    assert sg.n_fallback == 0 and [len(g) for g in sg.groups] == [2, 2, 2]
    assert sg.groups[0][0] == "x0"
    for name in ("gif", "sg", "gif-no-hia", "gif-proportional", "gif-no-fallback", "gif-paper", "tpe", "random"):
        assert isinstance(make_sampler(name, n_trials=10, seed=0), optuna.samplers.BaseSampler)
    with pytest.raises(ValueError, match="unknown sampler"):
        make_sampler("bohb", n_trials=10)


def test_one_parameter_degenerates_to_the_base_sampler() -> None:
    study = optuna.create_study(sampler=GIFSampler(30, seed=0))
    study.optimize(lambda t: (t.suggest_float("x", -2, 2) - 1.0) ** 2, n_trials=30)
    s = read_schedule(study)
    assert "one parameter" in s.note and s.groups == []
    assert {trial_phase(t)[0] for t in study.trials[s.n_warmup :]} == {"fallback"}
    assert study.best_value < 0.01


def test_categorical_conditional_failing_and_nan_trials() -> None:
    def objective(trial: optuna.Trial) -> float:
        opt = trial.suggest_categorical("optimizer", ["adam", "sgd"])
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        layers = trial.suggest_int("layers", 1, 4)
        momentum = trial.suggest_float("momentum", 0.0, 0.99) if opt == "sgd" else 0.0
        if trial.number in (2, 13):
            raise RuntimeError("diverged")
        if trial.number in (3, 14):
            return float("nan")
        return (math.log10(lr) + 2.5) ** 2 + 0.1 * layers + (0.5 if opt == "sgd" else 0.0) + (momentum - 0.9) ** 2

    study = optuna.create_study(sampler=GIFSampler(40, seed=1))
    study.optimize(objective, n_trials=40, catch=(RuntimeError,))
    assert len(study.trials) == 40
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 4  # the two errors and the two NaNs
    s = read_schedule(study)
    assert s is not None and set(s.importance) == {"optimizer", "lr", "layers", "momentum"}
    _check_phases(study)
    for t in study.trials:  # every value valid for its distribution
        for name, value in t.params.items():
            assert t.distributions[name]._contains(t.distributions[name].to_internal_repr(value))


def test_budget_smaller_than_the_warm_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        sampler = GIFSampler(4, seed=0, n_warmup=10, warmup="lhs")
    assert "exceeds the budget" in caplog.text
    study = optuna.create_study(sampler=sampler)
    study.optimize(weighted_sphere, n_trials=8)  # past the budget: fallback trials
    s = read_schedule(study)
    assert s.n_warmup == 4 and s.groups == [] and s.note
    assert [trial_phase(t)[0] for t in study.trials] == ["warmup"] * 4 + ["fallback"] * 4
    with pytest.raises(ValueError, match="n_trials"):
        GIFSampler(0)
    with pytest.raises(ValueError, match="allocation"):
        GIFSampler(10, allocation="greedy")


def test_multi_objective_is_refused() -> None:
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=GIFSampler(10, seed=0))
    with pytest.raises(ValueError, match="single-objective"):
        study.optimize(lambda t: (t.suggest_float("x", 0, 1), 1.0), n_trials=1)


# -- parallel workers and resume ---------------------------------------------------------------
N_SHARED = 36


def _worker(storage: str, name: str, claimed, lock) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    study = optuna.load_study(study_name=name, storage=storage, sampler=GIFSampler(N_SHARED, seed=3))
    while True:  # claim trials from a shared counter (as `salience tune --workers` does)
        with lock:
            if claimed.value >= N_SHARED:
                return
            claimed.value += 1
        study.optimize(weighted_sphere, n_trials=1)


def test_two_worker_processes_share_one_schedule(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(study_name="shared", storage=storage)
    ctx = mp.get_context("spawn")
    claimed, lock = ctx.Value("i", 0), ctx.Lock()
    workers = [ctx.Process(target=_worker, args=(storage, "shared", claimed, lock)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=240)
        assert w.exitcode == 0
    study = optuna.load_study(study_name="shared", storage=storage)
    numbers = [t.number for t in study.trials]
    assert sorted(numbers) == list(range(N_SHARED))  # none duplicated, none lost
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    _check_phases(study)
    assert len({t.datetime_start for t in study.trials}) == N_SHARED


def _crashing_worker(storage: str, name: str, crash_at: int) -> None:
    import os

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")

    def objective(trial: optuna.Trial) -> float:
        value = weighted_sphere(trial)
        if trial.number == crash_at:
            # a trial killed after its heartbeat began (Optuna's heartbeat thread writes its first beat
            # while the objective runs, and never fails a trial without one: under load the kill could
            # come first, and the trial stayed RUNNING after the resume)
            heartbeat.record_heartbeat(trial._trial_id)
            os._exit(1)  # killed mid-trial: the trial stays RUNNING in storage
        return value

    heartbeat = optuna.storages.RDBStorage(storage, heartbeat_interval=1, grace_period=2)
    study = optuna.load_study(study_name=name, storage=heartbeat, sampler=GIFSampler(N_SHARED, seed=3))
    study.optimize(objective, n_trials=N_SHARED)


def test_a_killed_study_resumes_where_it_stopped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2)
    optuna.create_study(study_name="killed", storage=storage)
    crash_at = 20  # after the schedule was assessed (warm start: 5 + 6 trials)
    proc = mp.get_context("spawn").Process(target=_crashing_worker, args=(url, "killed", crash_at))
    proc.start()
    proc.join(timeout=240)
    assert proc.exitcode == 1
    study = optuna.load_study(study_name="killed", storage=storage, sampler=GIFSampler(N_SHARED, seed=3))
    before = study._storage.get_study_system_attrs(study._study_id)[SCHEDULE_ATTR]
    assert study.trials[crash_at].state == optuna.trial.TrialState.RUNNING
    time.sleep(3)  # past the heartbeat grace period: the dead trial is failed on resume
    study.optimize(weighted_sphere, callbacks=[optuna.study.MaxTrialsCallback(N_SHARED, states=None)])
    assert study.trials[crash_at].state == optuna.trial.TrialState.FAIL
    assert [t.number for t in study.trials] == list(range(N_SHARED))
    assert study._storage.get_study_system_attrs(study._study_id)[SCHEDULE_ATTR] == before
    _check_phases(study)


def test_workers_with_one_seed_draw_their_own_points_in_search_phases() -> None:
    """Worker processes share the seed; each search-phase trial must still get its own TPE
    draw (a TPE seeded once per process drew the same point for concurrent trials)."""
    from optuna.trial import TrialState

    study = optuna.create_study(sampler=GIFSampler(60, seed=0))
    study.optimize(weighted_sphere, n_trials=45)  # past the warm start, inside the group phases
    schedule = read_schedule(study)
    assert schedule is not None and schedule.phase_of(45)[0] != "warmup"

    def ask_with_a_fresh_worker() -> dict[str, float]:
        study.sampler = GIFSampler(60, seed=0)  # another process, same seed
        trial = study.ask()
        params = {f"x{j}": trial.suggest_float(f"x{j}", -1.0, 1.0) for j in range(len(SCALES))}
        study.tell(trial, state=TrialState.FAIL)  # the history the next worker sees is unchanged
        return params

    first, second = ask_with_a_fresh_worker(), ask_with_a_fresh_worker()
    assert first != second
