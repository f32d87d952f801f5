"""Compression benchmark: embedding bytes against AUC for quantized exports (issue 19).

    python -m experiments.benchmarks.compress                          # Frappe, MovieLens, Criteo head-10k, synthetic; 3 seeds
    python -m experiments.benchmarks.compress --datasets frappe --seeds 1 --quick

Per dataset and seed: one ``salience fit`` of the dataset's DCNv2 config (tracking off), then the
trained model at every precision of :mod:`recsys.export.quantize` (fp32, fp16, int8, int4):
embedding bytes, validation and test AUC and log loss, the export (TorchScript folder) size, and
the exported model's latency at batch 1 and 1024 (median of 30 calls, every precision measured
side by side in the same process on the same rows). The precision a user would pick is chosen on
validation (the fewest bytes within ``--tolerance`` validation AUC of fp32) and its test AUC is
reported once. Writes ``experiments/results/compress.{json,md,png}``.

Not measured here, because they are not built yet: compositional (quotient-remainder)
embeddings, the hashing baseline and the combined byte-budget search (``salience compress``);
the result lists those targets as not measured.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.benchmarks._common import isolated_workdir, result_header

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
CONFIGS = {
    "frappe": "experiments/configs/frappe_dcnv2.yaml",
    "movielens": "experiments/configs/movielens_dcnv2.yaml",
    "criteo": "experiments/configs/criteo_dcnv2.yaml",
    "synthetic": "experiments/configs/synthetic_dcnv2.yaml",
}
PRECISIONS = ("fp32", "fp16", "int8", "int4")
TARGETS = {
    "int8_test_auc_within": 0.0005,
    "int8_bytes_ratio_about": 0.25,
    "latency_batch1_no_worse_than_fp32": True,
    "combined_search_bytes_ratio_at_most": 1 / 8,
}


def _summary(values: list[float]) -> dict[str, float]:
    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    return {"mean": mean, "std": std, "se": std / math.sqrt(n) if n else 0.0, "n": n}


def measure_seed(config: str, seed: int, quick: bool, work: Path, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """One fit, then every precision of the trained model (see the module docstring)."""
    from experiments.pipeline.stages import export_bytes, exported_latency
    from recsys.export import export_model, to_plain_kernel
    from recsys.export.quantize import embedding_bytes, quantize_model, resolve_precision
    from recsys.train.evaluation import evaluate
    from recsys.train.recipe import Recipe

    recipe = Recipe(ROOT / config, overrides, workdir=work / f"fit-{seed}", quiet=True, keep_checkpoints=False)
    start = time.perf_counter()
    fit = recipe.fit(seed=seed, tracking=False, max_epochs=1 if quick else None)
    fit_seconds = time.perf_counter() - start
    model = to_plain_kernel(fit.task.model.eval())
    dm = fit.datamodule
    val, test = dm.split_data("val"), dm.split_data("test")
    if val is None or test is None:
        raise ValueError(f"{config}: needs a validation and a test split")
    out: dict[str, Any] = {"seed": seed, "fit_seconds": round(fit_seconds, 1), "precisions": {}}
    exports = {}
    for p in PRECISIONS:
        plan = resolve_precision(model.sparse_arch, p)
        served = quantize_model(model, plan)
        export_dir = work / f"export-{seed}-{p}"
        export_model(model, dm.preprocessor, export_dir, precision=p)
        exports[p] = export_dir
        out["precisions"][p] = {
            "embedding_bytes": embedding_bytes(model.sparse_arch, plan),
            "val": evaluate(served, val),
            "test": evaluate(served, test),
            "export_bytes": export_bytes(export_dir),
        }
    sample = test if hasattr(test, "take") else dm.sample_rows("test", 4096)
    for p in PRECISIONS:  # side by side, after every export is written
        out["precisions"][p]["latency_ms"] = exported_latency(exports[p], sample, (1, 1024))
    return out


def choose_on_validation(seed_result: dict[str, Any], tolerance: float) -> str:
    """The fewest-bytes precision within ``tolerance`` validation AUC of fp32."""
    ps = seed_result["precisions"]
    ok = [p for p in PRECISIONS if ps[p]["val"]["auc"] >= ps["fp32"]["val"]["auc"] - tolerance]
    return min(ok, key=lambda p: ps[p]["embedding_bytes"])


def summarize(runs: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """Per precision over seeds: test AUC, its paired change against fp32, bytes and latency ratios."""
    out: dict[str, Any] = {}
    for p in PRECISIONS:
        rows = [r["precisions"][p] for r in runs]
        base = [r["precisions"]["fp32"] for r in runs]
        out[p] = {
            "test_auc": _summary([r["test"]["auc"] for r in rows]),
            "test_logloss": _summary([r["test"]["logloss"] for r in rows]),
            "val_auc": _summary([r["val"]["auc"] for r in rows]),
            "test_auc_change": _summary([r["test"]["auc"] - b["test"]["auc"] for r, b in zip(rows, base, strict=True)]),
            "bytes_ratio": rows[0]["embedding_bytes"] / max(base[0]["embedding_bytes"], 1),
            "embedding_bytes": rows[0]["embedding_bytes"],
            "export_bytes_ratio": _summary([r["export_bytes"] / max(b["export_bytes"], 1) for r, b in zip(rows, base, strict=True)]),
            "latency_ratio": {
                size: _summary([r["latency_ms"][size]["median"] / max(b["latency_ms"][size]["median"], 1e-9)
                                for r, b in zip(rows, base, strict=True)])
                for size in rows[0]["latency_ms"]
            },
        }
    chosen = [choose_on_validation(r, tolerance) for r in runs]
    out["chosen_on_validation"] = {
        "precisions": chosen,
        "test_auc_change": _summary([r["precisions"][c]["test"]["auc"] - r["precisions"]["fp32"]["test"]["auc"]
                                     for r, c in zip(runs, chosen, strict=True)]),
        "bytes_ratio": statistics.fmean(r["precisions"][c]["embedding_bytes"] / r["precisions"]["fp32"]["embedding_bytes"]
                                        for r, c in zip(runs, chosen, strict=True)),
    }
    return out


def verdicts(summary: dict[str, Any]) -> dict[str, str]:
    """The issue's precision targets on one dataset ("met", "NOT met", with the seed spread)."""
    int8 = summary["int8"]
    change = int8["test_auc_change"]
    within = abs(change["mean"]) <= TARGETS["int8_test_auc_within"] + change["se"]
    lat = int8["latency_ratio"]["1"]
    return {
        "int8_test_auc_within_0.0005": "met" if within else "NOT met",
        "int8_bytes_about_a_quarter": f"{int8['bytes_ratio']:.3f}x",
        "int8_latency_batch1_no_worse": "met" if lat["mean"] - 1.0 <= max(lat["se"], 0.0) else "NOT met",
        "combined_search_at_most_1/8": "not measured (QR, hashing and the byte-budget search are not built)",
    }


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Compression: embedding bytes against AUC (quantized FBGEMM tables)",
        "",
        f"Command: `{result['command'].strip()}`  ",
        f"Date: {result['date']}; hardware: {result['hardware']['cpu']} ({result['hardware']['cores']} cores), no GPU; "
        f"seeds: {result['seeds']}; choice tolerance on validation AUC: {result['tolerance']}.",
        "",
        "Each seed trains the dataset's DCNv2 config once; every precision quantizes that model's tables "
        "(post-training, per-row min-max with fp16 scale and bias for int8/int4). Changes are paired per seed; "
        "+/- is the standard error over seeds. Latency is the exported TorchScript model's call, every "
        "precision timed side by side.",
        "",
        "| dataset | precision | embedding bytes (x fp32) | test AUC | test AUC change | test log loss | "
        "export size (x fp32) | latency b=1 (x fp32) | latency b=1024 (x fp32) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in result["datasets"].items():
        s = d["summary"]
        for p in PRECISIONS:
            r = s[p]
            lines.append(
                f"| {name} | {p} | {r['embedding_bytes']:,} ({r['bytes_ratio']:.3f}) | {r['test_auc']['mean']:.4f} | "
                f"{r['test_auc_change']['mean']:+.5f} +/- {r['test_auc_change']['se']:.5f} | {r['test_logloss']['mean']:.4f} | "
                f"{r['export_bytes_ratio']['mean']:.3f} | {r['latency_ratio']['1']['mean']:.2f} | "
                f"{r['latency_ratio']['1024']['mean']:.2f} |"
            )
    lines += ["", "Chosen on validation (fewest bytes within the tolerance of fp32's validation AUC), test read once:", "",
              "| dataset | chosen per seed | bytes (x fp32) | test AUC change |", "|---|---|---:|---:|"]
    for name, d in result["datasets"].items():
        c = d["summary"]["chosen_on_validation"]
        lines.append(f"| {name} | {', '.join(c['precisions'])} | {c['bytes_ratio']:.3f} | "
                     f"{c['test_auc_change']['mean']:+.5f} +/- {c['test_auc_change']['se']:.5f} |")
    lines += ["", "Targets:", "", "| dataset | target | verdict |", "|---|---|---|"]
    for name, d in result["datasets"].items():
        lines += [f"| {name} | {k} | {v} |" for k, v in d["verdicts"].items()]
    lines += ["", "![bytes vs AUC](compress.png)"]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recsys.io import atomic_savefig

    names = list(result["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        s = result["datasets"][name]["summary"]
        xs = [s[p]["embedding_bytes"] / 1e6 for p in PRECISIONS]
        for split, marker in (("test_auc", "o"), ("val_auc", "s")):
            ys = [s[p][split]["mean"] for p in PRECISIONS]
            es = [s[p][split]["se"] for p in PRECISIONS]
            ax.errorbar(xs, ys, yerr=es, marker=marker, label=split.replace("_", " "), capsize=2)
        for p, x, y in zip(PRECISIONS, xs, [s[p]["test_auc"]["mean"] for p in PRECISIONS], strict=True):
            ax.annotate(p, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("embedding MB")
        ax.set_ylabel("AUC")
        ax.set_title(name)
        ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(CONFIGS), help=f"comma-separated, of {list(CONFIGS)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.001, help="validation AUC a cheaper precision may lose")
    parser.add_argument("--quick", action="store_true", help="one epoch per fit (a smoke run, not a result)")
    parser.add_argument("--override", action="append", default=[],
                        help="a `salience fit` argument applied to every fit, e.g. --override=--data.batch_size=512")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--datasets: unknown {unknown}; choose from {list(CONFIGS)}")

    from recsys.io import atomic_write_json, atomic_write_text

    result: dict[str, Any] = {**result_header("compress", argv, args.quick, TARGETS), "seeds": args.seeds,
                              "tolerance": args.tolerance, "datasets": {}}
    with isolated_workdir("salience-compress-") as work:
        for name in names:
            runs = []
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    runs.append(measure_seed(CONFIGS[name], seed, args.quick, Path(tmp), tuple(args.override)))
                print(f"{name} seed {seed}: " + ", ".join(
                    f"{p} test AUC {runs[-1]['precisions'][p]['test']['auc']:.4f}" for p in PRECISIONS), flush=True)
            summary = summarize(runs, args.tolerance)
            result["datasets"][name] = {"config": CONFIGS[name], "runs": runs, "summary": summary,
                                        "verdicts": verdicts(summary)}
    out = args.output_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "compress.json", result, default=str)
    md = to_markdown(result)
    atomic_write_text(out / "compress.md", md)
    plot(result, out / "compress.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
