"""The selection benchmark's curve verdicts: a method against the random rankings and LeAP against
the best other selector, each read from the 95% interval of the AUKC difference on the same test
rows over the ranking seeds (curves measured before the test scores were kept: the seed spread)."""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.benchmarks._common import BETTER, TIE, WORSE, verdict
from recsys.stats import Interval, over_seeds

__all__ = ["above_random", "leap_verdict", "seed_intervals"]


def seed_intervals(intervals: list[Any]) -> list[dict[str, Any]] | None:
    """Per-seed paired intervals as dicts (None when any seed's fits kept no test scores)."""
    return None if not intervals or any(i is None for i in intervals) else [i.to_dict() for i in intervals]


def _over_seeds(intervals: list[dict[str, Any]] | None, negate: bool = False) -> Interval | None:
    """The per-seed AUKC differences on the same test rows combined over the ranking seeds
    (:func:`recsys.stats.over_seeds`); ``negate``: the reverse difference."""
    if not intervals:
        return None
    iv = over_seeds([Interval(**d) for d in intervals])
    return Interval(-iv.estimate, -iv.high, -iv.low, iv.level, iv.se, iv.method, iv.n) if negate else iv




def leap_verdict(curves: dict[str, Any]) -> dict[str, Any]:
    """LeAP's test AUKC against the best other method on each dataset: the 95% interval of LeAP
    minus it on the same test rows, over the ranking seeds (curves measured before the test
    scores were kept: the seed spread, the standard error of the difference of the two means)."""
    out: dict[str, Any] = {}
    words = {BETTER: "LeAP strictly best", TIE: "tie (the 95% interval holds 0)", WORSE: "LeAP behind"}
    for dataset, c in curves.items():
        scored = {n: m["test_aukc"] for n, m in c["methods"].items() if "test_aukc" in m}
        if "leap" not in scored or len(scored) < 2:
            continue
        leap = scored["leap"]
        best_name = max((n for n in scored if n.split("[")[0] != "leap"), key=lambda n: scored[n]["mean"])
        best = scored[best_name]
        paired = _over_seeds(c["methods"][best_name].get("test_aukc_vs_leap"), negate=True)
        if paired is not None:
            out[dataset] = {"leap": leap["mean"], "best_other": best_name, "best_other_aukc": best["mean"],
                            "difference": paired.to_dict(), "verdict": words[paired.verdict()]}
            continue
        se = float(np.sqrt(sum((x["std"] ** 2) / max(x["n"], 1) for x in (leap, best))))
        v = verdict(leap["mean"], best["mean"], se) if leap["n"] > 1 and best["n"] > 1 else TIE
        out[dataset] = {"leap": leap["mean"], "best_other": best_name, "best_other_aukc": best["mean"], "spread": se,
                        "verdict": words[v]}
    return out


def above_random(m: dict[str, Any]) -> str:
    """``yes`` / ``tie`` / ``NO``: a method's test AUKC against the random rankings'. Paired
    (``test_aukc_vs_random``: per seed, on the same test rows) the 95% interval over the seeds
    decides, and is shown; otherwise a difference counts only beyond 1.96 of the random rankings'
    seed std (outside the random AUKCs' 95% range)."""
    words = {BETTER: "yes", TIE: "tie", WORSE: "NO"}
    paired = _over_seeds(m.get("test_aukc_vs_random"))
    if paired is not None:
        return f"{words[paired.verdict()]} {paired.text()}"
    spread = float("nan") if m.get("random_aukc_std") is None else float(m["random_aukc_std"])
    return words[verdict(m["aukc"], m["random_aukc_mean"], spread)]


