"""Feature-selection benchmark: planted truth, selection curves on real data, and cost.

    python -m experiments.benchmarks.selection            # everything (needs SALIENCE_DATA_DIR)
    python -m experiments.benchmarks.selection --parts synthetic
    python -m experiments.benchmarks.selection --quick    # smoke run (not a result)

Three parts, one JSON (``experiments/results/selection.json``) and one table (``.md``):

1. **synthetic** (``recsys.data.synthetic.selection_benchmark_config``: 40 fields, 10
   informative of which 2 are at their default in 99% of rows, 2 multi-hot and 2 dense, plus
   2 redundant copies and noise ID fields; embedding widths by cardinality, 4 to 16): each
   method's precision of its top-10 against the planted informative set and its Spearman
   correlation with the planted strength. A redundant copy in the top-10 stands in for its
   source when the source is not there too (keeping either one keeps the information); the
   Spearman correlation runs over the 38 non-copy fields (informativeness = planted
   strength, 0 for noise).
2. **curves** (Frappe, Criteo head-10k): each method's selection curve (retrain the
   committed DCNv2 config on the top-k fields, test AUC) and AUKC against random rankings
   (three seeds), all on one plot per dataset.
3. **cost** (measured side by side in the same process): LeAP's one training run against a
   plain training run of the same epochs, permutation importance with R=5 (its training run
   plus 5 x F evaluation passes) against LeAP, on the 39 Criteo fields; OutRank rows/s on
   Criteo.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

from experiments.benchmarks._common import BETTER, TIE, WORSE, isolated_workdir, result_header, verdict
from recsys.io import atomic_savefig, atomic_write_text

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RESULTS = Path(__file__).resolve().parents[1] / "results"
METHODS = ("outrank", "permutation", "leap")
#: the issue's targets
TARGETS: dict[str, Any] = {
    "precision_at_10": {"leap": 1.0, "outrank": 1.0, "any": 0.9},
    "leap_vs_plain_run_max": 1.5,
    "permutation_vs_leap_min": 5.0,
}

# -- the synthetic recipe ------------------------------------------------------------------------
#: DCNv2 on the 40-field layout; embedding L2 because the ID tables overfit after one epoch
#: without it (validation AUC 0.80 -> 0.70 by epoch 4)
SYNTHETIC_CONFIG: dict[str, Any] = {
    "seed_everything": 0,
    "trainer": {"max_epochs": 3},
    "model": {
        "backbone": {
            "class_path": "recsys.models.DCNv2",
            "init_args": {"cross_layers": 2, "deep_mlp": [256, 128], "dropout": 0.1, "batch_norm": True, "structure": "parallel"},
        },
        "embedding_kernel": "plain",
        "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.001}},
        "embedding_weight_decay": 0.01,
        "early_stopping_patience": 0,
    },
    "data": {
        "reader": {"class_path": "recsys.data.synthetic.SyntheticReader", "init_args": {}},
        "batch_size": 1024,
        "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 42},
    },
}
#: real-data curve budgets: the committed configs with fewer epochs (many fits per curve)
CURVE_SETTINGS: dict[str, dict[str, Any]] = {
    "frappe": {"config": "frappe_dcnv2.yaml", "ks": [1, 2, 3, 4, 6, 8],
               "overrides": ["--trainer.max_epochs=4", "--data.batch_size=2048", "--model.optimizer.init_args.lr=0.002"]},
    "criteo": {"config": "criteo_dcnv2.yaml", "ks": [2, 4, 8, 16, 24, 32],
               "overrides": ["--trainer.max_epochs=3", "--model.early_stopping_patience=1"]},
}

#: --quick: a few training batches per fit (the numbers of a quick run are meaningless)
QUICK_LIMITS = ["--trainer.limit_train_batches=5"]
#: --quick: the curves of the smallest real dataset only
QUICK_CURVES = ("criteo",)


def _synthetic_recipe(rows: int, epochs: int, workdir: Path) -> Any:
    from recsys.data.synthetic import selection_benchmark_config
    from recsys.train.recipe import Recipe

    cfg = json.loads(json.dumps(SYNTHETIC_CONFIG))
    init = selection_benchmark_config(n_rows=rows, seed=0, embedding_dim="by_cardinality").to_dict()
    cfg["data"]["reader"]["init_args"] = init
    cfg["trainer"]["max_epochs"] = epochs
    cfg["data"]["cache_dir"] = str(workdir / "cache")
    return Recipe(cfg, workdir=workdir, quiet=True)


def _methods(quick: bool, seed: int = 0) -> dict[str, Any]:
    from selection import LeAP, OutRank, PermutationImportance

    return {
        "outrank": OutRank(seed=seed, progress=False),
        "permutation": PermutationImportance(repeats=2 if quick else 5, seed=seed, tracking=False),
        "leap": LeAP(seed=seed, tracking=False),
    }


def _planted_metrics(report: Any, truth: Any) -> dict[str, Any]:
    from scipy.stats import spearmanr

    informative = set(truth.names("informative", "sparse_informative"))
    copies = {f.name: f.source for f in truth.features if f.role.value == "redundant"}
    top = report.top_k(10)
    kept = set(top)
    hits = {n for n in top if n in informative}
    hits |= {copies[n] for n in top if n in copies and copies[n] not in kept}  # a copy stands in for its source
    ranked = {f.feature: f.score for f in report.features}
    names = [f.name for f in truth.features if f.name not in copies and f.name in ranked]
    strength = [truth[n].strength if n in informative else 0.0 for n in names]
    rho = float(spearmanr([ranked[n] for n in names], strength).statistic)
    return {
        "precision_at_10": len(hits) / 10,
        "spearman": rho,
        "top10": top,
        "missed": sorted(informative - hits),
        "excluded": report.excluded,
    }


def run_synthetic(rows: int, epochs: int, workdir: Path, quick: bool) -> dict[str, Any]:
    from recsys.data.synthetic import GroundTruth
    from selection import LeAP, LeAPRegularizer

    recipe = _synthetic_recipe(rows, epochs, workdir / "synthetic")
    truth = GroundTruth.from_raw(recipe.raw_split("train"))
    out: dict[str, Any] = {"rows": rows, "epochs": epochs, "fields": len(recipe.schema), "methods": {}}
    methods = _methods(quick)
    other = LeAPRegularizer.PENALTY_SCALING if methods["leap"].regularizer is LeAPRegularizer.GRADIENT_NORMALIZATION else LeAPRegularizer.GRADIENT_NORMALIZATION
    if not quick:  # (the other regulariser is one more LeAP run, smoke-tested by the default one)
        methods[f"leap[{other.value}]"] = LeAP(seed=0, tracking=False, regularizer=other)
    for name, method in methods.items():
        print(f"[selection] synthetic: {name} ...", flush=True)
        report = method.rank(recipe)
        m = _planted_metrics(report, truth)
        m["cost_seconds"] = round(report.cost_seconds, 2)
        m["scores"] = {f.feature: round(f.score, 6) for f in report.features}
        if "test_auc" in report.extras:
            m["model_test_auc"] = report.extras["test_auc"]
        out["methods"][name] = m
        print(f"[selection] synthetic: {name}: precision@10 {m['precision_at_10']:.2f}, Spearman {m['spearman']:.3f}, "
              f"{m['cost_seconds']} s; missed {m['missed']}", flush=True)
    return out


def run_curves(dataset: str, workdir: Path, quick: bool, seeds: int) -> tuple[dict[str, Any], Any]:
    from recsys.train.recipe import Recipe
    from selection import FitCache, selection_curve

    s = CURVE_SETTINGS[dataset]
    overrides = list(s["overrides"]) + [f"--data.cache_dir={workdir / 'cache'}"]
    ks = s["ks"]
    if quick:
        overrides += ["--trainer.max_epochs=1", *QUICK_LIMITS]
        ks = ks[:2]
    recipe = Recipe(CONFIGS / s["config"], overrides, workdir=workdir / dataset, quiet=True)
    cache = FitCache()
    curves, reports = {}, {}
    start = time.perf_counter()
    for name, method in _methods(quick).items():
        print(f"[selection] {dataset}: ranking with {name} ...", flush=True)
        reports[name] = method.rank(recipe)
        curve = selection_curve(recipe, reports[name], ks, random_seeds=range(seeds), cache=cache)
        curves[name] = curve
        s_ = curve.summary()
        print(f"[selection] {dataset}: {name}: AUKC {s_['aukc']:.4f} vs random {s_['random_aukc_mean']:.4f}; "
              f"smallest k within 0.001: {s_['smallest_k_within_tolerance']}", flush=True)
    out = {
        "ks": ks,
        "overrides": s["overrides"],
        "config": f"experiments/configs/{s['config']}",
        "fits": cache.fits,
        "seconds": round(time.perf_counter() - start, 1),
        "methods": {
            name: {
                **{k: v for k, v in curves[name].summary().items() if k not in ("method", "dataset")},
                "ranking": reports[name].ranking,
                "rank_cost_seconds": round(reports[name].cost_seconds, 2),
                "curve": [{"k": p.k, "test_auc": p.test_auc, "test_logloss": p.test_logloss} for p in curves[name].points],
            }
            for name in curves
        },
        "random": [{"seed": seed, "curve": [{"k": p.k, "test_auc": p.test_auc} for p in pts]}
                   for seed, pts in next(iter(curves.values())).random.items()],
    }
    return out, curves


def plot_curves(dataset: str, curves: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    first = next(iter(curves.values()))
    for i, pts in enumerate(first.random.values()):
        ax.plot([p.k for p in pts], [p.test_auc for p in pts], "-o", color="0.65", markersize=3, linewidth=1,
                label="random rankings" if i == 0 else None)
    for name, curve in curves.items():
        ax.plot([p.k for p in curve.points], [p.test_auc for p in curve.points], "-o", markersize=4,
                label=f"{name} (AUKC {curve.aukc:.4f})")
    ax.axhline(first.full.test_auc, color="black", linestyle="--", linewidth=0.8, label=f"all {first.full.k} fields")
    ax.set_xlabel("fields kept (k)")
    ax.set_ylabel("test AUC")
    ax.set_title(f"Selection curves on {dataset} (DCNv2)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def run_cost(criteo: dict[str, Any] | None, workdir: Path, quick: bool) -> dict[str, Any]:
    """LeAP vs a plain run vs permutation importance (R=5; 2 in a quick run) on the 39 Criteo
    fields, one process."""
    from recsys.train.recipe import Recipe
    from selection import LeAP, OutRank, PermutationImportance
    from selection.outrank import Ranking, rank_raw

    s = CURVE_SETTINGS["criteo"]
    epochs = 1 if quick else 3
    overrides = [f"--trainer.max_epochs={epochs}", "--model.early_stopping_patience=0", f"--data.cache_dir={workdir / 'cache'}"]
    overrides += QUICK_LIMITS if quick else []
    recipe = Recipe(CONFIGS / s["config"], overrides, workdir=workdir / "cost", quiet=True)
    _ = recipe.schema  # data prepared before any clock starts
    rows: dict[str, Any] = {"epochs": epochs, "fields": len(recipe.schema)}
    if not quick:  # warm-up for imports, then the measured runs
        recipe.fit(tracking=False, run_name="warm-up")
    t = time.perf_counter()
    plain = recipe.fit(tracking=False, run_name="plain")
    rows["plain_run_seconds"] = round(time.perf_counter() - t, 2)
    leap = LeAP(seed=0, tracking=False).rank(recipe)
    rows["leap_seconds"] = round(leap.cost_seconds, 2)
    pi_repeats = 2 if quick else 5
    splits: tuple[Literal["val", "train"], ...] = ("val",) if quick else ("val", "train")  # quick: the same code, one split
    for split in splits:
        pi = PermutationImportance(repeats=pi_repeats, seed=0, tracking=False, split=split).rank(recipe)
        rows[f"permutation_{split}"] = {
            "repeats": pi_repeats,
            "rows_evaluated": pi.extras.get("rows"),
            "total_seconds": round(pi.cost_seconds, 2),
            "train_seconds": round(pi.extras.get("train_seconds", float("nan")), 2),
            "eval_seconds": round(pi.extras.get("eval_seconds", float("nan")), 2),
            "vs_leap": round(pi.cost_seconds / leap.cost_seconds, 2),
        }
    rows["leap_vs_plain_run"] = round(leap.cost_seconds / rows["plain_run_seconds"], 2)
    rows["plain_test_auc"] = plain.metrics.get("test_auc")
    # OutRank throughput on the raw Criteo rows (all 10k, 39 fields)
    raw = recipe.datamodule.reader.read()
    throughput = [("relevance only", OutRank(ranking=Ranking.RELEVANCE, controls=False, progress=False))]
    if not quick:  # (the pairwise 3MR pass dominates a quick run's time)
        throughput.append(("default (controls + 3MR pairs)", OutRank(progress=False)))
    for label, method in throughput:
        t = time.perf_counter()
        rank_raw(raw, method)
        dt = time.perf_counter() - t
        rows.setdefault("outrank", {})[label] = {"rows": len(raw), "seconds": round(dt, 2), "rows_per_second": round(len(raw) / dt)}
    return rows


def above_random(m: dict[str, Any]) -> str:
    """``yes`` / ``tie`` / ``NO``: a method's AUKC against the random rankings' mean, a difference
    counting only beyond the random rankings' seed std (the spread of one ranking's AUKC)."""
    spread = float("nan") if m.get("random_aukc_std") is None else float(m["random_aukc_std"])
    return {BETTER: "yes", TIE: "tie", WORSE: "NO"}[verdict(m["aukc"], m["random_aukc_mean"], spread)]


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Feature selection: planted truth, selection curves, cost",
        "",
        f"Command: `{result['command']}`  ",
        f"Date: {result['date']}; hardware: {result['hardware']['cpu']} ({result['hardware']['cores']} cores), no GPU; "
        f"torch {result['versions']['torch']}, torchrec {result['versions']['torchrec']}; wall time {result['seconds']} s.",
        "",
    ]
    syn = result.get("synthetic")
    if syn:
        lines += [
            f"## Planted truth (synthetic, {syn['rows']:,} rows, {syn['fields']} fields, 10 informative; DCNv2, {syn['epochs']} epochs)",
            "",
            "Targets: precision@10 = 1.0 for LeAP and OutRank's combined relevance, >= 0.9 for every method.",
            "",
            "| method | precision@10 | Spearman vs planted strength | cost (s) | missed |",
            "|---|---|---|---|---|",
        ]
        for name, m in syn["methods"].items():
            target = TARGETS["precision_at_10"].get(name, TARGETS["precision_at_10"]["any"])
            ok = "met" if m["precision_at_10"] >= target else "NOT met"
            lines.append(f"| {name} | {m['precision_at_10']:.2f} ({ok}) | {m['spearman']:.3f} | {m['cost_seconds']} | "
                         f"{', '.join(m['missed']) or '-'} |")
        lines.append("")
    for dataset in ("frappe", "criteo"):
        c = result.get("curves", {}).get(dataset)
        if not c:
            continue
        lines += [
            f"## Selection curves: {dataset} (`{c['config']}` with {' '.join(c['overrides'])}; k = {c['ks']}; "
            f"{c['fits']} fits, {c['seconds']} s)",
            "",
            f"![{dataset}](selection_{dataset}.png)",
            "",
            "| method | AUKC | random AUKC (3 seeds) | above random | all-fields test AUC | smallest k within 0.001 | ranking cost (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, m in c["methods"].items():
            lines.append(
                f"| {name} | {m['aukc']:.4f} | {m['random_aukc_mean']:.4f} +/- {m['random_aukc_std']:.4f} | "
                f"{above_random(m)} | {m['full_test_auc']:.4f} | {m['smallest_k_within_tolerance']} | {m['rank_cost_seconds']} |"
            )
        leap, perm = c["methods"].get("leap"), c["methods"].get("permutation")
        if leap and perm:
            lines.append(f"\nLeAP AUKC {'>=' if leap['aukc'] >= perm['aukc'] else '<'} permutation AUKC "
                         f"({leap['aukc']:.4f} vs {perm['aukc']:.4f}; target: LeAP at least as good).")
        lines.append("")
    cost = result.get("cost")
    if cost:
        pv, pt = cost["permutation_val"], cost.get("permutation_train")
        lines += [
            f"## Cost (Criteo head-10k, {cost['fields']} fields, {cost['epochs']} epochs, side by side in one process)",
            "",
            "| measurement | seconds | ratio | target |",
            "|---|---|---|---|",
            f"| plain training run | {cost['plain_run_seconds']} | 1.00 | |",
            f"| LeAP (one training run with the gates) | {cost['leap_seconds']} | {cost['leap_vs_plain_run']} x plain | <= 1.5x: "
            f"{'met' if cost['leap_vs_plain_run'] <= TARGETS['leap_vs_plain_run_max'] else 'NOT met'} |",
            f"| permutation R={pv.get('repeats', 5)} on the validation split ({pv['rows_evaluated']} rows): train {pv['train_seconds']} + eval "
            f"{pv['eval_seconds']} | {pv['total_seconds']} | {pv['vs_leap']} x LeAP | >= 5x: "
            f"{'met' if pv['vs_leap'] >= TARGETS['permutation_vs_leap_min'] else 'NOT met'} |",
        ]
        if pt:
            lines.append(f"| permutation R={pt.get('repeats', 5)} on the training split ({pt['rows_evaluated']} rows): train "
                         f"{pt['train_seconds']} + eval {pt['eval_seconds']} | {pt['total_seconds']} | {pt['vs_leap']} x LeAP | |")
        lines += [
            "",
            "| OutRank on raw Criteo | rows | seconds | rows/s |",
            "|---|---|---|---|",
        ]
        for label, o in cost["outrank"].items():
            lines.append(f"| {label} | {o['rows']:,} | {o['seconds']} | {o['rows_per_second']:,} |")
        lines.append("")
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="synthetic,curves,cost", help="comma-separated: synthetic, curves, cost")
    parser.add_argument("--rows", type=int, default=100_000, help="synthetic rows")
    parser.add_argument("--epochs", type=int, default=3, help="synthetic training epochs")
    parser.add_argument("--random-seeds", type=int, default=3)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="smoke run: small data, 1 epoch (not a result)")
    args = parser.parse_args(argv)

    import warnings

    warnings.filterwarnings("ignore")
    
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    args.output_dir = args.output_dir.resolve()
    rows, epochs, seeds = (6_000, 1, 1) if args.quick else (args.rows, args.epochs, args.random_seeds)
    start = time.perf_counter()
    result: dict[str, Any] = result_header("selection", argv, args.quick, TARGETS)
    name = "selection_quick" if args.quick else "selection"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    with isolated_workdir("salience-selection-") as work:
        if "synthetic" in parts:
            result["synthetic"] = run_synthetic(rows, epochs, work, args.quick)
        if "curves" in parts:
            result["curves"] = {}
            for dataset in QUICK_CURVES if args.quick else CURVE_SETTINGS:
                result["curves"][dataset], curves = run_curves(dataset, work, args.quick, seeds)
                plot_curves(dataset, curves, args.output_dir / f"{name}_{dataset}.png")
        if "cost" in parts:
            result["cost"] = run_cost(result.get("curves", {}).get("criteo"), work, args.quick)
    result["seconds"] = round(time.perf_counter() - start, 1)
    from recsys.io import atomic_write_json

    atomic_write_json(args.output_dir / f"{name}.json", result)
    md = to_markdown(result).replace("(selection_", f"({name}_")
    atomic_write_text(args.output_dir / f"{name}.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
