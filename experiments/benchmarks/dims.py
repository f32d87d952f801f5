"""Embedding-dimension benchmark: uniform dims, MDE, DNIS and iHAS at matched budgets.

    python -m experiments.benchmarks.dims              # everything (needs SALIENCE_DATA_DIR)
    python -m experiments.benchmarks.dims --datasets frappe --seeds 1
    python -m experiments.benchmarks.dims --quick      # smoke run (not a result)
    python -m experiments.benchmarks.dims --render experiments/results/dims.json   # re-derive verdicts and .md

For every (dataset, backbone) run (Frappe, Criteo head-10k and MovieLens-100K with DCNv2,
Criteo head-10k with DLRM too; the committed configs, every fit to its early stopping, see ``RUNS``) and every
seed, one process trains:

* **uniform-4, -8, -16**: every feature at one dim (uniform-16 is the reference);
* **mde**: the Mixed-Dimension-Embeddings frequency-power plan (alpha 0.3) under the budget;
* **dnis**: a DNIS search (warm start + bi-level mask search over 4 frequency blocks) whose
  plan is cut to the budget and then retrained by the same ``salience fit`` path as the
  baselines;
* **ihas**: an iHAS search (straight-through gates, 2 K-means clusters) cut to the budget
  (summed over the cluster models), one model retrained per cluster, the routed model
  evaluated on the test split (as ``salience dims --method ihas`` does).

The budget is half of the uniform-16 model's embedding parameters (``budget_of(schema, 16) // 2``)
for mde, dnis and ihas. Results: mean +/- std over seeds of embedding parameters and test
AUC / log loss, the parameter ratio and AUC delta against uniform-16, the issue's target
verdicts computed from those numbers, and the search cost against one plain training run
(uniform-16, same seed, same process). One JSON (``experiments/results/dims.json``), one
table (``.md``) and one parameters-vs-AUC plot (``dims.png``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from experiments.benchmarks._common import epoch_budget, hardware_text, isolated_workdir, result_header
from recsys.io import atomic_savefig, atomic_write_text
from recsys.stats import TIE, WORSE, Interval

if TYPE_CHECKING:
    from recsys.models.base import RankingModel

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RESULTS = Path(__file__).resolve().parents[1] / "results"
#: the issue's targets
TARGETS = {
    "dnis_auc_tolerance_vs_uniform16": 0.001,  # DNIS test AUC >= uniform-16's - 0.001 ...
    "dnis_parameter_ratio_max": 0.5,  # ... with at most half its embedding parameters
    "ihas_matches_dnis_on_at_least": 1,  # iHAS AUC >= DNIS AUC (same budget) on >= 1 run
}
UNIFORM_DIMS = (4, 8, 16)
REFERENCE_DIM = 16
METHODS = tuple(f"uniform-{d}" for d in UNIFORM_DIMS) + ("mde", "dnis", "ihas")
#: (dataset, arch) -> committed config and overrides: every fit trains to the config's early
#: stopping on validation AUC (the converged uniform models)
RUNS: dict[str, dict[str, Any]] = {
    "frappe/dcnv2": {"dataset": "frappe", "arch": "dcnv2", "config": "frappe_dcnv2.yaml",
                     "overrides": ["--data.batch_size=2048", "--model.optimizer.init_args.lr=0.002"]},
    "criteo/dcnv2": {"dataset": "criteo", "arch": "dcnv2", "config": "criteo_dcnv2.yaml", "overrides": []},
    "movielens/dcnv2": {"dataset": "movielens", "arch": "dcnv2", "config": "movielens_dcnv2.yaml",
                        "overrides": ["--data.batch_size=2048", "--model.optimizer.init_args.lr=0.002"]},
    "criteo/dlrm": {"dataset": "criteo", "arch": "dlrm", "config": "criteo_dlrm.yaml", "overrides": []},
}
#: search settings (small searches; their plans are retrained as every other model is)
DNIS_OPTIONS: dict[str, Any] = {"warm_start_epochs": 1, "search_epochs": 2}
#: iHAS retrains its cluster models for ``retrain_epochs``; a run without an epoch cap retrains
#: them to the routed model's validation plateau instead (see :func:`ihas_retrain_options`)
IHAS_OPTIONS: dict[str, Any] = {"num_clusters": 2, "search_epochs": 2, "retrain_epochs": 3}
QUICK: dict[str, Any] = {"runs": ["criteo/dcnv2"], "epochs": 1, "seeds": 1,
                         "dnis": {"warm_start_epochs": 1, "search_epochs": 1}, "ihas": {"search_epochs": 1, "retrain_epochs": 1}}


def _point(method: str, seed: int, params: int, test_auc: float, test_logloss: float, seconds: float,
           dims: dict[str, int], **extra: Any) -> dict[str, Any]:
    return {"method": method, "seed": seed, "embedding_parameters": int(params), "test_auc": float(test_auc),
            "test_logloss": float(test_logloss), "seconds": round(float(seconds), 2), "dims": dict(dims), **extra}


#: (labels, probabilities) of one model's test pass, row for row
Scores = tuple[np.ndarray, np.ndarray]


def ihas_retrain_options(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """iHAS's retraining as the run's other fits train: with an epoch cap in ``overrides``, that
    many epochs; without one, to the validation plateau under the config's ``trainer.max_epochs``
    and ``model.early_stopping_patience``."""
    if epoch_budget(overrides) or not (config.get("model") or {}).get("early_stopping_patience"):
        return {}
    return {"retrain_epochs": int((config.get("trainer") or {}).get("max_epochs") or 100),
            "retrain_patience": int(config["model"]["early_stopping_patience"])}


def _fit_point(recipe: Any, plan: Any, method: str, seed: int, **extra: Any) -> tuple[dict[str, Any], Scores | None]:
    fit = recipe.fit(extra_args=plan.to_config_overrides(), seed=seed, tracking=False, run_name=f"{method}-s{seed}")
    m = fit.metrics
    point = _point(method, seed, fit.task.model.embedding_parameters(), m.get("test_auc", float("nan")),
                   m.get("test_logloss", float("nan")), fit.seconds, plan.dims,
                   plan_parameters=int(plan.num_parameters(recipe.schema)),
                   epochs_run=fit.epochs_run, **extra)
    return point, fit.test_scores


def _paired(point: dict[str, Any], key: str, scores: Scores | None, reference: Scores | None) -> None:
    """``point[key]``: DeLong's interval of the model's test AUC minus ``reference``'s on the same rows."""
    from recsys.stats import delong

    if scores is not None and reference is not None and np.array_equal(scores[0], reference[0]):
        point[key] = delong(scores[0], scores[1], reference[1]).to_dict()


def run_one(key: str, workdir: Path, seeds: list[int], quick: bool) -> dict[str, Any]:
    """Every method and seed of one (dataset, arch) run."""
    from embeddings import DNIS, IHAS, MDEDims, budget_of, uniform_plan
    from recsys.train.evaluation import evaluate_with_scores
    from recsys.train.recipe import Recipe

    s = RUNS[key]
    overrides = list(s["overrides"]) + [f"--data.cache_dir={workdir / 'cache'}"]
    dnis_opts, ihas_opts = dict(DNIS_OPTIONS), dict(IHAS_OPTIONS)
    if quick:
        overrides += [f"--trainer.max_epochs={QUICK['epochs']}"]
        dnis_opts.update(QUICK["dnis"])
        ihas_opts.update(QUICK["ihas"])
    recipe = Recipe(CONFIGS / s["config"], overrides, workdir=workdir / key.replace("/", "-"), quiet=True)
    if not quick:
        ihas_opts.update(ihas_retrain_options(recipe.config, overrides))
    schema = recipe.schema  # data prepared before any clock starts
    reference = budget_of(schema, REFERENCE_DIM)
    budget = reference // 2
    points: list[dict[str, Any]] = []
    searches: dict[str, list[dict[str, Any]]] = {"dnis": [], "ihas": []}
    start = time.perf_counter()
    mde = MDEDims(alpha=0.3).search(recipe, budget=budget)  # deterministic: one plan for all seeds
    for seed in seeds:
        scores: dict[str, Scores | None] = {}
        for d in UNIFORM_DIMS:
            p, scores[f"uniform-{d}"] = _fit_point(recipe, uniform_plan(schema, d), f"uniform-{d}", seed)
            points.append(p)
            _log(key, points[-1])
        plain_seconds = points[-1]["seconds"]  # uniform-16: the plain training run
        ref = scores[f"uniform-{REFERENCE_DIM}"]
        for d in UNIFORM_DIMS:
            _paired(points[-len(UNIFORM_DIMS) + UNIFORM_DIMS.index(d)], "test_vs_uniform16", scores[f"uniform-{d}"], ref)
        p, scores["mde"] = _fit_point(recipe, mde, "mde", seed)
        _paired(p, "test_vs_uniform16", scores["mde"], ref)
        points.append(p)
        _log(key, points[-1])

        # DNIS: search, cut to the budget, retrain through salience fit
        t = time.perf_counter()
        plan = DNIS(seed=seed, **dnis_opts).search(recipe, budget=budget)
        search_seconds = time.perf_counter() - t
        p, scores["dnis"] = _fit_point(recipe, plan, "dnis", seed, search_seconds=round(search_seconds, 2),
                                       search_vs_plain_run=round(search_seconds / plain_seconds, 2),
                                       total_vs_plain_run=None)
        _paired(p, "test_vs_uniform16", scores["dnis"], ref)
        p["total_vs_plain_run"] = round((search_seconds + p["seconds"]) / plain_seconds, 2)
        points.append(p)
        _log(key, p)
        searches["dnis"].append({"seed": seed, "blocks": plan.block_lists(), "threshold": plan.extras["threshold"],
                                 "sweep": plan.extras["sweep"], "warm_start_val_auc": plan.extras["warm_start_val_auc"],
                                 "searched_val_auc": plan.extras["searched_val_auc"]})

        # iHAS: search, cut to the budget, one model per cluster, routed model on the test split
        search = IHAS(seed=seed, **ihas_opts)
        t = time.perf_counter()
        plan, gate_model = search.search_with_model(recipe, budget=budget)
        search_seconds = time.perf_counter() - t
        t = time.perf_counter()
        routed, retrained = search.retrain_with_record(recipe, plan, gate_model)
        retrain_seconds = time.perf_counter() - t
        test, labels, probs = evaluate_with_scores(routed, recipe.datamodule.prepared.splits["test"])
        params = sum(int(cast("RankingModel", m).embedding_parameters()) for m in routed.models)
        p = _point("ihas", seed, params, test["auc"], test["logloss"], retrain_seconds, plan.dims,
                   plan_parameters=int(plan.num_parameters(schema)), clusters=len(routed.models),
                   epochs_run=retrained["epochs_run"], best_epoch=retrained["best_epoch"],
                   search_seconds=round(search_seconds, 2),
                   search_vs_plain_run=round(search_seconds / plain_seconds, 2),
                   total_vs_plain_run=round((search_seconds + retrain_seconds) / plain_seconds, 2))
        _paired(p, "test_vs_uniform16", (labels, probs), ref)
        _paired(p, "test_vs_dnis", (labels, probs), scores["dnis"])
        points.append(p)
        _log(key, p)
        searches["ihas"].append({"seed": seed, "clusters": {str(c): d for c, d in plan.clusters.items()},
                                 "cluster_share": plan.extras["cluster_share"],
                                 "searched_val_auc": plan.extras["searched_val_auc"]})
    summary = _summarise(points, reference)
    return {
        "dataset": s["dataset"],
        "arch": s["arch"],
        "config": f"experiments/configs/{s['config']}",
        "overrides": s["overrides"] + ([f"--trainer.max_epochs={QUICK['epochs']}"] if quick else []),
        "dnis_options": dnis_opts,
        "ihas_options": ihas_opts,
        "mde_options": {"alpha": 0.3},
        "seeds": seeds,
        "fields": len(schema.sparse),
        "rows": sum(len(recipe.datamodule.prepared.splits[k]) for k in ("train", "val", "test")),
        "reference_parameters": reference,
        "budget": budget,
        "seconds": round(time.perf_counter() - start, 1),
        "summary": summary,
        "verdicts": _verdicts(summary, points),
        "points": points,
        "searches": searches,
    }


def _log(key: str, p: dict[str, Any]) -> None:
    print(f"[dims] {key} seed {p['seed']}: {p['method']}: {p['embedding_parameters']:,} params, test AUC "
          f"{p['test_auc']:.4f}, {p['seconds']} s" + (f" (+ search {p['search_seconds']} s)" if "search_seconds" in p else ""),
          flush=True)


def _summarise(points: list[dict[str, Any]], reference: int) -> dict[str, dict[str, Any]]:
    ref_auc = {p["seed"]: p["test_auc"] for p in points if p["method"] == f"uniform-{REFERENCE_DIM}"}
    out = {}
    for method in METHODS:
        ps = [p for p in points if p["method"] == method]
        if not ps:
            continue
        auc = np.array([p["test_auc"] for p in ps])
        params = np.array([p["embedding_parameters"] for p in ps], dtype=float)
        delta = np.array([p["test_auc"] - ref_auc[p["seed"]] for p in ps])  # paired by seed
        row = {
            "embedding_parameters_mean": float(params.mean()),
            "embedding_parameters_std": _std(params),
            "parameter_ratio": float(params.mean() / reference),
            "test_auc_mean": float(auc.mean()),
            "test_auc_std": _std(auc),
            "auc_delta_vs_uniform16_mean": float(delta.mean()),
            "auc_delta_vs_uniform16_std": _std(delta),
            "test_logloss_mean": float(np.mean([p["test_logloss"] for p in ps])),
            "seeds": len(ps),
            "seconds_mean": float(np.mean([p["seconds"] for p in ps])),
        }
        if "search_seconds" in ps[0]:
            row["search_seconds_mean"] = float(np.mean([p["search_seconds"] for p in ps]))
            row["search_vs_plain_run_mean"] = float(np.mean([p["search_vs_plain_run"] for p in ps]))
            row["total_vs_plain_run_mean"] = float(np.mean([p["total_vs_plain_run"] for p in ps]))
        out[method] = row
    return out


def _std(values: np.ndarray) -> float:
    """The sample standard deviation over seeds (ddof=1, as the other benchmarks; 0 for one seed)."""
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def _difference(points: list[dict[str, Any]], method: str, other: str, key: str) -> Interval | None:
    """``method - other`` in test AUC over seeds, paired by seed: the per-seed DeLong intervals
    on the same test rows (``point[key]``) combined with the seeds' spread (:func:`recsys.stats.over_seeds`);
    for a run that kept no test scores, a paired t over the seeds alone (the row variance they
    share is then missing: the interval is too narrow). None with fewer than two seeds and no scores."""
    from recsys.stats import over_seeds, paired_mean_difference

    mine = {p["seed"]: p for p in points if p["method"] == method}
    theirs = {p["seed"]: p for p in points if p["method"] == other}
    seeds = sorted(set(mine) & set(theirs))
    rows = [mine[s].get(key) for s in seeds]
    if seeds and all(rows):
        return over_seeds([Interval(**r) for r in rows if r])
    if len(seeds) < 2:
        return None
    return paired_mean_difference([mine[s]["test_auc"] for s in seeds], [theirs[s]["test_auc"] for s in seeds])


def _verdicts(summary: dict[str, dict[str, Any]], points: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets under the shared rule (:mod:`recsys.stats`): DNIS within the tolerance of
    uniform-16 only when the 95% interval of the paired difference stays above -tolerance (and
    the parameters are at most half); iHAS matches DNIS unless the interval says worse; better /
    worse only when the interval excludes zero, else a tie."""
    ref, dnis, ihas = summary[f"uniform-{REFERENCE_DIM}"], summary["dnis"], summary["ihas"]
    tol = TARGETS["dnis_auc_tolerance_vs_uniform16"]
    d_vs_u = _difference(points, "dnis", f"uniform-{REFERENCE_DIM}", "test_vs_uniform16")
    i_vs_d = _difference(points, "ihas", "dnis", "test_vs_dnis")
    dnis_ok = (d_vs_u is not None and d_vs_u.no_worse_than(tol)
               and dnis["parameter_ratio"] <= TARGETS["dnis_parameter_ratio_max"])
    ihas_vs_dnis = i_vs_d.verdict() if i_vs_d is not None else TIE
    return {
        "dnis_matches_uniform16_at_half": bool(dnis_ok),
        "dnis_vs_uniform16": d_vs_u.verdict() if d_vs_u is not None else TIE,
        "dnis_vs_uniform16_interval": None if d_vs_u is None else d_vs_u.to_dict(),
        "ihas_matches_dnis": ihas_vs_dnis != WORSE,
        "ihas_vs_dnis": ihas_vs_dnis,
        "ihas_vs_dnis_interval": None if i_vs_d is None else i_vs_d.to_dict(),
        "ihas_minus_dnis_auc": ihas["test_auc_mean"] - dnis["test_auc_mean"],
        "ihas_over_dnis_parameters": ihas["embedding_parameters_mean"] / dnis["embedding_parameters_mean"],
        "uniform16_test_auc": ref["test_auc_mean"],
    }


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(runs)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    styles = {"mde": ("s", "tab:orange"), "dnis": ("D", "tab:green"), "ihas": ("^", "tab:red")}
    for ax, r in zip(axes.ravel(), runs.values()):
        s = r["summary"]
        uni = [m for m in s if m.startswith("uniform-")]
        ax.errorbar([s[m]["embedding_parameters_mean"] for m in uni], [s[m]["test_auc_mean"] for m in uni],
                    yerr=[s[m]["test_auc_std"] for m in uni], fmt="-o", color="0.4", capsize=3, label="uniform 4/8/16")
        for m in uni:
            ax.annotate(m.split("-")[1], (s[m]["embedding_parameters_mean"], s[m]["test_auc_mean"]),
                        textcoords="offset points", xytext=(4, -10), fontsize=7, color="0.4")
        for m, (marker, color) in styles.items():
            if m in s:
                ax.errorbar([s[m]["embedding_parameters_mean"]], [s[m]["test_auc_mean"]], yerr=[s[m]["test_auc_std"]],
                            fmt=marker, color=color, capsize=3, markersize=7, label=m)
        ref = s[f"uniform-{REFERENCE_DIM}"]
        ax.axhline(ref["test_auc_mean"] - TARGETS["dnis_auc_tolerance_vs_uniform16"], color="black", linestyle=":",
                   linewidth=0.8, label="uniform-16 AUC - 0.001")
        ax.axvline(r["budget"], color="black", linestyle="--", linewidth=0.8, label="budget (half of uniform-16)")
        ax.set_xscale("log")
        ax.set_xlabel("embedding parameters")
        ax.set_ylabel("test AUC")
        ax.set_title(f"{r['dataset']} / {r['arch']} ({len(r['seeds'])} seeds)", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def _pm(mean: float, std: float, digits: int = 4) -> str:
    return f"{mean:.{digits}f} +/- {std:.{digits}f}"


def _se(v: dict[str, Any], key: str) -> str:
    """`` (95% interval [a, b] (how), tie)``: the interval and the verdict of a comparison, when the result has them."""
    iv = v.get(key + "_interval")
    if not iv:
        return f" (no interval: one seed, no test scores; {v.get(key, TIE)})"
    how = "DeLong per seed + seed spread" if iv["method"] in ("seeds", "delong") else "paired t over seeds, no row variance"
    return f" (95% interval [{iv['low']:+.4f}, {iv['high']:+.4f}], {how}; {v[key]})"


def _with_verdict(key: str, v: dict[str, Any]) -> str:
    return f"{key} ({v['ihas_vs_dnis']}: the interval includes zero)" if v.get("ihas_vs_dnis") == "tie" else key


def under_budget(run: dict[str, Any]) -> str | None:
    """How a run's fits were cut short of their validation plateau (its ``--trainer.max_epochs``
    override), or None when they train to the config's early stopping."""
    epochs = epoch_budget(run.get("overrides", []))
    return f"under budget: {epochs} epochs per fit, not trained to the validation plateau" if epochs else None


def _epochs_text(points: list[dict[str, Any]]) -> str:
    """The range of epochs the fits ran, per method (``-`` where a result did not record them)."""
    out = []
    for method in METHODS:
        epochs = [p["epochs_run"] for p in points if p["method"] == method and p.get("epochs_run")]
        if epochs:
            out.append(f"{method} {min(epochs)}-{max(epochs)}" if min(epochs) != max(epochs) else f"{method} {epochs[0]}")
    return "epochs run " + (", ".join(out) if out else "not recorded")


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Embedding dims: uniform, MDE, DNIS and iHAS at matched budgets",
        "",
        f"Command: `{result['command']}`  ",
        f"Date: {result['date']}; hardware: {hardware_text(result['hardware'])}; "
        f"torch {result['versions']['torch']}, torchrec {result['versions']['torchrec']}; wall time {result['seconds']} s.",
        "",
        f"Budget of mde, dnis and ihas: half of the uniform-16 model's embedding parameters. Targets: DNIS test AUC "
        f">= uniform-16's - {TARGETS['dnis_auc_tolerance_vs_uniform16']} with <= {TARGETS['dnis_parameter_ratio_max']}x "
        "its embedding parameters; iHAS test AUC >= DNIS's at the same budget on at least one run. Means +/- sample std "
        "(ddof=1) over seeds; the AUC delta is paired by seed. Verdicts (recsys.stats): DNIS is within the tolerance "
        "only when the 95% interval of its paired difference with uniform-16 stays above -tolerance; a comparison is "
        "better or worse only when that interval excludes zero, else a tie; iHAS matches DNIS unless it is worse. "
        "Runs that kept per-row test scores combine DeLong's interval per seed with the seeds' spread; older runs "
        "have a paired t over seeds only. Cost: search seconds / the seconds of one plain training run "
        "(uniform-16, same seed and epochs); for iHAS the retraining of the cluster models replaces the plain retrain.",
        "",
        "![parameters vs AUC](dims.png)",
        "",
    ]
    for r in result["runs"].values():
        s, v = r["summary"], r["verdicts"]
        cut = under_budget(r)
        mark = f" ({cut})" if cut else ""
        lines += [
            f"## {r['dataset']} / {r['arch']} (`{r['config']}`{' with ' + ' '.join(r['overrides']) if r['overrides'] else ''}; "
            f"{r['fields']} sparse "
            f"fields; seeds {r['seeds']}; {r['seconds']} s)",
            "",
            *([f"Measured by `{r['command'].strip()}` on {r['date'][:10]} (kept with `--merge`).", ""]
              if r.get("command") and r["command"] != result["command"] else []),
            *([f"**{cut[0].upper()}{cut[1:]}**: uniform-16 and every other model stop at that budget, so the verdicts "
               "below compare models that were still improving.", ""] if cut else
              [f"Every fit trains to its validation plateau (the config's early stopping): "
               f"{_epochs_text(r['points'])}.", ""]),
            f"Uniform-16: {r['reference_parameters']:,} embedding parameters; budget {r['budget']:,}. "
            f"DNIS {r['dnis_options']}; iHAS {r['ihas_options']}.",
            "",
            "| method | embedding params | x uniform-16 | test AUC | AUC - uniform-16 | test log loss | train s | search s | search / plain run | search+retrain / plain run |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for m, row in s.items():
            search = (f"{row['search_seconds_mean']:.1f} | {row['search_vs_plain_run_mean']:.2f} | "
                      f"{row['total_vs_plain_run_mean']:.2f}") if "search_seconds_mean" in row else "- | - | -"
            lines.append(
                f"| {m} | {row['embedding_parameters_mean']:,.0f} | {row['parameter_ratio']:.3f} | "
                f"{_pm(row['test_auc_mean'], row['test_auc_std'])} | "
                f"{row['auc_delta_vs_uniform16_mean']:+.4f} +/- {row['auc_delta_vs_uniform16_std']:.4f} | "
                f"{row['test_logloss_mean']:.4f} | {row['seconds_mean']:.1f} | {search} |"
            )
        d = s["dnis"]
        lines += [
            "",
            f"- DNIS vs uniform-16: {d['parameter_ratio']:.3f}x the parameters, AUC {d['auc_delta_vs_uniform16_mean']:+.4f}"
            f"{_se(v, 'dnis_vs_uniform16')}: **{'met' if v['dnis_matches_uniform16_at_half'] else 'NOT met'}**{mark}",
            f"- iHAS vs DNIS: AUC {v['ihas_minus_dnis_auc']:+.4f}{_se(v, 'ihas_vs_dnis')} at "
            f"{v['ihas_over_dnis_parameters']:.3f}x DNIS's parameters: "
            f"**{v.get('ihas_vs_dnis') or ('matches' if v['ihas_matches_dnis'] else 'below')}**{mark}",
            "",
        ]
    o = result.get("overall")
    if o:
        lines += [
            "## Targets",
            "",
            f"- DNIS reaches uniform-16's AUC (within 0.001) with at most half its parameters: "
            f"**{'met' if o['dnis_target_met'] else 'NOT met'}** (met on: {', '.join(o['dnis_met_on']) or 'none'}; "
            f"missed on: {', '.join(o['dnis_missed_on']) or 'none'})",
            f"- iHAS at least matches DNIS's AUC at the same budget on at least one run: "
            f"**{'met' if o['ihas_target_met'] else 'NOT met'}** (matches on: "
            f"{', '.join(_with_verdict(k, result['runs'][k]['verdicts']) for k in o['ihas_matches_on']) or 'none'})",
            "",
        ]
        cut_runs = [k for k, r in result["runs"].items() if under_budget(r)]
        if cut_runs:
            lines += [f"Under budget (fits cut short of their validation plateau): {', '.join(cut_runs)}. Converged "
                      "uniform models would move these verdicts; rerun without the `--trainer.max_epochs` overrides of "
                      "`RUNS` to judge at the plateau.", ""]
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def _overall(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    dnis_met = [k for k, r in runs.items() if r["verdicts"]["dnis_matches_uniform16_at_half"]]
    ihas_on = [k for k, r in runs.items() if r["verdicts"]["ihas_matches_dnis"]]
    return {
        "dnis_target_met": len(dnis_met) == len(runs),
        "dnis_met_on": dnis_met,
        "dnis_missed_on": [k for k in runs if k not in dnis_met],
        "ihas_target_met": len(ihas_on) >= TARGETS["ihas_matches_dnis_on_at_least"],
        "ihas_matches_on": ihas_on,
    }


def _render(path: Path) -> int:
    """Recompute the summaries and verdicts of a results JSON from its per-seed points; rewrite it and its markdown."""
    import json

    from recsys.io import atomic_write_json

    result = json.loads(path.read_text())
    for run in result["runs"].values():
        run["summary"] = _summarise(run["points"], run["reference_parameters"])
        run["verdicts"] = _verdicts(run["summary"], run["points"])
    if result["runs"]:
        result["overall"] = _overall(result["runs"])
    atomic_write_json(path, result)
    atomic_write_text(path.with_suffix(".md"), to_markdown(result).replace("(dims.png)", f"({path.stem}.png)"))
    print(f"wrote {path} (verdicts) and {path.with_suffix('.md')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(RUNS),
                        help=f"comma-separated (dataset/arch) runs, of: {', '.join(RUNS)}")
    parser.add_argument("--datasets", default=None, help="comma-separated: keep only the runs on these datasets")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per run (0..N-1)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: Criteo head-10k (DCNv2 and DLRM), 1 seed, 1 epoch (not a result)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the runs of the existing results that this command does not measure")
    parser.add_argument("--render", type=Path, default=None,
                        help="only recompute the verdicts of this results JSON and re-render its markdown")
    args = parser.parse_args(argv)
    if args.render is not None:
        return _render(args.render)

    import warnings

    warnings.filterwarnings("ignore")

    keys = [k.strip() for k in args.parts.split(",") if k.strip()]
    if args.quick and args.parts == parser.get_default("parts"):
        keys = list(QUICK["runs"])
    unknown = [k for k in keys if k not in RUNS]
    if unknown:
        parser.error(f"unknown run(s) {unknown}; available: {', '.join(RUNS)}")
    if args.datasets:
        wanted = {d.strip() for d in args.datasets.split(",") if d.strip()}
        keys = [k for k in keys if RUNS[k]["dataset"] in wanted]
    seeds = list(range(QUICK["seeds"] if args.quick else args.seeds))
    args.output_dir = args.output_dir.resolve()
    start = time.perf_counter()
    result: dict[str, Any] = {**result_header("dims", argv, args.quick, TARGETS), "runs": {}}
    name = "dims_quick" if args.quick else "dims"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    earlier = _earlier_runs(args.output_dir / f"{name}.json", keys) if args.merge else {}
    measured: dict[str, dict[str, Any]] = {}
    md = ""
    with isolated_workdir("salience-dims-") as work:
        for key in keys:
            measured[key] = {**run_one(key, work, seeds, args.quick), "command": result["command"], "date": result["date"]}
            result["runs"] = {**earlier, **measured}  # written after every run: a stopped run keeps what it finished
            result["overall"] = _overall(result["runs"])
            result["seconds"] = round(time.perf_counter() - start, 1)
            md = _write(result, args.output_dir, name)
    print(md)
    return 0


def _earlier_runs(path: Path, measuring: list[str]) -> dict[str, dict[str, Any]]:
    """``--merge``: the runs of an earlier result that this one does not measure, each with the
    command (and date) that measured it."""
    import json

    if not path.is_file():
        return {}
    previous = json.loads(path.read_text())
    return {k: {**r, "command": r.get("command", previous["command"]), "date": r.get("date", previous["date"])}
            for k, r in previous.get("runs", {}).items() if k not in measuring}


def _write(result: dict[str, Any], out: Path, name: str) -> str:
    """The JSON, the markdown table and the plot of ``result``; returns the markdown."""
    from recsys.io import atomic_write_json

    plot(result["runs"], out / f"{name}.png")
    atomic_write_json(out / f"{name}.json", result)
    md = to_markdown(result).replace("(dims.png)", f"({name}.png)")
    atomic_write_text(out / f"{name}.md", md)
    return md


if __name__ == "__main__":
    sys.exit(main())
