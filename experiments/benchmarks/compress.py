"""Compression benchmark: embedding bytes against AUC for quantized tables, QR and hashed rows (issue 19).

    python -m experiments.benchmarks.compress                          # Frappe, MovieLens, Criteo head-10k, synthetic; 3 seeds
    python -m experiments.benchmarks.compress --datasets frappe --seeds 1 --quick

Per dataset and seed: ``salience fit`` of the dataset's DCNv2 config (tracking off) with full
tables, with every sparse dim halved (``half``, :func:`half_dims`), and with quotient-remainder
(``qr``) or hashed (``hash``, same rows) tables for the features of at least ``MIN_IDS`` ids
(:mod:`recsys.models.rows`); then every technique: precisions of :mod:`recsys.export.quantize`
on the full model (fp32, fp16, int8, int4), the half-dim model alone and at int4 (1/8 of the
uniform-16 fp32 bytes at dim 16), the row schemes alone and with int8. For each: embedding bytes, validation and test AUC and log loss,
the export (TorchScript folder) size, and the exported model's latency at batch 1 and 1024
(median of 30 calls, every technique measured side by side in one process on the same rows).
The technique a user would pick is chosen on validation (the fewest bytes within
``--tolerance`` validation AUC of fp32) and its test AUC is reported once. Writes
``experiments/results/compress.{json,md,png}``.

The ``budget`` technique is the combined search of ``salience compress --budget`` without a
checkpoint (:func:`embeddings.compression.layouts.choose_layout`): the per-table precision search on
validation AUC on every trained layout under ``--budget`` x the uniform-16 fp32 bytes, the
layout keeping the most validation AUC chosen. Its layouts are the four above plus those
:func:`embeddings.compression.layouts.layouts_for_budget` sizes for the budget (the widest uniform dim and
the mixed-dimension MDE dims that fit at int8 and at int4, and the dims and row schemes that
follow OutRank's ranking of the training split, :func:`embeddings.compression.layouts.importance_layout`;
one retraining each).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from embeddings.compression.layouts import MIN_IDS, Layout, layouts_for_budget, row_schemes
from embeddings.compression.precision import uniform_bytes
from experiments.benchmarks._common import hardware_text, isolated_workdir, result_header
from recsys.stats import Interval

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
CONFIGS = {
    "frappe": "experiments/configs/frappe_dcnv2.yaml",
    "movielens": "experiments/configs/movielens_dcnv2.yaml",
    "criteo": "experiments/configs/criteo_dcnv2.yaml",
    "synthetic": "experiments/configs/synthetic_dcnv2.yaml",
}
PRECISIONS = ("fp32", "fp16", "int8", "int4")
#: every technique measured: precisions of the full model, then row schemes alone and with int8
TECHNIQUES = (*PRECISIONS, "half", "half+int4", "qr", "hash", "qr+int8", "hash+int8", "budget")
#: the trained variants the techniques read: the config's tables, every sparse dim halved, QR and hashed rows
SCHEMES = ("full", "half", "qr", "hash")
TARGETS = {
    "int8_test_auc_within": 0.0005,
    "int8_bytes_ratio_about": 0.25,
    "latency_batch1_no_worse_than_fp32": True,
    "combined_search_bytes_ratio_at_most": 1 / 8,
}


def _summary(values: list[float]) -> dict[str, float]:
    """Mean, sample std, s.e. and the 95% t interval of the mean over seeds (``low``/``high``,
    NaN for one seed: :func:`recsys.stats.mean_interval`)."""
    from recsys.stats import mean_interval

    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    iv = mean_interval(values)
    return {"mean": mean, "std": std, "se": std / math.sqrt(n) if n else 0.0, "n": n, "low": iv.low, "high": iv.high}


def half_dims(schema: Any) -> dict[str, int]:
    """``data.embedding_dims`` with every sparse feature at half its dim, rounded down to a
    multiple of 4 (int4's row layout), at least 4: dim 16 -> 8, whose int4 rows (4 bytes of
    values, 4 of scale and bias) are 1/8 of the uniform-16 fp32 row."""
    return {f.name: max(4, f.embedding_dim // 2 // 4 * 4) for f in schema.sparse}


def _fit(recipe: Any, seed: int, quick: bool, extra: list[str]) -> tuple[Any, Any, float, int]:
    """The trained model (plain kernel, eval mode), its data, the fit's seconds and its epochs run."""
    from recsys.export import to_plain_kernel
    from recsys.models.base import SparseArch

    start = time.perf_counter()
    fit = recipe.fit(seed=seed, tracking=False, max_epochs=1 if quick else None, extra_args=extra)
    model = to_plain_kernel(fit.task.model.eval())
    if not isinstance(model.sparse_arch, SparseArch):
        raise ValueError(f"{recipe.config_path}: a model without embedding tables has nothing to compress")
    return model, fit.datamodule, time.perf_counter() - start, fit.epochs_run


def measure_seed(config: str, seed: int, quick: bool, work: Path, overrides: tuple[str, ...] = (),
                 techniques: tuple[str, ...] = TECHNIQUES, budget_fraction: float = 1 / 8) -> dict[str, Any]:
    """One fit per row scheme (full, and ``qr`` / ``hash`` when asked), then every technique of
    the trained models (see the module docstring)."""
    from experiments.pipeline.stages import export_bytes, exported_latency
    from recsys.data.encoders import EncodedData
    from recsys.export import export_model
    from recsys.export.quantize import embedding_bytes, quantize_model, resolve_precision
    from recsys.stats import delong
    from recsys.train.evaluation import evaluate, evaluate_with_scores
    from recsys.train.recipe import Recipe

    recipe = Recipe(ROOT / config, overrides, workdir=work / f"fit-{seed}", quiet=True, keep_checkpoints=False)
    out: dict[str, Any] = {"seed": seed, "fit_seconds": {}, "techniques": {}, "embedding_rows": {}}
    budget = int(budget_fraction * uniform_bytes(recipe.schema))
    layouts = {"full": Layout("full"), "half": Layout("half", dims=half_dims(recipe.schema)),
               "qr": Layout("qr", rows=row_schemes(recipe.schema, "qr")), "hash": Layout("hash", rows=row_schemes(recipe.schema, "hash"))}
    layouts = {n: x for n, x in layouts.items() if "budget" in techniques or any(_scheme_of(t) == n for t in techniques)}
    if "budget" in techniques:  # the dims the budget allows, where they differ from the four above
        known = [x.dims for x in layouts.values()]
        ranking = _importance_ranking(recipe)
        out["importance_ranking"] = ranking
        sized = layouts_for_budget(recipe.schema, budget, kinds=("uniform", "mde", "importance"), ranking=ranking)
        layouts |= {x.name: x for x in sized if x.dims not in known or x.rows}
    models = {}
    for name, layout in layouts.items():
        model, dm, seconds, epochs = _fit(recipe, seed, quick, layout.overrides())
        models[name] = model
        out["fit_seconds"][name] = round(seconds, 1)
        out.setdefault("epochs_run", {})[name] = epochs
        out["embedding_rows"][name] = dict(layout.rows)
        if layout.dims and name != "half":
            out.setdefault("embedding_dims", {})[name] = dict(layout.dims)
    val, test = dm.split_data("val"), dm.split_data("test")
    if val is None or test is None:
        raise ValueError(f"{config}: needs a validation and a test split")
    exports = {}
    scores: dict[str, Any] = {}
    for t in techniques:
        if t == "budget":
            model, plan, out["budget"] = _budget_search(models, budget, budget_fraction, val)
        else:
            model = models[_scheme_of(t)]
            plan = resolve_precision(model.sparse_arch, t.split("+")[-1] if t not in SCHEMES else "fp32")
        precision = plan.to_dict()
        served = quantize_model(model, plan)
        export_dir = work / f"export-{seed}-{t.replace('+', '-')}"
        export_model(model, dm.preprocessor, export_dir, precision=precision)
        exports[t] = export_dir
        test_metrics, labels, scores[t] = evaluate_with_scores(served, test)
        out["techniques"][t] = {
            "embedding_bytes": embedding_bytes(model.sparse_arch, plan),
            "val": evaluate(served, val),
            "test": test_metrics,
            "export_bytes": export_bytes(export_dir),
        }
    # DeLong on this seed's test rows: every technique against fp32, qr against hash, budget against each
    pairs = [(t, "fp32") for t in techniques if t != "fp32"]
    pairs += [("qr", "hash")] if {"qr", "hash"} <= set(techniques) else []
    pairs += [("budget", t) for t in techniques if "budget" in techniques and t != "budget"]
    out["paired"] = {f"{a} - {b}": delong(labels, scores[a], scores[b]).to_dict() for a, b in pairs}
    sample = test if isinstance(test, EncodedData) else dm.sample_rows("test", 4096)
    for t in techniques:  # side by side, after every export is written
        out["techniques"][t]["latency_ms"] = exported_latency(exports[t], sample, (1, 1024))
    return out


def _importance_ranking(recipe: Any) -> list[str]:
    """OutRank's ranking of the training split (model-free; the ``importance`` layouts follow it)."""
    from selection.model_free.outrank import OutRank

    report = OutRank().rank(recipe)
    return [f.feature for f in report.features] + sorted(report.excluded)


def _budget_search(models: dict[str, Any], budget: int, fraction: float, val: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The byte-budget search of ``salience compress`` (:func:`embeddings.compression.layouts.choose_layout`)
    on every trained layout: the one whose plan keeps the most validation AUC wins (layouts the
    budget cannot fit are skipped)."""
    from embeddings.compression.layouts import choose_layout

    choice = choose_layout(models, budget, val)
    record = {"fraction_of_uniform16": fraction, "budget_bytes": budget, "chosen_layout": choice.chosen,
              "val_auc": {k: r.val_auc for k, r in choice.results.items()}, "skipped": choice.skipped,
              "tables": choice.result.plan.to_dict(),
              "validation_passes": sum(r.evaluations for r in choice.results.values())}
    return models[choice.chosen], choice.result.plan, record


def _scheme_of(technique: str) -> str:
    head = technique.split("+")[0]
    return head if head in SCHEMES else "full"


def choose_on_validation(seed_result: dict[str, Any], tolerance: float) -> str:
    """The fewest-bytes technique within ``tolerance`` validation AUC of fp32."""
    ts = seed_result["techniques"]
    ok = [t for t in ts if ts[t]["val"]["auc"] >= ts["fp32"]["val"]["auc"] - tolerance]
    return min(ok, key=lambda t: ts[t]["embedding_bytes"])


def summarize(runs: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """Per technique over seeds: test AUC, its paired change against fp32, bytes and latency ratios."""
    out: dict[str, Any] = {}
    for t in runs[0]["techniques"]:
        rows = [r["techniques"][t] for r in runs]
        base = [r["techniques"]["fp32"] for r in runs]
        pairs = list(zip(rows, base, strict=True))
        out[t] = {
            "test_auc": _summary([r["test"]["auc"] for r in rows]),
            "test_logloss": _summary([r["test"]["logloss"] for r in rows]),
            "val_auc": _summary([r["val"]["auc"] for r in rows]),
            "test_auc_change": _paired(runs, t, "fp32"),
            "bytes_ratio": statistics.fmean(r["embedding_bytes"] / max(b["embedding_bytes"], 1) for r, b in pairs),
            "embedding_bytes": round(statistics.fmean(r["embedding_bytes"] for r in rows)),  # the budget's plans vary by seed
            "export_bytes_ratio": _summary([r["export_bytes"] / max(b["export_bytes"], 1) for r, b in pairs]),
            "latency_ratio": {
                size: _summary([r["latency_ms"][size]["median"] / max(b["latency_ms"][size]["median"], 1e-9) for r, b in pairs])
                for size in rows[0]["latency_ms"]
            },
        }
    chosen = [choose_on_validation(r, tolerance) for r in runs]
    out["chosen_on_validation"] = {
        "techniques": chosen,
        "test_auc_change": _chosen_change(runs, chosen),
        "bytes_ratio": statistics.fmean(r["techniques"][c]["embedding_bytes"] / r["techniques"]["fp32"]["embedding_bytes"]
                                        for r, c in zip(runs, chosen, strict=True)),
    }
    return out


def _chosen_change(runs: list[dict[str, Any]], chosen: list[str]) -> dict[str, Any]:
    """The test AUC change of each seed's validation choice against fp32, paired like :func:`_paired`."""
    return _change(runs, [(c, "fp32") for c in chosen])


def _paired(runs: list[dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    """``a - b`` in test AUC on every seed (see :func:`_change`)."""
    if a == b:
        return {"mean": 0.0, "std": 0.0, "se": 0.0, "n": len(runs), "low": 0.0, "high": 0.0, "method": "same"}
    return _change(runs, [(a, b)] * len(runs))


def _change(runs: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The test AUC difference ``a - b`` of each run's pair: DeLong's interval per seed on the same
    test rows combined over seeds (:func:`recsys.stats.over_seeds`) where every run kept it (a
    pair of one technique with itself is a zero difference), else the t interval over seeds."""
    from recsys.stats import Interval, over_seeds

    def kept(run: dict[str, Any], a: str, b: str) -> Interval | None:
        if a == b:
            return Interval(0.0, 0.0, 0.0, se=0.0)
        stored = run.get("paired", {}).get(f"{a} - {b}")
        return None if stored is None else Interval(**stored)

    per_seed = [kept(r, a, b) for r, (a, b) in zip(runs, pairs, strict=True)]
    if all(iv is not None for iv in per_seed):
        ivs = [iv for iv in per_seed if iv is not None]
        iv = over_seeds(ivs)
        return {"mean": iv.estimate, "std": statistics.stdev([x.estimate for x in ivs]) if len(ivs) > 1 else 0.0,
                "se": iv.se, "n": len(runs), "low": iv.low, "high": iv.high, "method": "delong per seed, over seeds"}
    return _summary([r["techniques"][a]["test"]["auc"] - r["techniques"][b]["test"]["auc"]
                     for r, (a, b) in zip(runs, pairs, strict=True)])


def _interval(change: dict[str, Any]) -> Interval:
    low, high = change.get("low"), change.get("high")
    return Interval(change["mean"], math.nan if low is None else low, math.nan if high is None else high)


def _ci(change: dict[str, Any]) -> str:
    """``+0.00120 [-0.00030, +0.00270] over 3 seeds``."""
    iv = _interval(change)
    ends = f"[{iv.low:+.5f}, {iv.high:+.5f}]" if math.isfinite(iv.low) else "no interval"
    return f"{iv.estimate:+.5f} {ends} over {change.get('n', '?')} seeds"


def within(change: dict[str, float], tolerance: float, both_ways: bool = False) -> str:
    """``met`` when the whole 95% interval of the mean test AUC change over seeds stays above
    ``-tolerance`` (with ``both_ways`` also below ``+tolerance``), ``NOT met`` when the whole
    interval is outside, else ``inconclusive``: the seeds cannot tell (one seed always is)."""
    iv = _interval(change)
    if iv.within(tolerance) if both_ways else iv.no_worse_than(tolerance):
        return "met"
    outside = iv.high < -tolerance or (both_ways and iv.low > tolerance)
    return "NOT met" if outside else "inconclusive (the interval reaches past the tolerance)"


def _latency_verdict(ratio: dict[str, Any]) -> str:
    """int8 / fp32 latency over seeds: ``met`` when the 95% interval of the mean ratio lies at or
    below 1, ``NOT met`` when above, else ``inconclusive``."""
    low, high = ratio.get("low"), ratio.get("high")
    text = f"x{ratio['mean']:.2f}"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return f"inconclusive (one seed: {text}, no interval)"
    text += f" [{low:.2f}, {high:.2f}] over {ratio.get('n', '?')} seeds"
    return f"{'met' if high <= 1.0 else 'NOT met' if low > 1.0 else 'inconclusive'} ({text})"


def verdicts(summary: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, str]:
    """The issue's targets on one dataset that these techniques can answer, each judged on the 95%
    interval over seeds of the per-seed difference (the same test rows; :mod:`recsys.stats`)."""
    out: dict[str, str] = {}
    if "int8" in summary:
        int8 = summary["int8"]
        change = int8["test_auc_change"]
        out["int8 within 0.0005 test AUC of fp32"] = (f"{within(change, TARGETS['int8_test_auc_within'], True)} "
                                                      f"({_ci(change)})")
        out["int8 bytes (target ~1/4)"] = f"{int8['bytes_ratio']:.3f}x"
        lat = int8["latency_ratio"]["1"]
        out["int8 latency at batch 1 no worse than fp32"] = _latency_verdict(lat)
    if "qr" in summary and "hash" in summary:
        d = _paired(runs, "qr", "hash")
        v = _interval(d).verdict()
        out["qr beats hashing at equal bytes"] = (f"{'met' if v == 'better' else 'tie' if v == 'tie' else 'NOT met'} "
                                                  f"(test AUC {_ci(d)} at {summary['qr']['bytes_ratio']:.3f}x)")
    for fixed in ("half+int4", "qr+int8"):
        if fixed not in summary:
            continue
        c = summary[fixed]
        ok = within(c["test_auc_change"], 0.001) if c["bytes_ratio"] <= TARGETS["combined_search_bytes_ratio_at_most"] else "NOT met"
        out[f"{fixed} at <= 1/8 bytes within 0.001 test AUC (a fixed combination, not the budget search)"] = (
            f"{ok} ({c['bytes_ratio']:.3f}x, {_ci(c['test_auc_change'])})")
    if "budget" in summary:
        c = summary["budget"]
        change = c["test_auc_change"]
        out[f"budget search at {c['bytes_ratio']:.3f}x fp32 within 0.001 test AUC"] = (
            f"{within(change, 0.001)} ({_ci(change)}; layouts chosen: "
            f"{', '.join(r['budget'].get('chosen_layout', r['budget'].get('chosen_scheme', '?')) for r in runs)})")
        single = [t for t in summary if t not in ("budget", "chosen_on_validation", "fp32")
                  and summary[t]["embedding_bytes"] <= c["embedding_bytes"] * 1.0001]
        beaten = [t for t in single if _interval(_paired(runs, "budget", t)).verdict() == "better"]  # paired by seed
        # the technique the search itself chose on every seed (the same model: nothing to beat)
        same = [t for t in single if t not in beaten and all(
            r["techniques"][t]["test"]["auc"] == r["techniques"]["budget"]["test"]["auc"] for r in runs)]
        out["budget search above every technique of no more bytes"] = (
            f"{'met' if set(beaten) | set(same) == set(single) else 'NOT met'} (beats {beaten or 'none'} of "
            f"{single or 'none'}{f'; the same model as {same}' if same else ''})")
    else:
        out["combined byte-budget search"] = "not measured in this run"
    return out


def _change_text(change: dict[str, Any]) -> str:
    """``+0.00120 [-0.00030, +0.00270]`` (the 95% interval), or ``+/- s.e.`` where there is none."""
    iv = _interval(change)
    if math.isfinite(iv.low) and math.isfinite(iv.high):
        return f"{iv.estimate:+.5f} [{iv.low:+.5f}, {iv.high:+.5f}]"
    return f"{iv.estimate:+.5f} +/- {change.get('se', math.nan):.5f}"


def _budget_note(result: dict[str, Any]) -> list[str]:
    """How long each dataset's fits trained (epochs run, from the runs that recorded them)."""
    lines = []
    for name, d in result["datasets"].items():
        epochs = [e for r in d["runs"] for e in (r.get("epochs_run") or {}).values() if e is not None]
        if epochs:
            lines.append(f"- {name}: `{d['config']}` with its early stopping on validation AUC"
                         f"{' and the overrides of its command' if '--override' in d.get('command', '') else ''}; "
                         f"epochs run per fit {min(epochs)}-{max(epochs)} (median {statistics.median(epochs):g}).")
        else:
            lines.append(f"- {name}: epochs not recorded by this run (see its command's overrides).")
    return ["Training budget per dataset:", "", *lines, ""]


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Compression: embedding bytes against AUC (quantized tables, QR and hashed rows)",
        "",
        f"Command: `{result['command'].strip()}`  ",
        f"Date: {result['date']}; hardware: {hardware_text(result['hardware'])}; "
        f"seeds: {result['seeds']}; choice tolerance on validation AUC: {result['tolerance']}.",
        *[f"Rows of {name} measured by `{d['command'].strip()}` (kept with `--merge`)."
          for name, d in result["datasets"].items() if d.get("command") and d["command"] != result["command"]],
        *([f"Verdicts recomputed from these measurements by `{result['rendered_by'].strip()}`."] if result.get("rendered_by") else []),
        "",
        "Each seed trains the dataset's DCNv2 config with full tables, with every sparse dim halved (half: 16 -> 8), "
        f"and (for qr / hash) once more with every "
        f"feature of at least {MIN_IDS} ids on quotient-remainder tables (m = ceil(sqrt(n)) buckets, sum) or on a "
        "hashed table of the same rows. Precisions quantize a trained model's tables after training (per-row "
        "min-max with fp16 scale and bias for int8/int4). Changes are paired against fp32 on the same test rows: "
        "DeLong's interval per seed combined over seeds (`recsys.stats.over_seeds`), brackets the 95% interval "
        "(runs that kept no per-row scores: the t interval over seeds). Latency is the exported TorchScript model's call, every technique timed side "
        "by side on the same rows. The budget search also trains the widest uniform dim, the mixed-dimension "
        "(MDE) dims and the importance layout (dims that follow OutRank's ranking of the training split, its "
        "lower half on quotient-remainder rows) that fit the budget at int8 and at int4 (`embeddings.compression.layouts`), "
        "and chooses among all layouts on validation AUC.",
        "",
        *_budget_note(result),
        "| dataset | technique | embedding bytes (x fp32) | test AUC | test AUC change | test log loss | "
        "export size (x fp32) | latency b=1 (x fp32) | latency b=1024 (x fp32) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in result["datasets"].items():
        s = d["summary"]
        for t in [k for k in s if k != "chosen_on_validation"]:
            r = s[t]
            lines.append(
                f"| {name} | {t} | {r['embedding_bytes']:,} ({r['bytes_ratio']:.3f}) | {r['test_auc']['mean']:.4f} | "
                f"{_change_text(r['test_auc_change'])} | {r['test_logloss']['mean']:.4f} | "
                f"{r['export_bytes_ratio']['mean']:.3f} | {r['latency_ratio']['1']['mean']:.2f} | "
                f"{r['latency_ratio']['1024']['mean']:.2f} |"
            )
    lines += ["", "Chosen on validation (fewest bytes within the tolerance of fp32's validation AUC), test read once:", "",
              "| dataset | chosen per seed | bytes (x fp32) | test AUC change |", "|---|---|---:|---:|"]
    for name, d in result["datasets"].items():
        c = d["summary"]["chosen_on_validation"]
        lines.append(f"| {name} | {', '.join(c['techniques'])} | {c['bytes_ratio']:.3f} | "
                     f"{_change_text(c['test_auc_change'])} |")
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
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        s = result["datasets"][name]["summary"]
        techniques = [k for k in s if k != "chosen_on_validation"]
        for split, marker in (("test_auc", "o"), ("val_auc", "s")):
            pts = sorted((s[t]["embedding_bytes"] / 1e6, s[t][split]["mean"], s[t][split]["se"], t) for t in techniques)
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker=marker, ls="none",
                        label=split.replace("_", " "), capsize=2)
            if split == "test_auc":
                front, best = [], -1.0
                for x, y, _, _ in pts:  # the bytes-AUC frontier: no cheaper point is better
                    if y > best:
                        front.append((x, y))
                        best = y
                ax.plot([p[0] for p in front], [p[1] for p in front], lw=1, alpha=0.6)
                for x, y, _, t in pts:
                    ax.annotate(t, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
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
    parser.add_argument("--techniques", default=",".join(TECHNIQUES), help=f"comma-separated, of {list(TECHNIQUES)}")
    parser.add_argument("--budget", type=float, default=1 / 8,
                        help="the budget technique's bytes, as a fraction of the uniform-16 fp32 embedding bytes")
    parser.add_argument("--quick", action="store_true", help="one epoch per fit (a smoke run, not a result)")
    parser.add_argument("--override", action="append", default=[],
                        help="a `salience fit` argument applied to every fit, e.g. --override=--data.batch_size=512")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--merge", action="store_true",
                        help="keep the datasets of the existing result that this run does not measure (each with its command)")
    parser.add_argument("--render", action="store_true",
                        help="measure nothing: recompute the verdicts of the existing compress.json and rewrite the markdown and plot")
    args = parser.parse_args(argv)
    if args.render:
        return _render(args.output_dir.resolve(), argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--datasets: unknown {unknown}; choose from {list(CONFIGS)}")
    techniques = tuple(t.strip() for t in args.techniques.split(",") if t.strip())
    if "fp32" not in techniques or set(techniques) - set(TECHNIQUES):
        parser.error(f"--techniques: include fp32 (the reference) and choose from {list(TECHNIQUES)}")

    from recsys.io import atomic_write_json, atomic_write_text

    result: dict[str, Any] = {**result_header("compress", argv, args.quick, TARGETS), "seeds": args.seeds,
                              "tolerance": args.tolerance, "datasets": {}}
    out = args.output_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    earlier: dict[str, Any] = {}
    if args.merge and (out / "compress.json").is_file():
        previous = json.loads((out / "compress.json").read_text())
        earlier = {k: {**v, "command": v.get("command", previous.get("command"))}
                   for k, v in previous.get("datasets", {}).items() if k not in names}

    def write() -> str:  # after every dataset: a stopped run keeps the datasets it finished
        result["datasets"] = {**earlier, **{k: v for k, v in result["datasets"].items() if k not in earlier}}
        atomic_write_json(out / "compress.json", result, default=str)
        md = to_markdown(result)
        atomic_write_text(out / "compress.md", md)
        plot(result, out / "compress.png")
        return md

    with isolated_workdir("salience-compress-") as work:
        for name in names:
            runs = []
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    runs.append(measure_seed(CONFIGS[name], seed, args.quick, Path(tmp), tuple(args.override), techniques,
                                             args.budget))
                print(f"{name} seed {seed}: " + ", ".join(
                    f"{t} test AUC {runs[-1]['techniques'][t]['test']['auc']:.4f}" for t in techniques), flush=True)
            summary = summarize(runs, args.tolerance)
            result["datasets"][name] = {"config": CONFIGS[name], "runs": runs, "summary": summary,
                                        "verdicts": verdicts(summary, runs), "command": result["command"]}
            write()
    print(write())
    return 0


def _render(out: Path, argv: list[str] | None) -> int:
    """The verdicts, markdown and plot of ``out/compress.json`` again, from its measurements."""
    from recsys.io import atomic_write_json, atomic_write_text

    path = out / "compress.json"
    if not path.is_file():
        raise SystemExit(f"--render: no {path} to render")
    result = json.loads(path.read_text())
    for d in result["datasets"].values():
        d["summary"] = summarize(d["runs"], float(result.get("tolerance", 0.001)))  # intervals added since
        d["verdicts"] = verdicts(d["summary"], d["runs"])
    result["rendered_by"] = "python -m experiments.benchmarks.compress " + " ".join(argv if argv is not None else sys.argv[1:])
    atomic_write_json(path, result, default=str)
    atomic_write_text(out / "compress.md", to_markdown(result))
    plot(result, out / "compress.png")
    print(f"rendered {out / 'compress.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
