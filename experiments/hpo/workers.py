"""The worker loop of ``salience tune``, in this process or in spawned worker processes.

A worker evaluates trials of the study until its share of the budget is claimed: ``W`` worker
processes of one command claim trials from a shared counter, and every worker also stops once the
study holds ``n_trials`` trials (other commands on other machines may fill it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna

from experiments.hpo.fit_config import resolved_config
from experiments.hpo.objective import Objective, TrialSettings, log_trial
from experiments.hpo.samplers import study_sampler
from experiments.hpo.space import backbone_spec, search_space
from experiments.hpo.storage import open_storage

__all__ = ["run_worker", "spawn_workers"]


def run_worker(
    settings: TrialSettings,
    pruner: optuna.pruners.BasePruner,
    remaining: int,
    worker: int = 0,
    counter: Any = None,
    lock: Any = None,
) -> None:
    """Evaluate trials of the study until ``remaining`` are claimed (across workers when a
    shared ``counter``/``lock`` is given) or the study holds ``settings.n_trials`` trials."""
    from recsys.train.recipe import Recipe

    config = resolved_config(Path(settings.config), settings.overrides)
    backbone, base_args = backbone_spec(config)
    space = search_space(backbone, settings.fixed)
    recipe = Recipe(settings.config, settings.overrides, workdir=settings.workdir, quiet=True)
    objective = Objective(settings, recipe, space, base_args)
    storage = open_storage(settings.storage)
    sampler = study_sampler(settings.sampler, settings.n_trials, settings.seed)
    study = optuna.load_study(study_name=settings.study_name, storage=storage, sampler=sampler, pruner=pruner)
    callbacks: list[Any] = [
        optuna.study.MaxTrialsCallback(settings.n_trials, states=None),
        log_trial(settings.n_trials),
    ]
    if settings.tracking:
        from experiments.hpo.study_tracking import StudyTracker

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


def worker_main(
    settings: TrialSettings,
    pruner: optuna.pruners.BasePruner,
    remaining: int,
    worker: int,
    counter: Any,
    lock: Any,
    threads: int,
) -> None:
    """Entry point of a spawned worker process."""
    import torch

    from recsys.runtime import configure_logging

    torch.set_num_threads(threads)
    configure_logging(f"%(levelname)s [worker {worker}] %(name)s: %(message)s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run_worker(settings, pruner, remaining, worker, counter, lock)


def spawn_workers(settings: TrialSettings, pruner: optuna.pruners.BasePruner, remaining: int, workers: int) -> None:
    """Run ``workers`` spawned worker processes sharing ``remaining`` trials; each gets
    ``cpu_count // workers`` threads."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    counter = ctx.Value("i", 0)
    lock = ctx.Lock()
    threads = max(1, (os.cpu_count() or 1) // workers)
    procs = [
        ctx.Process(
            target=worker_main, args=(settings, pruner, remaining, i, counter, lock, threads), name=f"tune-worker-{i}"
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
