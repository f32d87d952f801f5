"""The pipeline benchmark: ``salience pipeline`` on Frappe, original vs final model.

    python -m experiments.benchmarks.pipeline                 # Frappe (needs SALIENCE_DATA_DIR), ~15-25 min
    python -m experiments.benchmarks.pipeline --config experiments/configs/pipeline/criteo.yaml

Runs the committed pipeline config from scratch in an isolated working folder (its own MLflow
store) and writes ``experiments/results/pipeline.{json,md}``: every stage's wall time and the
comparison of the original and the final model (features, embedding parameters, test AUC and log
loss, export size, exported-model latency at batch 1 and 1024), with the issue's targets: fewer
features, fewer embedding parameters, test AUC within 0.002 of the original, judged on DeLong's
95% interval of the paired difference on the same test rows: met only when its lower end is above
-0.002 (non-inferiority; a final model better beyond the interval also meets it). A run whose test
pass kept no scores falls back to the point estimate and says "unpaired". The HTML report is copied next to the results. Paths
in the JSON and the report are relative to the repository or to the pipeline's temporary output
folder.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from experiments.benchmarks._common import hardware_text, isolated_workdir, result_header

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
DEFAULT_CONFIG = ROOT / "experiments" / "configs" / "pipeline" / "frappe.yaml"
TARGETS = {"fewer_features": True, "fewer_embedding_parameters": True, "test_auc_within": 0.002}


def verdicts(compare: dict[str, Any]) -> dict[str, bool]:
    """The issue's targets, from the compare stage's result (its paired interval where it has one)."""
    from recsys.stats import Interval

    d = compare["delta"]
    interval = compare.get("test_auc_interval")
    tol = TARGETS["test_auc_within"]
    within = (Interval(**interval).no_worse_than(tol) if interval
              else abs(d["test_auc"]) <= tol or d["test_auc"] > 0)
    return {
        "fewer_features": d["n_features"] < 0,
        "fewer_embedding_parameters": d["embedding_parameters"] < 0,
        "test_auc_within": within,
    }


def _interval_text(compare: dict[str, Any]) -> str:
    iv = compare.get("test_auc_interval")
    if not iv:
        return "unpaired, one run each "
    return f"[{iv['low']:+.4f}, {iv['high']:+.4f}] 95% paired on {iv['n']:,} test rows (DeLong), {compare.get('verdict')}; "


def to_markdown(result: dict[str, Any]) -> str:
    c = result["compare"]
    o, f, d = c["original"], c["final"], c["delta"]
    v = result["verdicts"]

    def ok(key: str) -> str:
        return "met" if v[key] else "NOT met"

    lines = [
        f"# Pipeline: {result['pipeline']} from raw data to a smaller served model",
        "",
        f"Command: `{result['command'].strip()}`  ",
        f"Config: `{result['config']}`; date: {result['date']}; hardware: {hardware_text(result['hardware'])}; "
        f"wall time {result['seconds']:.0f} s.",
        "",
        "| | original | final | change |",
        "|---|---|---|---|",
        f"| features | {o['n_features']} | {f['n_features']} | {d['n_features']:+d} ({ok('fewer_features')}) |",
        f"| embedding parameters | {o['embedding_parameters']:,} | {f['embedding_parameters']:,} | "
        f"x{d['embedding_parameters_ratio']:.3f} ({ok('fewer_embedding_parameters')}) |",
        f"| test AUC | {o['test_auc']:.4f} | {f['test_auc']:.4f} | {d['test_auc']:+.4f} {_interval_text(c)}"
        f"(not more than {TARGETS['test_auc_within']} below: {ok('test_auc_within')}) |",
        f"| test log loss | {o['test_logloss']:.4f} | {f['test_logloss']:.4f} | {d['test_logloss']:+.4f} |",
        f"| export size (KB) | {o['export_bytes'] / 1024:,.0f} | {f['export_bytes'] / 1024:,.0f} | "
        f"x{d['export_bytes_ratio']:.2f} |",
    ]
    for b, ratio in d["latency_ratio"].items():
        lo, lf = o["latency_ms"][b], f["latency_ms"][b]
        lines.append(f"| latency batch {b}, median / p90 (ms) | {lo['median']:.3f} / {lo['p90']:.3f} | "
                     f"{lf['median']:.3f} / {lf['p90']:.3f} | x{ratio:.2f} |")
    lines += [
        f"| parity, max abs(eager - exported) | {o['parity_max_abs_diff']:.1e} | {f['parity_max_abs_diff']:.1e} | |",
        "",
        f"Kept features: {', '.join(f['features'])}; dropped: "
        f"{', '.join(sorted(set(o['features']) - set(f['features']))) or 'none'}.  ",
        f"Final dims: {', '.join(f'{k}={v}' for k, v in f['dims'].items())}.",
        "",
        "## What each stage decided",
        "",
    ]
    r = result["stages"]
    if "quality" in r:
        lines.append(f"- quality: {len(r['quality']['kept'])} features pass the gates; dropped: "
                     f"{r['quality']['dropped'] or 'none'}")
    if "screening" in r:
        lines.append(f"- OutRank screening: kept {len(r['screening']['kept'])}; dropped: {r['screening']['dropped'] or 'none'}")
    if "selection" in r:
        s = r["selection"]
        cs = s["curve"]
        lines.append(f"- {s['method']} selection curve: AUKC {cs['aukc']:.4f} vs random {cs['random_aukc_mean']:.4f}; "
                     f"all-screened test AUC {cs['full_test_auc']:.4f}; smallest k within {cs['tolerance']}: "
                     f"{cs['smallest_k_within_tolerance']} -> kept {s['k']}")
    if "dims" in r:
        m = r["dims"]
        lines.append(f"- {m['method']} dims: {m['parameters']:,} embedding parameters (budget {m['budget']:,} = "
                     f"{m['budget'] / max(m['uniform_parameters'], 1):.2f} x uniform-{m['uniform_dim']})")
    if "tuning" in r:
        t = r["tuning"]
        best = f"{t['best_value']:.4f}" if t["best_value"] is not None else "none"
        inc = f"{t['incumbent_val_auc']:.4f}" if t["incumbent_val_auc"] is not None else "n/a"
        lines.append(f"- {t['sampler']} tuning, {t['n_trials']} trials: best val AUC {best} vs the config's own "
                     f"hyperparameters {inc} -> final model uses the {t['chosen']} config")
    lines += ["", "| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {s['seconds']:.0f} |" for name, s in result["stage_seconds"].items()]
    lines += ["", "The HTML report of this run: [pipeline_report.html](pipeline_report.html)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="pipeline config (default: Frappe)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", default="pipeline", help="result file stem")
    args = parser.parse_args(argv)

    import json

    from experiments.pipeline import PipelineConfig, run_pipeline
    from experiments.pipeline.paths import portable_path, portable_paths
    from recsys.io import atomic_write_json, atomic_write_text
    from recsys.runtime import configure_logging

    configure_logging()  # the stages' progress lines
    config = PipelineConfig.load(args.config.resolve())
    out_dir = args.output_dir.resolve()
    start = time.perf_counter()
    with isolated_workdir("salience-pipeline-") as work:
        config.output = str(work / "pipeline")
        results = run_pipeline(config, restart=True)
        state = json.loads((work / "pipeline" / "pipeline_state.json").read_text())
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(results["report"]["report"], out_dir / f"{args.name}_report.html")
    pipeline_dir = work / "pipeline"  # deleted with the working folder: the JSON names paths relative to it
    result = {
        **result_header("pipeline", argv, False, TARGETS),
        "pipeline": config.name,
        "config": portable_path(args.config.resolve(), pipeline_dir),
        "paths": "relative to the repository, or to the pipeline's (temporary) output folder",
        "seconds": round(time.perf_counter() - start, 1),
        "stage_seconds": {name: {"seconds": s["seconds"]} for name, s in state["stages"].items()},
        "stages": portable_paths({k: v for k, v in results.items() if k not in ("compare", "report")}, pipeline_dir),
        "compare": portable_paths(results["compare"], pipeline_dir),
        "verdicts": verdicts(results["compare"]),
    }
    atomic_write_json(out_dir / f"{args.name}.json", result, default=str)
    md = to_markdown(result).replace("pipeline_report.html", f"{args.name}_report.html")
    atomic_write_text(out_dir / f"{args.name}.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
