"""``salience rank``, ``salience select`` and ``salience quality``.

    salience rank --config experiments/configs/frappe_dcnv2.yaml --method outrank
    salience select --config experiments/configs/frappe_dcnv2.yaml --method leap --k 2,4,6,8
    salience quality --config experiments/configs/criteo_dcnv2.yaml
    salience quality path/to/train.csv --label clicked
    salience quality train.txt --sketch-threshold 1000000 --sample 0.1
    salience rank --method outrank train.txt

Raw files (``quality FILE...``, ``rank --method outrank FILE...``) are read in chunks of
``--chunk-rows`` rows with bounded memory (:mod:`selection.model_free.data_quality_stream`,
:mod:`selection.model_free.outrank_stream`); ``--in-memory`` reads them whole as before. A ``--config``
reads its training split in memory.

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


def _selectors() -> list[str]:
    """Registered methods that read signal (every one but the random baseline)."""
    from selection.base import ImportanceMethod

    return ImportanceMethod.selector_names()


def _method_args(parser: argparse.ArgumentParser, config_required: bool = True, allow_all: bool = False) -> None:
    parser.add_argument("--config", required=config_required, help="a `salience fit` config (data + backbone + trainer)")
    if allow_all:
        parser.add_argument("--method", required=True, metavar="METHOD",
                            help=f"importance method, of {_selectors()}; 'all' (every one) or a comma-separated list "
                            "compares them side by side")
    else:
        parser.add_argument("--method", required=True, choices=_selectors(), help="importance method")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="method setting, e.g. --option penalty=0.01 (repeatable)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def _file_args(parser: argparse.ArgumentParser) -> None:
    """Options of raw data files read in chunks."""
    parser.add_argument("--format", default=None, choices=["csv", "tsv", "parquet", "criteo", "frappe"],
                        help="file format (default: from the extension)")
    parser.add_argument("--label", default="label", help="label column of CSV/TSV/Parquet files")
    parser.add_argument("--schema", default=None, help="schema file of CSV/TSV/Parquet files (default: every column categorical)")
    parser.add_argument("--chunk-rows", type=int, default=None, metavar="N",
                        help="rows read at a time from raw files (memory per chunk; default: sized by bytes, "
                             "about 128 MB of parsed rows and at most 262144 rows, whatever the width)")
    parser.add_argument("--sample", type=float, default=None, metavar="FRACTION",
                        help="keep each row with this probability (seeded; default: every row)")
    parser.add_argument("--sample-rows", type=int, default=None, metavar="N",
                        help="read at most N rows (after --sample)")
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of --sample")
    parser.add_argument("--edge-sample", type=int, default=1_000_000, metavar="N",
                        help="rows of the seeded sample OutRank's dense bin edges come from (exact below this)")
    parser.add_argument("--replay-bytes", type=int, default=None, metavar="N",
                        help="the most bytes of the parsed copy the second pass reads instead of parsing the file "
                             "again (in the temporary folder, TMPDIR; about 2x the text; default: half the free "
                             "space, at most 16 GiB; 0: parse twice)")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="drop rows with the wrong number of fields (counted, with their line numbers) instead of stopping")
    parser.add_argument("--in-memory", action="store_true", help="read each file whole instead of in chunks")
    parser.add_argument("--no-progress", action="store_true", help="do not show rows and rows/s")


def _refuse_unknown(parser: argparse.ArgumentParser, extra: Sequence[str]) -> None:
    """Raw data files take no `salience fit` overrides: an argument this command does not know
    is an error naming it (and the closest option), not silently ignored."""
    import difflib

    if not extra:
        return
    known = [o for action in parser._actions for o in action.option_strings]
    flag = extra[0].split("=", 1)[0]
    close = difflib.get_close_matches(flag, known, n=1)
    parser.error(f"unrecognized argument {extra[0]!r}" + (f"; did you mean {close[0]}?" if close else "")
                 + " (fit overrides apply only with --config)")


def _sources(args: argparse.Namespace) -> list[tuple[str, Any, dict[str, Any]]]:
    """``(path, chunk source, notes)`` per data file of ``args``."""
    from selection.model_free.outrank_stream import row_sample
    from selection.model_free.rawfiles import raw_chunk_source

    if args.chunk_rows is not None and args.chunk_rows < 1:
        raise SystemExit(f"--chunk-rows must be >= 1, got {args.chunk_rows}")
    if args.replay_bytes is not None and args.replay_bytes < 0:
        raise SystemExit(f"--replay-bytes must be >= 0 (0: parse the file again for the second pass), got {args.replay_bytes}")
    notes = {"chunk_rows": args.chunk_rows if args.chunk_rows is not None else "by bytes"}
    if args.sample is not None or args.sample_rows is not None:
        notes["sample"] = {"fraction": args.sample, "max_rows": args.sample_rows, "seed": args.sample_seed}
    out = []
    for path in args.data:
        src = raw_chunk_source(path, args.format, args.label, args.schema, args.chunk_rows, args.skip_bad_rows)
        try:
            src = row_sample(src, args.sample, args.sample_rows, args.sample_seed)
        except ValueError as e:
            raise SystemExit(f"--sample: {e}") from None
        out.append((path, src, notes))
    return out


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
    parser = argparse.ArgumentParser(
        prog="salience rank",
        description="Rank the features of a training config, or (--method outrank) of raw data files read in chunks.",
    )
    parser.add_argument("data", nargs="*", help="raw data files ranked by OutRank in bounded memory (instead of --config)")
    _method_args(parser, config_required=False)
    _file_args(parser)
    parser.add_argument("--output", default=None, help="report JSON (default: runs/rank/<dataset>-<method>.json)")
    parser.add_argument("--top", type=int, default=None, help="print only the top N rows")
    own, passthrough = split_passthrough(argv)
    args, overrides = parser.parse_known_args(own)
    overrides += passthrough
    if bool(args.data) == bool(args.config):
        parser.error("give either --config or data files")
    if args.data:
        _refuse_unknown(parser, overrides)
        return _rank_files(args)
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


def _rank_files(args: argparse.Namespace) -> int:
    """``salience rank --method outrank FILE...``: each file ranked in chunks (no MLflow run)."""
    from selection.base import get_method
    from selection.model_free.outrank import OutRank
    from selection.model_free.outrank_stream import rank_stream
    from selection.model_free.rawfiles import read_raw_file

    if args.method != "outrank":
        raise SystemExit(f"--method {args.method}: only outrank ranks raw data files; other methods train, give --config")
    try:
        method = get_method("outrank", **parse_options(args.option))
    except TypeError as e:
        raise SystemExit(f"--option: {e}") from None
    assert isinstance(method, OutRank)
    for path, source, notes in _sources(args):
        if args.in_memory:
            if "sample" in notes:
                raise SystemExit("--sample/--sample-rows need the streaming reader; drop --in-memory")
            report = method.rank_raw(read_raw_file(path, args.format, args.label, args.schema, args.skip_bad_rows))
        else:
            report = rank_stream(source, method, edge_sample=args.edge_sample, progress=not args.no_progress,
                                 notes=notes, replay_bytes=args.replay_bytes)
        name = Path(path).name.split(".")[0]
        default = Path("runs") / "rank" / f"{name}-outrank.json"
        out = Path(args.output if args.output and len(args.data) == 1 else
                   f"{args.output}.{Path(path).name}.json" if args.output else default)
        report.save(out)
        print(report.format(args.top))
        print(f"\nreport: {out}")
    return 0


def select_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="salience select",
        description="Rank features, retrain on the top-k for each k, draw the curve against random rankings, "
        "and write the reduced config.",
    )
    _method_args(parser, allow_all=True)
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

    names = _selectors() if args.method == "all" else [m.strip() for m in args.method.split(",") if m.strip()]
    unknown = [m for m in names if m not in _selectors()]
    if unknown or not names:
        parser.error(f"--method: unknown {unknown or args.method!r}; choose from {_selectors()}, 'all' or a comma-separated list")
    if len(names) > 1 or args.method == "all":
        return _select_all(args, overrides, names)
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
        from recsys.io import write_config

        reduced = report.reduced_config(recipe.config, k_star)
        chosen = next(p for p in curve.points if p.k == k_star)
        comment = (f"Reduced config: top-{k_star} features by {args.method}, k chosen on validation "
                   f"(validation AUC {chosen.best_val_auc:.4f} vs {curve.full.best_val_auc:.4f} with all {curve.full.k}; "
                   f"test AUC {chosen.test_auc:.4f} vs {curve.full.test_auc:.4f}).\n"
                   f"Written by: salience select --config {args.config} --method {args.method} --k {args.k}")
        write_config(out / "reduced_config.yaml", reduced, comment)
        if tracker is not None:
            tracker.log_artifact(out / "reduced_config.yaml", "selection")
    s = curve.summary()
    print(report.format())
    print()
    print(curve.to_markdown())
    print(
        f"\nAUKC: validation {s['val_aukc']:.4f}, test {s['aukc']:.4f} vs random {s['random_aukc_mean']:.4f} "
        f"(+/- {s['random_aukc_std']:.4f}); all {curve.full.k} features: validation AUC {curve.full.best_val_auc:.4f}, "
        f"test AUC {curve.full.test_auc:.4f}; smallest k within {args.tolerance:g} on validation (the choice): "
        f"{curve.smallest_k} (on test, reported only: {curve.smallest_k_test})"
    )
    iv = s["test_vs_full_at_smallest_k"]
    if iv is not None:
        within = "within" if s["within_tolerance_on_test"] else "NOT within"
        print(f"at k={curve.smallest_k}: test AUC - all features {iv['estimate']:+.4f}, 95% interval "
              f"[{iv['low']:+.4f}, {iv['high']:+.4f}] on the same {iv['n']:,} test rows (DeLong): "
              f"{s['verdict_at_smallest_k']}, {within} {args.tolerance:g}")
    print(f"wrote {out}/report.json, curve.json, curve.png, reduced_config.yaml (k={k_star})")
    if tracker is not None:
        print(f"MLflow run: {tracker.run_id} (nested runs: one per retrained model)")
    return 0


def _all_methods(names: list[str], options: list[str]) -> dict[str, Any]:
    """The selectors ``names``, each with its ``--option METHOD.KEY=VALUE`` settings."""
    from selection.base import get_method

    per: dict[str, list[str]] = {}
    for item in options:
        name, _, rest = item.partition(".")
        if not rest or "=" not in rest or name not in names:
            raise SystemExit(f"--option with several methods takes METHOD.KEY=VALUE (METHOD one of {names}), got {item!r}")
        per.setdefault(name, []).append(rest)
    try:
        return {name: get_method(name, **parse_options(per.get(name, []))) for name in names}
    except TypeError as e:
        raise SystemExit(f"--option: {e}") from None


def _select_all(args: argparse.Namespace, overrides: list[str], names: list[str]) -> int:
    """``select --method all`` (or a list): each selector's ranking and curve, one comparison table and plot."""
    from recsys.train.recipe import Recipe
    from selection.compare import compare_methods
    from selection.curve import parse_ks

    if args.report:
        raise SystemExit("--report reuses one ranking; it does not combine with --method all")
    methods = _all_methods(names, args.option)
    recipe = Recipe(args.config, overrides, workdir=Path("runs") / "select" / "fits", quiet=True)
    label = "all" if args.method == "all" else "-".join(names)
    out = Path(args.output or Path("runs") / "select" / f"{recipe.dataset_name}-{label}")
    tracker = _tracker(recipe, f"select-{label}", not args.no_tracking)
    recipe.parent_run_id = tracker.run_id if tracker is not None else None
    with tracker if tracker is not None else nullcontext():
        ks = parse_ks(args.k, len(recipe.schema.names))
        comparison = compare_methods(recipe, methods, ks, random_seeds=range(args.random_seeds),
                                     tolerance=args.tolerance, tracker=tracker)
        comparison.save(out)
    print(comparison.to_markdown())
    print(f"\nwrote {out}/comparison.md, comparison.json, comparison.png and <method>/report.json, curve.json")
    if tracker is not None:
        print(f"MLflow run: {tracker.run_id} (nested runs: every ranking fit and retrained model)")
    return 1 if comparison.failed and not comparison.curves else 0


def quality_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="salience quality",
        description="Data-quality report of raw data: cardinality, coverage, rare values, constant and near-constant "
        "features, suspected leakage, features below the noise controls.",
    )
    parser.add_argument("data", nargs="*", help="data files (CSV/TSV/Parquet, Criteo TSV, Frappe libFM)")
    parser.add_argument("--config", default=None, help="take the data from a `salience fit` config (training split)")
    _file_args(parser)
    parser.add_argument("--sketch", action="store_true",
                        help="count every feature with sketches: HyperLogLog cardinality, Misra-Gries top value "
                        "(bounded memory, approximate; no rare-value counts)")
    parser.add_argument("--sketch-threshold", type=int, default=None, metavar="N",
                        help="sketch a feature once it has N distinct values (default: exact counts until all "
                        "features together hold --exact-entries)")
    parser.add_argument("--exact-entries", type=int, default=None, metavar="N",
                        help="exact value counts held over all features at once (default 8,388,608, about 1 GB); "
                        "past it the features with the most distinct values are sketched")
    parser.add_argument("--output", default=None, help="also write the report as JSON here")
    own, passthrough = split_passthrough(argv)
    args, overrides = parser.parse_known_args(own)
    overrides += passthrough
    if not args.data and not args.config:
        parser.error("give data files or --config")
    if not args.config:
        _refuse_unknown(parser, overrides)

    from selection.model_free.data_quality import data_quality

    if args.config:
        from recsys.train.recipe import Recipe

        reports = [data_quality(Recipe(args.config, overrides, quiet=True).raw_split("train"))]
    elif args.in_memory:
        from selection.model_free.rawfiles import read_raw_files

        if args.sample is not None or args.sample_rows is not None or args.sketch or args.sketch_threshold:
            raise SystemExit("--sample/--sample-rows/--sketch need the streaming reader; drop --in-memory")
        reports = [data_quality(r) for r in read_raw_files(args.data, fmt=args.format, label=args.label, schema=args.schema,
                                                           skip_bad_rows=args.skip_bad_rows)]
    else:
        from selection.model_free.data_quality_stream import data_quality_stream

        reports = [
            data_quality_stream(source, sketch=args.sketch, sketch_threshold=args.sketch_threshold,
                                **({} if args.exact_entries is None else {"exact_entries": args.exact_entries}),
                                edge_sample=args.edge_sample, progress=not args.no_progress, notes=notes,
                                replay_bytes=args.replay_bytes)
            for _, source, notes in _sources(args)
        ]
    for report in reports:
        print(report.format())
        if args.output:
            report.save(args.output if len(reports) == 1 else f"{args.output}.{Path(report.source).name}.json")
    return 0
