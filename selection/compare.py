"""Every selector on one recipe, side by side (``salience select --method all``).

Each method ranks the recipe's features; each ranking gets its selection curve, all curves
sharing one :class:`~selection.curve.FitCache` (the all-features model and the random rankings
train once for all methods). The comparison reports per method the validation and test AUKC,
its test AUKC against the random rankings' on the same test rows (paired:
:meth:`MethodComparison.aukc_difference`, DeLong's interval of the two curves' contrast), the
smallest k within the tolerance (chosen on validation), and the ranking's cost in seconds and in
multiples of one training run (the all-features fit).

    comparison = compare_methods(recipe, {"leap": LeAP(), "lasso": LassoImportance()}, ks=[2, 4, 8])
    comparison.to_markdown(); comparison.plot(); comparison.save("runs/select/frappe-all")
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recsys.artifacts import plain
from recsys.io import atomic_savefig, atomic_write_text
from recsys.stats import Interval
from recsys.train.recipe import Recipe
from selection.base import ImportanceMethod
from selection.curve import FitCache, SelectionCurve, selection_curve
from selection.report import ImportanceReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from recsys.tracking import RunTracker

__all__ = ["MethodComparison", "compare_methods"]


@dataclass
class MethodComparison:
    """The rankings and curves of several methods on one recipe.

    Args:
        dataset: the recipe's dataset.
        reports: method -> its ranking.
        curves: method -> its selection curve.
        failed: method -> the error that stopped it (the others still ran).
    """

    dataset: str
    reports: dict[str, ImportanceReport] = field(default_factory=dict)
    curves: dict[str, SelectionCurve] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: the fits behind the curves, with their test scores (the paired AUKC differences)
    cache: FitCache | None = field(default=None, repr=False)
    #: (a, b, level) -> (the curves it was computed from, the interval): each contrast ranks every
    #: fit's test scores, so ``rows()``, ``to_markdown()`` and ``to_dict()`` share one computation
    _differences: dict[tuple[str, str, float], tuple[tuple[SelectionCurve, ...], Interval | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def aukc_difference(self, a: str, b: str = "random", level: float = 0.95) -> Interval | None:
        """Test AUKC of method ``a`` minus method ``b``'s (``random``: the mean of the random
        rankings' curves) on the same test rows, DeLong's interval of the contrast; None when
        the fits' test scores were not kept. Kept until either curve is replaced."""
        if self.cache is None or a not in self.curves or (b != "random" and b not in self.curves):
            return None
        curves: tuple[SelectionCurve, ...] = (self.curves[a],) if b == "random" else (self.curves[a], self.curves[b])
        kept = self._differences.get((a, b, level))
        if kept is not None and all(x is y for x, y in zip(kept[0], curves, strict=True)):  # b fixes the count
            return kept[1]
        minus = list(curves[0].random.values()) if b == "random" else [curves[1].points]
        interval = self.cache.aukc_difference([curves[0].points], minus, level) if minus else None
        self._differences[(a, b, level)] = (curves, interval)
        return interval

    def rows(self) -> list[dict[str, Any]]:
        """One summary row per method, best validation AUKC first."""
        out = []
        for name, curve in self.curves.items():
            s = curve.summary()
            fit = curve.full.seconds
            cost = self.reports[name].cost_seconds
            vs_random = self.aukc_difference(name)
            out.append({
                "method": name, "val_aukc": s["val_aukc"], "test_aukc": s["aukc"],
                "random_test_aukc": s["random_aukc_mean"],
                "test_aukc_vs_random": vs_random.to_dict() if vs_random is not None else None,
                "smallest_k": s["smallest_k_within_tolerance"],
                "test_vs_full_at_k": s["test_vs_full_at_smallest_k"], "verdict_at_k": s["verdict_at_smallest_k"],
                "rank_cost_seconds": round(cost, 2), "rank_cost_fits": round(cost / fit, 2) if fit > 0 else None,
                "top": self.reports[name].top_k(min(5, len(self.reports[name]))),
            })
        return sorted(out, key=lambda r: -r["val_aukc"] if np.isfinite(r["val_aukc"]) else np.inf)

    def to_markdown(self) -> str:
        if not self.curves:
            return "no method finished"
        any_curve = next(iter(self.curves.values()))
        lines = [
            f"Selectors on {self.dataset}: k = {any_curve.ks}, tolerance {any_curve.tolerance:g}; k chosen on validation, "
            "test read once per model. Cost: the ranking's wall time, and in multiples of one all-features fit "
            f"({any_curve.full.seconds:.1f} s).",
            "",
            "| method | validation AUKC | test AUKC | random test AUKC | test AUKC - random (95% CI, paired) | "
            "smallest k (validation) | test AUC - all features at k (95% CI, paired) | ranking cost s | cost / fit | top 5 |",
            "|---|---:|---:|---:|---|---:|---|---:|---:|---|",
        ]
        for r in self.rows():
            iv = r["test_vs_full_at_k"]
            paired = f"{iv['estimate']:+.4f} [{iv['low']:+.4f}, {iv['high']:+.4f}] {r['verdict_at_k']}" if iv else ""
            rnd = Interval(**r["test_aukc_vs_random"]) if r["test_aukc_vs_random"] else None
            vs_random = f"{rnd.text()} {rnd.verdict()}" if rnd is not None else ""
            lines.append(
                f"| {r['method']} | {r['val_aukc']:.4f} | {r['test_aukc']:.4f} | {r['random_test_aukc']:.4f} | {vs_random} | "
                f"{r['smallest_k']} | {paired} | {r['rank_cost_seconds']:.1f} | {r['rank_cost_fits']} | {', '.join(r['top'])} |"
            )
        lines += [f"\n{name}: failed: {error}" for name, error in self.failed.items()]
        return "\n".join(lines)

    def plot(self) -> Figure:
        """Validation (dashed) and test (solid) AUC against k, one colour per method."""
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
        colours = plt.get_cmap("tab20")
        for i, (name, curve) in enumerate(sorted(self.curves.items())):
            ks = [p.k for p in curve.points]
            axes[0].plot(ks, [p.best_val_auc for p in curve.points], "--o", markersize=3, color=colours(i % 20),
                         label=f"{name} ({curve.val_aukc:.4f})")
            axes[1].plot(ks, [p.test_auc for p in curve.points], "-o", markersize=3, color=colours(i % 20),
                         label=f"{name} ({curve.aukc:.4f})")
        if self.curves:
            curve = next(iter(self.curves.values()))
            for j, (split, full) in enumerate((("validation", curve.full.best_val_auc), ("test", curve.full.test_auc))):
                axes[j].axhline(full, color="black", linestyle=":", linewidth=0.8, label=f"all {curve.full.k} features")
                axes[j].set_title(f"{split} AUC vs k on {self.dataset} (AUKC in brackets)", fontsize=10)
                axes[j].set_xlabel("features kept (k)")
                axes[j].legend(fontsize=7, loc="lower right")
        axes[0].set_ylabel("AUC")
        fig.tight_layout()
        return fig

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "rows": self.rows(), "failed": dict(self.failed),
                "curves": {n: c.to_dict() for n, c in self.curves.items()}}

    def save(self, folder: str | Path) -> Path:
        """``comparison.{json,md,png}`` and each method's ``<method>/{report,curve}.json`` under ``folder``."""
        import matplotlib.pyplot as plt

        folder = Path(folder)
        for name in self.curves:
            self.reports[name].save(folder / name / "report.json")
            self.curves[name].save(folder / name / "curve.json")
        atomic_write_text(folder / "comparison.json", json.dumps(plain(self.to_dict()), indent=2, allow_nan=False))
        atomic_write_text(folder / "comparison.md", self.to_markdown() + "\n")
        fig = self.plot()
        atomic_savefig(fig, folder / "comparison.png", dpi=120)
        plt.close(fig)
        return folder


def compare_methods(
    recipe: Recipe,
    methods: Mapping[str, ImportanceMethod],
    ks: Sequence[int],
    *,
    random_seeds: Sequence[int] = (0, 1, 2),
    tolerance: float = 0.001,
    tracker: RunTracker | None = None,
    progress: bool = True,
    cache: FitCache | None = None,
) -> MethodComparison:
    """Rank with every method and draw every curve (one shared fit cache, ``cache`` when given:
    several comparisons on one recipe train each feature set once); a method that fails is
    recorded in ``failed`` and the others go on."""
    cache = cache if cache is not None else FitCache()
    out = MethodComparison(recipe.dataset_name, cache=cache)
    for name, method in methods.items():
        try:
            report = method.rank(recipe)
        except Exception as e:  # one broken method must not cost the others' hours: recorded, reported
            out.failed[name] = f"{type(e).__name__}: {e}"
            continue
        out.reports[name] = report
        out.curves[name] = selection_curve(recipe, report, ks, random_seeds=random_seeds, tolerance=tolerance,
                                           cache=cache, tracker=tracker, progress=progress)
    if tracker is not None:
        for r in out.rows():
            tracker.log_metrics({f"{r['method']}.val_aukc": r["val_aukc"], f"{r['method']}.test_aukc": r["test_aukc"]})
        tracker.log_dict(plain(out.to_dict()), "selection/comparison.json")
        import matplotlib.pyplot as plt

        fig = out.plot()
        tracker.log_figure(fig, "selection/comparison.png")
        plt.close(fig)
    return out
