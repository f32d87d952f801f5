"""``salience pipeline --config CFG``: run (or resume) a pipeline and print what it built."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["format_summary", "pipeline_main"]


def format_summary(results: dict[str, dict[str, Any]], output: str) -> str:
    """The closing table: original vs final model, and where to look next."""
    lines = [""]
    compare = results.get("compare")
    if compare is not None:
        o, f, d = compare["original"], compare["final"], compare["delta"]
        rows = [
            ("features", f"{o['n_features']}", f"{f['n_features']}", f"{d['n_features']:+d}"),
            ("embedding parameters", f"{o['embedding_parameters']:,}", f"{f['embedding_parameters']:,}",
             f"x{d['embedding_parameters_ratio']:.2f}"),
            ("test AUC", f"{o['test_auc']:.4f}", f"{f['test_auc']:.4f}", f"{d['test_auc']:+.4f}"),
            ("test log loss", f"{o['test_logloss']:.4f}", f"{f['test_logloss']:.4f}", f"{d['test_logloss']:+.4f}"),
            ("export size (KB)", f"{o['export_bytes'] / 1024:,.0f}", f"{f['export_bytes'] / 1024:,.0f}",
             f"x{d['export_bytes_ratio']:.2f}"),
        ]
        for b in o["latency_ms"]:
            if b in f["latency_ms"]:
                rows.append((f"latency batch {b} (ms)", f"{o['latency_ms'][b]['median']:.2f}",
                             f"{f['latency_ms'][b]['median']:.2f}", f"x{d['latency_ratio'][b]:.2f}"))
        lines.append(f"{'':<24}{'original':>14}{'final':>14}{'change':>10}")
        lines += [f"{r[0]:<24}{r[1]:>14}{r[2]:>14}{r[3]:>10}" for r in rows]
        verdict = "within" if compare["within_tolerance"] else "NOT within"
        interval = compare.get("test_auc_interval")
        paired = (f" (change {interval['estimate']:+.4f}, 95% interval [{interval['low']:+.4f}, {interval['high']:+.4f}] "
                  f"on the same {interval['n']:,} test rows, DeLong)" if interval else " (one run each, unpaired)")
        lines.append(f"final test AUC {verdict} {compare['auc_tolerance']:g} of the original{paired}; "
                     f"kept features: {', '.join(f['features'])}")
    report = results.get("report", {}).get("report")
    lines.append(f"results: {output}")
    if report is not None:
        lines.append(f"report:  {report}")
    lines.append("MLflow:  make ui   (serves http://127.0.0.1:5000; the pipeline is one parent run with a run per stage)")
    return "\n".join(lines)


def pipeline_main(argv: Sequence[str]) -> int:
    from experiments.pipeline.config import PipelineConfig, PipelineConfigError
    from experiments.pipeline.runner import Pipeline
    from experiments.pipeline.stages import STAGES, StageError

    parser = argparse.ArgumentParser(
        prog="salience pipeline",
        description="quality gates -> OutRank screening -> LeAP selection curve -> DNIS dims -> GIF tuning -> "
        "final fit -> export -> parity, next to the original model; one MLflow parent run, a run per stage, an HTML "
        "report. Re-running the same command resumes after the last finished stage.",
    )
    parser.add_argument("--config", required=True, help="pipeline YAML (see experiments/configs/pipeline/)")
    parser.add_argument("--output", default=None, help="output folder (default: the config's, else runs/pipeline/<name>)")
    parser.add_argument("--restart", action="store_true", help="start over, ignoring the stages done in the folder")
    parser.add_argument("--stop-after", choices=list(STAGES), default=None, help="stop after this stage (resume later)")
    args = parser.parse_args(argv)
    try:
        config = PipelineConfig.load(args.config)
        if args.output is not None:
            config.output = args.output
        results = Pipeline(config, restart=args.restart).run(args.stop_after)
    except (PipelineConfigError, StageError) as e:
        parser.exit(2, f"salience pipeline: error: {e}\n")
    print(format_summary(results, str(config.output_dir)))
    return 0
