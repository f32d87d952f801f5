"""``salience demo``: the main job on the embedded synthetic default.

Generates the synthetic CTR data (planted ground truth), trains DCNv2, evaluates the best
checkpoint on the test split, exports it to TorchScript, reloads the export in a fresh process
and checks parity with the eager model, logs everything to one MLflow run, and prints a
summary with the command that opens the MLflow UI. Later stages extend this demo.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parent / "configs" / "synthetic_dcnv2.yaml"


def run_demo(rows: int = 200_000, epochs: int = 3, output: str = "runs/demo", seed: int = 0) -> dict[str, Any]:
    """Run the demo; returns the summary it prints."""
    from recsys.train.cli import SalienceCLI

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
    summary = {
        "rows": rows,
        "test_auc": metrics.get("test_auc"),
        "test_logloss": metrics.get("test_logloss"),
        "best_val_auc": float(cli.trainer.checkpoint_callback.best_model_score or float("nan")),
        "embedding_parameters": cli.model.model.embedding_parameters(),
        "export_dir": str(out / "export"),
        "parity_max_abs_diff": (cli.export_report or {}).get("parity_max_abs_diff"),
        "mlflow_run_id": tracking.tracker.run_id if tracking is not None and tracking.tracker is not None else None,
        "seconds": round(time.perf_counter() - start, 1),
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="salience demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="synthetic rows to generate")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--output", default="runs/demo", help="folder for checkpoints and the export")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    args = parser.parse_args(argv)
    s = run_demo(args.rows, args.epochs, args.output, args.seed)
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
        "",
        "Open the MLflow UI:   make ui    (serves http://127.0.0.1:5000)",
    ]
    print("\n".join(lines))
    if parity is not None and parity > 1e-6:
        print(f"ERROR: exported model differs from eager by {parity:.2e} > 1e-6")
        return 1
    return 0
