"""Feature-selection benchmark (the ERASE table): every registered selector on planted truth,
an ID-like trap, selection curves on real data, and cost.

    python -m experiments.benchmarks.selection            # everything (needs SALIENCE_DATA_DIR)
    python -m experiments.benchmarks.selection --parts synthetic,trap --rows 1000000
    python -m experiments.benchmarks.selection --merge --parts synthetic_large --methods leap,outrank
    python -m experiments.benchmarks.selection --quick    # smoke run (not a result)

Every method of the registry (``selection.method_names()``; ``random`` is the curves' baseline)
runs with ``--seeds`` ranking seeds; a difference counts only when its 95% interval excludes zero: on
the curves, the AUKC difference on the same test rows (DeLong, ``FitCache.aukc_difference``) over the
ranking seeds (``recsys.stats.over_seeds``); elsewhere the difference of the means over seeds. Four parts, one JSON
(``experiments/results/selection.json``), one table (``.md``) and one plot per dataset:

1. **synthetic** (``recsys.data.synthetic.selection_benchmark_config`` at ``--rows`` rows: 40
   fields, 10 informative of which 2 are at their default in 99% of rows, 2 multi-hot and 2
   dense, plus 2 redundant copies and noise ID fields; embedding widths by cardinality, 4 to
   16): each method's precision of its top-10 against the planted informative set and its
   Spearman correlation with the planted strength. A redundant copy in the top-10 stands in for
   its source when the source is not there too (keeping either one keeps the information); the
   Spearman correlation runs over the 38 non-copy fields (informativeness = planted strength, 0
   for noise). LeAP's other regulariser is an ablation row. **synthetic_large** (not in the
   default parts) is the same at ``--large-rows`` rows (1M), for the methods one can afford there.
2. **trap** (the same layout at ``--trap-rows`` rows, so that the noise ID-like fields, with a
   distinct value in a large share of the training rows, can be memorised): how many ID-like
   noise fields each method puts in its top 10 (target: none for every learned selector).
3. **curves** (Frappe, MovieLens-100K CTR, Criteo head-10k): each method's selection curve
   (retrain the committed DCNv2 config on the top-k fields, every fit to its validation
   plateau) against random rankings, paired on the same test rows, validation
   and test AUKC, the smallest k within 0.001 of all fields (chosen on validation), and the
   ranking's cost in multiples of one all-fields training run (``selection.compare``).
4. **cost** (measured side by side in the same process): LeAP's one training run against a
   plain training run of the same epochs, permutation importance with R=5 against LeAP, on the
   39 Criteo fields; OutRank rows/s on Criteo.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from experiments.benchmarks._common import (
    epoch_budget,
    hardware_text,
    isolated_workdir,
    result_header,
)
from experiments.benchmarks._selection_cost import cost_lines, run_cost
from experiments.benchmarks._selection_verdicts import above_random, leap_verdict, seed_intervals
from recsys.io import atomic_savefig, atomic_write_text
from recsys.stats import Interval

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RESULTS = Path(__file__).resolve().parents[1] / "results"
#: methods that are not selectors of their own (``random`` is every curve's baseline)
BASELINES = ("random",)
#: model-free methods (the trap target is about what a model memorises)
MODEL_FREE = ("outrank",)
#: the issue's targets
TARGETS: dict[str, Any] = {
    "precision_at_10": {"leap": 1.0, "outrank": 1.0, "any": 0.9},
    "trap_id_fields_in_top10": 0,
    "leap_test_aukc": "best or tied with the best (95% interval of the difference) on every dataset; strictly best on >= 2",
    "leap_vs_plain_run_max": 1.5,
    "permutation_vs_leap_min": 5.0,
}

# -- the synthetic recipe ------------------------------------------------------------------------
#: DCNv2 on the 40-field layout; embedding L2 because the ID tables overfit after one epoch
#: without it (validation AUC 0.80 -> 0.70 by epoch 4)
SYNTHETIC_CONFIG: dict[str, Any] = {
    "seed_everything": 0,
    "trainer": {"max_epochs": 3},
    "model": {
        "backbone": {
            "class_path": "recsys.models.DCNv2",
            "init_args": {"cross_layers": 2, "deep_mlp": [256, 128], "dropout": 0.1, "batch_norm": True, "structure": "parallel"},
        },
        "embedding_kernel": "plain",
        "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.001}},
        "embedding_weight_decay": 0.01,
        "early_stopping_patience": 0,
    },
    "data": {
        "reader": {"class_path": "recsys.data.synthetic.SyntheticReader", "init_args": {}},
        "batch_size": 1024,
        "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 42},
    },
}
#: real-data curves: the committed configs, every fit to its validation plateau (early stopping on
#: validation AUC, the learning rate cut after one epoch without gain, patience 2), with larger
#: batches on Frappe and MovieLens; the epoch cap is a guard the table reports when a fit reaches it
_PLATEAU = ["--model.early_stopping_patience=2", "--model.lr_plateau_patience=1"]
CURVE_SETTINGS: dict[str, dict[str, Any]] = {
    "frappe": {"config": "frappe_dcnv2.yaml", "ks": [1, 2, 3, 4, 6, 8],
               "overrides": ["--trainer.max_epochs=40", "--data.batch_size=2048", "--model.optimizer.init_args.lr=0.002",
                             *_PLATEAU]},
    "movielens": {"config": "movielens_dcnv2.yaml", "ks": [1, 2, 3, 4, 6, 8],
                  "overrides": ["--trainer.max_epochs=40", "--data.batch_size=2048", "--model.optimizer.init_args.lr=0.002",
                                *_PLATEAU]},
    "criteo": {"config": "criteo_dcnv2.yaml", "ks": [2, 4, 8, 16, 24, 32],
               "overrides": ["--trainer.max_epochs=20", *_PLATEAU]},
}

#: --quick: a few training batches per fit (the numbers of a quick run are meaningless)
QUICK_LIMITS = ["--trainer.limit_train_batches=5"]
#: --quick: the curves of the smallest real dataset only
QUICK_CURVES = ("criteo",)


def method_list(only: str | None = None) -> list[str]:
    """Every registered selector (or the comma-separated ``only``), baselines left out."""
    from selection import method_names

    names = [n for n in method_names() if n not in BASELINES]
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise SystemExit(f"--methods: unknown {unknown}; known: {names}")
        names = wanted
    return names


def _methods(names: list[str], quick: bool, seed: int = 0) -> dict[str, Any]:
    """``names`` built with ``seed``, no MLflow run of their own and no progress bars."""
    from selection import get_method

    out: dict[str, Any] = {}
    for name in names:
        probe = get_method(name)
        options: dict[str, Any] = {k: v for k, v in {"seed": seed, "tracking": False, "progress": False}.items()
                                   if hasattr(probe, k)}
        if name == "permutation":
            options["repeats"] = 2 if quick else 5
        out[name] = get_method(name, **options)
    return out


class _Remembered:
    """A method whose last report is kept, for :class:`_Refused` rows to re-rank."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.last: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.method, name)

    def rank(self, recipe: Any) -> Any:
        self.last = self.method.rank(recipe)
        return self.last


class _Refused:
    """An ablation row of LeAP's fusion: the ``source`` row's report (ranked just before, on the
    same recipe) re-ranked under ``fusion`` without a second fit (``LeAP.refuse``)."""

    def __init__(self, source: _Remembered, fusion: Any, copies: bool = True) -> None:
        self.source = source
        self.fusion = fusion
        self.copies = copies

    def rank(self, recipe: Any) -> Any:
        if self.source.last is None:
            raise RuntimeError("the LeAP row must be ranked before its fusion ablations")
        return self.source.method.refuse(self.source.last, self.fusion, copies=self.copies)


def _leap_ablations(methods: dict[str, Any], seed: int, quick: bool, regularizer: bool = False,
                    validation_gates: bool = False, *, fields: int) -> None:
    """Add LeAP's alternatives to ``methods`` as ablation rows (``leap[...]``, after ``leap``):
    every other fusion of the gates with OutRank's relevance (``none``: the gates alone; not the
    one LeAP's ``auto`` resolves to at ``fields`` fields, which is ``leap`` itself) and the
    ranking without demoting copies (``copies=off``), re-ranking LeAP's own fit; with
    ``regularizer``, the other regulariser, and with ``validation_gates``, gates that step on
    validation batches (one gate step per two training steps), each a fit of its own."""
    from selection import LeAP, LeAPFusion, LeAPGateData, LeAPRegularizer

    if "leap" not in methods or quick:
        return
    default = methods["leap"]
    if default.fusion is not LeAPFusion.NONE:  # the other fusions re-rank the same fit
        methods["leap"] = source = _Remembered(default)
        same = {default.fusion, default.resolved_fusion(fields)}
        for fusion in LeAPFusion:
            if fusion not in same:
                methods[f"leap[fusion={fusion.value}]"] = _Refused(source, fusion)
        if default.copy_threshold > 0:
            methods["leap[copies=off]"] = _Refused(source, default.fusion, copies=False)
    if regularizer:
        other = (LeAPRegularizer.PENALTY_SCALING if default.regularizer is LeAPRegularizer.GRADIENT_NORMALIZATION
                 else LeAPRegularizer.GRADIENT_NORMALIZATION)
        methods[f"leap[{other.value}]"] = LeAP(seed=seed, tracking=False, regularizer=other)
    if validation_gates and default.gate_data is LeAPGateData.TRAIN:
        methods["leap[gate_data=validation]"] = LeAP(seed=seed, tracking=False, gate_data=LeAPGateData.VALIDATION,
                                                     controller_every=2)


def _default_fusion_row(fields: int) -> str:
    """The ablation row that would repeat ``leap`` at ``fields`` fields (its ``auto`` fusion)."""
    from selection import LeAP

    return f"leap[fusion={LeAP().resolved_fusion(fields).value}]"


def _synthetic_recipe(rows: int, epochs: int, workdir: Path) -> Any:
    from recsys.data.synthetic import selection_benchmark_config
    from recsys.train.recipe import Recipe

    cfg = json.loads(json.dumps(SYNTHETIC_CONFIG))
    init = selection_benchmark_config(n_rows=rows, seed=0, embedding_dim="by_cardinality").to_dict()
    cfg["data"]["reader"]["init_args"] = init
    cfg["trainer"]["max_epochs"] = epochs
    cfg["data"]["cache_dir"] = str(workdir / "cache")
    return Recipe(cfg, workdir=workdir, quiet=True, keep_checkpoints=False)


def _mean_std(values: list[float]) -> dict[str, Any]:
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if not len(arr):
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, "n": int(len(arr))}


def _planted_metrics(report: Any, truth: Any) -> dict[str, Any]:
    from scipy.stats import spearmanr

    informative = set(truth.names("informative", "sparse_informative"))
    copies = {f.name: f.source for f in truth.features if f.role.value == "redundant"}
    top = report.top_k(10)
    kept = set(top)
    hits = {n for n in top if n in informative}
    hits |= {copies[n] for n in top if n in copies and copies[n] not in kept}  # a copy stands in for its source
    ranked = {f.feature: f.score for f in report.features}
    names = [f.name for f in truth.features if f.name not in copies and f.name in ranked]
    strength = [truth[n].strength if n in informative else 0.0 for n in names]
    rho = float(spearmanr([ranked[n] for n in names], strength).statistic)
    return {
        "precision_at_10": len(hits) / 10,
        "spearman": rho,
        "top10": top,
        "missed": sorted(informative - hits),
        "excluded": report.excluded,
        "screening": _screening(report, truth),
    }


def _screening(report: Any, truth: Any) -> dict[str, Any] | None:
    """What the noise gate of a report that has one (OutRank's ``below_noise``, the pipeline's
    screening) drops on the planted truth: the signal fields (an interaction pair's included,
    where the layout plants one) must stay, the noise fields should go. None for a report
    without the gate."""
    if report.extras.get("below_noise") is None:
        return None
    dropped, pair = set(report.extras["below_noise"]), truth.names("interaction")
    noise = [n for n in truth.names("noise") if n in {f.feature for f in report.features}]
    return {"pair": pair, "pair_kept": all(n not in dropped for n in pair),
            "signal_dropped": sorted(dropped & set(truth.signal)), "noise_dropped": len(dropped & set(noise)),
            "noise_fields": len(noise)}


def run_synthetic(rows: int, epochs: int, workdir: Path, quick: bool, names: list[str], seeds: int,
                  folder: str = "synthetic") -> dict[str, Any]:
    """Planted truth: every method, ``seeds`` ranking seeds each (plus LeAP's other regulariser),
    its data and runs under ``workdir / folder``."""
    from recsys.data.synthetic import GroundTruth

    recipe = _synthetic_recipe(rows, epochs, workdir / folder)
    truth = GroundTruth.from_raw(recipe.raw_split("train"))
    out: dict[str, Any] = {"rows": rows, "epochs": epochs, "fields": len(recipe.schema), "seeds": seeds, "methods": {}}
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in range(seeds):
        methods = _methods(names, quick, seed)
        _leap_ablations(methods, seed, quick, regularizer=True, fields=len(recipe.schema.names))
        for name, method in methods.items():
            print(f"[selection] synthetic: {name} (seed {seed}) ...", flush=True)
            report = method.rank(recipe)
            m = _planted_metrics(report, truth)
            m["cost_seconds"] = round(report.cost_seconds, 2)
            m["seed"] = seed
            runs.setdefault(name, []).append(m)
            print(f"[selection] synthetic: {name} (seed {seed}): precision@10 {m['precision_at_10']:.2f}, "
                  f"Spearman {m['spearman']:.3f}, {m['cost_seconds']} s; missed {m['missed']}", flush=True)
    for name, rs in runs.items():
        missed = Counter(f for r in rs for f in r["missed"])
        out["methods"][name] = {
            "precision_at_10": _mean_std([r["precision_at_10"] for r in rs]),
            "spearman": _mean_std([r["spearman"] for r in rs]),
            "cost_seconds": _mean_std([r["cost_seconds"] for r in rs]),
            "missed": {f: c for f, c in missed.most_common()},
            "runs": [{k: r[k] for k in ("seed", "precision_at_10", "spearman", "cost_seconds", "top10", "missed",
                                        "screening")} for r in rs],
        }
    return out


def _screening_lines(syn: dict[str, Any]) -> list[str]:
    """The planted part's screening sentence (methods with a noise gate; target: the interaction
    pair kept, no signal field dropped)."""
    lines = []
    for name, m in syn["methods"].items():
        runs = [r["screening"] for r in m["runs"] if r.get("screening")]
        if not runs:
            continue
        kept = sum(r["pair_kept"] for r in runs)
        lost = sorted({f for r in runs for f in r["signal_dropped"]})
        pair = (f"the planted interaction pair ({' x '.join(runs[0]['pair'])}) kept on {kept} of {len(runs)} seeds; "
                if runs[0]["pair"] else "")
        lines.append(
            f"Screening ({name}'s noise gate, as the pipeline uses it): {pair}signal fields dropped: "
            f"{', '.join(lost) or 'none'}; noise fields dropped: "
            f"{', '.join(str(r['noise_dropped']) for r in runs)} of {runs[0]['noise_fields']} (per seed). "
            f"Target (no signal field dropped): {'met' if kept == len(runs) and not lost else 'NOT met'}.")
    return lines + [""] if lines else []


def run_trap(rows: int, epochs: int, workdir: Path, quick: bool, names: list[str], seeds: int) -> dict[str, Any]:
    """The planted layout on few rows: are the ID-like noise fields (single-valued categorical
    fields with a distinct value in at least 20% of the training rows) kept out of every
    method's top 10?"""
    from recsys.data.synthetic import GroundTruth

    recipe = _synthetic_recipe(rows, epochs, workdir / "trap")
    raw = recipe.raw_split("train")
    truth = GroundTruth.from_raw(raw)
    informative = set(truth.names("informative", "sparse_informative"))
    single = {f.name for f in raw.schema.features if f.kind.value == "categorical"}  # one id per row: can be an id
    noise = [f.name for f in truth.features if f.role.value == "noise" and f.name in single]
    distinct = {n: raw.frame[n].astype(str).nunique() / len(raw) for n in noise}
    id_like = sorted(n for n, share in distinct.items() if share >= 0.2)
    out: dict[str, Any] = {"rows": rows, "train_rows": len(raw), "epochs": epochs, "seeds": seeds,
                           "id_like": {n: round(distinct[n], 3) for n in id_like}, "methods": {}}
    for seed in range(seeds):
        for name, method in _methods(names, quick, seed).items():
            report = method.rank(recipe)
            top = report.top_k(10)
            rank = {f: i + 1 for i, f in enumerate(report.ranking)}
            trapped = [f for f in top if f in id_like]
            unscreened = [f for f in report.extras.get("unscreened_ranking", report.ranking)[:10] if f in id_like]
            entry = out["methods"].setdefault(name, {"runs": []})
            entry["runs"].append({"seed": seed, "id_like_in_top10": trapped, "unscreened_id_like_in_top10": unscreened,
                                  "screened": sorted(report.extras.get("memorisable") or {}),
                                  "best_id_like_rank": min((rank[f] for f in id_like if f in rank), default=None),
                                  "informative_in_top10": sum(f in informative for f in top)})
            print(f"[selection] trap: {name} (seed {seed}): ID-like in top 10: {trapped or '-'} "
                  f"(before the ID screen: {unscreened or '-'})", flush=True)
    for entry in out["methods"].values():
        entry["id_like_in_top10"] = _mean_std([len(r["id_like_in_top10"]) for r in entry["runs"]])
        entry["worst"] = max(len(r["id_like_in_top10"]) for r in entry["runs"])
        if all("unscreened_id_like_in_top10" in r for r in entry["runs"]):
            entry["unscreened_id_like_in_top10"] = _mean_std([len(r["unscreened_id_like_in_top10"]) for r in entry["runs"]])
    return out


def run_curves(dataset: str, workdir: Path, quick: bool, random_seeds: int, names: list[str], seeds: int,
               plot_path: Path | None) -> dict[str, Any]:
    """Every method's selection curve on ``dataset``, ``seeds`` ranking seeds, one shared fit cache;
    the first seed's curves plotted to ``plot_path`` (None: no plot)."""
    import matplotlib.pyplot as plt

    from recsys.train.recipe import Recipe
    from selection import FitCache
    from selection.compare import compare_methods

    s = CURVE_SETTINGS[dataset]
    overrides = list(s["overrides"]) + [f"--data.cache_dir={workdir / 'cache'}"]
    ks = curve_ks(dataset, quick)
    if quick:
        overrides += ["--trainer.max_epochs=1", *QUICK_LIMITS]
    recipe = Recipe(CONFIGS / s["config"], overrides, workdir=workdir / dataset, quiet=True, keep_checkpoints=False)
    cache = FitCache()
    load_start = os.getloadavg()[0]  # other jobs on the machine inflate the ranking-cost column
    start = time.perf_counter()
    per_seed = []
    for seed in range(seeds):
        print(f"[selection] {dataset}: ranking seed {seed}: {', '.join(names)}", flush=True)
        ranked = _methods(names, quick, seed)
        _leap_ablations(ranked, seed, quick, validation_gates=True, fields=len(recipe.schema.names))
        comparison = compare_methods(recipe, ranked, ks, random_seeds=range(random_seeds),
                                     tolerance=0.001, progress=False, cache=cache)
        for name, error in comparison.failed.items():
            print(f"[selection] {dataset}: {name} FAILED: {error}", flush=True)
        per_seed.append(comparison)
        if seed == 0 and plot_path is not None:
            fig = comparison.plot()
            atomic_savefig(fig, plot_path, dpi=110)
            plt.close(fig)
    first = per_seed[0]
    any_curve = next(iter(first.curves.values()))
    methods: dict[str, Any] = {}
    seed_rows = [{r["method"]: r for r in c.rows()} for c in per_seed]  # each seed's table once
    for name in [*names, *(n for n in first.curves if n not in names)]:  # ablation rows last
        rows = [by_method[name] for by_method in seed_rows if name in by_method]
        if not rows:
            methods[name] = {"failed": first.failed.get(name, "no result")}
            continue
        seeded = [c for c in per_seed if name in c.curves]
        methods[name] = {
            # per ranking seed, on the same test rows (DeLong contrast of the curves' fits)
            "test_aukc_vs_random": seed_intervals([c.aukc_difference(name) for c in seeded]),  # kept by rows()
            "test_aukc_vs_leap": None if name == "leap" else seed_intervals(
                [c.aukc_difference(name, "leap") for c in seeded if "leap" in c.curves]),
            "val_aukc": _mean_std([r["val_aukc"] for r in rows]),
            "test_aukc": _mean_std([r["test_aukc"] for r in rows]),
            "smallest_k": [r["smallest_k"] for r in rows],
            "rank_cost_seconds": _mean_std([r["rank_cost_seconds"] for r in rows]),
            "rank_cost_fits": _mean_std([r["rank_cost_fits"] for r in rows]),
            "top": rows[0]["top"],
            "ranking": first.reports[name].ranking if name in first.reports else None,
        }
    summary = any_curve.summary()
    epochs = [p.epochs for p in cache.points()]
    cap = epoch_budget(overrides)
    return {
        "ks": ks,
        "overrides": s["overrides"],
        "config": f"experiments/configs/{s['config']}",
        "seeds": seeds,
        "fits": cache.fits,
        "epochs": {"cap": int(cap) if cap else None, "min": min(epochs), "median": float(np.median(epochs)),
                   "max": max(epochs), "at_cap": sum(e >= int(cap) for e in epochs) if cap else 0},
        "seconds": round(time.perf_counter() - start, 1),
        "load_average": [round(load_start, 1), round(os.getloadavg()[0], 1)],
        "full": {"val_auc": summary["full_val_auc"], "test_auc": summary["full_test_auc"],
                 "seconds": round(any_curve.full.seconds, 2), "n_features": summary["n_features"]},
        "random": {"test_aukc": summary["random_aukc_mean"], "test_aukc_std": summary["random_aukc_std"],
                   "val_aukc": summary["random_val_aukc_mean"], "seeds": random_seeds},
        "methods": methods,
    }


def curve_ks(dataset: str, quick: bool = False) -> list[int]:
    """The k grid of ``dataset``'s curve (``--quick``: its first two ks)."""
    ks = CURVE_SETTINGS[dataset]["ks"]
    return ks[:2] if quick else ks


def check_mergeable(dataset: str, old: dict[str, Any] | None, seeds: int, quick: bool = False) -> None:
    """Refuse (before any fit) to merge some methods' rows into an earlier ``dataset`` curve
    measured with other ks, overrides or seeds."""
    s = CURVE_SETTINGS[dataset]
    ks = curve_ks(dataset, quick)
    if old and (old.get("ks"), old.get("overrides"), old.get("seeds")) != (ks, s["overrides"], seeds):
        raise SystemExit(f"--merge --methods: the earlier {dataset} curve has ks {old.get('ks')}, overrides "
                         f"{old.get('overrides')} and {old.get('seeds')} seeds, this run {ks}, {s['overrides']} "
                         f"and {seeds}: rerun every method, or match them")


def _pm(x: dict[str, Any], digits: int = 4) -> str:
    if not x or x.get("n", 0) == 0:
        return "-"
    return f"{x['mean']:.{digits}f}" + (f" +/- {x['std']:.{digits}f}" if x.get("n", 0) > 1 else "")


def _budget_note(curve: dict[str, Any]) -> list[str]:
    """Whether the curve's fits reached their validation plateaus: the epochs they ran against
    the cap; a curve measured without the epochs with a fixed epoch count says it is under that
    budget (every model compared under it, not at its plateau)."""
    run = curve.get("epochs")
    if run:
        reached = ("every fit stopped at its validation plateau (early stopping)" if run["at_cap"] == 0 else
                   f"**under budget: {run['at_cap']} of {curve['fits']} fits reached the {run['cap']}-epoch cap** "
                   "before their early stopping")
        return [f"Epochs per fit: {run['min']} to {run['max']} (median {run['median']:g}, cap {run['cap']}); {reached}.", ""]
    epochs = epoch_budget(curve.get("overrides", []))
    if not epochs:
        return []
    return [f"**Under budget: {epochs} epochs per fit** (many fits per curve), not trained to the validation plateau: "
            "the AUKCs and k compare models under that budget.", ""]


def _on(part: dict[str, Any], result: dict[str, Any]) -> str:
    """" on <hardware>" where a part kept with ``--merge`` was measured on other hardware than this run."""
    hw = part.get("hardware")
    return f" on {hardware_text(hw)}" if hw and hw != result.get("hardware") else ""


def _kept_rows(part: dict[str, Any]) -> str:
    """", rows of m1, m2 by `command`" for the rows a ``--merge`` run kept from earlier runs."""
    by_command: dict[str, list[str]] = {}
    for method, command in part.get("measured_by", {}).items():
        by_command.setdefault(command, []).append(method)
    return "".join(f"; rows of {', '.join(sorted(ms))} by `{c}`" for c, ms in by_command.items())


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Feature selection: the ERASE selectors on planted truth, an ID-like trap, real data, and cost",
        "",
        f"Command: `{result['command']}`  ",
        *([f"Earlier commands (parts kept with `--merge`): {', '.join(f'`{c}`' for c in result['earlier_commands'])}  "]
          if result.get("earlier_commands") else []),
        f"Date: {result['date']}; hardware: {hardware_text(result['hardware'])}; "
        f"torch {result['versions']['torch']}, torchrec {result['versions']['torchrec']}; wall time {result['seconds']} s.",
        "",
        "Every value is the mean over the ranking seeds +/- their standard deviation. A verdict says better/best "
        "only when the 95% interval of the difference excludes zero: on a curve measured with its fits' test scores, "
        "the AUKC difference on the same test rows over the ranking seeds; otherwise the seed spread.",
        "",
    ]
    if not result.get("complete", True):
        lines += ["**Incomplete run**: the parts below are those that finished before the run was stopped.", ""]
    for part in ("synthetic", "synthetic_large"):
        syn = result.get(part)
        if not syn:
            continue
        lines += [
            f"## Planted truth (synthetic, {syn['rows']:,} rows, {syn['fields']} fields, 10 informative; DCNv2, "
            f"{syn['epochs']} epochs; {syn['seeds']} seeds)",
            "",
            *(["The methods measured at this size (`--parts synthetic_large`); the others' cost there is in "
               "known-limitations.", ""] if part == "synthetic_large" else []),
            f"Measured by `{syn.get('command', result['command'])}`{_on(syn, result)}{_kept_rows(syn)}. "
            "Targets: precision@10 = 1.0 for LeAP and OutRank's combined relevance, >= 0.9 for every method.",
            "",
            "| method | precision@10 | target | Spearman vs planted strength | cost (s) | missed (seeds) |",
            "|---|---|---|---|---|---|",
        ]
        for name, m in sorted(syn["methods"].items(), key=lambda kv: -kv[1]["precision_at_10"]["mean"]):
            target = TARGETS["precision_at_10"].get(name, TARGETS["precision_at_10"]["any"])
            ok = "met" if m["precision_at_10"]["mean"] >= target else "NOT met"
            missed = ", ".join(f"{f} ({c})" for f, c in m["missed"].items()) or "-"
            lines.append(f"| {name} | {_pm(m['precision_at_10'], 2)} | {ok} | {_pm(m['spearman'], 3)} | "
                         f"{_pm(m['cost_seconds'], 1)} | {missed} |")
        lines.append("")
        lines += _screening_lines(syn)
    trap = result.get("trap")
    if trap:
        lines += [
            f"## ID-like trap (the same layout at {trap['rows']:,} rows, {trap['train_rows']:,} training rows; "
            f"{trap['seeds']} seeds)",
            "",
            "ID-like noise fields (distinct values / training rows): "
            + ", ".join(f"{n} ({v})" for n, v in trap["id_like"].items()) + ".",
            f"Target: no ID-like field in the top 10 of any learned selector. Measured by `{trap.get('command', result['command'])}`"
            f"{_on(trap, result)}{_kept_rows(trap)}. The learned selectors rank ID-like fields with no signal beyond chance "
            "on the training rows last (their `id_screen`, `selection.base.screen_memorisable`); the column "
            "before it counts them in the order the method's own scores gave.",
            "",
            "| method | ID-like fields in top 10 | worst seed | best rank of an ID-like field | verdict | "
            "ID-like in top 10 before the screen |",
            "|---|---|---|---|---|---|",
        ]
        for name, m in sorted(trap["methods"].items(), key=lambda kv: kv[1]["id_like_in_top10"]["mean"]):
            ranks = [r["best_id_like_rank"] for r in m["runs"] if r["best_id_like_rank"] is not None]
            learned = name not in MODEL_FREE
            ok = ("met" if m["worst"] == 0 else "NOT met") if learned else "(model-free)"
            before = _pm(m["unscreened_id_like_in_top10"], 2) if "unscreened_id_like_in_top10" in m else "-"
            lines.append(f"| {name} | {_pm(m['id_like_in_top10'], 2)} | {m['worst']} | {min(ranks) if ranks else '-'} | {ok} "
                         f"| {before} |")
        lines.append("")
    curves = result.get("curves", {})
    for dataset, c in curves.items():
        lines += [
            f"## Selection curves: {dataset} (`{c['config']}` with {' '.join(c['overrides'])}; k = {c['ks']}; "
            f"{c['seeds']} ranking seeds; {c['fits']} fits, {c['seconds']} s"
            + (f"; load average {c['load_average'][0]} at the start, {c['load_average'][1]} at the end)"
               if c.get("load_average") else ")"),
            "",
            f"![{dataset}](selection_{dataset}.png)",
            "",
            *([f"The plot shows the curves of `{c['plot_command']}` (first ranking seed).", ""] if c.get("plot_command") else []),
            *_budget_note(c),
            f"All {c['full']['n_features']} fields: validation AUC {c['full']['val_auc']:.4f}, test AUC "
            f"{c['full']['test_auc']:.4f}, one fit {c['full']['seconds']} s. Random rankings ({c['random']['seeds']} seeds): "
            f"validation AUKC {c['random']['val_aukc']:.4f}, test AUKC {c['random']['test_aukc']:.4f} +/- "
            f"{c['random']['test_aukc_std']:.4f}. k is chosen on validation; test is read once per model. "
            f"Measured by `{c.get('command', result['command'])}`{_on(c, result)}{_kept_rows(c)}.",
            "",
            "| method | validation AUKC | test AUKC | above random (test AUKC - random, 95% CI paired) | "
            "smallest k within 0.001 (validation) | "
            "ranking cost (fits) | top 5 |",
            "|---|---|---|---|---|---|---|",
        ]
        ordered = sorted(c["methods"].items(), key=lambda kv: -kv[1]["test_aukc"]["mean"] if "test_aukc" in kv[1] else 1.0)
        default_row = _default_fusion_row(c["full"]["n_features"])
        for name, m in ordered:
            if name == default_row:  # kept from a run that ranked LeAP's default fusion twice
                continue
            if "test_aukc" not in m:
                lines.append(f"| {name} | failed: {m.get('failed')} | | | | | |")
                continue
            above = above_random({"aukc": m["test_aukc"]["mean"], "random_aukc_mean": c["random"]["test_aukc"],
                                  "random_aukc_std": c["random"]["test_aukc_std"],
                                  "test_aukc_vs_random": m.get("test_aukc_vs_random")})
            lines.append(f"| {name} | {_pm(m['val_aukc'])} | {_pm(m['test_aukc'])} | {above} | {m['smallest_k']} | "
                         f"{_pm(m['rank_cost_fits'], 2)} | {', '.join(m['top'])} |")
        lines.append("")
    verdicts = result.get("leap_verdicts")
    if verdicts:
        strict = sum(v["verdict"] == "LeAP strictly best" for v in verdicts.values())
        behind = [d for d, v in verdicts.items() if v["verdict"] == "LeAP behind"]
        lines += [
            "## LeAP against the best other selector (test AUKC)",
            "",
            "| dataset | LeAP | best other | its AUKC | LeAP - best other (95% CI) | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for d, v in verdicts.items():
            diff = (f"{Interval(**v['difference']).text()} (paired, over seeds)" if "difference" in v else
                    f"{v['leap'] - v['best_other_aukc']:+.4f} +/- {1.96 * v['spread']:.4f} (seed spread, unpaired)")
            lines.append(f"| {d} | {v['leap']:.4f} | {v['best_other']} | {v['best_other_aukc']:.4f} | {diff} | {v['verdict']} |")
        lines += ["", f"Target (best or tied with the best everywhere, strictly best on >= 2): "
                  f"{'met' if not behind and strict >= 2 else 'NOT met'} (strictly best on {strict}; behind on {behind or 'none'}).", ""]
    cost = result.get("cost")
    if cost:
        lines += cost_lines(cost, cost.get("command", result["command"]), TARGETS, _on(cost, result))
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="synthetic,trap,curves,cost",
                        help="comma-separated: synthetic, synthetic_large, trap, curves, cost")
    parser.add_argument("--datasets", default="criteo,frappe,movielens", help="curves: comma-separated datasets")
    parser.add_argument("--methods", default=None, help="comma-separated registry names (default: every selector)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="synthetic rows")
    parser.add_argument("--large-rows", type=int, default=1_000_000,
                        help="rows of the synthetic_large part (the planted truth again, at the size of a real log)")
    parser.add_argument("--trap-rows", type=int, default=20_000, help="rows of the ID-like trap variant")
    parser.add_argument("--epochs", type=int, default=3, help="synthetic training epochs")
    parser.add_argument("--seeds", type=int, default=3, help="ranking seeds per method")
    parser.add_argument("--random-seeds", type=int, default=3, help="random rankings per curve")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="smoke run: small data, 1 epoch (not a result)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the parts (and curve datasets) of the existing result that this run does not redo")
    args = parser.parse_args(argv)

    import warnings

    warnings.filterwarnings("ignore")
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    names = method_list(args.methods)
    args.output_dir = args.output_dir.resolve()
    rows, trap_rows, epochs, seeds, rseeds = ((6_000, 4_000, 1, 1, 1) if args.quick else
                                             (args.rows, args.trap_rows, args.epochs, args.seeds, args.random_seeds))
    start = time.perf_counter()
    result: dict[str, Any] = result_header("selection", argv, args.quick, TARGETS)
    result["methods"] = names
    result["complete"] = False  # set when every part has run
    name = "selection_quick" if args.quick else "selection"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    previous_path = args.output_dir / f"{name}.json"
    #: the result file when this run started (a redone part keeps its other methods' rows from it)
    previous: dict[str, Any] = json.loads(previous_path.read_text()) if args.merge and previous_path.is_file() else {}
    redone: set[str] = set()  # the parts ("curves:<dataset>" for a curve) this run has measured

    def merge_file() -> None:
        """With ``--merge``: take every part (and curve dataset) of the result file that this run
        has not redone, re-read at each write, so runs of different parts can share the file."""
        if not (args.merge and previous_path.is_file()):
            return
        current = json.loads(previous_path.read_text())
        earlier = [*previous.get("earlier_commands", []), previous.get("command"),
                   *current.get("earlier_commands", []), current.get("command")]
        result["earlier_commands"] = list(dict.fromkeys(c for c in earlier if c and c != result["command"]))
        for part in ("synthetic", "synthetic_large", "trap", "cost"):
            if part in current and part not in redone:
                result[part] = current[part]
                result[part].setdefault("command", current.get("command"))
        for dataset, c in current.get("curves", {}).items():
            if f"curves:{dataset}" not in redone:
                result.setdefault("curves", {})[dataset] = c | {"command": c.get("command", current.get("command"))}
        if result.get("curves"):
            result["leap_verdicts"] = leap_verdict(result["curves"])

    merge_file()
    from recsys.io import atomic_write_json

    def write() -> str:  # after every part: a run stopped early still leaves what it finished
        merge_file()
        result["seconds"] = round(time.perf_counter() - start, 1)
        atomic_write_json(args.output_dir / f"{name}.json", result)
        md = to_markdown(result).replace("(selection_", f"({name}_")
        atomic_write_text(args.output_dir / f"{name}.md", md)
        return md

    def keep_rows(new: dict[str, Any], old: dict[str, Any], redone: Callable[[str], bool]) -> None:
        """Copy into ``new`` the rows of ``old`` whose method this run has not ``redone``, each
        with the command that measured it (``measured_by``)."""
        measured_by = new.setdefault("measured_by", {})
        for method, row in old["methods"].items():
            if not redone(method):
                new["methods"][method] = row
                measured_by[method] = old.get("measured_by", {}).get(method, old.get("command", previous.get("command")))

    def keep_other_methods(part: str) -> None:
        """With ``--merge`` and ``--methods``, a redone part keeps the earlier rows of the methods
        this run does not redo (same rows and seeds only), each with the command that measured it."""
        old = previous.get(part) if args.merge and previous_path.is_file() else None
        if not old or any(old.get(k) != result[part].get(k) for k in ("rows", "seeds", "epochs")):
            return
        keep_rows(result[part], old, set(result[part]["methods"]).__contains__)

    def keep_other_curve_methods(dataset: str, old: dict[str, Any]) -> None:
        """With ``--merge`` and ``--methods``, a redone curve keeps the earlier rows of the methods
        this run does not redo (their ablation rows ``m[...]`` included; the earlier curve has the
        same ks, overrides and seeds: :func:`check_mergeable`); with ``--random-seeds 0`` it keeps
        the earlier random rankings too. Each kept row names the command that measured it."""
        new = result["curves"][dataset]
        new["plot_command"] = old.get("plot_command", old.get("command", previous.get("command")))
        keep_rows(new, old, lambda method: method.split("[")[0] in names)  # m[...]: an ablation row of m
        if "leap" in names:  # the kept rows were paired with the earlier LeAP's fits
            for method in new["measured_by"]:
                new["methods"][method].pop("test_aukc_vs_leap", None)
        if not new["random"]["seeds"]:
            new["random"] = old["random"]

    stamp = {"command": result["command"], "hardware": result["hardware"]}  # each part names its run
    with isolated_workdir("salience-selection-") as work:
        if "synthetic" in parts:
            result["synthetic"] = run_synthetic(rows, epochs, work, args.quick, names, seeds) | stamp
            redone.add("synthetic")
            keep_other_methods("synthetic")
            write()
        if "synthetic_large" in parts:
            result["synthetic_large"] = run_synthetic(
                2 * rows if args.quick else args.large_rows, epochs, work, args.quick, names, seeds,
                folder="synthetic_large") | stamp
            redone.add("synthetic_large")
            keep_other_methods("synthetic_large")
            write()
        if "trap" in parts:
            result["trap"] = run_trap(trap_rows, epochs, work, args.quick, names, seeds) | stamp
            redone.add("trap")
            keep_other_methods("trap")
            write()
        if "curves" in parts:
            result.setdefault("curves", {})
            datasets = list(QUICK_CURVES) if args.quick else [d.strip() for d in args.datasets.split(",") if d.strip()]
            # the earlier curves a run of some methods merges into (checked before any fit)
            merging = args.merge and args.methods
            earlier = {d: (previous.get("curves") or {}).get(d) for d in datasets} if merging else {}
            for dataset, old in earlier.items():
                check_mergeable(dataset, old, seeds, args.quick)
            for dataset in datasets:
                old = earlier.get(dataset)
                plot = args.output_dir / f"{name}_{dataset}.png"
                # a run of some methods merged into an earlier curve leaves that curve's plot as it was
                result["curves"][dataset] = run_curves(dataset, work, args.quick, rseeds, names, seeds,
                                                       None if old else plot)
                result["curves"][dataset].update(stamp)
                if old:
                    keep_other_curve_methods(dataset, old)
                redone.add(f"curves:{dataset}")
                result["leap_verdicts"] = leap_verdict(result["curves"])
                write()
        if "cost" in parts:
            settings = CURVE_SETTINGS["criteo"]
            result["cost"] = run_cost(CONFIGS / settings["config"], work, args.quick, QUICK_LIMITS) | stamp
            redone.add("cost")
    result["complete"] = all(p in result for p in ("synthetic", "trap", "curves", "cost")) and (
        args.quick or set(result["curves"]) >= set(CURVE_SETTINGS))
    md = write()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
