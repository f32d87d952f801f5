"""Trained layouts for the byte-budget search: per-feature dims and row schemes ([INF], issue 19).

A budget in bytes can be met by quantizing a full model (:func:`embeddings.compression.precision.search_precisions`),
by training narrower tables, or by training fewer rows. :func:`layouts_for_budget` lists the
layouts worth training for one budget, each sized so that it fits at a precision the search can
reach:

* ``full``: the config's dims and rows (quantization alone);
* ``uniform@int8`` / ``uniform@int4``: every sparse feature at the widest multiple of 4 whose
  tables fit the budget at that precision (the 4 bytes of scale and bias per row counted);
* ``mde@int8`` / ``mde@int4``: the frequency-power dims of mixed-dimension embeddings
  (:func:`embeddings.dims.baselines.mde_plan`: small vocabularies wide, large ones narrow, none wider
  than the config's widest dim) with the embedding parameters that fit the budget at that
  precision;
* ``plan``: a dimension plan found earlier (``salience dims``: DNIS, iHAS), when given;
* ``importance@int8`` / ``importance@int4``: per-feature dims and row schemes from an importance
  ranking found earlier (``salience rank`` / ``select``: OutRank, LeAP, ...), when given: the
  lower half of the ranking moves to quotient-remainder rows, and every feature's dim follows
  its rank (``D * (n - rank + 1) / n``, the largest ``D`` that fits; [INF], see
  :func:`importance_layout`);
* ``qr`` / ``hash``: the config's dims on quotient-remainder tables (Shi et al. 2020) or on a
  hashed table of the same rows, for every feature of at least ``min_ids`` ids.

:func:`train_layouts` fits each one through the recipe; :func:`choose_layout` runs the
precision search under the budget on every trained layout and keeps the one with the most
validation AUC. ``salience compress --config CFG --budget 0.125x`` (without ``--checkpoint``)
runs all three and exports the winner.

    layouts = layouts_for_budget(recipe.schema, budget)
    models = train_layouts(recipe, layouts, seed=0)
    choice = choose_layout({n: m.model for n, m in models.items()}, budget, val)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embeddings.compression.precision import CompressResult, search_precisions
from recsys.data.schema import Schema
from recsys.export.quantize import Precision, PrecisionError, PrecisionPlan
from recsys.models.base import RankingModel, SparseArch
from recsys.models.rows import RowMapping

__all__ = [
    "Layout", "LayoutChoice", "TrainedLayout", "choose_layout", "importance_layout", "layouts_for_budget", "read_ranking",
    "row_schemes", "train_layouts",
]

#: features with fewer ids keep their full table under the qr / hash layouts
MIN_IDS = 64
#: every layout kind :func:`layouts_for_budget` knows, in the order it lists them
KINDS = ("full", "uniform", "mde", "plan", "importance", "qr", "hash")
#: the precisions the dims layouts are sized for
SIZED_AT = (Precision.INT8, Precision.INT4)


@dataclass(frozen=True)
class Layout:
    """One trained variant of the config: its sparse dims and row schemes.

    Args:
        name: e.g. ``full``, ``mde@int4``, ``qr``.
        dims: ``data.embedding_dims`` (feature -> dim); None keeps the config's.
        rows: ``model.embedding_rows`` (feature -> row scheme); empty keeps full tables.
    """

    name: str
    dims: Mapping[str, int] | None = None
    rows: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def overrides(self) -> list[str]:
        """The command-line arguments that train this layout."""
        out = [f"--data.embedding_dims={json.dumps(dict(self.dims))}"] if self.dims else []
        return out + ([f"--model.embedding_rows={json.dumps({k: dict(v) for k, v in self.rows.items()})}"] if self.rows else [])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dims": dict(self.dims) if self.dims else None,
                "rows": {k: dict(v) for k, v in self.rows.items()}}


def row_schemes(schema: Schema, scheme: RowMapping | str, min_ids: int = MIN_IDS) -> dict[str, dict[str, Any]]:
    """``model.embedding_rows`` for every sparse feature with at least ``min_ids`` ids:
    quotient-remainder with ``m = ceil(sqrt(n))`` buckets (``ceil(n / m) + m`` rows, sum), or a
    hashed table of the same rows (equal bytes: the baseline QR must beat)."""
    try:
        scheme = RowMapping(scheme)
    except ValueError:
        raise ValueError(f"row scheme must be 'qr' or 'hash', got {scheme!r}") from None
    out: dict[str, dict[str, Any]] = {}
    for f in schema.sparse:
        n = int(f.num_embeddings or 0)
        if n < min_ids:
            continue
        m = math.ceil(math.sqrt(n))
        out[f.name] = ({"scheme": "qr", "buckets": m, "combine": "sum"} if scheme is RowMapping.QR
                       else {"scheme": "hash", "rows": math.ceil(n / m) + m})
    return out


def _rows(schema: Schema) -> dict[str, int]:
    return {f.name: int(f.num_embeddings or 0) for f in schema.sparse}


def _uniform_dim(schema: Schema, budget: int, precision: Precision) -> int | None:
    """The widest multiple of 4, at most the config's widest dim, whose tables fit ``budget``
    bytes at ``precision`` (None when not even dim 4 fits)."""
    rows = sum(_rows(schema).values())
    widest = max(int(f.embedding_dim) for f in schema.sparse)
    fitting = [d for d in range(4, widest + 1, 4) if rows * precision.row_bytes(d) <= budget]
    return fitting[-1] if fitting else None


def _mde_dims(schema: Schema, budget: int, precision: Precision) -> dict[str, int] | None:
    """MDE dims whose tables fit ``budget`` bytes at ``precision`` (None when the budget is below
    dim 4 everywhere), at most the config's widest dim: a wider row would widen the interaction's
    input and grow the served model beyond its embedding bytes. A row at int-N costs
    ``dim * bits / 8`` bytes plus 4 of scale and bias."""
    from embeddings.dims.baselines import mde_plan
    from embeddings.plan import DimensionPlanError

    rows = _rows(schema)
    params = (budget - precision.row_overhead * sum(rows.values())) * 8 // precision.bits
    try:
        widest = max(int(f.embedding_dim) for f in schema.sparse)
        dims = dict(mde_plan(schema, int(params), max_dim=max(4, widest // 4 * 4)).dims)
    except DimensionPlanError:
        return None
    assert sum(rows[f] * precision.row_bytes(d) for f, d in dims.items()) <= budget
    return dims


def read_ranking(path: str | Path) -> list[str]:
    """The features of an importance report JSON (``salience rank --output``, ``select``), most
    important first (by their ``rank``: screens such as the ID screen already applied), then the
    features the method excluded (constant, all missing, ...) by name."""
    try:
        report = json.loads(Path(path).read_text())
        ranked = sorted(report["features"], key=lambda f: (f["rank"], str(f["feature"])))
        return [str(f["feature"]) for f in ranked] + sorted(map(str, report.get("excluded") or {}))
    except FileNotFoundError as e:
        raise ValueError(f"{path}: no such importance report") from e
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not an importance report (expected 'features' entries with 'feature' and "
                         f"'rank', as `salience rank --output` writes): {e!r}") from e


def importance_layout(schema: Schema, budget: int, precision: Precision, ranking: Sequence[str],
                      min_ids: int = MIN_IDS) -> Layout | None:
    """Dims and row schemes that follow an importance ranking, sized for ``budget`` bytes at
    ``precision`` (our own rule, [INF]); None when not even dim 4 fits.

    The sparse features are ranked by their order in ``ranking`` (1 = most important, of ``n``).
    Those in the lower half (rank > n / 2) with at least ``min_ids`` ids move to
    quotient-remainder rows (:func:`row_schemes`): the bytes their identity would cost go to the
    features that matter. Feature ``f`` gets dim ``clamp(4 * floor(D * w_f / 4), 4, widest)`` with
    ``w_f = (n - rank_f + 1) / n`` and the config's widest dim ``widest``; ``D`` is the largest
    that fits (found by bisection: the bytes grow with ``D``).

    Raises:
        ValueError: ``ranking`` misses some of the schema's sparse features (named).
    """
    sparse = [f.name for f in schema.sparse]
    order = [f for f in ranking if f in set(sparse)]
    missing = sorted(set(sparse) - set(order))
    if missing:
        raise ValueError(f"the importance ranking has no entry for sparse feature(s) {missing}")
    n = len(order)
    rank = {f: i + 1 for i, f in enumerate(order)}
    qr = {f: spec for f, spec in row_schemes(schema, "qr", min_ids).items() if rank[f] > n / 2}
    ids = _rows(schema)
    rows = {f: (math.ceil(ids[f] / qr[f]["buckets"]) + qr[f]["buckets"]) if f in qr else ids[f] for f in sparse}
    widest = max(4, max(int(f.embedding_dim) for f in schema.sparse) // 4 * 4)

    def dims(d: float) -> dict[str, int]:
        return {f: min(widest, max(4, 4 * math.floor(d * (n - rank[f] + 1) / n / 4))) for f in sparse}

    def size(d: float) -> int:
        return sum(rows[f] * precision.row_bytes(dim) for f, dim in dims(d).items())

    if size(0.0) > budget:
        return None
    lo, hi = 0.0, float(widest * n)  # size(hi): every dim at widest
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if size(mid) <= budget else (lo, mid)
    return Layout(f"importance@{precision.value}", dims=dims(lo), rows=qr)


def layouts_for_budget(schema: Schema, budget: int, *, kinds: Sequence[str] = ("full", "uniform", "mde", "qr", "hash"),
                       dims_plan: Mapping[str, int] | None = None, ranking: Sequence[str] | None = None,
                       min_ids: int = MIN_IDS) -> list[Layout]:
    """The layouts of the module docstring for ``budget`` bytes, duplicates (the same dims and
    rows) listed once.

    Args:
        schema: the config's fitted schema (dims and ``num_embeddings`` of every sparse feature).
        budget: embedding bytes.
        kinds: which of :data:`KINDS` to list (``plan`` needs ``dims_plan``).
        dims_plan: feature -> dim of a plan found earlier (e.g. ``DimensionPlan.load(p).dims``).
        ranking: features, most important first, for ``importance`` (e.g. :func:`read_ranking`).
        min_ids: the qr / hash layouts leave smaller tables full.
    """
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown layout kind(s) {unknown}; choose from {list(KINDS)}")
    if "plan" in kinds and not dims_plan:
        raise ValueError("the 'plan' layout needs a dimension plan (--dims-plan)")
    if "importance" in kinds and not ranking:
        raise ValueError("the 'importance' layout needs an importance ranking (--importance)")
    config_dims = {f.name: int(f.embedding_dim) for f in schema.sparse}
    out: list[Layout] = []
    for kind in kinds:
        if kind == "full":
            out.append(Layout("full"))
        elif kind in ("qr", "hash"):
            rows = row_schemes(schema, kind, min_ids)
            if rows:
                out.append(Layout(kind, rows=rows))
        elif kind == "plan":
            assert dims_plan is not None
            missing = sorted(set(config_dims) - set(dims_plan))
            if missing:
                raise ValueError(f"the dimension plan has no dim for {missing}")
            out.append(Layout("plan", dims={f: int(dims_plan[f]) for f in config_dims}))
        elif kind == "importance":
            assert ranking is not None
            out += [x for p in SIZED_AT if (x := importance_layout(schema, budget, p, ranking, min_ids)) is not None]
        else:
            for p in SIZED_AT:
                if kind == "uniform":
                    d = _uniform_dim(schema, budget, p)
                    dims = dict.fromkeys(config_dims, d) if d is not None else None
                else:
                    dims = _mde_dims(schema, budget, p)
                if dims is not None and dims != config_dims:
                    out.append(Layout(f"{kind}@{p.value}", dims=dims))
    unique: dict[str, Layout] = {}
    for layout in out:
        key = json.dumps([layout.dims and dict(sorted(layout.dims.items())), layout.rows], sort_keys=True)
        unique.setdefault(key, layout)
    return list(unique.values())


@dataclass
class TrainedLayout:
    """One fitted layout: its model (plain kernel, eval mode), data module and fit time."""

    layout: Layout
    model: RankingModel
    datamodule: Any
    seconds: float


def train_layouts(recipe: Any, layouts: Sequence[Layout], *, seed: int | None = None, max_epochs: int | None = None,
                  log: Callable[[str], None] = print) -> dict[str, TrainedLayout]:
    """Fit every layout through ``recipe`` (tracking off) and keep its model on the plain kernel."""
    from recsys.export import to_plain_kernel

    out: dict[str, TrainedLayout] = {}
    for i, layout in enumerate(layouts, 1):
        log(f"[compress] layout {i}/{len(layouts)}: {layout.name} ...")
        start = time.perf_counter()
        fit = recipe.fit(seed=seed, tracking=False, max_epochs=max_epochs, extra_args=layout.overrides())
        out[layout.name] = TrainedLayout(layout, to_plain_kernel(fit.task.model.eval()), fit.datamodule,
                                         time.perf_counter() - start)
        log(f"[compress] layout {layout.name}: trained in {out[layout.name].seconds:.1f} s")
    return out


@dataclass
class LayoutChoice:
    """The precision search on every layout, and the one chosen on validation AUC."""

    chosen: str
    results: dict[str, CompressResult]
    skipped: dict[str, str]

    @property
    def result(self) -> CompressResult:
        return self.results[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "skipped": dict(self.skipped),
                "layouts": {n: {"bytes": r.bytes, "val_auc": r.val_auc, "fp32_val_auc": r.fp32_val_auc,
                                "tables": r.plan.to_dict(), "validation_passes": r.evaluations}
                            for n, r in self.results.items()}}


def choose_layout(models: Mapping[str, RankingModel], budget: int, val: Any, tolerance: float | None = None) -> LayoutChoice:
    """The per-table precision search under ``budget`` bytes on every trained model (scored on
    ``val``); the layout whose plan keeps the most validation AUC wins. A layout whose smallest
    plan is above the budget is skipped with the reason.

    Raises:
        PrecisionError: no layout fits the budget (the message lists each one's reason).
    """
    from recsys.export.quantize import quantize_model
    from recsys.train.evaluation import evaluate

    results: dict[str, CompressResult] = {}
    skipped: dict[str, str] = {}
    def scorer(model: RankingModel) -> Callable[[PrecisionPlan], float]:
        return lambda plan: evaluate(quantize_model(model, plan), val)["auc"]

    for name, model in models.items():
        if not isinstance(model.sparse_arch, SparseArch):
            raise ValueError(f"layout {name!r}: the model has no embedding tables to compress")
        try:
            results[name] = search_precisions(model.sparse_arch, budget, scorer(model), tolerance)
        except PrecisionError as e:
            skipped[name] = str(e)
    fitting = {n: r for n, r in results.items() if r.bytes <= budget}
    if not fitting:
        why = [f"{n}: {reason}" for n, reason in skipped.items()]
        why += [f"{n}: the tolerance stops at {r.bytes:,} bytes" for n, r in results.items()]
        raise PrecisionError(f"no trained layout fits {budget:,} bytes: " + "; ".join(why))
    return LayoutChoice(max(fitting, key=lambda n: fitting[n].val_auc), results, skipped)
