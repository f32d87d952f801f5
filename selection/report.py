"""``ImportanceReport``: the ranked, evidenced answer every importance method returns.

A report is a table (one :class:`FeatureImportance` row per ranked feature) plus what produced
it (method, config, wall-clock cost, dataset) and method-specific evidence in ``extras``
(OutRank's redundancy matrix and noise controls, LeAP's gate trajectories, ...). Features a
method refuses to rank (a label leak, an entirely missing column) are listed in ``excluded``
with the reason, never silently ranked first.

    report = OutRank().rank(recipe)
    report.top_k(4)                      # ['item_id', 'site_category', ...]
    report.reduced_schema(schema, 4)     # Schema that trains the smaller model
    report.reduced_config(config, 4)     # training config dict with data.features set
    report.plot()                        # horizontal bar chart (matplotlib Figure)
    report.save("outrank.json"); ImportanceReport.load("outrank.json")
    report.to_mlflow(tracker)            # table + plot + JSON as run artifacts
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recsys.artifacts import check_format_version, plain, read_artifact, write_artifact
from recsys.data.schema import Schema

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from recsys.tracking import RunTracker

__all__ = ["FORMAT_VERSION", "FeatureImportance", "ImportanceReport"]

#: version of the JSON file format written by :meth:`ImportanceReport.save`
FORMAT_VERSION = 1


@dataclass(frozen=True)
class FeatureImportance:
    """One ranked feature.

    Args:
        feature: feature name.
        score: the method's importance score (higher = more important).
        rank: 1 for the most important feature.
        uncertainty: spread of the score where the method has one (std over repeats or
            batches), else None.
        width: input width the feature occupies at the seam (embedding dim of a sparse
            feature, 1 for a dense one): the cost of keeping it.
        kind: ``categorical``, ``multi_categorical`` or ``dense``.
        flags: warnings attached by the method (``below_noise``, ``constant``, ...).
    """

    feature: str
    score: float
    rank: int
    uncertainty: float | None = None
    width: int = 1
    kind: str = "categorical"
    flags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["flags"] = list(self.flags)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureImportance:
        return cls(**{**data, "flags": tuple(data.get("flags", ()))})


def _finite(x: float | None) -> float | None:
    """JSON has no NaN/inf: store them as None."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


@dataclass
class ImportanceReport:
    """A ranking of features by one importance method.

    Args:
        method: the method's name (``outrank``, ``permutation``, ``leap``, ``random``, ...).
        features: ranked rows, most important first (ranks 1..F).
        config: the method's settings.
        cost_seconds: wall-clock time the method took (training included where it trains).
        dataset: dataset name.
        excluded: features left out of the ranking -> reason (e.g. ``"leakage: ..."``).
        extras: JSON-able method-specific evidence.
    """

    method: str
    features: list[FeatureImportance]
    config: dict[str, Any] = field(default_factory=dict)
    cost_seconds: float = 0.0
    dataset: str = ""
    excluded: dict[str, str] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.features = sorted(self.features, key=lambda f: f.rank)
        ranks = [f.rank for f in self.features]
        if ranks != list(range(1, len(ranks) + 1)):
            raise ValueError(f"{self.method}: ranks must be 1..{len(ranks)} without gaps, got {ranks}")
        names = [f.feature for f in self.features]
        both = sorted(set(names) & set(self.excluded))
        if both:
            raise ValueError(f"{self.method}: features {both} are both ranked and excluded")

    @classmethod
    def from_scores(
        cls,
        method: str,
        scores: Mapping[str, float],
        *,
        uncertainty: Mapping[str, float | None] | None = None,
        widths: Mapping[str, int] | None = None,
        kinds: Mapping[str, str] | None = None,
        flags: Mapping[str, Sequence[str]] | None = None,
        config: Mapping[str, Any] | None = None,
        cost_seconds: float = 0.0,
        dataset: str = "",
        excluded: Mapping[str, str] | None = None,
        extras: Mapping[str, Any] | None = None,
    ) -> ImportanceReport:
        """Rank ``scores`` descending (NaN last; ties keep the order of ``scores``)."""
        names = list(scores)
        key = [(-(float(scores[n])) if math.isfinite(float(scores[n])) else math.inf) for n in names]
        order = sorted(range(len(names)), key=lambda i: (key[i], i))
        rows = [
            FeatureImportance(
                feature=names[i],
                score=float(scores[names[i]]),
                rank=r + 1,
                uncertainty=None if uncertainty is None or (u := uncertainty.get(names[i])) is None else float(u),
                width=int((widths or {}).get(names[i], 1)),
                kind=str((kinds or {}).get(names[i], "categorical")),
                flags=tuple((flags or {}).get(names[i], ())),
            )
            for r, i in enumerate(order)
        ]
        return cls(method, rows, dict(config or {}), float(cost_seconds), dataset, dict(excluded or {}), dict(extras or {}))

    # -- views -------------------------------------------------------------------------------
    @property
    def ranking(self) -> list[str]:
        """Feature names, most important first."""
        return [f.feature for f in self.features]

    @property
    def scores(self) -> dict[str, float]:
        return {f.feature: f.score for f in self.features}

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, feature: str) -> FeatureImportance:
        for f in self.features:
            if f.feature == feature:
                return f
        raise KeyError(f"{feature!r} is not ranked by {self.method}; ranked: {self.ranking}, excluded: {sorted(self.excluded)}")

    def top_k(self, k: int) -> list[str]:
        """The ``k`` most important features (in rank order).

        Raises:
            ValueError: when ``k`` is not in ``1..len(self)``.
        """
        if not 1 <= int(k) <= len(self.features):
            raise ValueError(
                f"k={k} is out of range: {self.method} ranked {len(self.features)} features"
                + (f" ({len(self.excluded)} more excluded: {sorted(self.excluded)})" if self.excluded else "")
                + f"; use 1 <= k <= {len(self.features)}"
            )
        return self.ranking[: int(k)]

    @property
    def dimensions(self) -> int:
        """Input dimensions of every ranked feature: Σ width (scalar 1, id its embedding dim,
        vector D)."""
        return sum(f.width for f in self.features)

    def dims_of(self, k: int) -> int:
        """Input dimensions of the top ``k`` features."""
        return sum(f.width for f in self.features[: int(k)])

    def top_dims(self, budget: int) -> list[str]:
        """The longest head of the ranking whose input dimensions fit ``budget`` (at least the
        first feature): selection by dimensions, the deployment metric at width.

        Raises:
            ValueError: ``budget`` < 1.
        """
        if budget < 1:
            raise ValueError(f"a dimension budget must be >= 1, got {budget}")
        out: list[str] = []
        used = 0
        for f in self.features:
            if out and used + f.width > budget:
                break
            out.append(f.feature)
            used += f.width
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per ranked feature (rank, feature, score, uncertainty, width, kind, flags)."""
        import pandas as pd

        frame = pd.DataFrame([f.to_dict() for f in self.features], columns=list(FeatureImportance.__dataclass_fields__))
        frame["flags"] = frame["flags"].map(lambda v: ",".join(v))
        return frame[["rank", "feature", "score", "uncertainty", "width", "kind", "flags"]]

    def format(self, top: int | None = None) -> str:
        """A plain-text table for the terminal."""
        rows = self.features[:top] if top else self.features
        lines = [
            f"{self.method} importance on {self.dataset or 'data'}: {len(self.features)} features ranked"
            f" in {self.cost_seconds:.1f} s",
            f"{'rank':>4}  {'feature':<28} {'score':>12} {'+/-':>10} {'width':>5}  flags",
        ]
        for f in rows:
            unc = f"{f.uncertainty:.4g}" if f.uncertainty is not None else ""
            lines.append(f"{f.rank:>4}  {f.feature:<28} {f.score:>12.5g} {unc:>10} {f.width:>5}  {','.join(f.flags)}")
        for name, reason in self.excluded.items():
            lines.append(f"   -  {name:<28} excluded: {reason}")
        return "\n".join(lines)

    # -- applying the selection ----------------------------------------------------------------
    def reduced_schema(self, schema: Schema, k: int) -> Schema:
        """``schema`` restricted to the top-``k`` features (schema order kept)."""
        return schema.select(self.top_k(k))

    def reduced_config(self, config: Mapping[str, Any] | str | Path, k: int) -> dict[str, Any]:
        """A ``salience fit`` config (dict or YAML path) that trains on the top-``k`` features.

        Sets ``data.features`` to the kept features and clears ``data.drop_features``.
        """
        if not isinstance(config, Mapping):
            import yaml

            config = yaml.safe_load(Path(config).read_text()) or {}
        out = json.loads(json.dumps(dict(config), default=str))  # deep copy, plain types
        data = out.setdefault("data", {})
        data["features"] = self.top_k(k)
        data.pop("drop_features", None)
        return out

    # -- rendering -----------------------------------------------------------------------------
    def plot(self, top: int | None = 40, ax: Any = None) -> Figure:
        """Horizontal bar chart of the scores (error bars where there is uncertainty)."""
        import matplotlib.pyplot as plt

        rows = self.features[:top] if top else self.features
        if ax is None:
            fig, ax = plt.subplots(figsize=(7, 0.28 * max(len(rows), 4) + 1.2))
        else:
            fig = ax.figure
        y = np.arange(len(rows))[::-1]
        err = [f.uncertainty or 0.0 for f in rows]
        colors = ["tab:red" if f.flags else "tab:blue" for f in rows]
        ax.barh(y, [f.score for f in rows], xerr=err if any(err) else None, color=colors, alpha=0.85)
        ax.set_yticks(y, [f"{f.feature} ({f.width})" for f in rows], fontsize=8)
        ax.axvline(0.0, color="black", linewidth=0.6)
        ax.set_xlabel("importance score")
        title = f"{self.method} on {self.dataset}" if self.dataset else self.method
        ax.set_title(title + ("  (red: flagged)" if any(f.flags for f in rows) else ""), fontsize=10)
        fig.tight_layout()
        return fig

    def plot_redundancy(self, ax: Any = None) -> Figure:
        """Heatmap of the feature-feature redundancy matrix in ``extras["redundancy"]``
        (OutRank), rows and columns in ranking order."""
        import matplotlib.pyplot as plt

        red = self.extras.get("redundancy")
        if not red or not red.get("features"):
            raise ValueError(f"{self.method} report has no redundancy matrix (extras['redundancy'])")
        names = list(red["features"])
        matrix = np.asarray([[np.nan if v is None else v for v in row] for row in red["matrix"]], dtype=float)
        order = [names.index(n) for n in self.ranking if n in names]
        matrix = matrix[np.ix_(order, order)]
        labels = [names[i] for i in order]
        if ax is None:
            side = 0.25 * len(labels) + 2.5
            fig, ax = plt.subplots(figsize=(side + 1, side))
        else:
            fig = ax.figure
        image = ax.imshow(matrix, cmap="viridis")
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_title(f"{self.method}: feature-feature redundancy", fontsize=10)
        fig.colorbar(image, ax=ax, shrink=0.8)
        fig.tight_layout()
        return fig

    def to_mlflow(self, tracker: RunTracker, prefix: str | None = None) -> None:
        """Log the table (CSV and an MLflow table), the bar chart (PNG), the redundancy heatmap
        where there is one, and the report (JSON) to ``tracker``'s run."""
        import matplotlib.pyplot as plt

        prefix = prefix or f"importance/{self.method}"
        frame = self.to_frame()
        tracker.log_text(frame.to_csv(index=False), f"{prefix}/ranking.csv")
        tracker.client.log_table(tracker.run_id, data=frame, artifact_file=f"{prefix}/ranking_table.json")
        tracker.log_dict(self.to_dict(), f"{prefix}/report.json")
        fig = self.plot()
        tracker.log_figure(fig, f"{prefix}/ranking.png")
        plt.close(fig)
        if self.extras.get("redundancy", {}).get("features"):
            fig = self.plot_redundancy()
            tracker.log_figure(fig, f"{prefix}/redundancy.png")
            plt.close(fig)
        tracker.log_metrics({f"{self.method}.cost_seconds": self.cost_seconds, f"{self.method}.features_ranked": len(self)})

    # -- files ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "dataset": self.dataset,
            "cost_seconds": self.cost_seconds,
            "config": plain(self.config),
            "features": [
                {**f.to_dict(), "score": _finite(f.score), "uncertainty": _finite(f.uncertainty)} for f in self.features
            ],
            "excluded": self.excluded,
            "extras": plain(self.extras),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "importance report") -> ImportanceReport:
        check_format_version(data, FORMAT_VERSION, source, "report", ValueError)
        rows = []
        for row in data["features"]:
            row = dict(row)
            row["score"] = float("nan") if row.get("score") is None else float(row["score"])
            rows.append(FeatureImportance.from_dict(row))
        return cls(
            method=data["method"],
            features=rows,
            config=dict(data.get("config", {})),
            cost_seconds=float(data.get("cost_seconds", 0.0)),
            dataset=data.get("dataset", ""),
            excluded=dict(data.get("excluded", {})),
            extras=dict(data.get("extras", {})),
        )

    def save(self, path: str | Path) -> Path:
        """Write the report atomically: YAML for ``.yaml``/``.yml``, JSON otherwise; returns the path."""
        return write_artifact(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> ImportanceReport:
        data = read_artifact(path, "importance report", ValueError, required=("method", "features"))
        return cls.from_dict(data, source=str(Path(path)))

    def with_method(self, method: str) -> ImportanceReport:
        return replace(self, method=method)

    def demoted(self, features: Mapping[str, str], flag: str = "copy", key: str = "copies") -> ImportanceReport:
        """These ranked features (-> why, e.g. the feature they copy) moved after all the others,
        in their own order, flagged ``flag``; ``extras[key]`` records them. Their scores are
        lowered by (score range + 1) so that scores still fall with rank."""
        moved = [f for f in self.features if f.feature in features]
        if not moved:
            return self
        finite = [f.score for f in self.features if math.isfinite(f.score)]
        shift = (max(finite) - min(finite) + 1.0) if finite else 0.0
        kept = [f for f in self.features if f.feature not in features]
        rows = [replace(f, rank=i + 1) for i, f in enumerate(kept)]
        rows += [replace(f, rank=len(kept) + i + 1, score=f.score - shift, flags=(*f.flags, flag)) for i, f in enumerate(moved)]
        extras = {**self.extras, key: {f.feature: features[f.feature] for f in moved}}
        return replace(self, features=rows, extras=extras)

