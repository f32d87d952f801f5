"""``salience demo``: the main job on the embedded synthetic default.

By default it is ``salience pipeline --config experiments/configs/pipeline/synthetic.yaml``:
quality gates -> OutRank screening -> LeAP selection curve -> DNIS dims -> GIF tuning -> final
fit -> export -> parity, next to the original model, with an HTML report (a few minutes on 2
cores; re-running resumes). ``salience demo --tour`` runs the tour of every capability instead:

Stage 1 generates the synthetic CTR data (planted ground truth), trains DCNv2, evaluates the
best checkpoint on the test split, exports it to TorchScript, reloads the export in a fresh
process and checks parity with the eager model, all logged to one MLflow run.

Stage 2 (feature selection) ranks the features with OutRank (model-free) and LeAP (one
training run), scores both rankings against the planted truth, retrains on the top-k LeAP
features for k = 2, 4, 8, 12 against a random ranking, and writes the reduced config; one parent
MLflow run with a nested run per retrained model.

Stage 3 (embedding dimensions) retrains the backbone at half the embedding parameters of the
uniform-16 model with the Mixed-Dimension-Embeddings rule and with a DNIS search (frequency
blocks x dimensions), next to the uniform-16 reference.

Stage 4 (generative) builds semantic IDs for the synthetic item catalogue (RQ-KMeans), trains the
generative model with the multi-target token weighting and the SASRec baseline through
``salience gen fit``, tests both, exports the generative model with its constrained beam search to
TorchScript and checks it against eager decoding.

Stage 5 (hyperparameter search) runs a short ``salience tune`` of the synthetic DCNv2 with the
GIF sampler (warm start, importance, groups, per-group TPE, fallback), tracked in MLflow, and
writes the best config; then GIF and TPE race on an anisotropic analytic function, where the
regret is known exactly.
"""

from __future__ import annotations

import argparse
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parent / "configs" / "synthetic_dcnv2.yaml"
GEN_CONFIG = Path(__file__).resolve().parent / "configs" / "generative" / "synthetic.yaml"


def run_demo(rows: int = 200_000, epochs: int = 3, output: str = "runs/demo", seed: int = 0) -> dict[str, Any]:
    """Run the demo; returns the summary it prints."""
    from recsys.train.cli import SalienceCLI
    from recsys.trainer_attrs import model_checkpoint

    out = Path(output)
    start = time.perf_counter()
    cli = SalienceCLI(
        args=[
            "fit",
            "--config",
            str(CONFIG),
            "--data.reader.init_args.n_rows",
            str(rows),
            "--data.reader.init_args.seed",
            str(seed),
            "--trainer.max_epochs",
            str(epochs),
            "--trainer.default_root_dir",
            str(out),
            "--after_fit.export_dir",
            str(out / "export"),
            "--tracking.run_name",
            "demo-dcnv2-synthetic",
        ]
    )
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if v.numel() == 1}
    tracking = cli.tracking
    best = model_checkpoint(cli.trainer)
    summary = {
        "rows": rows,
        "test_auc": metrics.get("test_auc"),
        "test_logloss": metrics.get("test_logloss"),
        "best_val_auc": float((best.best_model_score if best is not None else None) or float("nan")),
        "embedding_parameters": cli.model.model.embedding_parameters(),
        "export_dir": str(out / "export"),
        "parity_max_abs_diff": (cli.export_report or {}).get("parity_max_abs_diff"),
        "mlflow_run_id": tracking.tracker.run_id if tracking is not None and tracking.tracker is not None else None,
        "seconds": round(time.perf_counter() - start, 1),
    }
    return summary


SELECTION_KS = (2, 4, 8, 12)
#: AUC tolerance of the demo's "smallest sufficient k" (its test split is 5,000 rows)
SELECTION_TOLERANCE = 0.005


def _stage_overrides(rows: int, seed: int) -> list[str]:
    """The synthetic default's data for the later stages, with smaller id vocabularies so that
    50k rows teach the id effects (~10 rows per user)."""
    return [
        f"--data.reader.init_args.n_rows={rows}",
        f"--data.reader.init_args.seed={seed}",
        "--data.reader.init_args.cardinality_scale=0.05",
    ]


def _stage_recipe(rows: int, epochs: int, seed: int, workdir: Path) -> Any:
    """The synthetic default for the later stages (see :func:`_stage_overrides`)."""
    from recsys.train.recipe import Recipe

    overrides = [*_stage_overrides(rows, seed), f"--trainer.max_epochs={epochs}"]
    return Recipe(CONFIG, overrides, workdir=workdir, quiet=True)


def run_selection_stage(rows: int = 50_000, epochs: int = 2, output: str = "runs/demo", seed: int = 0) -> dict[str, Any]:
    """Rank (OutRank, LeAP), check against the planted truth, draw the selection curve."""

    from recsys.data.synthetic import GroundTruth
    from recsys.io import atomic_savefig, write_config
    from recsys.tracking import RunTracker
    from selection import LeAP, OutRank, selection_curve

    out = Path(output) / "selection"
    start = time.perf_counter()
    recipe = _stage_recipe(rows, epochs, seed, out / "fits")
    truth = GroundTruth.from_raw(recipe.raw_split("train"))
    parent = RunTracker(recipe.dataset_name, "demo-selection", tags={"salience.stage": "selection"})
    recipe.parent_run_id = parent.run_id
    with parent:
        reports = {"outrank": OutRank(progress=False).rank(recipe), "leap": LeAP().rank(recipe)}
        for report in reports.values():
            report.to_mlflow(parent)
            report.save(out / f"{report.method}.json")
        curve = selection_curve(
            recipe, reports["leap"], SELECTION_KS, random_seeds=[0], tolerance=SELECTION_TOLERANCE, tracker=parent
        )
        curve.save(out / "curve.json")
        atomic_savefig(curve.plot(), out / "curve.png", dpi=110)
        k_star = curve.smallest_k or max(SELECTION_KS)
        reduced = reports["leap"].reduced_config(recipe.config, k_star)
        write_config(out / "reduced_config.yaml", reduced)
        parent.log_artifact(out / "reduced_config.yaml", "selection")
    signal = set(truth.signal)
    return {
        "rows": rows,
        "rankings": {name: r.top_k(8) for name, r in reports.items()},
        "signal_in_top8": {name: len(signal & set(r.top_k(8))) for name, r in reports.items()},
        "n_signal": len(signal),
        "roles": {f.name: f.role.value for f in truth.features},
        "curve": curve.summary(),
        "curve_points": [(p.k, p.test_auc) for p in curve.points],
        "k_star": k_star,
        "output": str(out),
        "mlflow_run_id": parent.run_id,
        "seconds": round(time.perf_counter() - start, 1),
    }


def run_dims_stage(rows: int = 50_000, epochs: int = 2, output: str = "runs/demo", seed: int = 0) -> dict[str, Any]:
    """Uniform-16 vs MDE vs DNIS at half the uniform-16 embedding parameters."""
    from embeddings import DNIS, MDEDims, budget_of
    from recsys.tracking import RunTracker

    out = Path(output) / "dims"
    start = time.perf_counter()
    recipe = _stage_recipe(rows, epochs, seed, out / "fits")
    schema = recipe.schema
    budget = budget_of(schema, 16) // 2
    parent = RunTracker(recipe.dataset_name, "demo-dims", tags={"salience.stage": "dims"})
    recipe.parent_run_id = parent.run_id
    rows_out: list[dict[str, Any]] = []
    with parent:
        reference = recipe.fit(run_name="dims-uniform-16")
        rows_out.append({"model": "uniform-16", "parameters": reference.task.model.embedding_parameters(),
                         "test_auc": reference.metrics["test_auc"]})
        for search in (MDEDims(), DNIS(warm_start_epochs=1, search_epochs=2, seed=seed)):
            plan = search.search(recipe, budget)
            plan.save(out / f"{search.name}_plan.json")
            plan.to_mlflow(parent, schema)
            fit = recipe.fit(extra_args=plan.to_config_overrides(), run_name=f"dims-{search.name}")
            rows_out.append({"model": search.name, "parameters": fit.task.model.embedding_parameters(),
                             "test_auc": fit.metrics["test_auc"]})
    return {"rows": rows, "budget": budget, "models": rows_out, "output": str(out), "mlflow_run_id": parent.run_id,
            "seconds": round(time.perf_counter() - start, 1)}


def run_generative_stage(epochs: int = 3, output: str = "runs/demo", seed: int = 0) -> dict[str, Any]:
    """Semantic IDs -> generative model (multi-target weighting) vs SASRec -> export -> parity."""
    from generative.cli import GenerativeCLI

    out = Path(output) / "generative"
    start = time.perf_counter()
    models = []
    export: dict[str, Any] = {}
    sasrec = ["--model.arch={class_path: sasrec, init_args: {dim: 64, layers: 2, heads: 2}}"]
    for arch, extra in (("sid", ["--model.weighting=multi"]), ("sasrec", sasrec)):
        cli = GenerativeCLI(
            args=[
                "fit",
                f"--config={GEN_CONFIG}",
                f"--seed_everything={seed}",
                *extra,
                f"--trainer.max_epochs={epochs}",
                "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false",
                f"--trainer.default_root_dir={out / arch}",
                f"--tracking.run_name=demo-gen-{arch}",
                "--after_fit.verbose=false",
            ]
        )
        metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("test_")}
        models.append({"model": "sid-multi" if arch == "sid" else arch, **metrics})
        if arch == "sid":
            export = dict(cli.export_report or {})
            book = cli.datamodule.codebook
            codebook = {"level_sizes": list(book.level_sizes), "collision_rate_before": book.stats.get("collision_rate_before")}
    return {"models": models, "export": export, "codebook": codebook, "output": str(out),
            "seconds": round(time.perf_counter() - start, 1)}


#: the analytic race of the tuning stage: (function, dimensions)
TUNING_RACE = ("rastrigin", 30)


def run_tuning_stage(
    rows: int = 10_000,
    n_trials: int = 10,
    output: str = "runs/demo",
    seed: int = 0,
    limit_train_batches: int = 8,
    race_budget: int = 200,
) -> dict[str, Any]:
    """GIF tuning of the synthetic DCNv2 (1 epoch per trial), then GIF vs TPE on an analytic function.

    The study lives in ``<output>/tuning/optuna.db`` and is started afresh on every run (a demo
    re-run trains again rather than resuming); ``race_budget=0`` skips the analytic race.
    """
    import optuna
    from optuna.trial import TrialState

    from experiments.hpo import read_schedule, trial_phase
    from experiments.hpo.tune import tune

    out = Path(output) / "tuning"
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    storage = f"sqlite:///{out.resolve() / 'optuna.db'}"
    name = f"demo-synthetic_dcnv2-gif-s{seed}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        optuna.delete_study(study_name=name, storage=storage)
    except KeyError:
        pass
    result = tune(
        CONFIG,
        sampler="gif",
        n_trials=n_trials,
        storage=storage,
        study_name=name,
        seed=seed,
        max_epochs=1,
        limit_train_batches=limit_train_batches,
        overrides=_stage_overrides(rows, seed),
        output=out / "best_config.yaml",
        tracking=True,
    )
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    schedule = read_schedule(study)
    phases: dict[str, int] = {}
    for t in trials:
        phase = trial_phase(t)[0] or "?"
        phases[phase] = phases.get(phase, 0) + 1
    summary: dict[str, Any] = {
        "rows": rows,
        "n_trials": n_trials,
        "study_name": name,
        "storage": storage,
        "best_val_auc": result.best_value,
        "best_trial": result.best_trial,
        "best_params": result.best_params,
        "states": {k: n for k, n in ((s.name.lower(), sum(t.state == s for t in trials)) for s in TrialState) if n},
        "phases": phases,
        "schedule": schedule.to_dict() if schedule is not None else None,
        "best_config": result.best_config_path,
        "trials_dir": result.output_dir,
        "mlflow_run_id": result.parent_run_id,
        "tune_seconds": round(time.perf_counter() - start, 1),
    }
    summary["race"] = _analytic_race(race_budget, seed) if race_budget > 0 else None
    summary["seconds"] = round(time.perf_counter() - start, 1)
    return summary


def _analytic_race(budget: int, seed: int) -> dict[str, Any]:
    """Best regret of GIF, TPE and random search after ``budget`` trials on :data:`TUNING_RACE`."""
    import optuna

    from experiments.hpo import make_sampler
    from experiments.hpo.problems import analytic

    problem = analytic(*TUNING_RACE)
    regret: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for sampler in ("gif", "tpe", "random"):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # multivariate TPE
            study = optuna.create_study(sampler=make_sampler(sampler, n_trials=budget, seed=seed))
            study.optimize(problem.objective, n_trials=budget)
        regret[sampler] = float(study.best_value - problem.optimum)
        seconds[sampler] = round(time.perf_counter() - start, 2)
    return {"problem": f"{problem.name}-{problem.dim}d", "budget": budget, "regret": regret, "seconds": seconds}


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _tuning_lines(s: dict[str, Any]) -> list[str]:
    states = ", ".join(f"{n} {k}" for k, n in s["states"].items())
    phases = ", ".join(f"{n} {k}" for k, n in s["phases"].items())
    lines = ["", f"Hyperparameter search: salience tune --sampler gif on {s['rows']:,} rows "
             f"({s['n_trials']} trials, 1 epoch each)"]
    if s["best_val_auc"] is not None:
        lines.append(f"  best val AUC       {s['best_val_auc']:.4f} (trial {s['best_trial']})")
        params = ", ".join(f"{k}={_short(v)}" for k, v in s["best_params"].items())
        lines += textwrap.wrap(params, 110, initial_indent="  best params        ", subsequent_indent=" " * 21)
    else:
        lines.append("  no trial completed")
    lines.append(f"  trials             {states} (phases: {phases})")
    sched = s["schedule"]
    if sched is not None:
        lines.append(f"  GIF schedule       {sched['n_warmup']} warm-start, importance by {sched['evaluator']}"
                     + (f" ({sched['note']})" if sched["note"] else ""))
        for g, (names, budget) in enumerate(zip(sched["groups"], sched["budgets"])):
            imp = sum(sched["importance"].get(n, 0.0) for n in names)
            lines.append(f"    group {g}  {budget:>3} trial(s)  {', '.join(names)} (importance {imp:.2f})")
        lines.append(f"    fallback {sched['n_fallback']:>3} trial(s)  full space")
    else:
        lines.append("  GIF schedule       none (the budget ended within the warm start)")
    lines += [f"  best config        {s['best_config']}  (retrain: salience fit --config {s['best_config']})",
              f"  trials table       {s['trials_dir']}/trials.csv (study {s['study_name']} in {s['storage']})",
              f"  MLflow run         {s['mlflow_run_id']} (nested runs: one per trial)"]
    race = s["race"]
    if race is not None:
        r = race["regret"]
        lines += [f"  GIF vs TPE on {race['problem']} (anisotropic; {race['budget']} trials, 1 seed)",
                  f"    regret (0 = optimum): GIF {r['gif']:.3g}   TPE {r['tpe']:.3g}   random {r['random']:.3g}"]
    lines.append(f"  wall time          {s['seconds']} s (search {s['tune_seconds']} s)")
    return lines


def _generative_lines(s: dict[str, Any]) -> list[str]:
    cb = s["codebook"]
    lines = ["", f"Generative recommendation on synthetic sequences (semantic IDs {cb['level_sizes']}, "
             f"collision rate before disambiguation {cb['collision_rate_before']:.3f})"]
    for m in s["models"]:
        lines.append(f"  {m['model']:<10} test Recall@10 {m['test_recall_10']:.4f}  NDCG@10 {m['test_ndcg_10']:.4f}  "
                     f"tail Recall@10 {m['test_recall_10_tail']:.4f}")
    e = s["export"]
    if e:
        lines.append(f"  export     {e.get('output_dir')} (items identical to eager: {e.get('items_equal')}, "
                     f"max |score diff| {e.get('max_abs_score_diff', float('nan')):.2e})")
    lines.append(f"  wall time  {s['seconds']} s")
    return lines


def _dims_lines(s: dict[str, Any]) -> list[str]:
    ref = s["models"][0]
    lines = ["", f"Embedding dimensions on {s['rows']:,} rows (budget: {s['budget']:,} parameters = half of uniform-16)"]
    for m in s["models"]:
        lines.append(f"  {m['model']:<12} {m['parameters']:>10,} parameters ({m['parameters'] / ref['parameters']:.2f}x)"
                     f"   test AUC {m['test_auc']:.4f} ({m['test_auc'] - ref['test_auc']:+.4f})")
    lines += [f"  plans              {s['output']}/*_plan.json",
              f"  MLflow run         {s['mlflow_run_id']}", f"  wall time          {s['seconds']} s"]
    return lines


def _selection_lines(s: dict[str, Any]) -> list[str]:
    short = {"informative": "inf", "sparse_informative": "rare", "interaction": "pair", "redundant": "copy",
             "near_redundant": "near-copy", "noise": "NOISE"}
    lines = ["", f"Feature selection on {s['rows']:,} rows (planted roles in brackets)"]
    for name, top in s["rankings"].items():
        lines.append(f"  {name:<8} top-8: " + ", ".join(f"{f}[{short.get(s['roles'][f], '?')}]" for f in top))
        lines.append(f"           {s['signal_in_top8'][name]} of 8 carry planted signal ({s['n_signal']} signal features in all)")
    c = s["curve"]
    lines += [
        "  selection curve (LeAP ranking, DCNv2 retrained per k): "
        + ", ".join(f"k={k}: {auc:.4f}" for k, auc in s["curve_points"])
        + f"; all {c['n_features']} features: {c['full_test_auc']:.4f}",
        f"  AUKC {c['aukc']:.4f} vs random ranking {c['random_aukc_mean']:.4f}; smallest k within "
        f"{c['tolerance']:g} AUC: {c['smallest_k_within_tolerance']}",
        f"  reduced config     {s['output']}/reduced_config.yaml (top-{s['k_star']})",
        f"  MLflow run         {s['mlflow_run_id']} (nested runs: one per retrained model)",
        f"  wall time          {s['seconds']} s",
    ]
    return lines


PIPELINE_CONFIG = Path(__file__).resolve().parent / "configs" / "pipeline" / "synthetic.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="salience demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tour", action="store_true",
                        help="instead of the pipeline, the tour of every capability (stages 1-5 above)")
    parser.add_argument("--output", default=None, help="output folder (pipeline default: runs/pipeline/synthetic; tour: runs/demo)")
    parser.add_argument("--restart", action="store_true", help="pipeline: start over instead of resuming")
    parser.add_argument("--rows", type=int, default=200_000, help="tour: synthetic rows to generate")
    parser.add_argument("--epochs", type=int, default=3, help="tour: epochs of stage 1")
    parser.add_argument("--seed", type=int, default=0, help="tour: seed of the synthetic data")
    parser.add_argument("--selection-rows", type=int, default=50_000, help="tour: rows of the feature-selection stage (0 skips it)")
    parser.add_argument("--dims-rows", type=int, default=50_000, help="tour: rows of the embedding-dimension stage (0 skips it)")
    parser.add_argument("--gen-epochs", type=int, default=3, help="tour: epochs of the generative stage (0 skips it)")
    parser.add_argument("--tune-trials", type=int, default=10, help="tour: trials of the GIF tuning stage (0 skips it)")
    args = parser.parse_args(argv)
    if not args.tour:
        from experiments.pipeline.cli import pipeline_main

        extra = (["--output", args.output] if args.output else []) + (["--restart"] if args.restart else [])
        return pipeline_main(["--config", str(PIPELINE_CONFIG), *extra])
    args.output = args.output or "runs/demo"
    s = run_demo(args.rows, args.epochs, args.output, args.seed)
    selection = run_selection_stage(args.selection_rows, 2, args.output, args.seed) if args.selection_rows > 0 else None
    dims = run_dims_stage(args.dims_rows, 2, args.output, args.seed) if args.dims_rows > 0 else None
    gen = run_generative_stage(args.gen_epochs, args.output, args.seed) if args.gen_epochs > 0 else None
    tuning = None
    if args.tune_trials > 0:
        tuning = run_tuning_stage(n_trials=args.tune_trials, output=args.output, seed=args.seed)
    from recsys.tracking import tracking_uri

    parity = s["parity_max_abs_diff"]
    lines = [
        "",
        "Salience demo: synthetic CTR -> DCNv2 -> test -> TorchScript export -> parity",
        f"  rows                 {s['rows']:,}",
        f"  best validation AUC  {s['best_val_auc']:.4f}",
        f"  test AUC / log loss  {s['test_auc']:.4f} / {s['test_logloss']:.4f}",
        f"  embedding parameters {s['embedding_parameters']:,}",
        f"  export               {s['export_dir']}",
        f"  parity (fresh proc.) max |eager - exported| = {parity:.2e}" if parity is not None else "  parity               not checked",
        f"  MLflow run           {s['mlflow_run_id']}  ({tracking_uri()})",
        f"  wall time            {s['seconds']} s",
    ]
    if selection is not None:
        lines += _selection_lines(selection)
    if dims is not None:
        lines += _dims_lines(dims)
    if gen is not None:
        lines += _generative_lines(gen)
    if tuning is not None:
        lines += _tuning_lines(tuning)
    lines += [
        "",
        "Open the MLflow UI:   make ui    (serves http://127.0.0.1:5000)",
    ]
    print("\n".join(lines))
    if parity is not None and parity > 1e-6:
        print(f"ERROR: exported model differs from eager by {parity:.2e} > 1e-6")
        return 1
    return 0
