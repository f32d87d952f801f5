"""The ``salience`` command.

    salience fit|validate|test|predict --config experiments/configs/frappe_dcnv2.yaml
    torchrun --nproc_per_node 2 -m experiments.cli fit --config experiments/configs/frappe_dcnv2_sharded.yaml
    salience export --checkpoint CKPT --output DIR
    salience rank --config CFG --method {methods}
    salience select --config CFG --method M --k 2,4,8
    salience quality DATA... | --config CFG
    salience pipeline --config experiments/configs/pipeline/frappe.yaml
    salience demo
    salience wide-data --features 1000 --rows 50000 --output data/wide.parquet
    salience dims --config CFG --method {searches} --budget 0.5x16
    salience compress --checkpoint CKPT --config CFG --budget 0.1x --output DIR
    salience compress --config CFG --budget 0.125x --output DIR     # also trains dims / row-scheme layouts
    salience bench {benchmarks} [ARGS]
    salience tune --config CFG --sampler {samplers} --n-trials N [--storage URL] [--workers W]
    salience sid build --dataset beauty --method rq-kmeans --output DIR
    salience gen fit|test --config experiments/configs/generative/beauty.yaml
    salience gen recommend --model EXPORT_DIR --history "12 7 99"

``fit`` and friends are LightningCLI subcommands (see ``salience fit --help``); the others are
plain argparse commands (each has ``--help``). SIGTERM stops a command cleanly: its MLflow runs
end ``KILLED`` and it exits with status 143 (a rerun of a stopped ``fit`` resumes it).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from experiments.benchmarks import BENCHMARKS
from recsys.runtime import configure_logging, exit_distributed, sigterm_raises

LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _export(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="salience export", description="Export a checkpoint to TorchScript for serving.")
    parser.add_argument("--checkpoint", required=True, help="Lightning checkpoint written by `salience fit`")
    parser.add_argument("--output", required=True, help="output folder (model.pt, schema.json, loader.py)")
    parser.add_argument("--no-parity", action="store_true", help="skip the eager-vs-exported check in a fresh process")
    parser.add_argument("--precision", default="fp32",
                        help="embedding tables as fp32 (default), fp16, int8 or int4 on FBGEMM's inference kernel; "
                             "per-feature overrides after a comma: int8,C3=int4")
    parser.add_argument("--config", default=None,
                        help="the fit config: with --precision, report the test AUC change against fp32")
    args = parser.parse_args(argv)

    from recsys.export.quantize import PrecisionError
    from recsys.train.checkpoint import export_checkpoint

    test = None
    if args.config is not None and args.precision != "fp32":
        from recsys.train.recipe import Recipe

        test = Recipe(args.config, quiet=True).datamodule.split_data("test")
        if test is None:
            parser.error(f"--config {args.config}: no test split to report the precision's AUC change on")
    try:
        report = export_checkpoint(args.checkpoint, args.output, check_parity=not args.no_parity,
                                   precision=args.precision, test=test)
    except PrecisionError as e:
        parser.error(str(e))
    print(f"exported {args.checkpoint} -> {args.output}")
    emb = report["embedding_precision"]
    if emb.get("fp32_bytes"):
        print(f"embedding tables: {emb['bytes'] / 1e6:.3f} MB ({emb['bytes'] / emb['fp32_bytes']:.3f}x of fp32), "
              f"precision {args.precision}")
    if report.get("parity_max_abs_diff") is not None:
        print(f"parity (fresh process): max |eager - exported| = {report['parity_max_abs_diff']:.2e}")
    if "test" in report:
        t = report["test"]
        print(f"test AUC {t[args.precision]['auc']:.5f} vs fp32 {t['fp32']['auc']:.5f} (change {t['auc_change']:+.5f}); "
              f"log loss change {t['logloss_change']:+.5f}")
    return 0


def _demo(argv: Sequence[str]) -> int:
    from experiments.demo import main as demo_main

    return demo_main(list(argv))


def _rank(argv: Sequence[str]) -> int:
    from selection.cli import rank_main

    return rank_main(argv)


def _select(argv: Sequence[str]) -> int:
    from selection.cli import select_main

    return select_main(argv)


def _dims(argv: Sequence[str]) -> int:
    from embeddings.dims.cli import dims_main

    return dims_main(argv)


def _quality(argv: Sequence[str]) -> int:
    from selection.cli import quality_main

    return quality_main(argv)


def _sid(argv: Sequence[str]) -> int:
    from generative.cli import sid_main

    return sid_main(argv)


def _gen(argv: Sequence[str]) -> int:
    from generative.cli import gen_main

    return gen_main(argv)


def _compress(argv: Sequence[str]) -> int:
    from embeddings.compression.cli import compress_main

    return compress_main(argv)


def _pipeline(argv: Sequence[str]) -> int:
    from experiments.pipeline.cli import pipeline_main

    return pipeline_main(argv)


def _wide_data(argv: Sequence[str]) -> int:
    from recsys.data.synthetic.wide import wide_data_main

    return wide_data_main(argv)


def _tune(argv: Sequence[str]) -> int:
    from experiments.hpo.tune import tune_main

    return tune_main(argv)


def _bench(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="salience bench", description="Run a committed benchmark.")
    parser.add_argument("name", choices=list(BENCHMARKS))
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(f"experiments.benchmarks.{args.name}")
    return int(module.main(rest) or 0)


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "export": (_export, "export a checkpoint to TorchScript + schema.json + loader.py"),
    "rank": (_rank, "rank features by importance (any --method above) and write the report"),
    "select": (_select, "selection curve: retrain on the top-k features for each k vs random rankings"),
    "quality": (_quality, "data-quality report of raw data (cardinality, coverage, leakage, noise)"),
    "compress": (_compress, "one byte budget: per-table precision (and, without a checkpoint, dims and row schemes), chosen on validation, exported"),
    "dims": (_dims, "search embedding dims (any --method above), retrain, compare with uniform-16"),
    "sid": (_sid, "build semantic IDs (RQ-KMeans, RQ-VAE) for an item catalogue"),
    "gen": (_gen, "generative next-item recommender: fit|validate|test (Lightning) and recommend"),
    "tune": (_tune, "tune a ranking model's hyperparameters (any --sampler above; Optuna) and write the best config"),
    "pipeline": (_pipeline, "quality -> OutRank -> LeAP -> DNIS -> GIF -> final fit -> export, vs the original; resumable"),
    "wide-data": (_wide_data, "write the wide synthetic dataset (thousands of mixed features, planted truth) as Parquet or CSV"),
    "demo": (_demo, "synthetic data -> DCNv2 -> evaluate -> export -> parity, all tracked in MLflow"),
    "bench": (_bench, f"run a committed benchmark ({', '.join(BENCHMARKS)})"),
}


def _registered() -> dict[str, str]:
    """The choices the usage lists, read from the registries (never a hand-kept list)."""
    import embeddings
    import selection
    from experiments.hpo import SamplerChoice

    return {"methods": "|".join(selection.method_names()), "searches": "|".join(embeddings.search_names()),
            "samplers": "|".join(SamplerChoice.registered_names()), "benchmarks": "|".join(BENCHMARKS)}


def _usage() -> str:
    lines = [(__doc__ or "").strip().format(**_registered()), "", "commands:"]
    for name in LIGHTNING_SUBCOMMANDS:
        lines.append(f"  {name:<10} Lightning {name} of a ranking model (--config FILE)")
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name:<10} {help_text}")
    return "\n".join(lines)


#: show the whole traceback of an input error (the flag, or this variable set to 1)
TRACEBACK_FLAG, TRACEBACK_ENV = "--traceback", "SALIENCE_TRACEBACK"


def input_errors() -> tuple[type[BaseException], ...]:
    """The errors that report bad input of the user's own (a file, a config key, a value): the
    command prints their message alone. Anything else is a bug and keeps its traceback."""
    from embeddings.plan import DimensionPlanError
    from experiments.hpo.storage import StorageError
    from experiments.pipeline.config import PipelineConfigError
    from generative.codebook.artifact import CodebookError
    from recsys.artifacts import ArtifactError
    from recsys.data.raw import DataError
    from recsys.data.schema import SchemaError
    from recsys.data.streaming.shards import ShardError
    from recsys.devices import DeviceError
    from recsys.export.quantize import PrecisionError
    from recsys.train.sharded import ShardingError
    from selection.base import WidthRefusal

    return (DataError, SchemaError, ShardError, ArtifactError, PrecisionError, DeviceError, ShardingError,
            DimensionPlanError, PipelineConfigError, StorageError, CodebookError, WidthRefusal, FileNotFoundError,
            IsADirectoryError, NotADirectoryError)


def main(argv: Sequence[str] | None = None) -> int:
    from_command_line = argv is None
    args = list(sys.argv[1:] if argv is None else argv)
    show_traceback = TRACEBACK_FLAG in args or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    args = [a for a in args if a != TRACEBACK_FLAG]
    try:
        return _dispatch(args, from_command_line, own_argv=from_command_line and TRACEBACK_FLAG not in sys.argv)
    except Exception as e:
        if show_traceback or not isinstance(e, input_errors()):
            raise
        prog = "salience" + (f" {args[0]}" if args and not args[0].startswith("-") else "")
        print(f"{prog}: error: {e}\n(the whole traceback: add {TRACEBACK_FLAG} or set {TRACEBACK_ENV}=1)", file=sys.stderr)
        return 2


def _dispatch(argv: list[str], from_command_line: bool, own_argv: bool) -> int:
    """Run ``argv``'s command; ``own_argv``: LightningCLI may read ``sys.argv`` itself."""
    configure_logging()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command in LIGHTNING_SUBCOMMANDS:
        from recsys.train.cli import run_cli

        # on the real command line LightningCLI reads sys.argv itself (and warns if also given args)
        with sigterm_raises():
            run_cli(None if own_argv else [command, *rest])
        if from_command_line:
            exit_distributed(0)
        return 0
    if command in COMMANDS:
        with sigterm_raises():
            return COMMANDS[command][0](rest)
    print(f"salience: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
