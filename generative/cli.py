"""``salience sid build`` and ``salience gen fit|validate|test|recommend``.

    salience sid build --dataset beauty --content attributes --method rq-kmeans --output runs/sid/beauty
    salience gen fit --config experiments/configs/generative/beauty.yaml
    salience gen test --config experiments/configs/generative/beauty.yaml --ckpt_path CKPT
    salience gen recommend --model EXPORT_DIR --history "12 7 99" --k 10

``gen fit`` and friends are a LightningCLI over :class:`~generative.train.GenerativeTask` and
:class:`~generative.train.SequenceDataModule`: after ``fit`` the best checkpoint is tested and
exported to TorchScript (beam search included), with a fresh eager-vs-exported parity check.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser

from generative.mlflow_logging import GenerativeTracking
from generative.train import GenerativeTask, SequenceDataModule
from recsys.tracking import MlflowTracking
from recsys.train.cli import TrackedCLI

__all__ = ["GenerativeCLI", "gen_main", "sid_main"]

TRAINER_DEFAULTS: dict[str, Any] = {
    "max_epochs": 10,
    "logger": False,
    "default_root_dir": "runs/gen",
    "deterministic": True,
    "num_sanity_val_steps": 0,
}


class GenerativeCLI(TrackedCLI):
    """LightningCLI with MLflow tracking and test + TorchScript export after fit."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        self.export_report: dict[str, Any] | None = None
        super().__init__(
            GenerativeTask,
            SequenceDataModule,
            seed_everything_default=42,
            save_config_callback=None,
            trainer_defaults=TRAINER_DEFAULTS,
            args=args,
            run=run,
            parser_kwargs={"prog": "salience gen", "description": __doc__},
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(GenerativeTracking, "tracking")
        self.add_after_fit_arguments(parser, export_help="export the best model to TorchScript (sid)")
        parser.add_argument(
            "--resume", type=bool, default=True, help="fit: resume an unfinished fit of this run folder and config"
        )

    def can_export(self) -> bool:
        from generative.model import SIDRecommender

        # serving (beam search inside TorchScript) is for the semantic-ID model; SASRec is the baseline
        return isinstance(self.model.recommender, SIDRecommender)

    def _export(self, export_dir: str | None, tracking: MlflowTracking | None) -> None:
        """Export the best model with its beam search, then check it in a fresh process on real histories."""
        import torch

        from generative.serving import check_parity_in_fresh_process, export_recommender

        tracker = tracking.tracker if tracking is not None else None
        run_id = tracker.run_id if tracker is not None else "local"
        out = Path(export_dir) if export_dir else Path(self.trainer.default_root_dir) / "exports" / run_id
        model = self.model.recommender
        k, beam = int(self.model.hparams.eval_k), int(self.model.hparams.beam_size)
        export_recommender(model, out, k=k, beam_size=beam, metadata={"mlflow_run_id": run_id, "dataset": self.datamodule.dataset_name})
        history = torch.as_tensor(self.datamodule.split.test_history[:256], dtype=torch.long)
        items, scores = model.recommend_batched(history, k, beam_size=beam)
        diff = check_parity_in_fresh_process(out, history, items, scores)
        self.export_report = {"output_dir": str(out), "items_equal": True, "max_abs_score_diff": diff}
        print(f"exported recommender: {out} (fresh process, {len(history)} test users: same items, max |score diff| {diff:.2e})")
        if tracker is not None:
            tracker.log_metrics({"export_parity_max_abs_diff": diff})
            tracker.log_artifact(out, "model")


def gen_main(argv: Sequence[str]) -> int:
    """``salience gen ...``: ``recommend`` is argparse; the rest is the LightningCLI."""
    argv = list(argv)
    if argv and argv[0] == "recommend":
        return _recommend(argv[1:])
    import sys

    saved, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it sees both args and sys.argv
    try:
        GenerativeCLI(args=argv)
    finally:
        sys.argv = saved
    return 0


def _recommend(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="salience gen recommend", description="Top-k next items from an exported generative recommender."
    )
    parser.add_argument("--model", required=True, help="export folder written by `salience gen fit` (model.pt)")
    parser.add_argument("--history", action="append", required=True, help='item ids, oldest first, e.g. "12 7 99" (repeatable)')
    parser.add_argument("--k", type=int, default=None, help="list length (default: the exported k)")
    args = parser.parse_args(argv)

    import torch

    from generative.serving import load_recommender, read_metadata

    module, meta = load_recommender(args.model), read_metadata(args.model)
    histories = []
    for text in args.history:
        try:
            histories.append([int(tok) for tok in text.replace(",", " ").split()])
        except ValueError:
            parser.error(f"--history {text!r}: item ids must be integers")
    width = max(1, max(len(h) for h in histories))
    batch = torch.zeros(len(histories), width, dtype=torch.long)
    for row, items in enumerate(histories):
        if items:
            batch[row, width - len(items) :] = torch.tensor(items)
    unknown = int(((batch < 0) | (batch > int(meta["num_items"]))).sum())
    items, scores = module(batch)
    k = min(args.k or items.shape[1], items.shape[1])
    for row, text in enumerate(args.history):
        recs = ", ".join(f"{int(i)} ({float(s):.3f})" for i, s in zip(items[row, :k], scores[row, :k], strict=True))
        print(f"history [{text}] -> {recs}")
    if unknown:
        print(f"note: {unknown} history id(s) outside the catalogue 1..{meta['num_items']} were ignored")
    return 0


def sid_main(argv: Sequence[str]) -> int:
    """``salience sid build``: item content vectors -> semantic-ID codebook (saved and logged)."""
    parser = argparse.ArgumentParser(prog="salience sid", description="Build semantic IDs for an item catalogue.")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="fit a codebook and save it")
    build.add_argument("--dataset", default="synthetic", help="beauty | sports | toys | ml-100k | synthetic")
    build.add_argument("--data-dir", default=None, help="data folder (default: $SALIENCE_DATA_DIR)")
    build.add_argument("--content", default="attributes",
                       help="item content vectors: attributes | collaborative | text | concat "
                            "(attributes and collaborative side by side)")
    build.add_argument("--content-dim", type=int, default=None, help="content vector dimension")
    build.add_argument("--method", default="rq-kmeans", help="rq-kmeans | rq-vae")
    build.add_argument("--levels", type=int, default=3, help="code levels before the collision token")
    build.add_argument("--size", type=int, default=256, help="codes per level")
    build.add_argument("--epochs", type=int, default=None, help="RQ-VAE training epochs")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--output", required=True, help="folder for codebook.json (+ stats and plot)")
    build.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    args = parser.parse_args(argv)

    from generative.train import SequenceDataModule

    options: dict[str, Any] = {"levels": args.levels, "codebook_size": args.size}
    if args.epochs is not None:
        if args.method != "rq-vae":
            parser.error("--epochs applies to --method rq-vae only")
        options["epochs"] = args.epochs
    content_options = {} if args.content_dim is None else {"dim": args.content_dim}
    dm = SequenceDataModule(
        dataset=args.dataset,
        data_dir=args.data_dir,
        content={"class_path": args.content, "init_args": content_options},
        codebook={"class_path": args.method, "init_args": options},
        codebook_seed=args.seed,
    )
    book = dm.codebook
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    path = book.save(out / "codebook.json")
    from recsys.io import atomic_savefig

    fig = book.plot()
    atomic_savefig(fig, out / "codebook.png", dpi=110, bbox_inches="tight")
    print(book.summary())
    print(f"wrote {path}")
    if not args.no_tracking:
        from recsys.tracking import RunTracker

        with RunTracker(dm.dataset_name, f"sid-{args.method}-{args.dataset}", tags={"salience.stage": "sid"}) as tracker:
            tracker.log_params({"content": args.content, **content_options, "method": args.method, **options, "seed": args.seed})
            book.to_mlflow(tracker)
            print(f"MLflow run {tracker.run_id}")
    return 0
