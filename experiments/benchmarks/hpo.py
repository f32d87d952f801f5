"""HPO benchmark: GIF (Greedy Importance First) against TPE, random search, Sequential Grouping and ablations.

    python -m experiments.benchmarks.hpo                  # the committed run (Frappe needs SALIENCE_DATA_DIR)
    python -m experiments.benchmarks.hpo --no-frappe --seeds 3
    python -m experiments.benchmarks.hpo --quick          # smoke run (not a result)
    python -m experiments.benchmarks.hpo --render experiments/results/hpo.json   # re-derive verdicts, .md/.png

Three parts (``--parts``, default all), every study in memory, seeds 0..N-1 (``--seeds``, default 10),
(problem, method, seed) studies spread over ``--jobs`` processes (default 2, one BLAS thread each):

* **analytic**: sphere, Rastrigin, Rosenbrock, Ackley and Levy at d = 5, 10, 30, 50 on [-5, 5]^d,
  made anisotropic by input scales ``a_j = 10^(-3 j / (d - 1))`` around a shifted optimum of value 0
  (``experiments.hpo.problems``), budget 200 trials; methods ``gif``, ``tpe`` (multivariate),
  ``random``, ``sg`` (Sequential Grouping), the ablations ``gif-no-hia`` (random grouping),
  ``gif-proportional`` (the paper's importance-proportional allocation instead of GIF's equal
  budgets), ``gif-no-fallback``, and ``gif-paper`` (the literal methods.md 6.2 design: Latin
  hypercube warm start, PED-ANOVA, proportional allocation, TPE on all trials). Per run: the final regret (= best value),
  the AUC (mean over trials 1..B of log10(best-so-far regret + 1e-12); lower is better), the wall
  seconds, and for every study with a GIF schedule the Spearman correlation of the estimated
  importances with the true ``a_j`` over all d parameters and the top-k recall (k = max(1, d // 5)).
  Reported: mean and standard error (std / sqrt(n)) of final regret and AUC per (function, d,
  method), average ranks, mean log-regret curves with s.e. bands (``hpo.png``), and the targets:
  GIF's mean final regret below TPE's by more than 1.96 s.e. of the difference (the 95% interval)
  on every function at d = 30 and 50; at d = 5 GIF not worse than TPE by more than 1.96 s.e.; every
  ablation worse than full GIF at d >= 30 (its mean final regret above GIF's by more than 1.96 s.e.
  of the difference on most of those tasks; the geometric mean of the ratio ablation / GIF is
  reported beside); mean importance Spearman of GIF > 0.8. Every comparison follows the rule of
  ``experiments.benchmarks._common``: a difference within the s.e. is a tie, never a win.
* **bayesmark**: scikit-learn models on bundled datasets (``experiments.hpo.problems.BAYESMARK``,
  3-fold CV loss): DT-wine-acc, DT-diabetes-mse, RF-breast-acc, SVM-breast-acc (gamma conditional on
  the RBF kernel), kNN-wine-acc, ada-wine-acc, MLP-adam-wine-acc, lasso-diabetes-mse,
  linear-breast-nll; Bayesmark's spaces, cut for cost (RF 5-20 trees, AdaBoost 10-50 estimators,
  MLP 30 epochs; no digits task: 0.1-0.8 s per trial). Budget 50, methods gif, tpe, random, sg.
  Bayesmark-style normalised score per run:
  ``100 * (1 - (best - opt) / (ref - opt))``, opt = the best loss seen on the task over every run,
  ref = random search's mean final best (so random scores 0 on average, the best run 100); also
  the same score averaged over the trials (the normalised AUC).
* **frappe**: ``experiments.hpo.tune.tune`` on the Frappe DCNv2 config (short per-trial budget,
  ``FRAPPE``), GIF vs TPE, 3 seeds; skipped with the reason recorded when
  ``$SALIENCE_DATA_DIR/frappe`` is missing (``--no-frappe`` skips it too).

Cost on 2 idle cores with ``--jobs 2``: one 200-trial study takes 0.3 s (d = 5) to 2 s (d = 50) for the
TPE-based methods and 0.02-0.2 s for random search, about 22 CPU-seconds per (function, seed) over the
4 dims and 8 methods, so the analytic part is about 9 minutes; the Bayesmark part (2-80 ms per trial)
about 3.5 minutes; Frappe (6 studies x 20 short trials) about 5 minutes. A busy machine is several
times slower: every study's wall seconds are in the JSON.
Results: ``experiments/results/hpo.json`` (every run, the summaries, the target checks), ``hpo.md``
and ``hpo.png``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from experiments.benchmarks._common import BETTER, TIE, WORSE, majority_verdict, spread_of_difference, verdict
from experiments.hpo.problems import ANALYTIC, BAYESMARK, analytic, bayesmark_tasks
from recsys.io import atomic_savefig, atomic_write_text

__all__ = ["analytic_checks", "bayesmark_checks", "main", "run_analytic", "run_bayesmark", "run_frappe", "to_markdown",
           "worker_pool"]

RESULTS = Path(__file__).resolve().parents[1] / "results"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DIMS = (5, 10, 30, 50)
#: registered sampler names (``experiments.hpo.samplers``); each ``gif-*`` ablation runs a named
#: ``GIFConfig`` preset (``experiments.hpo.gif_config.GIF_PRESETS``)
METHODS = ("gif", "tpe", "random", "sg", "gif-no-hia", "gif-proportional", "gif-no-fallback", "gif-paper")
ABLATIONS = ("gif-no-hia", "gif-proportional", "gif-no-fallback")
BUDGET = 200
BAYESMARK_BUDGET = 50
BAYESMARK_METHODS = ("gif", "tpe", "random", "sg")
#: stored per-run incumbent checkpoints and the resolution of the aggregated curves
CHECKPOINT_EVERY = 10
CURVE_EVERY = 5
#: AUC floor inside the log
EPS = 1e-12
#: the Frappe part: ``tune()`` settings (a short per-trial budget: 2 epochs over half of the training batches)
FRAPPE: dict[str, Any] = {
    "config": "frappe_dcnv2.yaml",
    "methods": ["gif", "tpe"],
    "seeds": 3,
    "n_trials": 20,
    "max_epochs": 2,
    "limit_train_batches": 0.5,
    "pruner": "median",
    "overrides": [],
}
TARGETS: dict[str, Any] = {
    "gif_beats_tpe_final_regret_at_dims": [30, 50],  # GIF final regret < TPE's by > s.e., every function
    "gif_competitive_with_tpe_at_dims": [5],  # GIF mean <= TPE mean + s.e. of the difference
    "ablations_worse_than_gif_at_dims_ge": 30,  # ablation mean final regret > GIF's + s.e. on most tasks
    "gif_importance_spearman_min": 0.8,  # mean Spearman(estimated importance, a_j) of GIF studies
}
QUICK: dict[str, Any] = {
    "functions": ["sphere"], "dims": [5], "methods": ["gif", "tpe"], "seeds": 2, "budget": 20,
    "bayesmark": ["DT-diabetes-mse"], "bayesmark_methods": ["gif", "tpe", "random"], "bayesmark_budget": 12,
}
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_LIMITS: Any = None  # a worker's threadpoolctl limit, kept alive for its lifetime


# --- one study (runs in a worker) ---------------------------------------------------------------


def _make_sampler(method: str, n_trials: int, seed: int) -> Any:
    from experiments.hpo import make_sampler

    return make_sampler(method, n_trials=n_trials, seed=seed)


def _study(objective: Callable[[Any], float], method: str, n_trials: int, seed: int) -> tuple[Any, float]:
    import optuna

    study = optuna.create_study(direction="minimize", sampler=_make_sampler(method, n_trials, seed))
    start = time.perf_counter()
    study.optimize(objective, n_trials=n_trials)
    return study, time.perf_counter() - start


def _incumbent(study: Any, n_trials: int) -> np.ndarray:
    """Best-so-far value after each of the first ``n_trials`` trials (failed trials count as +inf)."""
    values = np.full(n_trials, np.inf)
    for t in study.trials[:n_trials]:
        if t.value is not None and t.state.name == "COMPLETE":
            values[t.number] = t.value
    return np.minimum.accumulate(values)


def _schedule_stats(study: Any, true: dict[str, float]) -> dict[str, Any]:
    """Spearman(estimated importance, a_j) and top-k recall from a GIF-family study's schedule."""
    try:
        from experiments.hpo.gif import read_schedule
    except ImportError:
        return {}
    schedule = read_schedule(study)
    if schedule is None:
        return {}
    from scipy.stats import spearmanr

    params = list(true)
    estimated = np.array([float(schedule.importance.get(p, 0.0)) for p in params])
    truth = np.array([true[p] for p in params])
    out: dict[str, Any] = {"schedule": {
        "n_warmup": schedule.n_warmup, "group_sizes": [len(g) for g in schedule.groups],
        "budgets": list(schedule.budgets), "n_fallback": schedule.n_fallback, "evaluator": schedule.evaluator,
        "note": schedule.note,
    }}
    if np.ptp(estimated) == 0:  # no importance assessed (e.g. gif-no-hia): nothing to score
        return out
    k = max(1, len(params) // 5)
    top_true = set(np.argsort(-truth, kind="stable")[:k])
    top_est = set(np.argsort(-estimated, kind="stable")[:k])
    rho = float(spearmanr(estimated, truth).statistic)
    out.update(spearman=round(rho, 4) if np.isfinite(rho) else None, topk_recall=len(top_true & top_est) / k, k=k)
    return out


def _analytic_job(job: tuple[str, int, str, int, int]) -> dict[str, Any]:
    function, dim, method, seed, budget = job
    problem = analytic(function, dim)
    study, seconds = _study(problem.objective, method, budget, seed)
    curve = _incumbent(study, budget)
    log_curve = np.log10(curve + EPS)
    return {
        "function": function, "dim": dim, "method": method, "seed": seed,
        "final": float(curve[-1]), "auc": float(log_curve.mean()), "seconds": round(seconds, 3),
        "checkpoints": [float(f"{v:.5g}") for v in curve[CHECKPOINT_EVERY - 1 :: CHECKPOINT_EVERY]],
        "log_curve": log_curve.tolist(),  # aggregated, then dropped from the stored run
        **_schedule_stats(study, problem.true_importance),
    }


def _bayesmark_job(job: tuple[str, str, int, int]) -> dict[str, Any]:
    task_name, method, seed, budget = job
    (task,) = bayesmark_tasks([task_name])
    study, seconds = _study(task.objective, method, budget, seed)
    curve = _incumbent(study, budget)
    return {"task": task_name, "method": method, "seed": seed, "final": float(curve[-1]),
            "seconds": round(seconds, 3), "curve": curve.tolist()}


def _init_worker() -> None:
    import warnings

    import optuna
    from threadpoolctl import threadpool_limits

    global _LIMITS
    _LIMITS = threadpool_limits(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@contextmanager
def worker_pool(n_procs: int) -> Iterator[Any]:
    """``n_procs`` spawned worker processes with one BLAS thread each (None: run in this process)."""
    import multiprocessing

    if n_procs <= 1:
        _init_worker()
        yield None
        return
    saved = {v: os.environ.get(v) for v in _THREAD_VARS}
    os.environ.update({v: "1" for v in _THREAD_VARS})  # inherited by the spawned workers
    try:
        with multiprocessing.get_context("spawn").Pool(n_procs, initializer=_init_worker) as pool:
            yield pool
    finally:
        for v, value in saved.items():
            if value is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = value


def _map(fn: Callable[[Any], dict[str, Any]], jobs: Sequence[Any], pool: Any, label: str) -> list[dict[str, Any]]:
    """``fn`` over ``jobs`` on ``pool`` (in this process when None), with progress lines."""
    out: list[dict[str, Any]] = []
    start = time.perf_counter()
    step = max(1, len(jobs) // 20)
    results = map(fn, jobs) if pool is None else pool.imap_unordered(fn, jobs)
    for i, r in enumerate(results, 1):
        out.append(r)
        if i % step == 0 or i == len(jobs):
            print(f"[{label}] {i}/{len(jobs)} studies, {time.perf_counter() - start:.0f} s", flush=True)
    return out


# --- aggregation ----------------------------------------------------------------------------------


def _mse(values: Iterable[float]) -> dict[str, float]:
    """Mean and standard error (std with ddof=1 / sqrt(n); 0 for one value)."""
    a = np.asarray(list(values), dtype=float)
    se = float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0
    return {"mean": float(a.mean()), "se": se}


def _ranks(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """Average rank (1 = best, ties averaged) of each method over the tasks of ``{task: {method: value}}``."""
    from scipy.stats import rankdata

    totals: dict[str, list[float]] = {}
    for row in table.values():
        methods = list(row)
        for m, r in zip(methods, rankdata([row[m] for m in methods])):
            totals.setdefault(m, []).append(float(r))
    return {m: round(float(np.mean(r)), 3) for m, r in totals.items()}


def summarise_analytic(runs: list[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """Per-task summaries, mean curves, average ranks (drops each run's full ``log_curve``)."""
    tasks: dict[str, dict[str, Any]] = {}
    keys = sorted({(r["function"], r["dim"]) for r in runs}, key=lambda k: (ANALYTIC.index(k[0]), k[1]))
    for function, dim in keys:
        entry: dict[str, Any] = {"function": function, "dim": dim, "methods": {}}
        for method in methods:
            rows = sorted((r for r in runs if (r["function"], r["dim"], r["method"]) == (function, dim, method)),
                          key=lambda r: r["seed"])
            if not rows:
                continue
            curves = np.array([r["log_curve"] for r in rows])
            idx = np.unique(np.r_[np.arange(CURVE_EVERY - 1, curves.shape[1], CURVE_EVERY), curves.shape[1] - 1])
            stats: dict[str, Any] = {
                "n": len(rows),
                "final": _mse(r["final"] for r in rows),
                "log10_final": _mse(math.log10(r["final"] + EPS) for r in rows),
                "auc": _mse(r["auc"] for r in rows),
                "seconds": round(float(np.mean([r["seconds"] for r in rows])), 3),
                "curve": {
                    "trials": (idx + 1).tolist(),
                    "mean": np.round(curves[:, idx].mean(axis=0), 4).tolist(),
                    "se": np.round(curves[:, idx].std(axis=0, ddof=1) / math.sqrt(len(rows))
                                   if len(rows) > 1 else np.zeros(len(idx)), 4).tolist(),
                },
            }
            rhos = [r["spearman"] for r in rows if r.get("spearman") is not None]
            if rhos:
                stats["spearman"] = _mse(rhos)
            recalls = [r["topk_recall"] for r in rows if "topk_recall" in r]
            if recalls:
                stats["topk_recall"] = float(np.mean(recalls))
            entry["methods"][method] = stats
        tasks[f"{function}-d{dim}"] = entry
    for r in runs:
        r.pop("log_curve", None)
    final = {k: {m: s["final"]["mean"] for m, s in t["methods"].items()} for k, t in tasks.items()}
    auc = {k: {m: s["auc"]["mean"] for m, s in t["methods"].items()} for k, t in tasks.items()}
    by_dim = {str(d): _ranks({k: v for k, v in final.items() if tasks[k]["dim"] == d})
              for d in sorted({t["dim"] for t in tasks.values()})}
    return {"tasks": tasks, "average_rank": {"final": _ranks(final), "auc": _ranks(auc), "final_by_dim": by_dim}}


def analytic_checks(summary: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, computed from the per-task summaries (absent methods are skipped)."""
    tasks = summary["tasks"]
    checks: dict[str, Any] = {}

    def has(t: dict[str, Any], *methods: str) -> bool:
        return all(m in t["methods"] for m in methods)

    def compare(t: dict[str, Any], a: str, b: str) -> str:
        """``a`` against ``b`` on one task's mean final regret (lower is better), beyond 1.96 s.e. (the 95% interval)"""
        fa, fb = t["methods"][a]["final"], t["methods"][b]["final"]
        return verdict(fa["mean"], fb["mean"], spread_of_difference(fa, fb), lower_is_better=True)

    high = {k: t for k, t in tasks.items()
            if t["dim"] in TARGETS["gif_beats_tpe_final_regret_at_dims"] and has(t, "gif", "tpe")}
    if high:
        outcome = {k: compare(t, "gif", "tpe") for k, t in high.items()}
        wins = sum(v == BETTER for v in outcome.values())
        checks["gif_beats_tpe_high_d"] = {"per_task": outcome, "wins": wins,
                                          "ties": sum(v == TIE for v in outcome.values()),
                                          "losses": sum(v == WORSE for v in outcome.values()),
                                          "tasks": len(outcome), "met": wins == len(outcome)}
    low = {k: t for k, t in tasks.items()
           if t["dim"] in TARGETS["gif_competitive_with_tpe_at_dims"] and has(t, "gif", "tpe")}
    if low:
        per: dict[str, Any] = {}
        for k, t in low.items():
            g, p = t["methods"]["gif"]["final"], t["methods"]["tpe"]["final"]
            outcome_k = compare(t, "gif", "tpe")
            per[k] = {"gif_minus_tpe": g["mean"] - p["mean"], "se": spread_of_difference(g, p),
                      "verdict": outcome_k, "ok": outcome_k != WORSE}
        checks["gif_competitive_low_d"] = {"per_task": per, "met": all(v["ok"] for v in per.values())}
    deep = {k: t for k, t in tasks.items()
            if t["dim"] >= TARGETS["ablations_worse_than_gif_at_dims_ge"] and "gif" in t["methods"]}
    ablations: dict[str, Any] = {}
    for ablation in ABLATIONS:
        mine = {k: t for k, t in deep.items() if ablation in t["methods"]}
        if not mine:
            continue
        logs = [math.log10((t["methods"][ablation]["final"]["mean"] + EPS) / (t["methods"]["gif"]["final"]["mean"] + EPS))
                for t in mine.values()]
        outcome = {k: compare(t, ablation, "gif") for k, t in mine.items()}
        overall = majority_verdict(list(outcome.values()))
        ablations[ablation] = {"geo_mean_ratio_vs_gif": float(10 ** np.mean(logs)), "tasks": len(mine),
                               "per_task": outcome, "worse_on": sum(v == WORSE for v in outcome.values()),
                               "better_on": sum(v == BETTER for v in outcome.values()),
                               "verdict": overall, "met": overall == WORSE}
    if ablations:
        checks["ablations_worse_than_gif"] = {"per_ablation": ablations,
                                              "met": all(v["met"] for v in ablations.values())}
    rhos = {k: t["methods"]["gif"]["spearman"]["mean"]
            for k, t in tasks.items() if "spearman" in t["methods"].get("gif", {})}
    if rhos:
        recall = {k: t["methods"]["gif"].get("topk_recall") for k, t in tasks.items() if k in rhos}
        mean = float(np.mean(list(rhos.values())))
        checks["gif_importance_spearman"] = {
            "per_task": rhos, "topk_recall": recall, "mean": mean,
            "tasks_above": sum(v > TARGETS["gif_importance_spearman_min"] for v in rhos.values()),
            "met": mean > TARGETS["gif_importance_spearman_min"],
        }
    return checks


def summarise_bayesmark(runs: list[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """Normalised scores (random search's mean final best = 0, the best loss seen on the task = 100)."""
    tasks: dict[str, Any] = {}
    for name in dict.fromkeys(r["task"] for r in runs):
        rows = [r for r in runs if r["task"] == name]
        opt = min(r["final"] for r in rows)
        random_rows = [r["final"] for r in rows if r["method"] == "random"]
        ref = float(np.mean(random_rows)) if random_rows else float(np.median([r["final"] for r in rows]))
        scale = max(ref - opt, EPS)
        for r in rows:
            r["score"] = round(100.0 * (1.0 - (r["final"] - opt) / scale), 3)
            r["score_auc"] = round(float(np.mean(100.0 * (1.0 - (np.asarray(r["curve"]) - opt) / scale))), 3)
        entry: dict[str, Any] = {"opt": opt, "random_reference": ref,
                                 "reference": "random" if random_rows else "median", "methods": {}}
        for method in methods:
            mine = [r for r in rows if r["method"] == method]
            if mine:
                entry["methods"][method] = {
                    "n": len(mine), "final": _mse(r["final"] for r in mine), "score": _mse(r["score"] for r in mine),
                    "score_auc": _mse(r["score_auc"] for r in mine),
                    "seconds": round(float(np.mean([r["seconds"] for r in mine])), 3),
                }
        tasks[name] = entry
    for r in runs:
        r["curve"] = [float(f"{v:.5g}") for v in r["curve"][CHECKPOINT_EVERY - 1 :: CHECKPOINT_EVERY]]
    overall: dict[str, dict[str, float]] = {}  # per seed: mean score over the tasks; then mean +/- s.e. over seeds
    for m in methods:
        per_seed: dict[int, list[float]] = {}
        for r in runs:
            if r["method"] == m:
                per_seed.setdefault(r["seed"], []).append(r["score"])
        if per_seed:
            overall[m] = _mse(float(np.mean(v)) for v in per_seed.values())
    ranks = _ranks({k: {m: -s["score"]["mean"] for m, s in t["methods"].items()} for k, t in tasks.items()})
    return {"tasks": tasks, "mean_score": overall, "average_rank": ranks, "checks": bayesmark_checks(overall)}


def bayesmark_checks(mean_score: dict[str, dict[str, float]]) -> dict[str, Any]:
    """GIF competitive with TPE: its mean normalised score not below TPE's by more than the s.e."""
    checks: dict[str, Any] = {}
    if "gif" in mean_score and "tpe" in mean_score:
        g, p = mean_score["gif"], mean_score["tpe"]
        margin = spread_of_difference(g, p)
        outcome = verdict(g["mean"], p["mean"], margin)
        checks["gif_competitive_with_tpe"] = {"gif_minus_tpe_mean_score": g["mean"] - p["mean"], "se": margin,
                                              "verdict": outcome, "met": outcome != WORSE}
    return checks


# --- parts ----------------------------------------------------------------------------------------


def run_analytic(functions: Sequence[str], dims: Sequence[int], methods: Sequence[str], seeds: Sequence[int],
                 budget: int, pool: Any = None) -> dict[str, Any]:
    # the costliest (largest d) first, so the last jobs are short and the workers finish together
    jobs = [(f, d, m, s, budget)
            for d in sorted(dims, reverse=True) for f in functions for s in seeds for m in methods]
    start = time.perf_counter()
    runs = _map(_analytic_job, jobs, pool, "analytic")
    seconds = time.perf_counter() - start
    runs.sort(key=lambda r: (ANALYTIC.index(r["function"]), r["dim"], list(methods).index(r["method"]), r["seed"]))
    summary = summarise_analytic(runs, methods)
    return {"functions": list(functions), "dims": list(dims), "methods": list(methods), "seeds": list(seeds),
            "budget": budget, "seconds": round(seconds, 1), "study_seconds": round(sum(r["seconds"] for r in runs), 1),
            **summary, "checks": analytic_checks(summary), "runs": runs}


def run_bayesmark(names: Sequence[str], methods: Sequence[str], seeds: Sequence[int], budget: int,
                  pool: Any = None) -> dict[str, Any]:
    jobs = [(n, m, s, budget) for n in names for s in seeds for m in methods]
    start = time.perf_counter()
    runs = _map(_bayesmark_job, jobs, pool, "bayesmark")
    seconds = time.perf_counter() - start
    runs.sort(key=lambda r: (list(names).index(r["task"]), list(methods).index(r["method"]), r["seed"]))
    return {"tasks_run": list(names), "methods": list(methods), "seeds": list(seeds), "budget": budget,
            "seconds": round(seconds, 1), "study_seconds": round(sum(r["seconds"] for r in runs), 1),
            **summarise_bayesmark(runs, methods), "runs": runs}


def _trial_values(result: Any) -> list[float | None]:
    """The objective values of a tune() result, in trial order (None for failed/pruned trials)."""
    return [None if v is None else round(float(v), 6) for v in result.values]


def run_frappe(seeds: Sequence[int], n_trials: int, workdir: Path, methods: Sequence[str] = ("gif", "tpe"),
               settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """GIF vs TPE tuning the Frappe DCNv2 config through ``experiments.hpo.tune.tune`` (validation AUC).

    One in-``workdir`` SQLite study per (method, seed), no MLflow; ``settings`` overrides
    :data:`FRAPPE`. A failed study is recorded with its error, not raised.
    """
    from recsys.data.raw import data_dir

    root = data_dir()
    if root is None or not (root / "frappe").exists():
        return {"skipped": f"$SALIENCE_DATA_DIR/frappe not found (SALIENCE_DATA_DIR={os.environ.get('SALIENCE_DATA_DIR')!r})"}
    try:
        from experiments.hpo.tune import tune
    except ImportError as err:
        return {"skipped": f"experiments.hpo.tune.tune is not available: {err}"}
    cfg = {**FRAPPE, **(settings or {})}
    config = CONFIGS / cfg["config"]
    runs: list[dict[str, Any]] = []
    start = time.perf_counter()
    for seed in seeds:
        for method in methods:
            folder = workdir / f"frappe-{method}-{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            try:
                result = tune(
                    config, sampler=method, n_trials=n_trials, storage=f"sqlite:///{folder / 'optuna.db'}",
                    study_name=f"frappe-{method}-s{seed}", workers=1, seed=seed, max_epochs=cfg["max_epochs"],
                    limit_train_batches=cfg["limit_train_batches"], overrides=list(cfg["overrides"]),
                    output=folder / "best_config.yaml", tracking=False, pruner=cfg["pruner"],
                )
            except Exception as err:  # noqa: BLE001 - one failed study must not lose the others
                runs.append({"method": method, "seed": seed, "error": f"{type(err).__name__}: {err}"})
                print(f"[frappe] {method} seed {seed} failed: {err}", flush=True)
                continue
            best = None if result.best_value is None else float(result.best_value)
            runs.append({"method": method, "seed": seed, "best_value": best, "values": _trial_values(result),
                         "best_params": dict(result.best_params), "n_complete": result.n_complete,
                         "n_pruned": result.n_pruned, "n_failed": result.n_failed,
                         "seconds": round(time.perf_counter() - t0, 1)})
            print(f"[frappe] {method} seed {seed}: best val AUC {best} ({runs[-1]['seconds']:.0f} s)", flush=True)
    summary = {m: {"n": len(ok), "best_value": _mse(r["best_value"] for r in ok),
                   "seconds": round(float(np.mean([r["seconds"] for r in ok])), 1)}
               for m in methods if (ok := [r for r in runs if r["method"] == m and r.get("best_value") is not None])}
    return {"config": str(config.relative_to(CONFIGS.parents[1])), "methods": list(methods), "seeds": list(seeds),
            "n_trials": n_trials, "settings": {k: v for k, v in cfg.items() if k not in ("methods", "seeds")},
            "seconds": round(time.perf_counter() - start, 1), "summary": summary, "runs": runs}


# --- report -----------------------------------------------------------------------------------------


def plot(analytic_part: dict[str, Any], path: Path) -> None:
    """Mean log10 regret vs trial per method, s.e. bands; one panel per (function, d)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = analytic_part["tasks"]
    functions = [f for f in ANALYTIC if any(t["function"] == f for t in tasks.values())]
    dims = sorted({t["dim"] for t in tasks.values()})
    fig, axes = plt.subplots(len(functions), len(dims), figsize=(3.2 * len(dims), 2.4 * len(functions)),
                             squeeze=False, sharex=True)
    colours = dict(zip(METHODS, plt.get_cmap("tab10").colors))  # type: ignore[attr-defined]  # a ListedColormap
    for i, f in enumerate(functions):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            task = tasks.get(f"{f}-d{d}")
            if task is None:
                ax.axis("off")
                continue
            for method, s in task["methods"].items():
                x, mean, se = (np.asarray(s["curve"][k]) for k in ("trials", "mean", "se"))
                ax.plot(x, mean, label=method, color=colours.get(method), lw=1.6 if method == "gif" else 1.0)
                ax.fill_between(x, mean - se, mean + se, color=colours.get(method), alpha=0.2, lw=0)
            ax.set_title(f"{f}, d={d}", fontsize=9)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("log10 regret", fontsize=8)
            if i == len(functions) - 1:
                ax.set_xlabel("trial", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def _fmt(stat: dict[str, float], digits: int = 3) -> str:
    return f"{stat['mean']:.{digits}g} ± {stat['se']:.2g}"


def _not_worse(verdicts: list[str]) -> str:
    """A "not worse than" target without an equivalence margin: met only where the interval
    shows GIF better; ties are not shown worse, which is not the same as shown not worse."""
    if any(v == "worse" for v in verdicts):
        return "**NOT met**"
    if all(v == "better" for v in verdicts):
        return "**met**"
    return "**tie** (not shown worse; without an equivalence margin a tie does not show it is not worse)"


def _met(flag: bool) -> str:
    return "**met**" if flag else "**NOT met**"


def to_markdown(result: dict[str, Any], png: str = "hpo.png") -> str:
    lines = [
        "# HPO benchmark: GIF vs TPE, random, Sequential Grouping and ablations",
        "",
        f"Command: `{result['command']}`  ",
        f"Date: {result['date']}; hardware: {result['hardware']['cpu']} ({result['hardware']['cores']} cores), "
        f"{result['jobs']} worker processes; quick: {result['quick']}; optuna {result['libraries'].get('optuna')}, "
        f"scikit-learn {result['libraries'].get('sklearn')}.  ",
        f"Total wall time: {result['seconds'] / 60:.1f} min.",
        "",
    ]
    a = result.get("analytic")
    if a:
        lines += [
            f"## Anisotropic analytic functions (budget {a['budget']}, seeds {len(a['seeds'])}, "
            f"{a['seconds'] / 60:.1f} min)",
            "",
            "Final regret and AUC (mean over trials of log10 best-so-far regret; lower is better): mean ± s.e. "
            "over seeds. Spearman: the GIF schedule's estimated importances against the true scales a_j "
            "(all d parameters); recall: top-k (k = max(1, d // 5)).",
            "",
            f"![convergence]({png})",
            "",
            "| task | method | final regret | log10 final | AUC | Spearman | top-k recall | s/study |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for key, t in a["tasks"].items():
            best = min(s["final"]["mean"] for s in t["methods"].values())
            for method, s in t["methods"].items():
                final = _fmt(s["final"])
                if s["final"]["mean"] == best:
                    final = f"**{final}**"
                rho = _fmt(s["spearman"], 2) if "spearman" in s else ""
                recall = f"{s['topk_recall']:.2f}" if "topk_recall" in s else ""
                lines.append(f"| {key} | {method} | {final} | {_fmt(s['log10_final'])} | {_fmt(s['auc'])} | {rho} | "
                             f"{recall} | {s['seconds']:.2f} |")
        r = a["average_rank"]
        lines += ["", "Average rank over tasks (1 = best):", "", "| method | final regret | AUC | "
                  + " | ".join(f"final, d={d}" for d in r["final_by_dim"]) + " |",
                  "|---|---|---|" + "---|" * len(r["final_by_dim"])]
        for method in r["final"]:
            by_dim = " | ".join(str(r["final_by_dim"][d].get(method, "")) for d in r["final_by_dim"])
            lines.append(f"| {method} | {r['final'][method]} | {r['auc'][method]} | {by_dim} |")
        c = a["checks"]
        lines += ["", "### Targets", ""]
        lines.append("A comparison counts only when the 95% interval of the difference of the means excludes zero "
                     "(beyond 1.96 standard errors of the difference); within it, it is a tie.")
        lines.append("")
        if "gif_beats_tpe_high_d" in c:
            v = c["gif_beats_tpe_high_d"]
            not_won = [f"{k} ({o})" for k, o in v["per_task"].items() if o != "better"]
            lines.append(f"- GIF mean final regret below TPE's beyond 1.96 s.e. (the 95% interval) at d = 30, 50: won {v['wins']}, tied "
                         f"{v['ties']}, lost {v['losses']} of {v['tasks']} tasks -> {_met(v['met'])}"
                         + (f" (not won: {', '.join(not_won)})" if not_won else ""))
        if "gif_competitive_low_d" in c:
            v = c["gif_competitive_low_d"]
            cells = ", ".join(f"{k} {p['gif_minus_tpe']:+.3g} (s.e. {p['se']:.2g}, {p['verdict']})"
                              for k, p in v["per_task"].items())
            lines.append(f"- GIF not worse than TPE beyond 1.96 s.e. at d = 5 (GIF - TPE mean final regret): {cells} -> "
                         f"{_not_worse([p['verdict'] for p in v['per_task'].values()])}")
        if "ablations_worse_than_gif" in c:
            v = c["ablations_worse_than_gif"]
            cells = ", ".join(f"{k}: {p['verdict']} (worse beyond 1.96 s.e. (the 95% interval) on {p['worse_on']}/{p['tasks']} tasks, "
                              f"better on {p['better_on']}; geometric mean ratio x{p['geo_mean_ratio_vs_gif']:.3g})"
                              for k, p in v["per_ablation"].items())
            lines.append(f"- every ablation worse than GIF at d >= 30 (mean final regret above GIF's beyond 1.96 s.e. (the 95% interval) "
                         f"on most tasks): {cells} -> {_met(v['met'])}")
        if "gif_importance_spearman" in c:
            v = c["gif_importance_spearman"]
            lines.append(f"- GIF importance Spearman with a_j > 0.8: mean {v['mean']:.3f}, above 0.8 on "
                         f"{v['tasks_above']}/{len(v['per_task'])} tasks -> {_met(v['met'])}")
        else:
            lines.append("- GIF importance Spearman: no GIF schedule was recorded")
        lines.append("")
    b = result.get("bayesmark")
    if b:
        lines += [
            f"## Bayesmark-style sklearn tasks (budget {b['budget']}, seeds {len(b['seeds'])}, "
            f"{b['seconds'] / 60:.1f} min)",
            "",
            "Normalised score: 100 * (1 - (best - opt) / (ref - opt)); opt = the best 3-fold CV loss seen on the "
            "task, "
            "ref = random search's mean final best (random = 0 on average). Mean ± s.e. over seeds; "
            "'AUC' = the score averaged over the trials.",
            "",
            "| task | opt | " + " | ".join(b["methods"]) + " |",
            "|---|---|" + "---|" * len(b["methods"]),
        ]
        for key, t in b["tasks"].items():
            cells = " | ".join(_fmt(t["methods"][m]["score"]) if m in t["methods"] else "" for m in b["methods"])
            lines.append(f"| {key} | {t['opt']:.4g} | {cells} |")
        lines += ["", "| method | mean score over tasks (s.e. over seeds) | mean score AUC | average rank | s/study |",
                  "|---|---|---|---|---|"]
        for m in b["methods"]:
            if m not in b["mean_score"]:
                continue
            auc = np.mean([t["methods"][m]["score_auc"]["mean"] for t in b["tasks"].values() if m in t["methods"]])
            sec = np.mean([t["methods"][m]["seconds"] for t in b["tasks"].values() if m in t["methods"]])
            rank = b["average_rank"].get(m, "")
            lines.append(f"| {m} | {_fmt(b['mean_score'][m])} | {auc:.3g} | {rank} | {sec:.2f} |")
        if "gif_competitive_with_tpe" in b["checks"]:
            v = b["checks"]["gif_competitive_with_tpe"]
            lines += ["", f"- GIF not worse than TPE beyond 1.96 s.e. (mean score difference "
                          f"{v['gif_minus_tpe_mean_score']:+.2f}, s.e. {v['se']:.2f}: {v['verdict']}) -> {_not_worse([v['verdict']])}"]
        lines.append("")
    f = result.get("frappe")
    if f:
        lines += ["## Frappe ranking-model tuning (`salience tune`)", ""]
        if "skipped" in f:
            lines += [f"Skipped: {f['skipped']}", ""]
        else:
            st = f["settings"]
            lines += [f"Config `{f['config']}`, {f['n_trials']} trials per study, {st['max_epochs']} epochs per trial "
                      f"over {st['limit_train_batches']} of the training batches, {st['pruner']} pruner, "
                      f"seeds {f['seeds']}; {f['seconds'] / 60:.1f} min. Best validation AUC, mean ± s.e. "
                      "over seeds:",
                      "", "| method | best val AUC | s/study |", "|---|---|---|"]
            for m, s in f["summary"].items():
                lines.append(f"| {m} | {_fmt(s['best_value'], 5)} | {s['seconds']:.0f} |")
            errors = [r for r in f["runs"] if "error" in r]
            lines += [f"- {r['method']} seed {r['seed']} failed: {r['error']}" for r in errors]
            lines.append("")
    return "\n".join(lines) + "\n"


def recompute_checks(result: dict[str, Any]) -> None:
    """Recompute the target checks of a results dict from its stored summaries (in place)."""
    if result.get("analytic"):
        result["analytic"]["checks"] = analytic_checks(result["analytic"])
    if result.get("bayesmark"):
        result["bayesmark"]["checks"] = bayesmark_checks(result["bayesmark"]["mean_score"])


def _libraries() -> dict[str, str]:
    import optuna
    import scipy
    import sklearn

    return {"optuna": optuna.__version__, "sklearn": sklearn.__version__, "scipy": scipy.__version__,
            "numpy": np.__version__}


def _write(result: dict[str, Any], out: Path, stem: str) -> None:
    from recsys.io import atomic_write_json, atomic_write_text

    atomic_write_json(out / f"{stem}.json", result)
    atomic_write_text(out / f"{stem}.md", to_markdown(result, png=f"{stem}.png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="analytic,bayesmark,frappe",
                        help="comma-separated: analytic, bayesmark, frappe")
    parser.add_argument("--functions", default=",".join(ANALYTIC))
    parser.add_argument("--dims", default=",".join(map(str, DIMS)))
    parser.add_argument("--methods", default=",".join(METHODS), help="analytic methods")
    parser.add_argument("--budget", type=int, default=BUDGET, help="trials per analytic study")
    parser.add_argument("--bayesmark-tasks", default=None, help="comma-separated task names (default: all)")
    parser.add_argument("--bayesmark-methods", default=",".join(BAYESMARK_METHODS))
    parser.add_argument("--bayesmark-budget", type=int, default=BAYESMARK_BUDGET)
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 of every analytic and Bayesmark study")
    parser.add_argument("--frappe", action=argparse.BooleanOptionalAction, default=True, help="run the Frappe part")
    parser.add_argument("--frappe-seeds", type=int, default=FRAPPE["seeds"])
    parser.add_argument("--frappe-trials", type=int, default=FRAPPE["n_trials"])
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--output", "--output-dir", dest="output", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, no Frappe (not a result)")
    parser.add_argument("--render", type=Path, default=None,
                        help="only recompute the verdicts of this results JSON and re-render its .md and .png")
    args = parser.parse_args(argv)

    if args.render is not None:
        import json

        from recsys.io import atomic_write_json

        result: dict[str, Any] = json.loads(args.render.read_text())
        stem = args.render.stem
        recompute_checks(result)
        atomic_write_json(args.render, result)
        atomic_write_text(args.render.with_suffix(".md"), to_markdown(result, png=f"{stem}.png"))
        if result.get("analytic"):
            plot(result["analytic"], args.render.with_suffix(".png"))
        print(f"wrote {args.render} (verdicts) and {args.render.with_suffix('.md')}")
        return 0

    from experiments.benchmarks._common import isolated_workdir, result_header

    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"analytic", "bayesmark", "frappe"}
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}")
    functions = [f for f in args.functions.split(",") if f]
    dims = [int(d) for d in args.dims.split(",") if d]
    methods = [m for m in args.methods.split(",") if m]
    bm_methods = [m for m in args.bayesmark_methods.split(",") if m]
    bm_names = [n for n in args.bayesmark_tasks.split(",") if n] if args.bayesmark_tasks else [
        "-".join(spec) for spec in BAYESMARK]
    seeds, budget, bm_budget = list(range(args.seeds)), args.budget, args.bayesmark_budget
    if args.quick:
        functions, dims, methods = QUICK["functions"], QUICK["dims"], QUICK["methods"]
        bm_names, bm_methods, bm_budget = QUICK["bayesmark"], QUICK["bayesmark_methods"], QUICK["bayesmark_budget"]
        seeds, budget = list(range(QUICK["seeds"])), QUICK["budget"]
        parts.discard("frappe")
    if not args.frappe:
        parts.discard("frappe")
    bad = [f for f in functions if f not in ANALYTIC]
    if bad:
        parser.error(f"--functions: unknown {bad}; available: {ANALYTIC}")
    bayesmark_tasks(bm_names)  # validates the names

    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    stem = "hpo_quick" if args.quick else "hpo"
    result = {**result_header("hpo", argv, args.quick, TARGETS), "libraries": _libraries(),
              "jobs": args.jobs, "seconds": 0.0}
    start = time.perf_counter()
    if parts & {"analytic", "bayesmark"}:
        with worker_pool(args.jobs) as pool:
            if "analytic" in parts:
                result["analytic"] = run_analytic(functions, dims, methods, seeds, budget, pool)
                plot(result["analytic"], out / f"{stem}.png")
            if "bayesmark" in parts:
                result["bayesmark"] = run_bayesmark(bm_names, bm_methods, seeds, bm_budget, pool)
    result["seconds"] = round(time.perf_counter() - start, 1)
    _write(result, out, stem)  # checkpoint before the long Frappe part
    if "frappe" in parts:
        with isolated_workdir("salience-hpo-bench-") as work:
            result["frappe"] = run_frappe(list(range(args.frappe_seeds)), args.frappe_trials, work,
                                          methods=FRAPPE["methods"])
    elif not args.quick:
        result["frappe"] = {"skipped": "not requested (--no-frappe or --parts)"}
    result["seconds"] = round(time.perf_counter() - start, 1)
    _write(result, out, stem)
    print(to_markdown(result, png=f"{stem}.png"))
    written = [out / f"{stem}.{ext}" for ext in ("json", "md", "png") if ext != "png" or "analytic" in parts]
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
