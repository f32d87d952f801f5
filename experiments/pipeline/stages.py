"""The stages of ``salience pipeline``, each a function of a :class:`StageContext`.

A stage reads the results of the stages before it (``ctx.results``), writes its files into its
own folder, logs them to its MLflow run (``ctx.tracker``) and returns its result, a JSON-able
dict that the runner saves as ``<stage>/result.json`` (the layout is in the README's pipeline
section). Stages never read another stage's folder except through those results and the files
they name.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from experiments.pipeline.config import PipelineConfig
from recsys.io import atomic_path, atomic_savefig, atomic_write_text, write_config

if TYPE_CHECKING:
    from recsys.data.encoders import EncodedData
    from recsys.stats import Interval
    from recsys.tracking import RunTracker
    from recsys.train.recipe import Recipe

__all__ = ["STAGES", "TEST_SCORES", "StageContext", "StageError", "exported_latency", "export_bytes", "paired_auc"]

log = logging.getLogger(__name__)

#: test rows the latency measurement draws its batches from when the data is streamed
LATENCY_SAMPLE_ROWS = 65_536
#: the original and final stages' test labels and probabilities, row for row (the paired comparison's input)
TEST_SCORES = "test_scores.npz"


class StageError(RuntimeError):
    """A stage finished with a result the pipeline cannot go on from (e.g. a failed parity check)."""


@dataclass
class StageContext:
    """What a stage sees.

    Args:
        config: the pipeline config.
        name: the stage's name.
        folder: the stage's output folder.
        results: results of the stages done before, by name.
        tracker: the stage's MLflow run.
        experiment: the MLflow experiment of the pipeline.
    """

    config: PipelineConfig
    name: str
    folder: Path
    results: dict[str, dict[str, Any]]
    tracker: RunTracker
    experiment: str
    _recipes: dict[str, Recipe] = field(default_factory=dict)

    def recipe(self, features: Sequence[str] | None = None, extra: Sequence[str] = (), config: Any = None,
               keep_checkpoints: bool = True) -> Recipe:
        """A recipe of the model config (or ``config``) restricted to ``features``, with the
        pipeline's and ``extra`` overrides; its fits nest under this stage's run."""
        from recsys.train.recipe import Recipe

        overrides = [*self.config.overrides, *extra]
        if features is not None:
            overrides.append(f"--data.features={json.dumps(list(features))}")
        recipe = Recipe(config if config is not None else self.config.model_config_path, overrides,
                        workdir=self.folder / "fits", quiet=True, keep_checkpoints=keep_checkpoints)
        recipe.parent_run_id = self.tracker.run_id
        return recipe

    def search_recipe(self, features: Sequence[str] | None = None) -> Recipe:
        return self.recipe(features, self.config.search_overrides, keep_checkpoints=self.config.keep_search_checkpoints)

    def kept(self, *stages: str) -> list[str] | None:
        """The kept features of the last of ``stages`` that ran (None: all of the model config)."""
        for stage in reversed(stages):
            if stage in self.results and "kept" in self.results[stage]:
                return list(self.results[stage]["kept"])
        return None

    def log_figure(self, figure: Any, name: str) -> Path:
        """Save ``figure`` as ``<folder>/<name>`` and log it to the stage's run."""
        import matplotlib.pyplot as plt

        path = atomic_savefig(figure, self.folder / name, dpi=110)
        plt.close(figure)
        self.tracker.log_artifact(path, self.name)
        return path


# -- 1. data quality ----------------------------------------------------------------------------
def run_quality(ctx: StageContext) -> dict[str, Any]:
    """Profile the training rows; features with a gating flag are dropped from then on."""
    from selection import data_quality

    recipe = ctx.search_recipe()
    raw = recipe.raw_split("train")
    report = data_quality(raw)
    report.save(ctx.folder / "quality.json")
    atomic_write_text(ctx.folder / "quality.md", report.to_markdown())
    ctx.tracker.log_artifact(ctx.folder / "quality.json", ctx.name)
    ctx.tracker.log_artifact(ctx.folder / "quality.md", ctx.name)
    gates = set(ctx.config.quality.drop_flags)
    dropped = {f.feature: f.flags for f in report.features if gates & set(f.flags)}
    kept = [f.feature for f in report.features if f.feature not in dropped]
    if not kept:
        raise StageError(f"quality: every feature has one of the flags {sorted(gates)}; nothing left to model")
    ctx.tracker.log_metrics({"features": len(report.features), "dropped": len(dropped)})
    return {"n_rows": report.rows, "kept": kept, "dropped": dropped}


# -- 2. OutRank screening -------------------------------------------------------------------------
def run_screening(ctx: StageContext) -> dict[str, Any]:
    """OutRank on the features that passed the gates; drop leakage and below-noise ones."""
    from selection import OutRank

    cfg = ctx.config.screening
    kept = ctx.kept("quality")
    recipe = ctx.search_recipe(kept)
    report = OutRank(**{"progress": False, **cfg.options}).rank(recipe)
    report.save(ctx.folder / "outrank.json")
    report.to_mlflow(ctx.tracker)
    dropped = {name: f"excluded: {why}" for name, why in report.excluded.items()}
    if cfg.drop_below_noise:
        below = report.extras.get("below_noise", {}) or {}
        dropped |= {name: f"below the noise control {ref}" for name, ref in below.items()}
    ranked = [name for name in report.ranking if name not in dropped]
    if cfg.max_features is not None:
        dropped |= {name: f"OutRank rank beyond max_features={cfg.max_features}" for name in ranked[cfg.max_features:]}
        ranked = ranked[: cfg.max_features]
    order = kept or ranked
    kept_now = [n for n in order if n in set(ranked)]
    if not kept_now:
        raise StageError("screening: OutRank dropped every feature; set screening.drop_below_noise: false")
    ctx.tracker.log_metrics({"kept": len(kept_now), "dropped": len(dropped)})
    return {"kept": kept_now, "dropped": dropped}


# -- 3. learned selection and the selection curve ----------------------------------------------
def run_selection(ctx: StageContext) -> dict[str, Any]:
    """Rank the screened features (LeAP), retrain on the top k for each k against random
    rankings, and keep the smallest k within the tolerance of the all-feature model's validation
    AUC (the test AUCs are reported, never used to choose)."""
    from selection import get_method, selection_curve
    from selection.curve import parse_ks

    cfg = ctx.config.selection
    recipe = ctx.search_recipe(ctx.kept("quality", "screening"))
    method = _seeded(get_method, cfg.method, cfg.options, ctx.config.seed)
    report = method.rank(recipe)
    report.save(ctx.folder / f"{report.method}.json")
    report.to_mlflow(ctx.tracker)
    n = len(report)
    if isinstance(cfg.ks, str):
        ks = parse_ks(cfg.ks, n)
    else:  # the grid is written before screening says how many features are left: clip it
        ks = sorted({min(int(k), n) for k in cfg.ks if int(k) >= 1}) or [n]
        if max(cfg.ks) > n:
            log.info("selection: %d features left after screening; k grid clipped to %s", n, ks)
    curve = selection_curve(recipe, report, ks, random_seeds=cfg.random_seeds, tolerance=cfg.tolerance,
                            tracker=ctx.tracker)
    curve.save(ctx.folder / "curve.json")
    ctx.log_figure(curve.plot(), "curve.png")
    k = curve.smallest_k or n
    kept = report.top_k(k)
    ctx.tracker.log_metrics({"k": k, "aukc": curve.aukc, "val_aukc": curve.val_aukc, "random_aukc": curve.random_aukc})
    return {"method": report.method, "k": k, "kept": kept,
            "dropped": [n for n in report.ranking if n not in set(kept)], "curve": curve.summary()}


def _seeded(create: Callable[..., Any], name: str, options: dict[str, Any], seed: int) -> Any:
    """``create(name, **options)``, given the pipeline's seed at construction when the class has a
    ``seed`` and the options set none (methods may be frozen dataclasses: never assigned after)."""
    made = create(name, **options)
    if "seed" in options or not hasattr(made, "seed"):
        return made
    return create(name, **{**options, "seed": seed})


# -- 4. dimension search -----------------------------------------------------------------------------
def run_dims(ctx: StageContext) -> dict[str, Any]:
    """Search per-feature (or per-block) dims of the kept features under the budget."""
    from embeddings import budget_of, get_search

    cfg = ctx.config.dims
    recipe = ctx.search_recipe(ctx.kept("quality", "screening", "selection"))
    schema = recipe.schema
    uniform = budget_of(schema, cfg.uniform_dim)
    budget = int(cfg.budget * uniform)
    search = _seeded(get_search, cfg.method, cfg.options, ctx.config.seed)
    plan = search.search(recipe, budget)
    plan.save(ctx.folder / "plan.json")
    plan.to_mlflow(ctx.tracker, schema)
    ctx.log_figure(plan.plot(schema), "dims.png")
    parameters = plan.num_parameters(schema)
    return {"method": cfg.method, "budget": budget, "parameters": parameters, "uniform_parameters": uniform,
            "uniform_dim": cfg.uniform_dim, "dims": dict(plan.dims), "plan": str(ctx.folder / "plan.json")}


# -- 5. hyperparameter search of the reduced model -------------------------------------------------
def reduced_config(config: PipelineConfig, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The model config with the kept features and the searched dims."""
    import yaml

    from embeddings import DimensionPlan

    out = yaml.safe_load(config.model_config_path.read_text(encoding="utf-8")) or {}
    kept = next((results[s]["kept"] for s in ("selection", "screening", "quality") if s in results), None)
    if kept is not None:
        data = out.setdefault("data", {})
        data["features"] = list(kept)
        data.pop("drop_features", None)
    if "dims" in results:
        out = DimensionPlan.load(results["dims"]["plan"]).to_config(out)
    return out


def run_tuning(ctx: StageContext) -> dict[str, Any]:
    """GIF (or another sampler) on the reduced model; the config's own hyperparameters are the
    incumbent: the tuned config is used only when its best trial beats them."""
    import optuna

    from experiments.hpo import trial_phase
    from experiments.hpo.tune import tune

    cfg = ctx.config.tuning
    base_path = _write_reduced(ctx)
    trial_args = [*cfg.overrides, f"--trainer.max_epochs={cfg.max_epochs}"]
    if cfg.limit_train_batches is not None:
        trial_args.append(f"--trainer.limit_train_batches={cfg.limit_train_batches}")
    reference = ctx.recipe(extra=trial_args, config=base_path).fit(run_name="tuning-incumbent", seed=ctx.config.seed)
    fixed = dict(cfg.fixed)
    if "dims" in ctx.results:
        fixed.setdefault("embedding_dim", ctx.results["dims"]["uniform_dim"])  # the plan sets every dim
    storage = f"sqlite:///{(ctx.folder / 'optuna.db').resolve()}"
    study_name = f"{ctx.config.name}-{cfg.sampler}"
    _fail_stale_trials(storage, study_name)
    result = tune(
        base_path,
        sampler=cfg.sampler,
        n_trials=cfg.n_trials,
        storage=storage,
        study_name=study_name,
        seed=ctx.config.seed,
        max_epochs=cfg.max_epochs,
        limit_train_batches=cfg.limit_train_batches,
        overrides=[*ctx.config.overrides, *cfg.overrides],
        output=ctx.folder / "best_config.yaml",
        experiment=ctx.experiment,
        fixed=fixed,
        parent_run_id=ctx.tracker.run_id,
    )
    for path in (base_path, result.best_config_path, Path(result.output_dir) / "trials.csv"):
        if path is not None and Path(path).is_file():
            ctx.tracker.log_artifact(path, ctx.name)
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
    by_number = sorted(trials, key=lambda t: t.number)
    incumbent = reference.metrics.get("best_val_auc")
    tuned_wins = result.best_value is not None and (incumbent is None or result.best_value > incumbent)
    chosen = result.best_config_path if tuned_wins else str(base_path)
    ctx.tracker.log_metrics({"best_val_auc": result.best_value or float("nan"), "incumbent_val_auc": incumbent or float("nan")})
    schedule = None
    if cfg.sampler == "gif":
        from experiments.hpo import read_schedule

        sched = read_schedule(optuna.load_study(study_name=study_name, storage=storage))
        schedule = sched.to_dict() if sched is not None else None
    return {
        "sampler": cfg.sampler,
        "n_trials": cfg.n_trials,
        "values": [t.value if t.value is not None else None for t in by_number],
        "phases": [trial_phase(t)[0] for t in by_number],
        "best_value": result.best_value,
        "best_trial": result.best_trial,
        "best_params": result.best_params,
        "incumbent_val_auc": incumbent,
        "tuned_config": result.best_config_path,
        "best_config": chosen,
        "chosen": "tuned" if tuned_wins else "incumbent",
        "schedule": schedule,
        "trials_csv": str(Path(result.output_dir) / "trials.csv"),
    }


def _fail_stale_trials(storage: str, study_name: str) -> None:
    """Trials left RUNNING by a killed pipeline become FAIL (one pipeline process owns the study)."""
    import optuna
    from optuna.trial import TrialState

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        log.warning("trial %d of %s was left running by a stopped pipeline: marked FAIL", t.number, study_name)


# -- 6./7. the final and the original model -----------------------------------------------------
def _fit_and_measure(ctx: StageContext, config: Any, name: str) -> dict[str, Any]:
    """Train ``config`` with the final settings, export it (fresh-process parity), measure it."""
    cmp = ctx.config.compare
    recipe = ctx.recipe(extra=ctx.config.final_overrides, config=config)
    export_dir = ctx.folder / "export"
    fit = recipe.fit(run_name=f"{ctx.config.name}-{name}", export=True,
                     extra_args=[f"--after_fit.export_dir={export_dir}"])
    parity = (fit.export or {}).get("parity_max_abs_diff")
    if parity is None or not parity <= cmp.parity_tolerance:
        raise StageError(f"{name}: exported model differs from eager by {parity} > {cmp.parity_tolerance}")
    from recsys.data.schema import Schema

    schema = Schema.from_dict(fit.datamodule.schema_dict)  # the trained dims (the plan's, if any)
    dm = fit.datamodule  # test_auc/test_logloss come from the fit's (streamed when streaming) test pass
    test = dm.sample_rows("test", LATENCY_SAMPLE_ROWS) if dm.streaming else dm.prepared.splits["test"]
    latency = exported_latency(export_dir, test, cmp.latency_batches, cmp.latency_repeats)
    summary = {
        "name": name,
        "features": list(schema.names),
        "n_features": len(schema.names),
        "embedding_parameters": int(fit.task.model.embedding_parameters()),
        "test_auc": fit.metrics["test_auc"],
        "test_logloss": fit.metrics["test_logloss"],
        "best_val_auc": fit.metrics.get("best_val_auc"),
        "export_dir": str(export_dir),
        "export_bytes": export_bytes(export_dir),
        "parity_max_abs_diff": parity,
        "latency_ms": latency,
        "run_id": fit.run_id,
        "config": str(config),
        "dims": {f.name: f.embedding_dim for f in schema.sparse},
        "fit_seconds": round(fit.seconds, 1),
    }
    ctx.tracker.log_metrics({"test_auc": summary["test_auc"], "test_logloss": summary["test_logloss"],
                             "embedding_parameters": summary["embedding_parameters"],
                             "export_bytes": summary["export_bytes"],
                             **{f"latency_ms_b{b}": v["median"] for b, v in latency.items()}})
    if fit.test_scores is not None:  # the rows of the paired comparison (compare stage)
        labels, scores = fit.test_scores
        with atomic_path(ctx.folder / TEST_SCORES) as tmp, open(tmp, "wb") as tmp_file:
            np.savez(tmp_file, labels=labels, scores=scores)
        summary["test_scores"] = TEST_SCORES
    if name == "final" and ctx.config.compress.enabled:
        summary["compressed"] = _compress(ctx, fit, test)
    return summary


def _compress(ctx: StageContext, fit: Any, latency_rows: EncodedData) -> dict[str, Any]:
    """The final model's per-table embedding precision, searched on validation rows within
    ``compress.auc_tolerance``, its frontier (uniform precisions and the plan; each model's test
    split read once) and its export (:func:`embeddings.compression.precision.compress_and_export`)."""
    from embeddings.compression.precision import compress_and_export, parse_budget, plot_frontier, uniform_bytes
    from recsys.export import to_plain_kernel
    from recsys.models.base import SparseArch

    cfg, cmp = ctx.config.compress, ctx.config.compare
    dm = fit.datamodule
    model = to_plain_kernel(fit.task.model.eval())
    if not isinstance(model.sparse_arch, SparseArch):
        raise StageError("compress: the final model has no embedding tables to quantize")
    reference = uniform_bytes(dm.preprocessor.fitted_schema)
    budget = parse_budget(cfg.budget, reference) if cfg.budget is not None else None
    val = dm.sample_rows("val", cfg.eval_rows, seed=ctx.config.seed)
    start = time.perf_counter()
    export_dir = ctx.folder / "export_compressed"
    done = compress_and_export(
        model, dm.preprocessor, val, dm.split_data("test"), export_dir, budget=budget, tolerance=cfg.auc_tolerance,
        fp32_test={"auc": fit.metrics["test_auc"], "logloss": fit.metrics["test_logloss"]},
        metadata={"pipeline": ctx.config.name, "auc_tolerance": cfg.auc_tolerance, "budget": cfg.budget})
    result, frontier, parity = done.result, done.frontier, done.parity_max_abs_diff
    assert parity is not None
    if not parity <= cmp.parity_tolerance:
        raise StageError(f"compress: the quantized export differs from the eager quantized model by {parity} > "
                         f"{cmp.parity_tolerance}")
    search = done.point("search")
    out = {
        "tables": result.plan.to_dict(),
        "embedding_bytes": result.bytes,
        "fp32_embedding_bytes": result.fp32_bytes,
        "uniform16_fp32_bytes": reference,
        "auc_tolerance": cfg.auc_tolerance,
        "budget": cfg.budget,
        "budget_met": None if budget is None else result.bytes <= budget,
        "val_rows": len(val),
        "val_auc": result.val_auc,
        "fp32_val_auc": result.fp32_val_auc,
        "test_auc": search["test_auc"],
        "test_logloss": search["test_logloss"],
        "frontier": frontier,
        "trace": result.trace,
        "validation_passes": result.evaluations,
        "export_dir": str(export_dir),
        "export_bytes": export_bytes(export_dir),
        "parity_max_abs_diff": parity,
        "latency_ms": exported_latency(export_dir, latency_rows, cmp.latency_batches, cmp.latency_repeats),
        "seconds": round(time.perf_counter() - start, 1),
    }
    ctx.log_figure(plot_frontier(frontier, result.trace, title=f"{ctx.config.name}: final model, embedding precision"),
                   "frontier.png")
    ctx.tracker.log_metrics({
        "compressed.embedding_bytes": out["embedding_bytes"], "compressed.val_auc": out["val_auc"],
        "compressed.test_auc": out["test_auc"], "compressed.export_bytes": out["export_bytes"],
        **{f"frontier.{p['technique']}.{k}": p[k] for p in frontier for k in ("bytes", "val_auc", "test_auc")},
    })
    return out


def run_final(ctx: StageContext) -> dict[str, Any]:
    return _fit_and_measure(ctx, ctx.results["tuning"]["best_config"] if "tuning" in ctx.results
                            else _write_reduced(ctx), "final")


def run_original(ctx: StageContext) -> dict[str, Any]:
    return _fit_and_measure(ctx, ctx.config.model_config_path, "original")


def _write_reduced(ctx: StageContext) -> Path:
    """``<stage>/reduced_config.yaml``: the model config with the kept features and searched dims."""
    return write_config(ctx.folder / "reduced_config.yaml", reduced_config(ctx.config, ctx.results))


def export_bytes(export_dir: str | Path) -> int:
    """Bytes of every file of an export folder (model, schema with vocabularies, loader)."""
    return sum(f.stat().st_size for f in Path(export_dir).rglob("*") if f.is_file())


def exported_latency(
    export_dir: str | Path, data: EncodedData, batch_sizes: Sequence[int], repeats: int = 30, warmup: int = 3
) -> dict[str, dict[str, float]]:
    """Median and 90th-percentile milliseconds of one call of the exported TorchScript model
    per batch size, on real encoded rows (the model call only: no parsing or encoding)."""
    import torch

    from recsys.data.batching import make_batch
    from recsys.export import kjt_to_lists, load_exported

    module = load_exported(export_dir)
    names = list(module.feature_names)  # not schema.json: its vocabularies parse to ~0.6 GB of strings at 45M rows
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    for size in batch_sizes:
        rows = rng.choice(len(data), size=int(size), replace=len(data) < size)
        batch = make_batch(data, np.sort(rows).astype(np.int64))
        values, lengths = kjt_to_lists(batch.sparse_features, names)
        times = []
        with torch.inference_mode():
            for i in range(warmup + repeats):
                start = time.perf_counter()
                module(values, lengths, batch.dense_features)
                if i >= warmup:
                    times.append((time.perf_counter() - start) * 1000.0)
        out[str(size)] = {"median": float(np.median(times)), "p90": float(np.percentile(times, 90))}
    return out


# -- 8. the comparison ------------------------------------------------------------------------------
def run_compare(ctx: StageContext) -> dict[str, Any]:
    """Original vs final: features, embedding parameters, AUC, log loss, export size, latency."""
    original, final = ctx.results["original"], ctx.results["final"]
    tol = ctx.config.compare.auc_tolerance
    delta = {
        "n_features": final["n_features"] - original["n_features"],
        "embedding_parameters": final["embedding_parameters"] - original["embedding_parameters"],
        "embedding_parameters_ratio": final["embedding_parameters"] / max(original["embedding_parameters"], 1),
        "test_auc": final["test_auc"] - original["test_auc"],
        "test_logloss": final["test_logloss"] - original["test_logloss"],
        "export_bytes_ratio": final["export_bytes"] / max(original["export_bytes"], 1),
        "latency_ratio": {b: final["latency_ms"][b]["median"] / max(original["latency_ms"][b]["median"], 1e-9)
                          for b in original["latency_ms"] if b in final["latency_ms"]},
    }
    if isinstance(final.get("compressed"), dict):
        c = final["compressed"]
        delta["compressed"] = {
            "embedding_bytes_ratio": c["embedding_bytes"] / max(4 * original["embedding_parameters"], 1),
            "test_auc": c["test_auc"] - original["test_auc"],
            "export_bytes_ratio": c["export_bytes"] / max(original["export_bytes"], 1),
        }
    paired = paired_auc(ctx.folder.parent / "final" / TEST_SCORES, ctx.folder.parent / "original" / TEST_SCORES)
    if paired is not None:  # the final model's AUC minus the original's on the same test rows (DeLong)
        within, verdict = paired.no_worse_than(tol), paired.verdict()
    else:  # a test pass on several processes keeps no scores: the point estimates only
        within, verdict = bool(delta["test_auc"] >= -tol), "unpaired"
    ctx.tracker.log_metrics({"delta_test_auc": delta["test_auc"], "parameters_ratio": delta["embedding_parameters_ratio"]})
    return {"original": original, "final": final, "delta": delta, "auc_tolerance": tol, "within_tolerance": within,
            "test_auc_interval": None if paired is None else paired.to_dict(), "verdict": verdict,
            "smaller": bool(delta["n_features"] < 0 and delta["embedding_parameters"] < 0)}


def paired_auc(scores_a: Path, scores_b: Path) -> Interval | None:
    """AUC(A) - AUC(B) with DeLong's 95% interval, from two ``test_scores.npz`` of the same
    test rows (None when either is missing).

    Raises:
        StageError: the files hold different rows (other labels or another count).
    """
    from recsys.stats import delong

    if not (scores_a.is_file() and scores_b.is_file()):
        return None
    with np.load(scores_a) as a, np.load(scores_b) as b:
        if a["labels"].shape != b["labels"].shape or not np.array_equal(a["labels"], b["labels"]):
            raise StageError(f"{scores_a} and {scores_b} score different test rows: no paired comparison")
        return delong(a["labels"], a["scores"], b["scores"])


# -- 9. the report ----------------------------------------------------------------------------------
def run_report(ctx: StageContext) -> dict[str, Any]:
    from experiments.pipeline.html_report import write_report

    path = write_report(ctx.folder.parent)
    ctx.tracker.log_artifact(path, ctx.name)
    return {"report": str(path)}


#: the stages in order: name -> function
STAGES: dict[str, Callable[[StageContext], dict[str, Any]]] = {
    "quality": run_quality,
    "screening": run_screening,
    "selection": run_selection,
    "dims": run_dims,
    "tuning": run_tuning,
    "final": run_final,
    "original": run_original,
    "compare": run_compare,
    "report": run_report,
}
