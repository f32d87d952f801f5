"""``salience rank``, ``salience select`` and ``salience quality``.

    salience rank --config experiments/configs/frappe_dcnv2.yaml --method outrank
    salience select --config experiments/configs/frappe_dcnv2.yaml --method leap --k 2,4,6,8
    salience quality --config experiments/configs/criteo_dcnv2.yaml
    salience quality path/to/train.csv --label clicked

Arguments after ``--`` are passed to every ``salience fit`` the command runs
(e.g. ``-- --trainer.max_epochs=5``). Method settings go through ``--option key=value``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from recsys.argv import parse_options, split_passthrough

__all__ = ["quality_main", "rank_main", "select_main"]

log = logging.getLogger(__name__)


def _method_args(parser: argparse.ArgumentParser) -> None:
    from selection.base import method_names

    parser.add_argument("--config", required=True, help="a `salience fit` config (data + backbone + trainer)")
    parser.add_argument("--method", required=True, choices=[m for m in method_names() if m != "random"],
                        help="importance method")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="method setting, e.g. --option penalty=0.01 (repeatable)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def _build(args: argparse.Namespace, overrides: list[str], workdir: Path) -> tuple[Any, Any]:
    from recsys.train.recipe import Recipe
    from selection.base import get_method

    try:
        method = get_method(args.method, **parse_options(args.option))
    except TypeError as e:
        raise SystemExit(f"--option: {e}") from None
    recipe = Recipe(args.config, overrides, workdir=workdir, quiet=True)
    return method, recipe


def _tracker(recipe: Any, run_name: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from recsys.tracking import RunTracker

    return RunTracker(recipe.dataset_name, run_name, tags={"salience.dataset": recipe.dataset_name, "salience.stage": "selection"})


def rank_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="salience rank", description="Rank the features of a training config.")
    _method_args(parser)
    parser.add_argument("--output", default=None, help="report JSON (default: runs/rank/<dataset>-<method>.json)")
    parser.add_argument("--top", type=int, default=None, help="print only the top N rows")
    own, passthrough = split_passthrough(argv)
    args, overrides = parser.parse_known_args(own)
    overrides += passthrough
    method, recipe = _build(args, overrides, Path("runs") / "rank" / "fits")
    tracker = _tracker(recipe, f"rank-{args.method}", not args.no_tracking)
    recipe.parent_run_id = tracker.run_id if tracker is not None else None
    with tracker if tracker is not None else nullcontext():
        report = method.rank(recipe)
        out = Path(args.output or Path("runs") / "rank" / f"{recipe.dataset_name}-{args.method}.json")
        report.save(out)
        if tracker is not None:
            report.to_mlflow(tracker)
    print(report.format(args.top))
    print(f"\nreport: {out}" + (f"   MLflow run: {tracker.run_id}" if tracker is not None else ""))
    return 0


def select_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="salience select",
        description="Rank features, retrain on the top-k for each k, draw the curve against random rankings, "
        "and write the reduced config.",
    )
    _method_args(parser)
    parser.add_argument("--k", default="all", help="kept-feature counts, e.g. 2,4,8 (default: powers of two)")
    parser.add_argument("--report", default=None, help="reuse a saved ranking (JSON from `salience rank`) instead of ranking")
    parser.add_argument("--random-seeds", type=int, default=3, help="random rankings drawn on the same plot")
    parser.add_argument("--tolerance", type=float, default=0.001, help="AUC tolerance of the smallest sufficient k")
    parser.add_argument("--output", default=None, help="output folder (default: runs/select/<dataset>-<method>)")
    own, passthrough = split_passthrough(argv)
    args, overrides = parser.parse_known_args(own)
    overrides += passthrough

    from selection.curve import FitCache, parse_ks, selection_curve
    from selection.report import ImportanceReport

    method, recipe = _build(args, overrides, Path("runs") / "select" / "fits")
    out = Path(args.output or Path("runs") / "select" / f"{recipe.dataset_name}-{args.method}")
    tracker = _tracker(recipe, f"select-{args.method}", not args.no_tracking)
    recipe.parent_run_id = tracker.run_id if tracker is not None else None
    with tracker if tracker is not None else nullcontext():
        report = ImportanceReport.load(args.report) if args.report else method.rank(recipe)
        ks = parse_ks(args.k, len(report))
        report.save(out / "report.json")
        if tracker is not None:
            report.to_mlflow(tracker)
        curve = selection_curve(recipe, report, ks, random_seeds=range(args.random_seeds), tolerance=args.tolerance,
                                cache=FitCache(), tracker=tracker)
        curve.save(out / "curve.json")
        from recsys.io import atomic_savefig

        fig = curve.plot()
        atomic_savefig(fig, out / "curve.png", dpi=120)
        k_star = curve.smallest_k or max(ks)
        import yaml

        from recsys.io import atomic_write_text

        reduced = report.reduced_config(recipe.config, k_star)
        header = (f"# Reduced config: top-{k_star} features by {args.method} "
                  f"(test AUC {next(p.test_auc for p in curve.points if p.k == k_star):.4f} vs "
                  f"{curve.full.test_auc:.4f} with all {curve.full.k}).\n# Written by: salience select --config {args.config} "
                  f"--method {args.method} --k {args.k}\n")
        atomic_write_text(out / "reduced_config.yaml", header + yaml.safe_dump(reduced, sort_keys=False))
        if tracker is not None:
            tracker.log_artifact(out / "reduced_config.yaml", "selection")
    s = curve.summary()
    print(report.format())
    print()
    print(curve.to_markdown())
    print(
        f"\nAUKC {s['aukc']:.4f} vs random {s['random_aukc_mean']:.4f} (+/- {s['random_aukc_std']:.4f}); "
        f"all {curve.full.k} features: test AUC {curve.full.test_auc:.4f}; smallest k within {args.tolerance:g}: "
        f"{curve.smallest_k}"
    )
    print(f"wrote {out}/report.json, curve.json, curve.png, reduced_config.yaml (k={k_star})")
    if tracker is not None:
        print(f"MLflow run: {tracker.run_id} (nested runs: one per retrained model)")
    return 0


def quality_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="salience quality",
        description="Data-quality report of raw data: cardinality, coverage, rare values, constant and near-constant "
        "features, suspected leakage, features below the noise controls.",
    )
    parser.add_argument("data", nargs="*", help="data files (CSV/TSV/Parquet, Criteo TSV, Frappe libFM)")
    parser.add_argument("--config", default=None, help="take the data from a `salience fit` config (training split)")
    parser.add_argument("--format", default=None, choices=["csv", "tsv", "parquet", "criteo", "frappe"],
                        help="file format (default: from the extension)")
    parser.add_argument("--label", default="label", help="label column of CSV/TSV/Parquet files")
    parser.add_argument("--schema", default=None, help="schema file of CSV/TSV/Parquet files (default: every column categorical)")
    parser.add_argument("--output", default=None, help="also write the report as JSON here")
    own, passthrough = split_passthrough(argv)
    args, overrides = parser.parse_known_args(own)
    overrides += passthrough
    if not args.data and not args.config:
        parser.error("give data files or --config")

    from selection.quality import data_quality
    from selection.rawfiles import read_raw_files

    if args.config:
        from recsys.train.recipe import Recipe

        raws = [Recipe(args.config, overrides, quiet=True).raw_split("train")]
    else:
        raws = read_raw_files(args.data, fmt=args.format, label=args.label, schema=args.schema)
    for raw in raws:
        report = data_quality(raw)
        print(report.format())
        if args.output:
            report.save(args.output if len(raws) == 1 else f"{args.output}.{Path(raw.report.source).name}.json")
    return 0
