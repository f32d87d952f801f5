"""The wide benchmark: thousands of heterogeneous, mostly-default features (issue 37).

    python -m experiments.benchmarks.wide                                 # every part (hours on 2 cores)
    python -m experiments.benchmarks.wide --parts rank --features 100     # one part, one width
    python -m experiments.benchmarks.wide --merge --parts curves          # redo a part, keep the rest
    python -m experiments.benchmarks.wide --quick                         # smoke run (not a result)

The data is the wide generator's (:mod:`recsys.data.synthetic.wide`): sparse statistical scalars at 0.0 in
90-99.5% of rows, ids of 2 to 100k values, embedding vectors of width 8-64, a planted signal set
(ids, common and rare scalars, vectors), a pair that matters only jointly, exact and near copies,
noise; F = 100, 1,000 and 5,000 features at a fixed ``--rows`` (50,000: at F = 5,000 one fit of
the wide DCNv2 takes minutes on 2 cores, and the selection curves need dozens). Parts, one JSON
(``experiments/results/wide.json``), one table (``.md``) and one plot (``.png``):

1. **rank**: every registered selector ranks each width once (seed 0), each in its own process
   (its peak RSS is its own): recall of the planted signal at |signal| (a copy in the top stands
   in for its source), whether copies are demoted (no copied pair has both members in the top),
   the ranking's cost in seconds and in multiples of one plain training run of the same recipe
   (run in its own process at the same width, just before), peak RSS, or the refusal's message.
   LeAP's other fusions re-rank its fit for free (ablation rows); LeAP's bi-level mode (the
   authors' code: gates stepped on validation batches) is a row of its own.
2. **io**: ``salience quality`` and ``salience rank --method outrank`` on the raw Parquet file
   of each width (peak RSS), and at F = 1,000 and ``--io-rows`` (200,000) rows OutRank's full
   ranking against its relevance alone (alternating runs, median).
3. **throughput**: training samples/s of the wide DCNv2 step against F, fused and plain kernel
   (interleaved), and the share of the step at F = 1,000 that is per-feature overhead (lookups,
   seam, batching) against the dense arch's arithmetic (profile), with the backbone's FLOPs.
4. **curves** (F = 1,000): selection curves of LeAP, the gate-based baselines (AutoField, AdaFS,
   LPFS, OptFS) and OutRank over two ranking seeds: input dimensions removed at the k chosen on
   validation, and the test-AUC change there against the all-features model on the same test
   rows (over the seeds: "no loss" is a tie or better by the benchmarks' verdict rule).
5. **pipeline** (F = 1,000): ``salience pipeline`` end to end; whether screening keeps the pair.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.benchmarks._common import result_header
from experiments.benchmarks._wide_report import dims_verdict
from recsys.io import atomic_write_text
from recsys.runtime import process_peak_rss_mb

RESULTS = Path(__file__).resolve().parents[1] / "results"
PARTS = ("rank", "io", "throughput", "curves", "pipeline")
TARGETS: dict[str, Any] = {
    "every_selector_at_5000": "completes, or refuses at once naming its cost; nothing killed for memory",
    "peak_rss_gb_at_5000": 8.0,  # quality, rank --method outrank, fit, LeAP
    "leap_recall_at_5000": 0.95,
    "leap_dims_removed_vs_best_gate_baseline": 2.0,
    "leap_cost_runs_at_5000": 1.5,
    "pipeline_keeps_the_pair": True,
    "outrank_full_vs_relevance_at_1000": 2.0,
    "per_feature_overhead_share_at_1000": 0.25,
}
#: the gate-based baselines of the dims target (the LeAP paper's comparison)
GATE_BASELINES = ("autofield", "adafs", "lpfs", "optfs")
#: the selectors with selection curves
CURVE_METHODS = ("leap", *GATE_BASELINES, "outrank")
#: LeAP's fusions re-ranked from its own fit (ablation rows; those reading held-out drops only
#: where the fit measured them: up to 64 fields)
LEAP_ABLATIONS = ("none", "sum", "relevance_heldout", "heldout")


# -- data and recipe -----------------------------------------------------------------------------
def data_file(root: Path, features: int, rows: int, fmt: str = "parquet") -> Path:
    """The wide dataset of ``features`` x ``rows`` under ``root`` (written once, reused)."""
    from recsys.data.synthetic.wide import WideConfig, write_wide

    path = root / f"wide{features}x{rows}.{fmt}"
    if not path.exists() or not path.with_name(f"{path.name.split('.')[0]}.truth.json").exists():
        write_wide(WideConfig(n_features=features, n_rows=rows, seed=0), path)
    return path


def _companion(path: Path, suffix: str) -> Path:
    return path.with_name(f"{path.name.split('.')[0]}{suffix}")


def wide_config(path: Path, cache: Path, epochs: int, quick: bool = False) -> dict[str, Any]:
    """The wide recipe: a low-rank DCNv2 (the input is thousands of dimensions wide) on streamed
    shards (bounded memory at any width), batch 512, early stopping after one flat epoch."""
    return {
        "seed_everything": 0,
        "trainer": {"max_epochs": epochs, "enable_progress_bar": False, "enable_model_summary": False,
                    **({"limit_train_batches": 4, "limit_val_batches": 2} if quick else {})},
        "model": {
            "backbone": {"class_path": "recsys.models.DCNv2",
                         "init_args": {"cross_layers": 2, "low_rank": 64, "deep_mlp": [256, 128], "structure": "parallel"}},
            "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.001}},
            "early_stopping_patience": 1,
        },
        "data": {
            "reader": {"class_path": "recsys.data.readers.TabularReader",
                       "init_args": {"path": str(path), "schema": str(_companion(path, ".schema.yaml"))}},
            "batch_size": 512,
            "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 42},
            "streaming": True,
            "cache_dir": str(cache),
        },
    }


#: the rank part's extra rows: a selector with options (``name:key=value``), e.g. LeAP's bi-level mode
VARIANTS = ("leap:gate_data=validation",)


def _method(spec: str, seed: int, quick: bool) -> Any:
    """A selector from ``name`` or ``name:key=value,...`` (options as YAML scalars)."""
    import yaml

    from selection import get_method

    name, _, extra = spec.partition(":")
    probe = get_method(name)
    options = {k: v for k, v in {"seed": seed, "tracking": False, "progress": False}.items() if hasattr(probe, k)}
    if name == "permutation":
        options["repeats"] = 2 if quick else 5
    for item in filter(None, extra.split(",")):
        key, _, value = item.partition("=")
        options[key] = yaml.safe_load(value)
    return get_method(name, **options)


# -- what a ranking is worth on the planted truth ----------------------------------------------
def planted_metrics(ranking: list[str], truth: Any) -> dict[str, Any]:
    """Recall of the planted signal at |signal| (a copy in the top stands in for its source) and
    the copied pairs with both members in the top (0: copies demoted)."""
    signal = set(truth.signal)
    k = len(signal)
    top = ranking[:k]
    kept = set(top)
    hits = (kept & signal) | {truth.sources[f] for f in kept if f in truth.sources and truth.sources[f] in signal}
    doubled = sorted(f for f, s in truth.sources.items() if f in kept and s in kept)
    return {"recall": len(hits) / k, "k": k, "missed": sorted(signal - hits), "copies_kept_twice": doubled,
            "copies_demoted": not doubled, "pair_in_top": sorted(set(truth.names("interaction")) & kept)}


# -- the worker: one ranking (or one plain fit) in a process of its own --------------------------
def _worker(args: argparse.Namespace) -> int:
    from recsys.data.synthetic.wide import WideTruth
    from recsys.train.recipe import Recipe
    from selection.base import WidthRefusal

    path = Path(args.data)
    work = Path(args.workdir)
    os.chdir(work)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
    truth = WideTruth.load(_companion(path, ".truth.json"))
    recipe = Recipe(wide_config(path, Path(args.cache), args.epochs, args.quick), workdir=work / "fits", quiet=True,
                    keep_checkpoints=False)
    out: dict[str, Any] = {"method": args.method, "features": truth.config.n_features, "seed": args.seed}
    t0 = time.perf_counter()
    try:
        if args.method == "fit":
            fit = recipe.fit(tracking=False, seed=args.seed)
            out.update(seconds=fit.seconds, test_auc=fit.metrics.get("test_auc"), best_val_auc=fit.metrics.get("best_val_auc"))
        elif args.method == "curve":
            out.update(_curve(recipe, Path(args.report), args.ks, truth))
        else:
            method = _method(args.method, args.seed, args.quick)
            report = method.rank(recipe)
            out.update(seconds=time.perf_counter() - t0, cost_seconds=report.cost_seconds,
                       fit_seconds=report.extras.get("fit_seconds"), **planted_metrics(report.ranking, truth),
                       dims=report.dimensions, excluded=report.excluded)
            report.save(work / "report.json")
            if args.method.partition(":")[0] == "leap":
                fusions = [f for f in LEAP_ABLATIONS if f in ("none", "sum") or "heldout" in report.extras]
                out["ablations"] = {fusion: planted_metrics(method.refuse(report, fusion).ranking, truth)
                                    for fusion in fusions}
                out.update(heldout_fields=report.extras.get("heldout_fields"), fusion=report.extras.get("fusion"))
    except WidthRefusal as e:  # a selector that refuses the width names its cost
        out.update(refused=str(e).splitlines()[0][:400], seconds=time.perf_counter() - t0)
    out["peak_rss_mb"] = process_peak_rss_mb()  # VmHWM: ru_maxrss would carry the parent's RSS over exec
    atomic_write_text(Path(args.out), json.dumps(out, indent=1, default=str))
    return 0


def _curve(recipe: Any, report_path: Path, ks: str, truth: Any) -> dict[str, Any]:
    from selection.curve import selection_curve
    from selection.report import ImportanceReport

    report = ImportanceReport.load(report_path)
    n = len(report)
    grid = sorted({min(int(k), n) for k in ks.split(",")} | {n})
    curve = selection_curve(recipe, report, grid, random_seeds=(), progress=False)
    return {"curve": curve.to_dict(), "summary": curve.summary()}


def work_dir(root: Path, data: Path, method: str, seed: int = 0) -> Path:
    """The folder of one worker's run (``method`` may carry options: ``leap:gate_data=validation``)."""
    return root / "work" / f"{data.stem}-{method.replace(':', '-').replace('=', '-').replace(',', '-')}-{seed}"


def _with_cost_runs(row: dict[str, Any], fit: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its cost in runs of the plain ``fit`` (when both are measured)."""
    if fit.get("seconds") and row.get("cost_seconds") is not None:
        row["cost_runs"] = row["cost_seconds"] / fit["seconds"]
    return row


def run_worker(root: Path, data: Path, method: str, *, seed: int = 0, epochs: int, quick: bool, timeout: int,
               report: Path | None = None, ks: str = "") -> dict[str, Any]:
    """One worker process; its JSON, or the error that ended it (a kill for memory shows as such)."""
    work = work_dir(root, data, method, seed)
    work.mkdir(parents=True, exist_ok=True)
    out = work / "result.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "experiments.benchmarks.wide", "--worker", "--method", method, "--data", str(data),
           "--cache", str(root / "cache"), "--workdir", str(work), "--out", str(out), "--seed", str(seed),
           "--epochs", str(epochs), *(["--quick"] if quick else []), *(["--report", str(report), "--ks", ks] if report else [])]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"method": method, "error": f"timed out after {timeout} s", "wall_seconds": timeout}
    wall = time.perf_counter() - t0
    if proc.returncode in (-15, 143):  # stopped from outside (SIGTERM): not measured, not a failure
        return {"method": method, "wall_seconds": wall, "interrupted": True, "error": f"exit {proc.returncode}: stopped"}
    if proc.returncode != 0 or not out.exists():
        killed = proc.returncode in (-9, 137)
        return {"method": method, "wall_seconds": wall,
                "error": ("killed (memory?) " if killed else f"exit {proc.returncode}: ") + proc.stderr.strip()[-600:]}
    result = json.loads(out.read_text())
    result["wall_seconds"] = wall
    if (work / "report.json").exists():
        result["report"] = str(work / "report.json")
    return result


# -- parts ---------------------------------------------------------------------------------------
def part_rank(root: Path, widths: list[int], rows: int, methods: list[str], epochs: int, quick: bool,
              timeout: int, reuse_fit: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in widths:
        data = data_file(root, f, rows)
        done = work_dir(root, data, "fit") / "result.json"
        if reuse_fit and done.exists():  # the plain fit of an earlier run of this width (the cost unit)
            fit = {**json.loads(done.read_text()), "reused": True}
        else:
            fit = run_worker(root, data, "fit", epochs=epochs, quick=quick, timeout=timeout)
        rows_f: dict[str, Any] = {"fit": fit}
        for m in methods:
            r = rows_f[m] = _with_cost_runs(run_worker(root, data, m, epochs=epochs, quick=quick, timeout=timeout), fit)
            print(f"F={f} {m}: " + (r.get("error") or r.get("refused") or
                  f"recall {r.get('recall'):.2f}, {r.get('cost_seconds', 0):.0f} s, {r.get('peak_rss_mb', 0):.0f} MB"),
                  flush=True)
        out[str(f)] = rows_f
    return out


def _measured(cmd: list[str], timeout: int) -> dict[str, Any]:
    """``cmd`` in a child of a small wrapper process: its wall time and its own peak RSS."""
    wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); p = subprocess.run(sys.argv[1:], "
               "capture_output=True, text=True); w = time.perf_counter() - t; "
               "print(p.returncode, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "sys.stderr.write(p.stderr[-600:])")
    proc = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, timeout=timeout)
    code, wall, rss = proc.stdout.split()[:3]
    return {"exit": int(code), "seconds": float(wall), "peak_rss_mb": int(rss) / 1024,
            **({"error": proc.stderr.strip()[-400:]} if int(code) else {})}


def part_io(root: Path, widths: list[int], rows: int, io_rows: int, timeout: int, repeats: int) -> dict[str, Any]:
    salience = [sys.executable, "-m", "experiments.cli"]
    out: dict[str, Any] = {}
    for f in widths:
        data = data_file(root, f, rows)
        args = [str(data), "--schema", str(_companion(data, ".schema.yaml")), "--label", "click", "--no-progress"]
        out[str(f)] = {
            "quality": _measured([*salience, "quality", *args, "--output", str(root / f"q{f}.json")], timeout),
            "outrank": _measured([*salience, "rank", "--method", "outrank", *args, "--output", str(root / f"o{f}.json")],
                                 timeout),
        }
        print(f"io F={f}: {out[str(f)]}", flush=True)
    if 1000 not in widths and (len(widths) > 1 or widths[0] > 1000):
        return out  # the full-vs-relevance timing is at F = 1,000 (or the one narrow width asked for)
    data = data_file(root, 1000 if 1000 in widths else widths[0], io_rows)
    args = [str(data), "--schema", str(_companion(data, ".schema.yaml")), "--label", "click", "--no-progress"]
    times: dict[str, list[float]] = {"relevance": [], "combined": []}
    for _ in range(repeats):  # alternating, so a slow spell of the machine hits both
        for ranking in times:
            r = _measured([*salience, "rank", "--method", "outrank", *args, "--option", f"ranking={ranking}",
                           "--output", str(root / f"or-{ranking}.json")], timeout)
            times[ranking].append(r["seconds"])
    ratio = [c / r for c, r in zip(times["combined"], times["relevance"], strict=True)]
    out["outrank_full_vs_relevance"] = {"rows": io_rows, "features": data.stem, "seconds": times,
                                        "ratio_median": float(np.median(ratio)), "ratios": ratio}
    return out


def part_throughput(widths: list[int], steps: int, repeats: int, batch: int) -> dict[str, Any]:
    from experiments.benchmarks._wide_throughput import profile_shares, samples_per_second

    out: dict[str, Any] = {"batch_size": batch, "per_width": {}}
    for f in widths:
        out["per_width"][str(f)] = samples_per_second(f, steps, repeats, batch)
        print(f"throughput F={f}: {out['per_width'][str(f)]['median']}", flush=True)
    at = 1000 if 1000 in widths else widths[0]
    out["profile"] = profile_shares(at, batch)
    out["profile_grouped"] = profile_shares(at, batch, kernel="grouped")
    return out


def part_curves(root: Path, rank: dict[str, Any], rows: int, ks: str, seeds: int, epochs: int, quick: bool,
                timeout: int, methods: Sequence[str] = CURVE_METHODS) -> dict[str, Any]:
    width = 1000 if not quick else min(int(f) for f in rank)
    data = data_file(root, width, rows)
    out: dict[str, Any] = {"features": width, "ks": ks, "methods": {}}
    for m in methods:
        runs = []
        for seed in range(seeds):
            ranked = run_worker(root, data, m, seed=seed, epochs=epochs, quick=quick, timeout=timeout)
            if "report" not in ranked:
                runs.append({"ranking": ranked})
                continue
            curve = run_worker(root, data, "curve", seed=seed, epochs=epochs, quick=quick, timeout=timeout * 4,
                               report=Path(ranked["report"]), ks=ks)
            runs.append({"ranking": {k: v for k, v in ranked.items() if k != "report"}, **curve})
        out["methods"][m] = {"runs": runs, **dims_verdict(runs)}
        print(f"curves {m}: {out['methods'][m].get('dims_removed_share')}", flush=True)
    return out


def part_pipeline(root: Path, rows: int, epochs: int, quick: bool, timeout: int) -> dict[str, Any]:
    from experiments.benchmarks._wide_throughput import pipeline_run

    data = data_file(root, 1000 if not quick else 100, rows)
    return pipeline_run(root, data, wide_config(data, root / "cache", epochs, quick), timeout)


# -- report --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="salience bench wide", description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--features", default="100,1000,5000", help="widths F")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--io-rows", type=int, default=200_000, help="rows of OutRank's full-vs-relevance timing")
    parser.add_argument("--methods", default=None, help="selectors of the rank part (default: every registered one)")
    parser.add_argument("--curve-methods", default=",".join(CURVE_METHODS),
                        help=f"selectors of the curves part (default: {','.join(CURVE_METHODS)})")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=2, help="ranking seeds of the curves")
    parser.add_argument("--ks", default="10,25,50,100,200,400", help="kept-feature counts of the curves")
    parser.add_argument("--timeout", type=int, default=5400, help="seconds one ranking may take")
    parser.add_argument("--root", default=".cache/wide-bench", help="data, shards and work folders")
    parser.add_argument("--output-dir", default=str(RESULTS))
    parser.add_argument("--merge", action="store_true", help="keep the parts of the committed result this run does not redo")
    parser.add_argument("--merge-from", action="append", default=[], metavar="FILE[:PART+PART]",
                        help="merge these parts (default: all) of another run's result file into this one (parts "
                        "run side by side with their own --output-dir); repeatable, later files win")
    parser.add_argument("--reuse-fit", action="store_true", help="rank part: take the plain fit (the cost unit) of an "
                        "earlier run of the same width instead of fitting again")
    parser.add_argument("--quick", action="store_true")
    # the worker's own arguments
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--method", "--data", "--cache", "--workdir", "--out", "--report"):
        parser.add_argument(name, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    from experiments.benchmarks._wide_report import render, save

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts: unknown {unknown}; parts are {list(PARTS)}")
    widths = [int(x) for x in args.features.split(",")]
    rows = args.rows
    if args.quick:
        widths, rows, args.io_rows, args.epochs, args.seeds, args.ks = [min(widths)], 2000, 2000, 1, 1, "5,10"
    root = Path(args.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    out_json = Path(args.output_dir) / ("wide_quick.json" if args.quick else "wide.json")
    result: dict[str, Any] = json.loads(out_json.read_text()) if args.merge and out_json.exists() else {}
    for part in PARTS:  # the parts kept from the committed result keep the command that made them
        if part in result and result.get("command") and part not in result.get("commands", {}):
            result.setdefault("commands", {})[part] = [portable_command(result["command"])]
    result.update(result_header("wide", argv, args.quick, TARGETS))
    result["command"] = portable_command(result["command"])
    result["rows"] = rows
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else _selectors()
    for spec in args.merge_from:
        path, _, only = spec.partition(":")
        other = json.loads(Path(path).read_text())
        wanted = [p for p in only.split("+") if p] or list(PARTS)
        _merge_parts(result, {k: v for k, v in other.items() if k not in PARTS or k in wanted})
    if "rank" in parts:
        ranked = part_rank(root, widths, rows, methods, args.epochs, args.quick, args.timeout, args.reuse_fit)
        if not args.merge:
            result.pop("rank", None)
        _merge_parts(result, {"rank": ranked})
    if "io" in parts:
        if not args.merge:
            result.pop("io", None)
        _merge_parts(result, {"io": part_io(root, widths, rows, args.io_rows, args.timeout, 1 if args.quick else 3)})
    if "throughput" in parts:
        result["throughput"] = part_throughput(widths, 3 if args.quick else 8, 1 if args.quick else 5, 512)
    if "curves" in parts:
        curve_methods = [m.strip() for m in args.curve_methods.split(",") if m.strip()]
        unknown = sorted(set(curve_methods) - set(CURVE_METHODS))
        if unknown:
            parser.error(f"--curve-methods: {unknown} have no curve worker; available: {','.join(CURVE_METHODS)}")
        result["curves"] = part_curves(root, result.get("rank", {str(widths[0]): {}}), rows, args.ks, args.seeds,
                                       args.epochs, args.quick, args.timeout, curve_methods)
    if "pipeline" in parts:
        result["pipeline"] = part_pipeline(root, rows, args.epochs, args.quick, args.timeout)
    _rank_from_curves(result)
    result["verdicts"] = render(result)["verdicts"]
    save(result, Path(args.output_dir), quick=args.quick, root=root)
    print(render(result)["markdown"])
    return 0


def portable_command(cmd: str) -> str:
    """``cmd`` without the options that name this machine's folders (``--output-dir``,
    ``--merge-from``, ``--root``)."""
    import shlex

    words, out, skip = shlex.split(cmd), [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("--output-dir", "--merge-from", "--root"):
            skip = True
            continue
        if not w.startswith(("--output-dir=", "--merge-from=", "--root=")):
            out.append(w)
    return " ".join(shlex.quote(w) for w in out)


def _merge_parts(result: dict[str, Any], other: dict[str, Any]) -> None:
    """``other``'s parts into ``result``: rankings per width and selector, the rest whole."""
    for part in PARTS:
        if part not in other:
            continue
        made_by = other.get("commands", {}).get(part) or ([other["command"]] if other.get("command") else [])
        made = result.setdefault("commands", {}).setdefault(part, [])
        for cmd in made_by:  # what made each part (several runs for the rank part)
            cmd = portable_command(cmd)
            if cmd not in made:
                made.append(cmd)
        if part == "rank":
            kept = result.setdefault("rank", {})
            for width, rows in other["rank"].items():
                kept[width] = {**kept.get(width, {}), **rows}
        elif part == "io":  # per width (and the full-vs-relevance timing)
            result["io"] = {**result.get("io", {}), **other["io"]}
        else:
            result[part] = other[part]


def _rank_from_curves(result: dict[str, Any]) -> None:
    """The curves part's seed-0 rankings (the same worker, seed and recipe as the rank part's)
    fill the rank table's rows its own run did not make, marked ``from_curves``."""
    curves = result.get("curves") or {}
    width = str(curves.get("features", ""))
    rows = result.get("rank", {}).get(width)
    if rows is None:
        return
    for m, c in curves.get("methods", {}).items():
        first = next((r["ranking"] for r in c.get("runs", []) if r.get("ranking", {}).get("seed") == 0), None)
        if m in rows or first is None:
            continue
        rows[m] = _with_cost_runs({**first, "from_curves": True}, rows.get("fit", {}))


def _selectors() -> list[str]:
    from selection import method_names

    return [*(n for n in method_names() if n != "random"), *VARIANTS]


if __name__ == "__main__":
    sys.exit(main())
