"""Generative-recommendation benchmark: SASRec vs the semantic-ID model under four token weightings.

    python -m experiments.benchmarks.generative              # the committed run (needs SALIENCE_DATA_DIR)
    python -m experiments.benchmarks.generative --datasets beauty --seeds 1
    python -m experiments.benchmarks.generative --quick      # smoke run on synthetic data (not a result)

For every dataset (Amazon Beauty and MovieLens-100K, leave-one-out, history 20) the semantic IDs are built
once (item attributes (TF-IDF -> SVD) concatenated with collaborative vectors (training
co-occurrence -> PPMI -> SVD) -> RQ-KMeans, 3 levels x 256 + a collision token) and
shared by every arm. For every seed, every arm trains for the same number of epochs with the
same batch size, picks its best epoch on NDCG@10 over a fixed subset of validation users, and is
tested on every user:

* **sasrec**: item-ID SASRec, full softmax (the reference every generative number is read against);
* **sid-plain**: the generative model with plain cross-entropy;
* **sid-front**: Front-Greater weighting (per-position information gain, entropy variant);
* **sid-frequency**: Frequency weighting (effective-number weights, beta 0.9);
* **sid-multi**: the multi-target objective (plain + front (entropy gain) + frequency, learnable
  weights with the regulariser, normalised mixture, curriculum pace with a 1,000-step time constant).

CPU budget (stated, the same for every arm): ``EPOCHS`` epochs of batch ``BATCH_SIZE`` on 2 cores;
the whole committed run takes about ``BUDGET_MINUTES`` minutes. Results: mean +/- std over seeds
of Recall@5/10 and NDCG@5/10, overall and for head vs tail items (tail = the least popular items
covering 20% of training interactions), training and evaluation seconds, the codebook
statistics, the issue's target verdicts computed from those numbers ("beats" and "improves" need
the difference to exceed the s.e. of the difference over seeds), and the published anchors
(TIGER, SASRec as reported in TIGER) printed beside ours. One JSON
(``experiments/results/generative.json``) and one table (``.md``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from generative.data import SequenceDataset

from experiments.benchmarks._common import (
    BETTER,
    TIE,
    isolated_workdir,
    result_header,
    spread_of_difference,
    verdict,
)
from recsys.io import atomic_write_text

RESULTS = Path(__file__).resolve().parents[1] / "results"
EPOCHS = 20
PATIENCE = 3
BATCH_SIZE = 256
BUDGET_MINUTES = 45
VAL_USERS = 2000
#: the generative model's size for the CPU budget (one position per history item, see SIDTransformer)
SID_MODEL: dict[str, Any] = {
    "d_model": 64, "heads": 4, "encoder_layers": 2, "decoder_layers": 1, "ff_dim": 256, "dropout": 0.1,
    "history_tokens": "item",
}
SID: dict[str, Any] = {"arch": {"class_path": "sid", "init_args": SID_MODEL}, "beam_size": 20}
#: arm -> GenerativeTask arguments
ARMS: dict[str, dict[str, Any]] = {
    "sasrec": {"arch": {"class_path": "sasrec", "init_args": {"dim": 64, "layers": 2, "heads": 2, "dropout": 0.2}}},
    "sid-plain": {**SID, "weighting": "plain"},
    "sid-front": {**SID, "weighting": {"class_path": "front", "init_args": {"gain": "entropy"}}},
    "sid-frequency": {**SID, "weighting": "frequency"},
    "sid-multi": {**SID, "weighting": {"class_path": "multi", "init_args": {"front_gain": "entropy"}}},
}
#: every arm: AdamW, linear warm-up then cosine decay over the run
COMMON: dict[str, Any] = {"optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 2e-3, "weight_decay": 0.01}},
                          "warmup_steps": 100}
#: published numbers to print next to ours (test split, leave-one-out)
ANCHORS = {
    "beauty": {
        "TIGER (paper)": {"recall@5": 0.0454, "ndcg@5": 0.0321, "recall@10": 0.0648, "ndcg@10": 0.0384},
        "SASRec (as reported in TIGER)": {"recall@5": 0.0387, "ndcg@5": 0.0249, "recall@10": 0.0605, "ndcg@10": 0.0318},
    },
    "toys": {
        "TIGER (paper)": {"recall@5": 0.0521, "ndcg@5": 0.0371, "recall@10": 0.0712, "ndcg@10": 0.0432},
    },
    "sports": {
        "TIGER (paper)": {"recall@5": 0.0264, "ndcg@5": 0.0181, "recall@10": 0.0400, "ndcg@10": 0.0225},
    },
}
#: SASRec on Beauty: 90% of the Recall@10 reported in TIGER (0.0605)
SASREC_RECALL_TARGET = 0.054
TARGETS: dict[str, Any] = {
    "sasrec_recall@10_on_beauty_at_least": SASREC_RECALL_TARGET,
    "multi_beats_plain_on": ["recall@10", "ndcg@10"],  # mean over seeds, per dataset
    "weighted_arm_improves_tail_recall@10": True,  # at least one of front/frequency/multi > plain
}
METRICS = ("recall@5", "ndcg@5", "recall@10", "ndcg@10", "recall@10_head", "recall@10_tail", "ndcg@10_tail")


def _data(dataset: str, quick: bool) -> Any:
    from generative.train import SequenceDataModule

    return SequenceDataModule(
        dataset=cast("SequenceDataset", dataset),  # one of generative.data.DATASETS (--datasets is checked)
        content="concat",
        codebook={"class_path": "rq-kmeans", "init_args": {"levels": 3, "codebook_size": 32 if quick else 256}},
        batch_size=BATCH_SIZE,
        eval_batch_size=512,
        val_users=None if quick else VAL_USERS,
    )


#: --quick: a few batches per fit and evaluation (the numbers of a quick run are meaningless)
QUICK_TRAIN_BATCHES, QUICK_EVAL_BATCHES = 5, 2


def run_arm(
    dm: Any, arm: str, seed: int, epochs: int, workdir: Path, quick: bool = False, patience: int = 0
) -> dict[str, Any]:
    """Train one arm for at most ``epochs`` (stopping after ``patience`` epochs without a better
    validation NDCG@10; 0 = never), keep its best validation epoch, test it on every user
    (``quick``: a few batches only, :data:`QUICK_TRAIN_BATCHES` and :data:`QUICK_EVAL_BATCHES`)."""
    import lightning.pytorch as pl

    from generative.mlflow_logging import GenerativeTracking
    from generative.train import GenerativeTask

    pl.seed_everything(seed, workers=True, verbose=False)
    options = {**COMMON, **ARMS[arm]}
    dm.shuffle_seed = seed
    task = GenerativeTask(**options, early_stopping_patience=patience)
    tracking = GenerativeTracking(run_name=f"{arm}-{dm.dataset_name}-seed{seed}")
    tracking.keep_open = True
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        num_sanity_val_steps=0,
        default_root_dir=str(workdir / "runs" / f"{dm.dataset_name}-{arm}-{seed}"),
        callbacks=[tracking],
        limit_train_batches=QUICK_TRAIN_BATCHES if quick else None,
        limit_val_batches=QUICK_EVAL_BATCHES if quick else None,
        limit_test_batches=QUICK_EVAL_BATCHES if quick else None,
    )
    start = time.perf_counter()
    trainer.fit(task, datamodule=dm)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    (test,) = trainer.test(task, datamodule=dm, ckpt_path="best", verbose=False, weights_only=True)
    test_seconds = time.perf_counter() - start
    tracking.finish()
    assert task.recommender is not None  # built by the fit
    params = sum(p.numel() for p in task.recommender.parameters())
    point: dict[str, Any] = {
        "arm": arm,
        "seed": seed,
        "train_seconds": round(train_seconds, 1),
        "test_seconds": round(test_seconds, 1),
        "parameters": int(params),
        "best_epoch": _best_epoch(trainer),
        "epochs_run": int(trainer.current_epoch),
        **{m: float(test[f"test_{m.replace('@', '_')}"]) for m in METRICS},
    }
    weights = getattr(task, "weight_history", [])
    if weights:
        point["final_weights"] = weights[-1]
    if task.test_ranks is not None and task.catalog is not None and task.catalog.tail is not None:
        ranks, targets = task.test_ranks
        point["_per_user"] = {"ranks": ranks, "tail": np.asarray(task.catalog.tail)[targets]}  # not written to the JSON
    return point


#: the per-user metrics paired between arms (``*_tail``: over the users whose target is a tail item)
PAIRED_METRICS = ("recall@10", "ndcg@10", "recall@10_tail")
#: (arm, reference) pairs compared per user
PAIRS = (("sid-multi", "sid-plain"), ("sid-front", "sid-plain"), ("sid-frequency", "sid-plain"), ("sid-plain", "sasrec"))


def paired_by_user(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``arm - reference`` on the same test users for every pair of :data:`PAIRS` present: per
    seed a paired t interval over users (:func:`recsys.stats.paired_mean_difference`), then the
    seeds combined (:func:`recsys.stats.over_seeds`: their spread plus the users' variance)."""
    from generative.ranking_metrics import per_row_metrics
    from recsys.stats import over_seeds, paired_mean_difference

    by = {(p["arm"], p["seed"]): p["_per_user"] for p in points if "_per_user" in p}
    out: dict[str, dict[str, Any]] = {}
    for arm, ref in PAIRS:
        seeds = sorted(s for (a, s) in by if a == arm and (ref, s) in by)
        if not seeds:
            continue
        entry: dict[str, Any] = {}
        for metric in PAIRED_METRICS:
            per_seed = []
            for seed in seeds:
                a, b = by[(arm, seed)], by[(ref, seed)]
                rows = a["tail"] if metric.endswith("_tail") else np.ones(len(a["ranks"]), dtype=bool)
                name = metric.removesuffix("_tail")
                k = int(name.split("@")[1])
                per_seed.append(paired_mean_difference(
                    per_row_metrics(a["ranks"][rows], k)[name], per_row_metrics(b["ranks"][rows], k)[name]))
            combined = over_seeds(per_seed)
            entry[metric] = {**combined.to_dict(), "verdict": combined.verdict(),
                             "per_seed": [i.to_dict() for i in per_seed]}
        out[f"{arm} - {ref}"] = entry
    return out


def _best_epoch(trainer: Any) -> int | None:
    path = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
    for part in Path(path).stem.split("-"):
        if part.startswith("epoch="):
            return int(part.split("=")[1])
    return None


def run_dataset(
    dataset: str, seeds: list[int], epochs: int, arms: list[str], workdir: Path, quick: bool, patience: int = 0
) -> dict[str, Any]:
    dm = _data(dataset, quick)
    start = time.perf_counter()
    book = dm.codebook
    split = dm.split
    codebook_seconds = time.perf_counter() - start
    points = []
    for seed in seeds:
        for arm in arms:
            point = run_arm(dm, arm, seed, epochs, workdir, quick, patience)
            points.append(point)
            print(
                f"[{dataset}] seed {seed} {arm:<14} R@10 {point['recall@10']:.4f} N@10 {point['ndcg@10']:.4f} "
                f"tail R@10 {point['recall@10_tail']:.4f} ({point['train_seconds']:.0f}s + {point['test_seconds']:.0f}s)",
                flush=True,
            )
    stats = {k: v for k, v in book.stats.items() if not isinstance(v, (list, dict)) or k in ("usage", "perplexity")}
    return {
        "dataset": dataset,
        "users": int(len(split.test_target)),
        "items": int(split.num_items),
        "train_examples": int(len(split.train_target)),
        "codebook": {"level_sizes": [int(s) for s in book.level_sizes], "seconds": round(codebook_seconds, 1), **stats},
        "points": [{k: v for k, v in p.items() if k != "_per_user"} for p in points],
        "summary": _summarise(points),
        "paired": paired_by_user(points),
        **_sasrec_interval(points),
    }


def _sasrec_interval(points: list[dict[str, Any]]) -> dict[str, Any]:
    """SASRec's test Recall@10 with its 95% interval (users' variance per seed, seeds combined)."""
    from generative.ranking_metrics import per_row_metrics
    from recsys.stats import mean_interval, over_seeds

    per_seed = [mean_interval(per_row_metrics(p["_per_user"]["ranks"], 10)["recall@10"])
                for p in points if p["arm"] == "sasrec" and "_per_user" in p]
    return {"sasrec_recall@10": over_seeds(per_seed).to_dict()} if per_seed else {}


def merge_runs(previous: dict[str, Any], measured: dict[str, dict[str, Any]], arms: list[str]) -> dict[str, dict[str, Any]]:
    """``--merge``: the datasets of ``previous`` that this run did not measure, whole; of those it
    measured, the points of the arms it did not run (each keeping its command and budget), next
    to the new ones, with what was computed from those arms alone (their per-user pairs, SASRec's
    interval). The summary covers every point; a pair of a kept arm with a new one has no per-user
    interval (their users' ranks were not kept together)."""
    out: dict[str, dict[str, Any]] = {}
    for name, run in previous.get("datasets", {}).items():
        stamp = {"command": run.get("command", previous["command"]), "budget": run.get("budget", previous["budget"])}
        points = [{**stamp, **p} for p in run["points"]]
        if name not in measured:
            out[name] = {**run, **stamp, "points": points}
            continue
        kept = [p for p in points if p["arm"] not in arms]
        new = measured[name]
        everything = kept + new["points"]
        pairs = {k: v for k, v in run.get("paired", {}).items() if not set(k.split(" - ")) & set(arms)}
        out[name] = {**new, "points": everything, "summary": _summarise(everything),
                     "paired": {**pairs, **new.get("paired", {})}}
        if "sasrec" not in arms and "sasrec_recall@10" in run:
            out[name]["sasrec_recall@10"] = run["sasrec_recall@10"]
    for name, run in measured.items():
        out.setdefault(name, run)
    return out


def _summarise(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for arm in dict.fromkeys(p["arm"] for p in points):
        rows = [p for p in points if p["arm"] == arm]
        entry: dict[str, Any] = {"seeds": len(rows)}
        for key in (*METRICS, "train_seconds", "test_seconds"):
            values = np.array([r[key] for r in rows], dtype=float)
            entry[key] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0}
        entry["parameters"] = rows[0]["parameters"]
        out[arm] = entry
    return out


def _compare(s: dict[str, Any], arm: str, other: str, metric: str) -> str:
    """``arm`` against ``other`` on the mean of ``metric`` over seeds, beyond 1.96 s.e. (the 95% interval) of the difference."""
    a = {**s[arm][metric], "n": s[arm]["seeds"]}
    b = {**s[other][metric], "n": s[other]["seeds"]}
    if a["mean"] is None or b["mean"] is None:  # an empty head/tail group
        return TIE
    return verdict(a["mean"], b["mean"], spread_of_difference(a, b))


def _versus_plain(run: dict[str, Any], arm: str, metric: str) -> str:
    """``arm`` against sid-plain: the per-user paired interval over seeds when the run kept one,
    else (older runs) the means over seeds beyond 1.96 s.e. of their difference."""
    paired = run.get("paired", {}).get(f"{arm} - sid-plain", {}).get(metric)
    if paired is not None:
        return str(paired["verdict"])
    return _compare(run["summary"], arm, "sid-plain", metric)


def _sasrec_verdict(run: dict[str, Any]) -> dict[str, Any] | None:
    """SASRec's Recall@10 against :data:`SASREC_RECALL_TARGET`: met when the 95% interval of its
    mean (the users' variance and the seeds' spread, :func:`recsys.stats.over_seeds`) lies above."""
    entry = run.get("sasrec_recall@10")
    if entry is None:
        return None
    low, high, mean = entry["low"], entry["high"], entry["estimate"]
    target = SASREC_RECALL_TARGET
    text = ("met" if low >= target else "NOT met" if high < target
            else "inconclusive (the interval straddles the target)")
    return {"target": target, "estimate": mean, "low": low, "high": high, "verdict": text}


def _verdicts(datasets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets per dataset: "beats" and "improves" need the 95% interval of the difference to
    exclude zero: per user on the same test users, combined over seeds (``paired``), or for runs
    without per-user results the seeds' means (``experiments.benchmarks._common``); else a tie."""
    verdicts: dict[str, Any] = {}
    for name, run in datasets.items():
        s = run["summary"]
        if "sid-multi" not in s or "sid-plain" not in s:
            sasrec = _sasrec_verdict(run) if name == "beauty" else None
            if sasrec is not None:
                verdicts[name] = {"sasrec_recall@10": sasrec}
            continue
        multi = {m: _versus_plain(run, "sid-multi", m) for m in TARGETS["multi_beats_plain_on"]}
        tail = {arm: _versus_plain(run, arm, "recall@10_tail")
                for arm in ("sid-front", "sid-frequency", "sid-multi") if arm in s}
        verdicts[name] = {
            "rule": "per-user paired" if run.get("paired") else "means over seeds",
            "multi_beats_plain": multi,
            "multi_beats_plain_met": all(v == BETTER for v in multi.values()),
            "tail_recall@10_vs_plain": tail,
            "tail_recall@10_improved_by": [a for a, v in tail.items() if v == BETTER],
            "tail_target_met": any(v == BETTER for v in tail.values()),
        }
        sasrec = _sasrec_verdict(run) if name == "beauty" else None
        if sasrec is not None:
            verdicts[name]["sasrec_recall@10"] = sasrec
    return verdicts


def _strict(value: Any) -> Any:
    """NaN (an empty head/tail group) -> null, so the file is strict JSON."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _pm(stat: dict[str, float], digits: int = 4) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def _gap_lines(name: str, run: dict[str, Any], budget: dict[str, Any]) -> list[str]:
    """How far the best arms are from the published anchors, and what budget would close it."""
    anchors = ANCHORS.get(name, {})
    if not anchors:
        return []
    per_epoch = -(-run["train_examples"] // budget["batch_size"])
    s = run["summary"]
    sid = max((a for a in s if a.startswith("sid-")), key=lambda a: s[a]["recall@10"]["mean"], default=None)
    if budget.get("patience"):
        steps_text = f"at most {budget['epochs'] * per_epoch:,} optimiser steps per arm here, {per_epoch:,} per epoch"
    else:
        steps_text = f"{budget['epochs'] * per_epoch:,} optimiser steps per arm here"
    lines = ["", f"Gap to the published numbers ({steps_text}):"]
    tiger = anchors.get("TIGER (paper)")
    if sid is not None and tiger:
        ours = s[sid]["recall@10"]["mean"]
        lines.append(
            f"- best generative arm ({sid}): Recall@10 {ours:.4f} = {ours / tiger['recall@10']:.0%} of TIGER's "
            f"{tiger['recall@10']:.4f}, NDCG@10 {s[sid]['ndcg@10']['mean']:.4f} = "
            f"{s[sid]['ndcg@10']['mean'] / tiger['ndcg@10']:.0%} of {tiger['ndcg@10']:.4f}. TIGER trains a ~13M-parameter "
            f"model (4+4 layers, d 128, one encoder position per SID token) for 200k steps of batch 256 on accelerators; "
            f"ours has {s[sid]['parameters']:,} parameters and reads one position per history item."
        )
    reported = anchors.get("SASRec (as reported in TIGER)")
    if "sasrec" in s and reported:
        ours = s["sasrec"]["recall@10"]["mean"]
        runs = [p for p in run.get("points", []) if p["arm"] == "sasrec" and p.get("best_epoch") is not None]
        at_end = sum(p["best_epoch"] == p.get("epochs_run", budget["epochs"]) - 1 for p in runs)
        lines.append(
            f"- SASRec: Recall@10 {ours:.4f} = {ours / reported['recall@10']:.0%} of the {reported['recall@10']:.4f} "
            f"reported in TIGER"
            + (f"; its best validation epoch was its last on {at_end} of {len(runs)} seeds." if runs else ".")
        )
    lines.append(
        "- Closing the gap needs accelerator time rather than code: `experiments/configs/generative/beauty_h200.yaml` "
        "is TIGER's size (token-level history, 4+4 layers, up to 200 epochs with early stopping) for one H200-class GPU."
    )
    return lines


def _budget_text(budget: dict[str, Any]) -> str:
    patience = budget.get("patience") or 0
    if patience:
        return f"at most {budget['epochs']} epochs, stopped after {patience} without a better validation NDCG@10"
    return f"{budget['epochs']} epochs"


def _arm_budget_lines(run: dict[str, Any]) -> list[str]:
    """Where the arms of one dataset were measured under different budgets (``--merge``), which is which."""
    by_arm: dict[str, tuple[str, bool, str]] = {}
    for p in run.get("points", []):
        if p.get("budget"):
            plateau = bool(p["budget"].get("patience"))
            by_arm.setdefault(p["arm"], (_budget_text(p["budget"]), plateau, p.get("command", "").strip()))
    if len(set(by_arm.values())) <= 1:
        return []
    lines = ["", "The arms were measured under different budgets (merged with `--merge`); compare arms only within one budget:", ""]
    for arm, (budget, plateau, command) in by_arm.items():
        unplateaued = "" if plateau else " (under budget: not trained to its validation plateau)"
        lines.append(f"- {arm}: {budget}{unplateaued}; `{command}`")
    return lines


def _paired_lines(run: dict[str, Any]) -> list[str]:
    """The per-user paired differences (95% intervals over users and seeds) as a table."""
    paired = run.get("paired") or {}
    if not paired:
        return []
    lines = ["", "Paired on the same test users (arm - reference; per seed a t interval over users, seeds combined; "
                 "95%):", "", "| arm - reference | " + " | ".join(PAIRED_METRICS) + " |",
             "|---|" + "---|" * len(PAIRED_METRICS)]
    for pair, entry in paired.items():
        cells = [f"{e['estimate']:+.4f} [{e['low']:+.4f}, {e['high']:+.4f}] {e['verdict']}"
                 for e in (entry[m] for m in PAIRED_METRICS)]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    epochs = [p for p in run.get("points", []) if p.get("epochs_run") is not None]
    if epochs:
        by_arm: dict[str, list[str]] = {}
        for p in epochs:
            by_arm.setdefault(p["arm"], []).append(f"{p['best_epoch'] + 1 if p.get('best_epoch') is not None else '?'}"
                                                   f"/{p['epochs_run']}")
        lines += ["", "Best epoch / epochs run per seed: " + "; ".join(f"{a} {', '.join(v)}" for a, v in by_arm.items())]
    return lines


def _rule_text(v: dict[str, Any]) -> str:
    if v.get("rule") == "per-user paired":
        return "the 95% interval of the per-user paired difference, over seeds, excludes zero"
    return "mean over seeds, beyond 1.96 s.e. (the 95% interval) of the difference"


def _tail_detail(v: dict[str, Any]) -> str:
    per = v.get("tail_recall@10_vs_plain")
    return f" ({', '.join(f'{a}: {o}' for a, o in per.items())})" if per else ""


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Generative recommendation benchmark",
        "",
        f"Command: `{result['command']}`  ",
        f"Date: {result['date']}; hardware: {result['hardware']}; quick: {result['quick']}  ",
        f"Budget (every arm): {_budget_text(result['budget'])}, batch {result['budget']['batch_size']}, "
        f"best epoch on NDCG@10 over {result['budget']['val_users']} validation users; test on every user. "
        f"Total wall time: {result['total_minutes']:.1f} min.",
        "",
    ]
    lines += ["Arms (every SID arm: the same codebook, model and optimiser; only the loss differs):", ""]
    for arm, options in result.get("arms", ARMS).items():
        lines.append(f"- `{arm}`: {json.dumps(options)}")
    lines.append("")
    for name, run in result["datasets"].items():
        cb = run["codebook"]
        lines += [
            f"## {name} ({run['users']:,} users, {run['items']:,} items, {run['train_examples']:,} training examples)",
            "",
            *([f"Measured by `{run['command'].strip()}` (kept with `--merge`); budget: "
               f"{_budget_text(run.get('budget', result['budget']))}.", ""]
              if run.get("command") and run["command"] != result["command"] else []),
            f"Semantic IDs: RQ-KMeans on item content vectors (attributes + collaborative), levels {cb['level_sizes']} "
            f"(last = collision token); collision rate before disambiguation "
            f"{cb.get('collision_rate_before', float('nan')):.3f}; code usage per level {cb.get('usage')}; built in {cb['seconds']} s.",
            "",
            "| arm | Recall@5 | NDCG@5 | Recall@10 | NDCG@10 | R@10 head | R@10 tail | N@10 tail | train s | test s | params |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for arm, s in run["summary"].items():
            cells = " | ".join(_pm(s[m]) for m in METRICS)
            lines.append(
                f"| {arm} | {cells} | {s['train_seconds']['mean']:.0f} | {s['test_seconds']['mean']:.0f} | {s['parameters']:,} |"
            )
        for anchor, values in ANCHORS.get(name, {}).items():
            cells = " | ".join(f"{values[m]:.4f}" if m in values else "" for m in METRICS)
            lines.append(f"| *{anchor}* | {cells} | | | |")
        lines += _gap_lines(name, run, run.get("budget", result["budget"]))
        lines += _arm_budget_lines(run)
        lines += _paired_lines(run)
        v = result["verdicts"].get(name)
        if v and "sasrec_recall@10" in v:
            sv = v["sasrec_recall@10"]
            lines += ["", f"- SASRec Recall@10 at least {sv['target']} (90% of the 0.0605 reported in TIGER; 95% interval over "
                          f"users and seeds): {sv['estimate']:.4f} [{sv['low']:.4f}, {sv['high']:.4f}] -> {sv['verdict']}"]
        if v and "multi_beats_plain" in v:
            lines += [
                "",
                f"- multi-target beats plain CE ({_rule_text(v)}; within it a "
                f"tie): {v['multi_beats_plain']} -> {'met' if v['multi_beats_plain_met'] else 'NOT met'}",
                f"- weighted arms that improve tail Recall@10 over plain ({_rule_text(v)}): "
                f"{v['tail_recall@10_improved_by'] or 'none'}{_tail_detail(v)} -> "
                f"{'met' if v['tail_target_met'] else 'NOT met'}",
            ]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="beauty,ml-100k", help="comma-separated: beauty, toys, sports, ml-100k")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm (0..N-1)")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="training epochs of every arm")
    parser.add_argument("--patience", type=int, default=PATIENCE,
                        help="stop an arm after this many epochs without a better validation NDCG@10 (0 = never)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--merge", action="store_true",
                        help="keep the datasets of the existing result that this run does not measure (each with its command and budget)")
    parser.add_argument("--quick", action="store_true", help="synthetic data, 1 seed, 1 epoch (smoke run, not a result)")
    parser.add_argument("--render", type=Path, default=None,
                        help="only recompute the verdicts of this results JSON and re-render its markdown")
    args = parser.parse_args(argv)
    if args.render is not None:
        result = json.loads(args.render.read_text())
        result["verdicts"] = _verdicts(result["datasets"])  # the verdict rule may be newer than the file
        atomic_write_text(args.render, json.dumps(_strict(result), indent=2, allow_nan=False) + "\n")
        atomic_write_text(args.render.with_suffix(".md"), to_markdown(result))
        print(f"wrote {args.render.with_suffix('.md')}")
        return 0
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown {unknown}; available: {list(ARMS)}")
    datasets = ["synthetic"] if args.quick else [d for d in args.datasets.split(",") if d]
    from generative.data import DATASETS

    unknown = [d for d in datasets if d not in DATASETS]
    if unknown:
        parser.error(f"--datasets: unknown {unknown}; available: {', '.join(DATASETS)}")
    seeds = [0] if args.quick else list(range(args.seeds))
    epochs = 1 if args.quick else args.epochs
    patience = 0 if args.quick else args.patience
    result = result_header("generative", argv, args.quick, TARGETS)
    result["budget"] = {"epochs": epochs, "patience": patience, "batch_size": BATCH_SIZE, "val_users": VAL_USERS, "cores": 2}
    result["arms"] = {arm: {**COMMON, **ARMS[arm]} for arm in arms}
    result["sid_model"] = SID_MODEL
    out = args.output_dir
    stem = "generative_quick" if args.quick else "generative"
    start = time.perf_counter()
    with isolated_workdir("salience-gen-bench-") as work:
        measured = {d: run_dataset(d, seeds, epochs, arms, work, args.quick, patience)
                    for d in datasets}
    for run in measured.values():
        run.update(command=result["command"], budget=result["budget"])
        for point in run["points"]:
            point.update(command=result["command"], budget=result["budget"])
    previous: dict[str, Any] = {}
    if args.merge and (out / f"{stem}.json").is_file():  # read at the end: a run that finished meanwhile is kept
        previous = json.loads((out / f"{stem}.json").read_text())
    result["datasets"] = merge_runs(previous, measured, arms) if previous else measured
    result["arms"] = {**previous.get("arms", {}), **result["arms"]}
    result["total_minutes"] = (time.perf_counter() - start) / 60
    result["verdicts"] = _verdicts(result["datasets"])
    result["anchors"] = ANCHORS
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{stem}.json", json.dumps(_strict(result), indent=2, allow_nan=False) + "\n")
    atomic_write_text(out / f"{stem}.md", to_markdown(result))
    print(to_markdown(result))
    print(f"wrote {out / f'{stem}.json'} and {out / f'{stem}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
