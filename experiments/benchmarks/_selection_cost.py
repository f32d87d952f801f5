"""The selection benchmark's cost part: LeAP against a plain training run and permutation importance
on Criteo head-10k, in one process (``python -m experiments.benchmarks.selection --merge --parts cost``).

LeAP and the plain run alternate :data:`COST_PAIRS` times; the target reads the 95% interval of
the geometric mean ratio (a paired t on the log times): met when the whole interval is within
the limit, NOT met when it is all above, else inconclusive.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = ["COST_PAIRS", "cost_lines", "cost_verdict", "ratio_interval", "run_cost"]


#: alternating (plain run, LeAP ranking) pairs of the cost part
COST_PAIRS = 7


def run_cost(config: Path, workdir: Path, quick: bool, quick_limits: list[str]) -> dict[str, Any]:
    """LeAP vs a plain run vs permutation importance (R=5; 2 in a quick run) on the 39 Criteo
    fields, one process."""
    from recsys.train.recipe import Recipe
    from selection import LeAP, OutRank, PermutationImportance
    from selection.model_free.outrank import Ranking, rank_raw

    epochs = 1 if quick else 3
    overrides = [f"--trainer.max_epochs={epochs}", "--model.early_stopping_patience=0", f"--data.cache_dir={workdir / 'cache'}"]
    overrides += quick_limits if quick else []
    recipe = Recipe(config, overrides, workdir=workdir / "cost", quiet=True)
    _ = recipe.schema  # data prepared before any clock starts
    rows: dict[str, Any] = {"epochs": epochs, "fields": len(recipe.schema)}
    if not quick:  # warm-up for imports, then the measured runs
        recipe.fit(tracking=False, run_name="warm-up")
    # alternating pairs (plain, LeAP, plain, LeAP, ...): the ratio's median and spread, and a t
    # interval of the mean log ratio (recsys.stats) that the verdict reads
    plain_times, leap_times = [], []
    for i in range(1 if quick else COST_PAIRS):
        t = time.perf_counter()
        plain = recipe.fit(tracking=False, run_name=f"plain-{i}")
        plain_times.append(time.perf_counter() - t)
        leap = LeAP(seed=0, tracking=False).rank(recipe)
        leap_times.append(leap.cost_seconds)
    rows["plain_run_seconds"] = round(float(np.median(plain_times)), 2)
    rows["leap_seconds"] = round(float(np.median(leap_times)), 2)
    rows["pairs"] = {"plain_seconds": [round(x, 2) for x in plain_times], "leap_seconds": [round(x, 2) for x in leap_times],
                     "ratios": [round(a / b, 3) for a, b in zip(leap_times, plain_times, strict=True)]}
    rows["leap_vs_plain_interval"] = ratio_interval(leap_times, plain_times)
    pi_repeats = 2 if quick else 5
    splits: tuple[Literal["val", "train"], ...] = ("val",) if quick else ("val", "train")  # quick: the same code, one split
    for split in splits:
        pi = PermutationImportance(repeats=pi_repeats, seed=0, tracking=False, split=split).rank(recipe)
        rows[f"permutation_{split}"] = {
            "repeats": pi_repeats,
            "rows_evaluated": pi.extras.get("rows"),
            "total_seconds": round(pi.cost_seconds, 2),
            "train_seconds": round(pi.extras.get("train_seconds", float("nan")), 2),
            "eval_seconds": round(pi.extras.get("eval_seconds", float("nan")), 2),
            "vs_leap": round(pi.cost_seconds / leap.cost_seconds, 2),
        }
    rows["leap_vs_plain_run"] = round(float(np.median(rows["pairs"]["ratios"])), 2)
    rows["plain_test_auc"] = plain.metrics.get("test_auc")
    # OutRank throughput on the raw Criteo rows (all 10k, 39 fields)
    raw = recipe.datamodule.reader.read()
    throughput = [("relevance only", OutRank(ranking=Ranking.RELEVANCE, controls=False, progress=False))]
    if not quick:  # (the pairwise 3MR pass dominates a quick run's time)
        throughput.append(("default (controls + 3MR pairs)", OutRank(progress=False)))
    for label, method in throughput:
        t = time.perf_counter()
        rank_raw(raw, method)
        dt = time.perf_counter() - t
        rows.setdefault("outrank", {})[label] = {"rows": len(raw), "seconds": round(dt, 2), "rows_per_second": round(len(raw) / dt)}
    return rows


def ratio_interval(a: list[float], b: list[float]) -> dict[str, float] | None:
    """The geometric mean of ``a_i / b_i`` over alternating pairs with its 95% interval (a paired
    t on the log times, :func:`recsys.stats.paired_mean_difference`, exponentiated); None below 2 pairs."""
    from recsys.stats import paired_mean_difference

    if len(a) < 2:
        return None
    iv = paired_mean_difference(np.log(a), np.log(b))
    return {"estimate": math.exp(iv.estimate), "low": math.exp(iv.low), "high": math.exp(iv.high), "pairs": len(a)}


def cost_verdict(cost: dict[str, Any], limit: float) -> str:
    """``met`` when the ratio's whole interval is at or below ``limit``, ``NOT met`` when it is
    above, else ``inconclusive``; a run without pairs judges its one ratio."""
    iv = cost.get("leap_vs_plain_interval")
    if not iv:
        return "met (one pair)" if cost["leap_vs_plain_run"] <= limit else "NOT met (one pair)"
    return "met" if iv["high"] <= limit else "NOT met" if iv["low"] > limit else "inconclusive"


def _median_of(cost: dict[str, Any]) -> str:
    pairs = cost.get("pairs")
    return f", median of {len(pairs['ratios'])} alternating pairs" if pairs and len(pairs["ratios"]) > 1 else ""


def _ratio_text(cost: dict[str, Any]) -> str:
    pairs, iv = cost.get("pairs"), cost.get("leap_vs_plain_interval")
    if not pairs or not iv:
        return ""
    r = pairs["ratios"]
    return (f" (pairs {min(r):.2f}-{max(r):.2f}; geometric mean {iv['estimate']:.2f}, 95% interval "
            f"[{iv['low']:.2f}, {iv['high']:.2f}])")


def cost_lines(cost: dict[str, Any], command: str, targets: dict[str, Any], on: str = "") -> list[str]:
    """The cost part's markdown section (``on``: where it was measured, when not the file's hardware)."""
    lines: list[str] = []
    pv, pt = cost["permutation_val"], cost.get("permutation_train")
    lines += [
        f"## Cost (Criteo head-10k, {cost['fields']} fields, {cost['epochs']} epochs, side by side in one process)",
        "",
        f"Measured by `{command}`{on}.",
        "",
        "| measurement | seconds | ratio | target |",
        "|---|---|---|---|",
        f"| plain training run{_median_of(cost)} | {cost['plain_run_seconds']} | 1.00 | |",
        f"| LeAP (one training run with the gates){_median_of(cost)} | {cost['leap_seconds']} | "
        f"{cost['leap_vs_plain_run']} x plain{_ratio_text(cost)} | <= {targets['leap_vs_plain_run_max']}x: {cost_verdict(cost, targets['leap_vs_plain_run_max'])} |",
        f"| permutation R={pv.get('repeats', 5)} on the validation split ({pv['rows_evaluated']} rows): train {pv['train_seconds']} + eval "
        f"{pv['eval_seconds']} | {pv['total_seconds']} | {pv['vs_leap']} x LeAP | >= 5x: "
        f"{'met' if pv['vs_leap'] >= targets['permutation_vs_leap_min'] else 'NOT met'} |",
    ]
    if pt:
        lines.append(f"| permutation R={pt.get('repeats', 5)} on the training split ({pt['rows_evaluated']} rows): train "
                     f"{pt['train_seconds']} + eval {pt['eval_seconds']} | {pt['total_seconds']} | {pt['vs_leap']} x LeAP | |")
    lines += [
        "",
        "| OutRank on raw Criteo | rows | seconds | rows/s |",
        "|---|---|---|---|",
    ]
    for label, o in cost["outrank"].items():
        lines.append(f"| {label} | {o['rows']:,} | {o['seconds']} | {o['rows_per_second']:,} |")
    lines.append("")
    return lines
