"""``DimensionPlan``: the embedding widths a dimension search (or a baseline) hands back.

A plan gives every sparse feature it names an embedding dim, optionally finer:

* per feature: ``dims={"user": 16, "item": 32}``;
* per (feature, frequency block): ``blocks={"item": [FrequencyBlock(0, 100, 32),
  FrequencyBlock(100, None, 8)]}``. Vocabularies are ordered by descending frequency with the
  OOV id at row 0 (:mod:`recsys.data.encoders`), so a frequency block is a contiguous id range
  ``[start, stop)``; ``stop=None`` on the last block means "to the end of the table" (DNIS);
* per cluster: ``clusters={0: {"user": 8, ...}, 1: {...}}`` with one model per cluster (iHAS).

Policies:

* **Alignment.** Every dim is a multiple of :data:`ALIGNMENT` (4, FBGEMM's table-batched
  kernels). A dim that is not is *rounded up* to the next multiple of 4 with a
  :class:`DimensionAlignmentWarning` that names the feature (and block or cluster); a dim below
  1, or not an integer, is refused with a :class:`DimensionPlanError` naming the feature.
* **Partial plans.** Sparse features a plan does not name keep the schema's dim; a plan that
  names a feature the schema lacks (or a dense feature) is refused when it meets the schema.
* **Budgets** (:func:`check_budget`): a parameter budget below one aligned dim (4) per feature,
  i.e. below ``4 x sum(num_embeddings)``, is refused with the smallest feasible budget.

::

    plan = DimensionPlan({"user": 8, "item": 32}, method="manual")
    plan.num_parameters(schema)          # exact: sum(num_embeddings x dim) over the tables
    model = DCNv2(plan.apply(schema))
    plan.save("plan.yaml"); DimensionPlan.load("plan.yaml")
    recipe.fit(extra_args=plan.to_config_overrides())
    plan.to_mlflow(tracker, schema)      # plan JSON + per-feature dims plot + parameter count
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recsys.artifacts import check_format_version, plain, read_artifact, write_artifact
from recsys.data.schema import Schema, SchemaError

if TYPE_CHECKING:
    from types import FrameType

    from matplotlib.figure import Figure

    from recsys.tracking import RunTracker

__all__ = [
    "ALIGNMENT",
    "FORMAT_VERSION",
    "DimensionAlignmentWarning",
    "DimensionPlan",
    "DimensionPlanError",
    "FrequencyBlock",
    "align_dim",
    "check_budget",
    "min_budget",
]

#: version of the file format written by :meth:`DimensionPlan.save`
FORMAT_VERSION = 1
#: embedding dims are multiples of this (FBGEMM table-batched embedding alignment)
ALIGNMENT = 4


class DimensionPlanError(SchemaError):
    """A dimension plan is malformed or does not fit the schema it is applied to."""


class DimensionAlignmentWarning(UserWarning):
    """A dim that is not a multiple of :data:`ALIGNMENT` was rounded up."""


def align_dim(dim: int, multiple: int = ALIGNMENT) -> int:
    """``dim`` rounded up to a multiple of ``multiple`` (4 -> 4, 5 -> 8, 1 -> 4)."""
    return int(math.ceil(int(dim) / multiple) * multiple)


def checked_dim(value: Any, where: str) -> int:
    """An aligned dim from user input: refuses non-integers and dims < 1, rounds up with a
    warning naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != int(value):
        raise DimensionPlanError(f"{where}: embedding dim must be an integer, got {value!r}")
    dim = int(value)
    if dim < 1:
        raise DimensionPlanError(f"{where}: embedding dim must be >= 1, got {dim}")
    aligned = align_dim(dim)
    if aligned != dim:
        warnings.warn(
            f"{where}: embedding dim {dim} is not a multiple of {ALIGNMENT} (FBGEMM alignment); rounded up to {aligned}",
            DimensionAlignmentWarning,
            stacklevel=_user_stacklevel(),
        )
    return aligned


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside this package (and the dataclass-generated
    ``__init__``), so a warning points at the user's line."""
    import sys

    here = str(Path(__file__).parent)
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and (frame.f_code.co_filename.startswith(here) or frame.f_code.co_filename.startswith("<")):
        frame, level = frame.f_back, level + 1
    return level


@dataclass(frozen=True)
class FrequencyBlock:
    """One frequency block of a feature's vocabulary: ids ``[start, stop)`` get width ``dim``.

    Args:
        start: first id of the block (the first block starts at 0, the OOV row).
        stop: one past the last id; None on the last block means "to the end of the table".
        dim: embedding width of the block (aligned to 4).
    """

    start: int
    stop: int | None
    dim: int

    def size(self, num_embeddings: int) -> int:
        """Rows in the block for a table of ``num_embeddings`` rows."""
        return (num_embeddings if self.stop is None else self.stop) - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "stop": self.stop, "dim": self.dim}

    @classmethod
    def coerce(cls, value: FrequencyBlock | Mapping[str, Any] | Sequence[Any]) -> FrequencyBlock:
        """From a block, a ``{start, stop, dim}`` mapping or a ``(start, stop, dim)`` triple."""
        if isinstance(value, FrequencyBlock):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"start", "stop", "dim"})
            if unknown or "dim" not in value or "start" not in value:
                raise DimensionPlanError(f"a frequency block needs keys start, stop, dim; got {dict(value)!r}")
            return cls(value["start"], value.get("stop"), value["dim"])
        if isinstance(value, (list, tuple)) and len(value) == 3:
            return cls(value[0], value[1], value[2])
        raise DimensionPlanError(f"a frequency block is (start, stop, dim) or a mapping; got {value!r}")


def min_budget(schema: Schema, features: Sequence[str] | None = None) -> int:
    """The smallest embedding-parameter budget: one aligned dim (4) for every table."""
    names = list(features) if features is not None else schema.sparse_names
    return sum(ALIGNMENT * table_size(schema, n) for n in names)


def check_budget(schema: Schema, budget: int, features: Sequence[str] | None = None) -> int:
    """``budget`` as an int, or a :class:`DimensionPlanError` when it cannot give every
    feature one aligned dim (the error lists the per-feature minimum)."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget):
        raise DimensionPlanError(f"budget must be a number of embedding parameters, got {budget!r}")
    names = list(features) if features is not None else schema.sparse_names
    if not names:
        raise DimensionPlanError("the schema has no sparse feature: there is nothing to give a budget to")
    need = min_budget(schema, names)
    if budget < need:
        parts = ", ".join(f"{n}: {ALIGNMENT} x {table_size(schema, n)}" for n in names[:12])
        more = f", ... ({len(names) - 12} more)" if len(names) > 12 else ""
        raise DimensionPlanError(
            f"budget={int(budget)} embedding parameters is smaller than one dim of {ALIGNMENT} per feature, "
            f"which needs {need} ({parts}{more}); raise the budget to at least {need}"
        )
    return int(budget)


def table_size(schema: Schema, name: str) -> int:
    spec = schema[name]
    if not spec.is_sparse:
        raise DimensionPlanError(f"feature {name!r} is dense: it has no embedding table")
    if spec.num_embeddings is None:
        raise DimensionPlanError(
            f"feature {name!r}: num_embeddings is unknown; use a fitted schema (Preprocessor.fitted_schema or recipe.schema)"
        )
    return int(spec.num_embeddings)


@dataclass(frozen=True)
class DimensionPlan:
    """Embedding dims for the sparse features of a schema.

    Args:
        dims: feature -> embedding dim. For a blocked feature it defaults to (and must equal)
            the largest block dim; for a cluster plan, to the largest dim over the clusters.
        blocks: feature -> frequency blocks, contiguous from id 0 (see :class:`FrequencyBlock`).
        clusters: cluster id -> (feature -> dim); every cluster names the same features.
        cluster_sizes: cluster id -> number of training instances routed to it (optional); a
            cluster with no instance is refused.
        method: what produced the plan (``uniform``, ``mde``, ``dnis``, ``ihas``, ``manual``).
        dataset: dataset name.
        num_embeddings: table sizes the plan was derived for (used when no schema is passed to
            :meth:`num_parameters`, :meth:`plot` or :meth:`to_mlflow`).
        config: the producing method's settings (budget, alpha, ...).
        extras: JSON-able method-specific evidence (masks, curves, ...).

    Raises:
        DimensionPlanError: a dim below 1 or not an integer, a malformed block list, a cluster
            with no features or no instances, blocks and clusters together.

    Dims that are not multiples of 4 are rounded up with a :class:`DimensionAlignmentWarning`.
    """

    dims: dict[str, int] = field(default_factory=dict)
    blocks: dict[str, tuple[FrequencyBlock, ...]] = field(default_factory=dict)
    clusters: dict[int, dict[str, int]] = field(default_factory=dict)
    cluster_sizes: dict[int, int] = field(default_factory=dict)
    method: str = "manual"
    dataset: str = ""
    num_embeddings: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        dims = {str(n): checked_dim(d, f"feature {n!r}") for n, d in dict(self.dims).items()}
        blocks = {str(n): self._checked_blocks(str(n), b) for n, b in dict(self.blocks).items()}
        clusters: dict[int, dict[str, int]] = {}
        for cid, cdims in dict(self.clusters).items():
            if not isinstance(cdims, Mapping) or not cdims:
                raise DimensionPlanError(f"cluster {cid}: it names no feature (an empty cluster has no model)")
            clusters[int(cid)] = {str(n): checked_dim(d, f"cluster {cid}, feature {n!r}") for n, d in cdims.items()}
        if blocks and clusters:
            raise DimensionPlanError("a plan has frequency blocks or clusters, not both")
        if clusters:
            first = list(next(iter(clusters.values())))
            for cid, cdims in clusters.items():
                if set(cdims) != set(first):
                    raise DimensionPlanError(
                        f"cluster {cid} names features {sorted(cdims)}, another cluster {sorted(first)}: "
                        "every cluster model needs a dim for every feature"
                    )
        sizes = {int(c): int(s) for c, s in dict(self.cluster_sizes).items()}
        if sizes:
            if not clusters:
                raise DimensionPlanError("cluster_sizes given without clusters")
            if set(sizes) != set(clusters):
                raise DimensionPlanError(f"cluster_sizes has clusters {sorted(sizes)}, the plan {sorted(clusters)}")
            empty = sorted(c for c, s in sizes.items() if s <= 0)
            if empty:
                raise DimensionPlanError(
                    f"cluster(s) {empty} ended up empty (no instance routed to them): drop them or use fewer clusters"
                )
        # the per-feature width at the seam: the widest block / cluster
        derived: dict[str, int] = {n: max(b.dim for b in bl) for n, bl in blocks.items()}
        for cdims in clusters.values():
            for n, d in cdims.items():
                derived[n] = max(derived.get(n, 0), d)
        for n, d in derived.items():
            if n in dims and dims[n] != d:
                what = "block" if n in blocks else "cluster"
                raise DimensionPlanError(
                    f"feature {n!r}: dims says {dims[n]} but its largest {what} dim is {d}; leave it out of dims"
                )
            dims.setdefault(n, d)
        if not dims:
            raise DimensionPlanError("an empty dimension plan: give dims, blocks or clusters for at least one feature")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "blocks", blocks)
        object.__setattr__(self, "clusters", clusters)
        object.__setattr__(self, "cluster_sizes", sizes)
        object.__setattr__(self, "num_embeddings", {str(n): int(v) for n, v in dict(self.num_embeddings).items()})

    @staticmethod
    def _checked_blocks(name: str, raw: Any) -> tuple[FrequencyBlock, ...]:
        items = [FrequencyBlock.coerce(b) for b in (raw or ())]
        if not items:
            raise DimensionPlanError(f"feature {name!r}: an empty list of frequency blocks")
        out = []
        expected = 0
        for i, b in enumerate(items):
            where = f"feature {name!r}, block {i} [{b.start}, {b.stop})"
            if int(b.start) != expected:
                raise DimensionPlanError(
                    f"{where}: blocks must be contiguous id ranges from 0; this one should start at {expected}"
                )
            if b.stop is None and i != len(items) - 1:
                raise DimensionPlanError(f"{where}: only the last block may have stop=None (to the end of the table)")
            if b.stop is not None and int(b.stop) <= int(b.start):
                raise DimensionPlanError(f"{where}: stop must be greater than start")
            out.append(FrequencyBlock(int(b.start), None if b.stop is None else int(b.stop), checked_dim(b.dim, where)))
            expected = int(b.stop) if b.stop is not None else -1
        return tuple(out)

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def from_schema(cls, schema: Schema, method: str = "schema", **kwargs: Any) -> DimensionPlan:
        """The dims a schema already has (table sizes recorded when it is fitted)."""
        return cls(
            dims={f.name: f.embedding_dim for f in schema.sparse},
            method=method,
            dataset=kwargs.pop("dataset", schema.name),
            num_embeddings=table_sizes(schema),
            **kwargs,
        )

    # -- views -------------------------------------------------------------------------------
    @property
    def features(self) -> list[str]:
        """The features the plan names (in plan order)."""
        return list(self.dims)

    @property
    def is_blocked(self) -> bool:
        return bool(self.blocks)

    @property
    def is_clustered(self) -> bool:
        return bool(self.clusters)

    def __getitem__(self, feature: str) -> int:
        try:
            return self.dims[feature]
        except KeyError:
            raise KeyError(f"{feature!r} is not in the plan; planned features: {self.features}") from None

    # -- against a schema ----------------------------------------------------------------------
    def check(self, schema: Schema) -> None:
        """Refuse a plan that does not fit ``schema``: unknown or dense features; blocks that do
        not cover a feature's table exactly (needs a fitted schema)."""
        unknown = [n for n in self.dims if n not in schema.names]
        if unknown:
            raise DimensionPlanError(
                f"the plan names features {unknown} that the schema lacks; schema sparse features: {schema.sparse_names}"
            )
        dense = [n for n in self.dims if not schema[n].is_sparse]
        if dense:
            raise DimensionPlanError(f"the plan gives embedding dims to dense features {dense}: they have no table")
        for name, blocks in self.blocks.items():
            n = table_size(schema, name)
            stop = blocks[-1].stop
            if stop is not None and stop != n:
                raise DimensionPlanError(
                    f"feature {name!r}: its blocks end at id {stop} but its table has {n} rows; "
                    f"end the last block at {n} or with stop=None"
                )
            if stop is None and blocks[-1].start >= n:
                raise DimensionPlanError(
                    f"feature {name!r}: the last block starts at id {blocks[-1].start}, past the table's {n} rows"
                )

    def apply(self, schema: Schema) -> Schema:
        """``schema`` with the planned per-feature dims (unplanned features keep theirs).

        A blocked plan applies each feature's largest block dim and a cluster plan the largest
        dim over its clusters: the model that results has the plan's per-feature *width*; the
        per-block tables come from ``SparseArchConfig(blocks=plan.block_lists())`` (``salience
        fit``: ``model.embedding_blocks``, set by :meth:`to_config_overrides`), the per-cluster
        models from :meth:`apply_cluster`.
        """
        self.check(schema)
        return schema.with_dims(self.dims)

    def apply_cluster(self, schema: Schema, cluster: int) -> Schema:
        """``schema`` with cluster ``cluster``'s dims (the schema of that cluster's model)."""
        if cluster not in self.clusters:
            raise DimensionPlanError(f"cluster {cluster} is not in the plan; clusters: {sorted(self.clusters)}")
        self.check(schema)
        return schema.with_dims(self.clusters[cluster])

    def parameters_per_feature(self, schema: Schema | None = None) -> dict[str, int]:
        """Embedding parameters of each table the plan sizes (rows x dim; per block range size
        x block dim for blocked features; summed over the cluster models of a cluster plan).

        Args:
            schema: a fitted schema; default: the table sizes recorded in the plan.
        """
        sizes = self._sizes(schema)
        out: dict[str, int] = {}
        for name, dim in self.dims.items():
            n = sizes[name]
            if name in self.blocks:
                out[name] = sum(b.size(n) * b.dim for b in self.blocks[name])
            elif self.clusters:
                out[name] = sum(n * c[name] for c in self.clusters.values())
            else:
                out[name] = n * dim
        return out

    def num_parameters(self, schema: Schema | None = None) -> int:
        """Exact embedding-parameter count of the planned tables.

        With a schema, features the plan does not name count with the schema's dim, so this is
        ``RankingModel.embedding_parameters()`` of a model built from :meth:`apply` (per-feature
        plans; a cluster plan counts every cluster model's tables).
        """
        total = sum(self.parameters_per_feature(schema).values())
        if schema is not None:
            copies = max(len(self.clusters), 1)
            total += sum(copies * table_size(schema, f.name) * f.embedding_dim for f in schema.sparse if f.name not in self.dims)
        return total

    def cluster_parameters(self, schema: Schema | None = None) -> dict[int, int]:
        """Cluster id -> embedding parameters of that cluster's model (planned features)."""
        sizes = self._sizes(schema)
        return {c: sum(sizes[n] * d for n, d in cdims.items()) for c, cdims in self.clusters.items()}

    def _sizes(self, schema: Schema | None) -> dict[str, int]:
        if schema is not None:
            self.check(schema)
            return {n: table_size(schema, n) for n in self.dims}
        missing = [n for n in self.dims if n not in self.num_embeddings]
        if missing:
            raise DimensionPlanError(
                f"the table sizes of {missing} are unknown: pass a fitted schema (the plan records none for them)"
            )
        return dict(self.num_embeddings)

    # -- training configs ----------------------------------------------------------------------
    def to_config_overrides(self) -> list[str]:
        """``salience fit`` arguments that train with the planned per-feature dims
        (``recipe.fit(extra_args=plan.to_config_overrides())``); needs the data module's
        ``embedding_dims`` option. A blocked plan adds ``--model.embedding_blocks`` (feature ->
        ``[[start, stop, dim], ...]``, stop null = to the end of the table): one table per
        (feature, block), so the model trains at the planned size."""
        args = [f"--data.embedding_dims={json.dumps(self.dims)}"]
        if self.blocks:
            args.append(f"--model.embedding_blocks={json.dumps(self.block_lists())}")
        return args

    def block_lists(self) -> dict[str, list[list[int | None]]]:
        """The frequency blocks as ``model.embedding_blocks`` takes them: feature ->
        ``[[start, stop, dim], ...]`` (stop None = to the end of the table)."""
        return {n: [[b.start, b.stop, b.dim] for b in bl] for n, bl in self.blocks.items()}

    def to_config(self, config: Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """A ``salience fit`` config (dict or YAML path) with ``data.embedding_dims`` set to the
        planned per-feature dims (merged over any there) and, for a blocked plan,
        ``model.embedding_blocks`` set to its frequency blocks."""
        if not isinstance(config, Mapping):
            import yaml

            config = yaml.safe_load(Path(config).read_text()) or {}
        out = json.loads(json.dumps(dict(config), default=str))
        data = out.setdefault("data", {})
        data["embedding_dims"] = {**dict(data.get("embedding_dims") or {}), **self.dims}
        model = out.get("model") or {}
        # blocks of a feature the plan sizes are replaced (a flat planned dim drops them)
        kept = {n: b for n, b in dict(model.get("embedding_blocks") or {}).items() if n not in self.dims}
        if kept or self.blocks:
            out["model"] = {**model, "embedding_blocks": {**kept, **self.block_lists()}}
        elif "embedding_blocks" in model:
            out["model"] = {k: v for k, v in model.items() if k != "embedding_blocks"}
        return out

    # -- rendering -----------------------------------------------------------------------------
    def format(self, schema: Schema | None = None) -> str:
        """A plain-text table (feature, rows, dim, parameters) for the terminal."""
        try:
            params: dict[str, int] | None = self.parameters_per_feature(schema)
            sizes: dict[str, int] | None = self._sizes(schema)
        except DimensionPlanError:
            params = sizes = None
        lines = [f"{self.method} dimension plan" + (f" on {self.dataset}" if self.dataset else "")]
        lines.append(f"{'feature':<28} {'rows':>10} {'dim':>5} {'parameters':>12}  blocks/clusters")
        for name, dim in self.dims.items():
            rows = f"{sizes[name]}" if sizes else "?"
            par = f"{params[name]}" if params else "?"
            detail = ""
            if name in self.blocks:
                detail = " ".join(f"[{b.start},{'' if b.stop is None else b.stop}):{b.dim}" for b in self.blocks[name])
            elif self.clusters:
                detail = " ".join(f"c{c}:{d[name]}" for c, d in self.clusters.items())
            lines.append(f"{name:<28} {rows:>10} {dim:>5} {par:>12}  {detail}")
        if params:
            lines.append(f"total embedding parameters: {sum(params.values())}")
        return "\n".join(lines)

    def plot(self, schema: Schema | None = None, ax: Any = None) -> Figure:
        """Bar chart of the per-feature dims (one bar group per cluster for a cluster plan;
        block dims of a blocked feature as dots over its bar)."""
        import matplotlib.pyplot as plt
        import numpy as np

        names = self.features
        if ax is None:
            fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(names) + 2.0), 3.6))
        else:
            fig = ax.figure
        x = np.arange(len(names))
        if self.clusters:
            width = 0.8 / len(self.clusters)
            for i, (cid, cdims) in enumerate(self.clusters.items()):
                ax.bar(x - 0.4 + width * (i + 0.5), [cdims[n] for n in names], width, label=f"cluster {cid}")
            ax.legend(fontsize=7)
        else:
            ax.bar(x, [self.dims[n] for n in names], color="tab:blue", alpha=0.85)
            for i, name in enumerate(names):
                for b in self.blocks.get(name, ()):
                    ax.plot(i, b.dim, marker="_", markersize=12, color="tab:orange")
        try:
            sizes = self._sizes(schema)
            labels = [f"{n} ({sizes[n]})" for n in names]
            total = f", {self.num_parameters(schema):,} embedding parameters"
        except DimensionPlanError:
            labels, total = list(names), ""
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("embedding dim")
        ax.set_title(f"{self.method} dims" + (f" on {self.dataset}" if self.dataset else "") + total, fontsize=10)
        fig.tight_layout()
        return fig

    def to_mlflow(
        self, tracker: RunTracker, schema: Schema | None = None, prefix: str | None = None, metric_prefix: str = ""
    ) -> None:
        """Log the plan (JSON), the per-feature dims plot (PNG), the text table and the
        ``embedding_parameters`` metric to ``tracker``'s run.

        Args:
            tracker: the MLflow run.
            schema: fitted schema for the parameter count (default: the recorded table sizes).
            prefix: artifact folder (default ``dims/<method>``).
            metric_prefix: prepended to the metric name (several plans in one run).
        """
        import matplotlib.pyplot as plt

        prefix = prefix or f"dims/{self.method}"
        params = self.num_parameters(schema)
        tracker.log_dict(self.to_dict(), f"{prefix}/plan.json")
        tracker.log_text(self.format(schema), f"{prefix}/plan.txt")
        fig = self.plot(schema)
        tracker.log_figure(fig, f"{prefix}/dims.png")
        plt.close(fig)
        tracker.log_metrics({f"{metric_prefix}embedding_parameters": params})

    # -- files ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "dataset": self.dataset,
            "dims": dict(self.dims),
        }
        if self.blocks:
            out["blocks"] = {n: [b.to_dict() for b in bl] for n, bl in self.blocks.items()}
        if self.clusters:
            out["clusters"] = {str(c): dict(d) for c, d in self.clusters.items()}
        if self.cluster_sizes:
            out["cluster_sizes"] = {str(c): s for c, s in self.cluster_sizes.items()}
        if self.num_embeddings:
            out["num_embeddings"] = dict(self.num_embeddings)
        out["config"] = plain(self.config)
        out["extras"] = plain(self.extras)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "dimension plan") -> DimensionPlan:
        allowed = {"format_version", "method", "dataset", "dims", "blocks", "clusters", "cluster_sizes",
                   "num_embeddings", "config", "extras"}  # fmt: skip
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise DimensionPlanError(f"{source}: unknown keys {unknown}; allowed: {sorted(allowed)}")
        check_format_version(data, FORMAT_VERSION, source, "plan", DimensionPlanError)
        for key in ("dims", "blocks", "clusters", "cluster_sizes", "num_embeddings"):
            if data.get(key) is not None and not isinstance(data[key], Mapping):
                raise DimensionPlanError(f"{source}: {key!r} must be a mapping, got {type(data[key]).__name__}")
        try:
            return cls(
                dims=dict(data.get("dims") or {}),
                blocks={n: tuple(bl or ()) for n, bl in (data.get("blocks") or {}).items()},
                clusters={int(c): dict(d or {}) for c, d in (data.get("clusters") or {}).items()},
                cluster_sizes={int(c): int(s) for c, s in (data.get("cluster_sizes") or {}).items()},
                method=str(data.get("method", "manual")),
                dataset=str(data.get("dataset", "")),
                num_embeddings=dict(data.get("num_embeddings") or {}),
                config=dict(data.get("config") or {}),
                extras=dict(data.get("extras") or {}),
            )
        except DimensionPlanError as e:
            raise DimensionPlanError(f"{source}: {e}") from e

    def save(self, path: str | Path) -> Path:
        """Write the plan atomically: YAML for ``.yaml``/``.yml``, JSON otherwise; returns the path."""
        return write_artifact(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> DimensionPlan:
        data = read_artifact(path, "dimension plan", DimensionPlanError, any_of=("dims", "blocks", "clusters"))
        return cls.from_dict(data, source=str(Path(path)))


def table_sizes(schema: Schema) -> dict[str, int]:
    return {f.name: int(f.num_embeddings) for f in schema.sparse if f.num_embeddings is not None}
