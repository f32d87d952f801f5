"""The selection curve: retrain on the top-k features for each k and measure what is lost.

A ranking is only as good as the smaller model it buys. For each k in a grid, the backbone
is retrained from scratch on the top-k features of the ranking; each model's validation AUC
(its best checkpoint's) and test AUC are recorded; the same is done for several random
rankings. The protocol is leak-free: k is *chosen* on the validation split
(:attr:`SelectionCurve.smallest_k`), and the test split is read once per model and reported,
never used to choose. Summaries, on both splits and labelled so:

* **AUKC** (ERASE's metric, KDD'24): the area under the AUC-vs-k curve, divided by the k
  range, so it reads in AUC units (the mean AUC over the k range, trapezoid rule): ``aukc`` on
  test, ``val_aukc`` on validation.
* **smallest k within tolerance** (the choice): the smallest k whose validation AUC is at
  least the all-features model's minus ``tolerance``; ``smallest_k_test`` is the same rule on
  test, for reference only.
* **the paired test verdict**: every top-k model's test AUC minus the all-features model's on
  the same test rows, with DeLong's 95% interval (:func:`recsys.stats.delong`); at the chosen k,
  ``better`` / ``worse`` only when the interval excludes zero, and ``within tolerance`` only when
  its far end stays within ``tolerance``.

Every fit is an ordinary tracked ``salience fit`` run, nested under one parent MLflow run per
curve. Fits are memoised by feature set, so the all-features model (and any subset two
rankings share) is trained once per :class:`FitCache`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recsys.artifacts import plain
from recsys.io import atomic_write_text
from recsys.stats import Interval, delong_contrast
from recsys.train.recipe import Recipe
from selection.base import RandomRanking, feature_widths, trained_schema
from selection.report import ImportanceReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from recsys.tracking import RunTracker

__all__ = ["CurvePoint", "FitCache", "SelectionCurve", "aukc", "aukc_weights", "parse_ks", "selection_curve"]

log = logging.getLogger(__name__)


def parse_ks(text: str | Sequence[int], n_features: int) -> list[int]:
    """``"2,4,8"`` (or a list) -> sorted unique ks, each checked against ``n_features``.

    ``"all"`` or an empty value gives 1, 2, 4, ... up to ``n_features``.
    """
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or parts == ["all"]:
            ks = sorted({min(2**i, n_features) for i in range(int(math.log2(max(n_features, 1))) + 2)})
            return ks
        try:
            ks = [int(p) for p in parts]
        except ValueError as e:
            raise ValueError(f"--k must be a comma-separated list of integers, got {text!r}") from e
    else:
        ks = [int(k) for k in text]
    bad = [k for k in ks if k < 1 or k > n_features]
    if bad:
        raise ValueError(f"--k: {bad} out of range; the ranking has {n_features} features, so use 1 <= k <= {n_features}")
    return sorted(set(ks))


def aukc(ks: Sequence[int], aucs: Sequence[float]) -> float:
    """Area under the AUC-vs-k curve over the k range, divided by that range (AUC units).

    A single point gives its AUC.
    """
    if len(ks) == 0:
        return float("nan")
    return float(aukc_weights(ks) @ np.asarray(aucs, dtype=np.float64))


def aukc_weights(ks: Sequence[int]) -> np.ndarray:
    """The trapezoid weights ``w`` (one per k, in the given order) with ``aukc(ks, aucs) == w @ aucs``:
    an AUKC is a linear contrast of its models' AUCs, so two curves on the same test rows compare
    by :func:`recsys.stats.delong_contrast`."""
    k = np.asarray(ks, dtype=np.float64)
    w = np.zeros(len(k))
    if len(k) == 0:
        return w
    order = np.argsort(k, kind="stable")
    ks_sorted = k[order]
    if len(k) == 1 or ks_sorted[-1] == ks_sorted[0]:
        return np.full(len(k), 1.0 / len(k))
    half = np.diff(ks_sorted) / 2 / (ks_sorted[-1] - ks_sorted[0])
    sorted_w = np.zeros(len(k))
    sorted_w[:-1] += half
    sorted_w[1:] += half
    w[order] = sorted_w
    return w


@dataclass
class CurvePoint:
    """One retrained model: the top-k features of a ranking and its test metrics."""

    k: int
    features: list[str]
    test_auc: float
    test_logloss: float
    best_val_auc: float = float("nan")
    seconds: float = 0.0
    run_id: str | None = None
    dims: int = 0  # input dimensions of the kept features (scalar 1, id its embedding dim, vector D)
    #: test AUC minus the all-features model's on the same rows (a recsys.stats.Interval as a dict)
    test_vs_full: dict[str, Any] | None = None
    epochs: int = 0  # training epochs run (fewer than the trainer's max_epochs: stopped at its validation plateau)


class FitCache:
    """Memoises fits by feature set (order-free), so shared subsets train once, with each fit's
    test probabilities (float32, test-split order) for the paired comparisons."""

    def __init__(self) -> None:
        self._points: dict[tuple[str, ...], CurvePoint] = {}
        self._scores: dict[tuple[str, ...], np.ndarray] = {}
        #: the test labels every fit of the recipe scores (None until a fit kept its scores)
        self.test_labels: np.ndarray | None = None
        self.fits = 0

    @staticmethod
    def key(features: Sequence[str]) -> tuple[str, ...]:
        """The memo key of a feature set (order-free)."""
        return tuple(sorted(features))

    def points(self) -> list[CurvePoint]:
        """Every fit made so far, once each."""
        return list(self._points.values())

    def scores(self, features: Sequence[str]) -> np.ndarray | None:
        """The test probabilities of the fit on ``features`` (None: not kept, e.g. several processes)."""
        return self._scores.get(self.key(features))

    def get(
        self, recipe: Recipe, features: Sequence[str], run_name: str, parent_run_id: str | None, tracking: bool
    ) -> CurvePoint:
        key = self.key(features)
        if key not in self._points:
            result = recipe.fit(features=list(features), run_name=run_name, parent_run_id=parent_run_id, tracking=tracking)
            self.fits += 1
            m = result.metrics
            self._points[key] = CurvePoint(
                k=len(features),
                features=list(features),
                test_auc=float(m.get("test_auc", float("nan"))),
                test_logloss=float(m.get("test_logloss", float("nan"))),
                best_val_auc=float(m.get("best_val_auc", float("nan"))),
                seconds=result.seconds,
                run_id=result.run_id,
                epochs=result.epochs_run,
            )
            if result.test_scores is not None:
                labels, probs = result.test_scores
                if self.test_labels is None:
                    self.test_labels = labels
                if np.array_equal(labels, self.test_labels):  # the same rows in the same order
                    self._scores[key] = probs.astype(np.float32, copy=False)
            log.info("trained on %d features: test AUC %.4f (%s)", len(features), self._points[key].test_auc, run_name)
        point = self._points[key]
        return CurvePoint(**{**asdict(point), "features": list(features)})


    def aukc_difference(self, plus: Sequence[Sequence[CurvePoint]], minus: Sequence[Sequence[CurvePoint]],
                        level: float = 0.95) -> Interval | None:
        """The mean test AUKC of the ``plus`` curves minus the mean of the ``minus`` curves, on the
        same test rows, with DeLong's interval of that contrast of their fits' AUCs (a fit on both
        sides cancels); None when a fit did not keep its test scores or the rows hold one class.

        Args:
            plus, minus: curves (each its points over one k grid) whose fits came from this cache.
        """
        weights: dict[tuple[str, ...], float] = {}
        for side, curves in ((1.0, plus), (-1.0, minus)):
            for points in curves:
                for p, w in zip(points, aukc_weights([p.k for p in points]), strict=True):
                    key = self.key(p.features)
                    weights[key] = weights.get(key, 0.0) + side * w / len(curves)
        weights = {k: w for k, w in weights.items() if abs(w) > 1e-15}
        if self.test_labels is None or len(np.unique(self.test_labels)) != 2:
            return None
        if not weights:  # the same fits on both sides
            return Interval(0.0, 0.0, 0.0, level, 0.0, "delong", int(self.test_labels.size))
        scores = [self._scores.get(k) for k in weights]
        if any(s is None for s in scores):
            return None
        return delong_contrast(self.test_labels, scores, list(weights.values()), level)


@dataclass
class SelectionCurve:
    """Test AUC / log loss against the number of kept features, for a ranking and random ones.

    Args:
        method: the ranking's method.
        dataset: dataset name.
        ks: the k grid.
        points: the ranking's top-k models, one per k.
        full: the all-features model.
        random: random-ranking points per seed (same ks).
        tolerance: AUC tolerance of :attr:`smallest_k`.
        ranking: the ranking the curve was drawn for.
    """

    method: str
    dataset: str
    ks: list[int]
    points: list[CurvePoint]
    full: CurvePoint
    random: dict[int, list[CurvePoint]] = field(default_factory=dict)
    tolerance: float = 0.001
    ranking: list[str] = field(default_factory=list)

    @property
    def aukc(self) -> float:
        """AUKC of the test AUCs."""
        return aukc([p.k for p in self.points], [p.test_auc for p in self.points])

    @property
    def val_aukc(self) -> float:
        """AUKC of the validation AUCs (each model's best checkpoint)."""
        return aukc([p.k for p in self.points], [p.best_val_auc for p in self.points])

    @property
    def random_aukcs(self) -> list[float]:
        return [aukc([p.k for p in pts], [p.test_auc for p in pts]) for pts in self.random.values()]

    @property
    def random_aukc(self) -> float:
        values = self.random_aukcs
        return float(np.mean(values)) if values else float("nan")

    @property
    def random_val_aukcs(self) -> list[float]:
        return [aukc([p.k for p in pts], [p.best_val_auc for p in pts]) for pts in self.random.values()]

    @property
    def smallest_k(self) -> int | None:
        """The choice: the smallest k with validation AUC >= the full model's - tolerance (None
        if no k qualifies, or the models have no validation AUC)."""
        return self._smallest("best_val_auc")

    @property
    def smallest_k_test(self) -> int | None:
        """The same rule on the test AUCs: reported for reference, never used to choose."""
        return self._smallest("test_auc")

    @property
    def dims_at_smallest_k(self) -> int | None:
        """Input dimensions kept at :attr:`smallest_k` (None when no k qualifies)."""
        k = self.smallest_k
        return next((p.dims for p in self.points if p.k == k), None) if k is not None else None

    @property
    def dims_removed_share(self) -> float | None:
        """Share of the all-features model's input dimensions removed at :attr:`smallest_k`,
        the k chosen on validation (the LeAP paper's deployment metric)."""
        kept = self.dims_at_smallest_k
        return None if kept is None or not self.full.dims else 1.0 - kept / self.full.dims

    def _smallest(self, metric: str) -> int | None:
        full = float(getattr(self.full, metric))
        for p in sorted(self.points, key=lambda p: p.k):
            if getattr(p, metric) >= full - self.tolerance:  # NaN never qualifies
                return p.k
        return None

    def summary(self) -> dict[str, Any]:
        rnd, rnd_val = self.random_aukcs, self.random_val_aukcs
        return {
            "method": self.method,
            "dataset": self.dataset,
            "aukc": self.aukc,
            "random_aukc_mean": self.random_aukc,
            "random_aukc_std": float(np.std(rnd)) if rnd else float("nan"),
            "aukc_minus_random": self.aukc - self.random_aukc,
            "val_aukc": self.val_aukc,
            "random_val_aukc_mean": float(np.mean(rnd_val)) if rnd_val else float("nan"),
            "random_val_aukc_std": float(np.std(rnd_val)) if rnd_val else float("nan"),
            "full_test_auc": self.full.test_auc,
            "full_val_auc": self.full.best_val_auc,
            "smallest_k_within_tolerance": self.smallest_k,
            "k_chosen_on": "validation",
            "smallest_k_on_test": self.smallest_k_test,
            "tolerance": self.tolerance,
            "n_features": self.full.k,
            "n_dims": self.full.dims,
            "dims_at_smallest_k": self.dims_at_smallest_k,
            "dims_removed_share": self.dims_removed_share,
            **self._chosen_verdict(),
        }

    def _chosen_verdict(self) -> dict[str, Any]:
        """The chosen k's paired test comparison with the all-features model."""
        k = self.smallest_k
        chosen = next((p for p in self.points if p.k == k), None) if k is not None else None
        interval = chosen.test_vs_full if chosen is not None else None
        if interval is None:
            return {"test_vs_full_at_smallest_k": None, "verdict_at_smallest_k": None, "within_tolerance_on_test": None}
        iv = Interval(**interval)
        return {"test_vs_full_at_smallest_k": interval, "verdict_at_smallest_k": iv.verdict(),
                "within_tolerance_on_test": iv.no_worse_than(self.tolerance)}

    # -- rendering -----------------------------------------------------------------------------
    def plot(self, ax: Any = None, x: str = "k") -> Figure:
        """Test AUC vs k (``x="dims"``: vs the input dimensions kept): the ranking, each random
        ranking (grey) and the all-features level."""
        import matplotlib.pyplot as plt

        if ax is None:
            fig, ax = plt.subplots(figsize=(6.5, 4))
        else:
            fig = ax.figure
        for i, (_seed, pts) in enumerate(sorted(self.random.items())):
            ax.plot([getattr(p, x) for p in pts], [p.test_auc for p in pts], "-o", color="0.6", markersize=3, linewidth=1,
                    label="random rankings" if i == 0 else None)
        ax.plot([getattr(p, x) for p in self.points], [p.test_auc for p in self.points], "-o", color="tab:blue",
                label=f"{self.method}, test (AUKC {self.aukc:.4f})")
        ax.plot([getattr(p, x) for p in self.points], [p.best_val_auc for p in self.points], "--", color="tab:blue", alpha=0.6,
                label=f"{self.method}, validation (AUKC {self.val_aukc:.4f}; k chosen here)")
        ax.axhline(self.full.test_auc, color="black", linestyle="--", linewidth=0.8, label=f"all {self.full.k} features")
        ax.axhspan(self.full.test_auc - self.tolerance, self.full.test_auc, color="tab:green", alpha=0.12,
                   label=f"within {self.tolerance:g}")
        chosen = self.smallest_k if x == "k" else self.dims_at_smallest_k
        if chosen is not None:
            ax.axvline(chosen, color="tab:green", linewidth=0.8)
        ax.set_xlabel("features kept (k)" if x == "k" else "input dimensions kept")
        ax.set_ylabel("AUC")
        ax.set_title(f"selection curve: {self.method} on {self.dataset}" + (
            f" (random AUKC {self.random_aukc:.4f})" if self.random else ""), fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        return fig

    def to_markdown(self) -> str:
        lines = ["| k | dims | validation AUC | test AUC | test AUC - all features (95% CI, paired) | test log loss | "
                 "random test AUC (mean) | features |",
                 "|---|---|---|---|---|---|---|---|"]
        rnd = {k: [p.test_auc for pts in self.random.values() for p in pts if p.k == k] for k in self.ks}
        for p in self.points:
            r = f"{np.mean(rnd[p.k]):.4f}" if rnd.get(p.k) else ""
            chosen = " (chosen)" if p.k == self.smallest_k else ""
            iv = p.test_vs_full
            paired = f"{iv['estimate']:+.4f} [{iv['low']:+.4f}, {iv['high']:+.4f}]" if iv else ""
            lines.append(f"| {p.k}{chosen} | {p.dims} | {p.best_val_auc:.4f} | {p.test_auc:.4f} | {paired} | "
                         f"{p.test_logloss:.4f} | {r} | {', '.join(p.features)} |")
        return "\n".join(lines)

    # -- files ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "ks": self.ks,
            "ranking": self.ranking,
            "points": [asdict(p) for p in self.points],
            "full": asdict(self.full),
            "random": {str(s): [asdict(p) for p in pts] for s, pts in self.random.items()},
            "tolerance": self.tolerance,
            "method": self.method,
            "dataset": self.dataset,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SelectionCurve:
        def point(p: dict[str, Any]) -> CurvePoint:  # strict JSON stores NaN as null
            nan = float("nan")
            values: dict[str, Any] = {k: (nan if v is None and k not in ("run_id", "test_vs_full") else v) for k, v in p.items()}
            return CurvePoint(**values)

        return cls(
            method=data["method"],
            dataset=data["dataset"],
            ks=list(data["ks"]),
            points=[point(p) for p in data["points"]],
            full=point(data["full"]),
            random={int(s): [point(p) for p in pts] for s, pts in data.get("random", {}).items()},
            tolerance=float(data.get("tolerance", 0.001)),
            ranking=list(data.get("ranking", [])),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        atomic_write_text(path, json.dumps(plain(self.to_dict()), indent=2, allow_nan=False))
        return path

    @classmethod
    def load(cls, path: str | Path) -> SelectionCurve:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_mlflow(self, tracker: RunTracker) -> None:
        import matplotlib.pyplot as plt

        tracker.log_metrics({k: float(v) for k, v in self.summary().items() if isinstance(v, (int, float)) and v is not None})
        for p in self.points:
            tracker.log_metrics({"curve.test_auc": p.test_auc, "curve.test_logloss": p.test_logloss}, step=p.k)
        tracker.log_dict(self.to_dict(), "selection/curve.json")
        fig = self.plot()
        tracker.log_figure(fig, "selection/curve.png")
        plt.close(fig)


def _pair_with_full(cache: FitCache, full: CurvePoint, points: Sequence[CurvePoint]) -> None:
    """Each point's test AUC minus the all-features model's on the same rows (DeLong), when
    both fits kept their test scores."""
    from recsys.stats import delong

    reference = cache.scores(full.features)
    if reference is None or cache.test_labels is None or len(np.unique(cache.test_labels)) != 2:
        return
    for p in points:
        scores = cache.scores(p.features)
        if scores is not None:
            p.test_vs_full = delong(cache.test_labels, scores, reference).to_dict()


def selection_curve(
    recipe: Recipe,
    report: ImportanceReport,
    ks: Iterable[int],
    *,
    random_seeds: Sequence[int] = (0, 1, 2),
    tolerance: float = 0.001,
    cache: FitCache | None = None,
    tracker: RunTracker | None = None,
    progress: bool = True,
) -> SelectionCurve:
    """Retrain ``recipe``'s backbone on the top-k features of ``report`` for every k.

    Args:
        recipe: the training recipe (data, backbone, trainer settings).
        report: the ranking.
        ks: kept-feature counts (each 1..len(report)).
        random_seeds: seeds of the random rankings drawn on the same ks (empty: none).
        tolerance: AUC tolerance for :attr:`SelectionCurve.smallest_k`.
        cache: fit memo shared between curves on the same recipe.
        tracker: parent MLflow run; every fit becomes a nested child run (None: no tracking).
        progress: show a progress bar over the fits (memoised ones pass instantly).

    Returns:
        the curve (with the all-features model as reference).
    """
    ks = parse_ks(list(ks), len(report))
    cache = cache or FitCache()
    parent = tracker.run_id if tracker is not None else None
    tracking = tracker is not None
    schema_names = [n for n in recipe.schema.names if n in set(report.ranking)]
    # every (label, features) fit of the curve, then one progress bar over them
    jobs: list[tuple[str, str, int, list[str]]] = [("full", "all-features", len(schema_names), schema_names)]
    jobs += [("ranked", f"{report.method}-top{k}", k, report.top_k(k)) for k in ks]
    for seed in random_seeds:
        order = RandomRanking(seed=seed).rank_schema(recipe.schema.select(report.ranking))
        jobs += [(f"random{seed}", f"random{seed}-top{k}", k, order.top_k(k)) for k in ks]
    from tqdm.auto import tqdm

    widths = feature_widths(trained_schema(recipe))
    done: dict[str, list[CurvePoint]] = {}
    for group, run_name, _, features in tqdm(jobs, desc=f"selection curve ({report.method})", unit="fit", disable=not progress):
        point = cache.get(recipe, features, run_name, parent, tracking)
        point.dims = sum(widths.get(f, 1) for f in features)
        done.setdefault(group, []).append(point)
    full = done["full"][0]
    points = done.get("ranked", [])
    _pair_with_full(cache, full, [*points, *(p for group, pts in done.items() if group.startswith("random") for p in pts)])
    random = {int(seed): done[f"random{seed}"] for seed in random_seeds if f"random{seed}" in done}
    curve = SelectionCurve(report.method, report.dataset or recipe.dataset_name, ks, points, full, random, tolerance,
                           report.ranking)
    if tracker is not None:
        curve.to_mlflow(tracker)
    return curve
