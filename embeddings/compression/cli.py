"""``salience compress``: the smallest served model for a byte budget or an AUC tolerance, chosen on validation.

    # a trained checkpoint: per-table precision (fp32 -> fp16 -> int8 -> int4) only
    salience compress --checkpoint CKPT --config CFG --budget 0.1x --output DIR   # 0.1 x the uniform-16 fp32 bytes
    salience compress --checkpoint CKPT --config CFG --budget 2MB --output DIR
    salience compress --checkpoint CKPT --config CFG --tolerance 0.001 --output DIR  # as small as 0.001 AUC allows
    # no checkpoint: train every layout the budget allows (dims, row schemes), search each, keep the best
    salience compress --config CFG --budget 0.125x --output DIR
    salience compress --config CFG --budget 0.125x --layouts full,mde,qr --dims-plan runs/dims/plan.json --output DIR
    salience compress --config CFG --budget 0.125x --importance runs/rank/outrank.json --output DIR
    # after a pipeline: its final config, its overrides, its ranking and dimension plan
    salience compress --config OUT/final/reduced_config.yaml --budget 0.125x --importance OUT/selection/leap.json \
        --dims-plan OUT/dims/plan.json --output DIR -- --data.reader.init_args.n_rows=50000

Arguments it does not know (or all after ``--``) are ``salience fit`` overrides of the config,
applied to its data and to every fit, as ``salience rank`` and ``select`` take them. With a
checkpoint, the config (with those overrides) must encode the data as the checkpoint's own
encoders do, else the command stops and says so.

With a checkpoint, the trained model's tables start at fp32 and a lazy greedy search lowers one
table one precision step at a time, always the step that loses the least validation AUC per
byte saved, until the embedding bytes fit the budget (:func:`embeddings.compression.precision.search_precisions`).
With ``--tolerance``, a step that would take the validation AUC more than that below fp32's is
undone and its table stays where it is.

Without a checkpoint the command also chooses each feature's dim and row scheme
(:mod:`embeddings.compression.layouts`): it trains the config as it is (``full``), at the widest uniform
dim and at the mixed-dimension (MDE) dims that fit the budget at int8 and at int4, on
quotient-remainder and on hashed tables for the large features, and at a dimension plan found
earlier (``--dims-plan``, e.g. DNIS's from ``salience dims``) and at the dims and row schemes an
importance ranking calls for (``--importance``, a ``salience rank`` report: the lower half of the
features on quotient-remainder rows, dims that follow the ranks); runs the precision search on each
under the budget; and keeps the layout with the most validation AUC. The test split is read
once per layout's final model and only reported.

Writes ``plan.json`` (precision and bytes per table, the search trace, validation and test AUC;
with layouts, the chosen layout's dims and rows and every layout's result), ``frontier.png``
(bytes against validation and test AUC) and the quantized export with its fresh-process parity
check under ``DIR/export``; with layouts also ``comparison.md``.

The budget is a fraction ``Nx`` of the uniform-16 fp32 embedding bytes (every sparse feature at
dim 16, 4 bytes a value: the reference issue 19 sizes against) or an absolute size in
``KB``/``MB``/``GB``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from embeddings.compression.layouts import KINDS, choose_layout, layouts_for_budget, read_ranking, train_layouts
from embeddings.compression.precision import Compressed, parse_budget, plot_frontier, uniform_bytes
from recsys.argv import split_passthrough
from recsys.export.quantize import PrecisionError
from recsys.models.base import RankingModel, SparseArch

__all__ = ["compress_main"]


def compress_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="salience compress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a `salience fit` checkpoint (without one: train the layouts the budget allows)")
    parser.add_argument("--config", required=True, help="the fit config (its validation and test splits; the layouts' base)")
    parser.add_argument("--budget", help="0.1x (of the uniform-16 fp32 embedding bytes) or 2MB")
    parser.add_argument("--tolerance", type=float,
                        help="validation AUC the plan may lose against fp32 (a step losing more is undone); "
                             "without --budget: as small as this allows")
    parser.add_argument("--output", required=True, help="folder for plan.json and the export")
    parser.add_argument("--no-parity", action="store_true", help="skip the export's fresh-process parity check")
    parser.add_argument("--layouts", default="full,uniform,mde,qr,hash",
                        help=f"without --checkpoint: the layouts trained, from {','.join(KINDS)} (default: %(default)s; "
                             "plan is added with --dims-plan)")
    parser.add_argument("--dims-plan", help="without --checkpoint: a dimension plan JSON (salience dims) trained as one more layout")
    parser.add_argument("--importance", help="without --checkpoint: an importance report JSON (salience rank --output) whose "
                        "ranking sizes one more layout per precision (importance@int8, importance@int4)")
    parser.add_argument("--seed", type=int, help="without --checkpoint: seed_everything of every layout's fit (default: the config's)")
    parser.add_argument("--max-epochs", type=int, help="without --checkpoint: trainer.max_epochs of every layout's fit")
    own, passthrough = split_passthrough(argv if argv is not None else sys.argv[1:])
    args, overrides = parser.parse_known_args(own)
    args.overrides = overrides + passthrough  # `salience fit` arguments, as `salience rank` and `select` take them
    if args.budget is None and args.tolerance is None:
        parser.error("give --budget (0.1x or 2MB), --tolerance (validation AUC, e.g. 0.001), or both")
    if args.tolerance is not None and not args.tolerance >= 0:
        parser.error(f"--tolerance must be >= 0, got {args.tolerance}")
    if args.checkpoint:
        given = [f"--{k.replace('_', '-')}" for k in ("dims_plan", "importance", "seed", "max_epochs") if getattr(args, k) is not None]
        if given:
            parser.error(f"{', '.join(given)} apply to the layout search (without --checkpoint)")
        return _from_checkpoint(args, parser)
    if args.budget is None:
        parser.error("without --checkpoint, give --budget: the layouts are sized for it")
    return _with_layouts(args, parser)


def _budget(args: argparse.Namespace, parser: argparse.ArgumentParser, reference: int) -> int | None:
    try:
        return parse_budget(args.budget, reference) if args.budget is not None else None
    except ValueError as e:
        parser.error(str(e))


def _from_checkpoint(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from embeddings.compression.precision import compress_and_export
    from recsys.export import to_plain_kernel
    from recsys.train.checkpoint import load_checkpoint
    from recsys.train.recipe import Recipe

    loaded = load_checkpoint(args.checkpoint)
    model: RankingModel = to_plain_kernel(loaded.model.eval())
    if not isinstance(model.sparse_arch, SparseArch):
        parser.error(f"{args.checkpoint}: the model has no embedding tables to compress")
    reference = uniform_bytes(loaded.preprocessor.fitted_schema)
    budget = _budget(args, parser, reference)
    dm = Recipe(args.config, args.overrides, quiet=True).datamodule
    if not dm.preprocessor.same_encoders(loaded.preprocessor, dims=False):
        parser.error(f"{args.checkpoint} encodes its data otherwise than --config {args.config} does (other rows, "
                     "features or vocabularies): give the config the checkpoint was trained with, and the same "
                     "overrides (e.g. a pipeline's `overrides`) after it")
    val, test = dm.split_data("val"), dm.split_data("test")
    if val is None or test is None:
        parser.error(f"{args.config}: compress chooses on the validation split and reports the test split; the config lacks one")
    start = time.perf_counter()
    out = Path(args.output)
    try:  # the test split is read once per model of the frontier
        done = compress_and_export(model, loaded.preprocessor, val, test, out / "export", budget=budget,
                                   tolerance=args.tolerance, parity=not args.no_parity,
                                   metadata={"checkpoint": str(args.checkpoint), "budget": args.budget,
                                             "tolerance": args.tolerance})
    except PrecisionError as e:
        parser.error(str(e))
    _write(args, out, done, reference, budget, start, {"checkpoint": str(args.checkpoint)})
    return 0


def _with_layouts(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from embeddings.compression.precision import compress_and_export
    from embeddings.plan import DimensionPlan
    from recsys.export.quantize import quantize_model
    from recsys.train.evaluation import evaluate
    from recsys.train.recipe import Recipe

    out = Path(args.output)
    recipe = Recipe(args.config, args.overrides, quiet=True, workdir=out / "fits", keep_checkpoints=False)
    reference = uniform_bytes(recipe.schema)
    budget = _budget(args, parser, reference)
    assert budget is not None
    kinds = [k.strip() for k in args.layouts.split(",") if k.strip()]
    dims_plan = None
    if args.dims_plan:
        dims_plan = dict(DimensionPlan.load(args.dims_plan).dims)
        kinds += [] if "plan" in kinds else ["plan"]
    try:
        ranking = read_ranking(args.importance) if args.importance else None
        kinds += [] if ranking is None or "importance" in kinds else ["importance"]
        layouts = layouts_for_budget(recipe.schema, budget, kinds=kinds, dims_plan=dims_plan, ranking=ranking)
    except ValueError as e:
        parser.error(f"--layouts / --dims-plan / --importance: {e}")
    start = time.perf_counter()
    trained = train_layouts(recipe, layouts, seed=args.seed, max_epochs=args.max_epochs)
    dm = next(iter(trained.values())).datamodule
    val, test = dm.split_data("val"), dm.split_data("test")
    if val is None or test is None:
        parser.error(f"{args.config}: compress chooses on the validation split and reports the test split; the config lacks one")
    try:
        choice = choose_layout({n: t.model for n, t in trained.items()}, budget, val, args.tolerance)
    except PrecisionError as e:
        parser.error(str(e))
    fp32_test = evaluate(trained["full"].model, test) if "full" in trained else None
    winner = trained[choice.chosen]
    done = compress_and_export(winner.model, dm.preprocessor, val, test, out / "export", budget=budget,
                               tolerance=args.tolerance, parity=not args.no_parity, result=choice.result,
                               fp32_test=fp32_test if choice.chosen == "full" else None,
                               metadata={"config": str(args.config), "budget": args.budget, "layout": choice.chosen})
    comparison: list[dict[str, Any]] = []
    for name, result in choice.results.items():  # the test split: once per layout's final model
        if name == choice.chosen:  # the frontier's searched plan: scored there
            on_test = {"auc": done.point("search")["test_auc"], "logloss": done.point("search")["test_logloss"]}
        else:
            on_test = evaluate(quantize_model(trained[name].model, result.plan), test)
        comparison.append({"layout": name, "bytes": result.bytes, "bytes_vs_uniform16": result.bytes / max(reference, 1),
                           "val_auc": result.val_auc, "test_auc": on_test["auc"], "test_logloss": on_test["logloss"],
                           "fits_budget": result.bytes <= budget, "fit_seconds": round(trained[name].seconds, 1),
                           "chosen": name == choice.chosen})
    done.frontier += [{"technique": f"layout {c['layout']}", "bytes": c["bytes"], "val_auc": c["val_auc"],
                       "test_auc": c["test_auc"], "test_logloss": c["test_logloss"]} for c in comparison]
    _write(args, out, done, reference, budget, start, {
        "config": str(args.config), "layout": winner.layout.to_dict(), "layouts": comparison,
        "skipped_layouts": choice.skipped, "full_fp32_test": fp32_test,
    })
    _write_comparison(out / "comparison.md", comparison, fp32_test, budget, reference)
    print("layouts (searched under the budget, chosen on validation):")
    for c in comparison:
        print(f"  {'*' if c['chosen'] else ' '} {c['layout']:<12} {c['bytes']:>12,} bytes ({c['bytes_vs_uniform16']:.3f}x) "
              f"validation AUC {c['val_auc']:.5f}  test AUC {c['test_auc']:.5f}")
    for name, why in choice.skipped.items():
        print(f"    {name:<12} skipped: {why}")
    if fp32_test is not None:
        chosen = next(c for c in comparison if c["chosen"])
        print(f"chosen layout {choice.chosen}: test AUC {chosen['test_auc']:.5f} vs the config's full fp32 model "
              f"{fp32_test['auc']:.5f} (change {chosen['test_auc'] - fp32_test['auc']:+.5f}); comparison: {out / 'comparison.md'}")
    return 0


def _write_comparison(path: Path, rows: list[dict[str, Any]], fp32_test: dict[str, float] | None, budget: int,
                      reference: int) -> None:
    from recsys.io import atomic_write_text

    lines = [f"# Layouts under {budget:,} bytes ({budget / max(reference, 1):.3f}x of uniform-16 fp32)", "",
             "Chosen on validation AUC; the test split is read once per layout and only reported.", ""]
    if fp32_test is not None:
        lines += [f"The config's full fp32 model: test AUC {fp32_test['auc']:.5f}.", ""]
    lines += ["| layout | bytes | x uniform-16 | validation AUC | test AUC | test AUC change | fit s | chosen |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in rows:
        change = f"{c['test_auc'] - fp32_test['auc']:+.5f}" if fp32_test is not None else "-"
        lines.append(f"| {c['layout']} | {c['bytes']:,} | {c['bytes_vs_uniform16']:.3f} | {c['val_auc']:.5f} | "
                     f"{c['test_auc']:.5f} | {change} | {c['fit_seconds']} | {'yes' if c['chosen'] else ''} |")
    atomic_write_text(path, "\n".join(lines) + "\n")


def _write(args: argparse.Namespace, out: Path, done: Compressed, reference: int, budget: int | None, start: float,
           source: dict[str, Any]) -> None:
    """``plan.json`` and ``frontier.png`` of ``done``, and the summary lines."""
    from recsys.io import atomic_savefig, atomic_write_json

    result, frontier, parity = done.result, done.frontier, done.parity_max_abs_diff
    test_fp32, test_plan = ({"auc": done.point(n)["test_auc"], "logloss": done.point(n)["test_logloss"]} for n in ("fp32", "search"))
    record = {
        **source,
        "budget": args.budget, "budget_bytes": budget, "tolerance": args.tolerance, "budget_met": result.bytes <= result.budget,
        "uniform16_fp32_bytes": reference,
        "bytes": result.bytes, "fp32_bytes": result.fp32_bytes,
        "bytes_vs_uniform16": result.bytes / max(reference, 1),
        "tables": result.plan.to_dict(),
        "val": {"fp32_auc": result.fp32_val_auc, "plan_auc": result.val_auc},
        "test": {"fp32": test_fp32, "plan": test_plan, "auc_change": test_plan["auc"] - test_fp32["auc"],
                 "auc_change_interval": done.point("search").get("test_vs_fp32")},
        "trace": result.trace, "validation_passes": result.evaluations, "frontier": frontier,
        "seconds": round(time.perf_counter() - start, 1), "export": str(done.export_dir), "parity_max_abs_diff": parity,
    }
    atomic_write_json(out / "plan.json", record)
    atomic_savefig(plot_frontier(frontier, result.trace), out / "frontier.png")
    counts: dict[str, int] = {}
    for p in result.plan.tables.values():
        counts[p.value] = counts.get(p.value, 0) + 1
    goal = f"budget {budget:,} bytes ({args.budget})" if args.budget is not None else f"tolerance {args.tolerance} validation AUC"
    if args.budget is not None and args.tolerance is not None:
        goal += f", tolerance {args.tolerance}" + ("" if result.bytes <= result.budget else " (the budget is NOT met within it)")
    print(f"{goal}; chose {', '.join(f'{n} x {p}' for p, n in counts.items())}: "
          f"{result.bytes:,} bytes = {result.bytes / max(result.fp32_bytes, 1):.3f}x of fp32, "
          f"{result.bytes / max(reference, 1):.3f}x of uniform-16 ({result.evaluations} validation passes)")
    print(f"validation AUC {result.val_auc:.5f} vs fp32 {result.fp32_val_auc:.5f}; "
          f"test AUC {test_plan['auc']:.5f} vs fp32 {test_fp32['auc']:.5f} (change {test_plan['auc'] - test_fp32['auc']:+.5f})")
    iv = done.point("search").get("test_vs_fp32")
    if iv:
        from recsys.stats import Interval

        print(f"  95% interval [{iv['low']:+.5f}, {iv['high']:+.5f}] on the same {iv['n']:,} test rows (DeLong): "
              f"{Interval(**iv).verdict()}")
    if parity is not None:
        print(f"parity (fresh process): max |eager - exported| = {parity:.2e}")
    print(f"plan: {out / 'plan.json'}; frontier: {out / 'frontier.png'}; export: {done.export_dir}")
