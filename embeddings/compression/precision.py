"""Per-table precision under one byte budget or AUC tolerance, chosen on validation (what
``salience compress`` runs; the command is :mod:`embeddings.compression.cli`).

The trained model's tables start at fp32. A lazy greedy search lowers one table one precision
step at a time (fp32 -> fp16 -> int8 -> int4, as far as the table's dim allows; see
:mod:`recsys.export.quantize`), always the step that loses the least validation AUC per byte
saved, until the embedding bytes fit the budget. Each candidate step is scored once by one
validation pass of the model with that table quantized (the others as chosen so far) and
rescored only when its table changed (a table's loss barely depends on the others' precision),
plus one pass after each step for the exact validation AUC of the plan so far: about six
validation passes per table in all. With ``--tolerance``, a step that would take the
validation AUC more than that below fp32's is undone and its table stays where it is (without
``--budget``, the search goes as far as the tolerance allows).

Writes ``plan.json`` (precision and bytes per table, the search trace, validation and test AUC),
``frontier.png`` (bytes against validation and test AUC of fp32, fp16, int8 and int4 for every
table and of the searched plan: the test split is read once per model) and the quantized export
(with its fresh-process parity check) under ``DIR/export``.

The budget is a fraction ``Nx`` of the uniform-16 fp32 embedding bytes (every sparse feature
at dim 16, 4 bytes a value: the reference issue 19 sizes against) or an absolute size in
``KB``/``MB``/``GB``. Row schemes (quotient-remainder, hashing) and dims are set in the config
a model is trained with (``model.embedding_rows``, ``data.embedding_dims``); this search does
not retrain. :mod:`embeddings.compression.layouts` trains such variants for a budget and runs this search on
each. The pipeline runs the same search after its final fit (``compress`` in the pipeline
config).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recsys.data.schema import Schema
from recsys.export.quantize import Precision, PrecisionError, PrecisionPlan, embedding_bytes
from recsys.models.base import RankingModel, SparseArch, table_configs_for

__all__ = [
    "CompressResult", "Compressed", "compress_and_export", "parse_budget", "plot_frontier",
    "precision_frontier", "search_precisions", "uniform_bytes", "uniform_plan",
]

#: the precisions a table steps down through
LADDER = (Precision.FP32, Precision.FP16, Precision.INT8, Precision.INT4)
_UNITS = {"kb": 1e3, "mb": 1e6, "gb": 1e9}


def uniform_bytes(schema: Schema, dim: int = 16) -> int:
    """fp32 bytes of every sparse feature's full table at ``dim``: the budget's reference."""
    return sum(int(f.num_embeddings or 0) * dim * 4 for f in schema.sparse)


def parse_budget(text: str, reference: int) -> int:
    """``"0.1x"`` (of ``reference`` bytes) or ``"2MB"`` / ``"500KB"`` / ``"1.5GB"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(x|kb|mb|gb)\s*", text.lower())
    if m is None:
        raise ValueError(f"--budget {text!r}: expected a fraction of the uniform-16 fp32 bytes like 0.1x, or 2MB / 500KB")
    value, unit = float(m.group(1)), m.group(2)
    out = value * reference if unit == "x" else value * _UNITS[unit]
    if out <= 0:
        raise ValueError(f"--budget {text!r}: must be positive")
    return int(out)


def _steps(dim: int) -> list[Precision]:
    """The precisions a table of ``dim`` can step through, each storing a row in fewer bytes
    (int8's scale and bias make a dim-4 row as large as fp16's: that step is skipped)."""
    out: list[Precision] = []
    for p in LADDER:
        if dim % p.dim_multiple == 0 and (not out or p.row_bytes(dim) < out[-1].row_bytes(dim)):
            out.append(p)
    return out


@dataclass
class CompressResult:
    """The chosen plan and how it was found."""

    plan: PrecisionPlan
    bytes: int
    fp32_bytes: int
    budget: int
    val_auc: float
    fp32_val_auc: float
    trace: list[dict[str, Any]] = field(default_factory=list)
    evaluations: int = 0


def search_precisions(arch: SparseArch, budget: int | None, score: Callable[[PrecisionPlan], float],
                      tolerance: float | None = None) -> CompressResult:
    """The lazy greedy search of the module docstring.

    Args:
        arch: the trained model's sparse arch (plain kernel).
        budget: embedding bytes to fit under; None: as small as ``tolerance`` allows.
        score: validation AUC of the model at a plan (higher is better).
        tolerance: validation AUC the plan may lose against fp32: a step that would lose more is
            undone and its table keeps its precision (the budget may then stay unmet: compare
            ``result.bytes`` with it). None: no limit.

    Raises:
        PrecisionError: the budget is below the smallest plan the tables allow (the message
            says that minimum).
        ValueError: neither a budget nor a tolerance.
    """
    if budget is None and tolerance is None:
        raise ValueError("search_precisions needs a byte budget, an AUC tolerance, or both")
    dims = {c.name: c.embedding_dim for c in table_configs_for(arch)}
    ladders = {t: _steps(d) for t, d in dims.items()}
    lowest = PrecisionPlan({t: steps[-1] for t, steps in ladders.items()})
    minimum = embedding_bytes(arch, lowest)
    if budget is None:
        budget = minimum
    if budget < minimum:
        raise PrecisionError(
            f"budget {budget:,} bytes is below the smallest model these tables allow: {minimum:,} bytes "
            f"({minimum / 1e6:.3f} MB, every table at its lowest precision); raise --budget or shrink the tables "
            "(fewer rows: model.embedding_rows, or smaller dims)"
        )
    current = {t: Precision.FP32 for t in dims}
    fp32 = PrecisionPlan(dict(current))
    total = embedding_bytes(arch, fp32)
    base = score(fp32)
    result = CompressResult(fp32, total, total, budget, base, base, evaluations=1)
    auc = base
    cache: dict[str, tuple[float, int]] = {}  # table -> (validation AUC lost by its next step, bytes saved)
    closed: set[str] = set()  # tables whose next step lost more than the tolerance
    while total > budget:
        for t in dims:
            ladder = ladders[t]
            i = ladder.index(current[t])
            if i + 1 == len(ladder) or t in cache or t in closed:
                continue
            trial = PrecisionPlan({**current, t: ladder[i + 1]})
            cache[t] = (auc - score(trial), total - embedding_bytes(arch, trial))
            result.evaluations += 1
        if not cache:
            break
        t = min(cache, key=lambda k: cache[k][0] / max(cache[k][1], 1))
        _, saved = cache.pop(t)  # the others keep their scores: a table's loss barely depends on the rest
        ladder = ladders[t]
        before = current[t]
        current[t] = ladder[ladder.index(before) + 1]
        stepped = score(PrecisionPlan(dict(current)))
        result.evaluations += 1
        undone = tolerance is not None and stepped < base - tolerance  # too much lost: this table keeps `before`
        result.trace.append({"table": t, "precision": current[t].value, "bytes": total - saved, "val_auc": stepped,
                             **({"undone": True} if undone else {})})
        if undone:
            current[t] = before
            closed.add(t)
            continue
        total -= saved
        auc = stepped
    result.plan, result.bytes, result.val_auc = PrecisionPlan(dict(current)), total, auc
    return result


def uniform_plan(arch: SparseArch, precision: Precision | str) -> PrecisionPlan:
    """Every table at ``precision``, or at the nearest step above it that its dim allows (int4
    on a dim-6 table: int8)."""
    precision = Precision(precision)
    top = LADDER.index(precision)
    return PrecisionPlan({c.name: [p for p in _steps(c.embedding_dim) if LADDER.index(p) <= top][-1]
                          for c in table_configs_for(arch)})


def precision_frontier(model: RankingModel, val: Any, test: Any, result: CompressResult,
                       fp32_test: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Bytes against validation and test AUC of every uniform precision and of the searched
    plan (``technique``: ``fp32`` ... ``int4``, ``search``), and each one's test AUC minus fp32's
    on the same rows with DeLong's 95% interval (``test_vs_fp32``, a :class:`recsys.stats.Interval`
    as a dict): each model's test split read once (fp32's scores are read for the pairing even
    when ``fp32_test`` gives its metrics).

    Args:
        model: the trained model (plain kernel, eval mode).
        val, test: the validation rows the search scored on and the test split (in memory or
            streamed views).
        result: the search's result (its plan is the ``search`` point; its validation AUCs of
            fp32 and of the plan are reused).
        fp32_test: ``auc`` and ``logloss`` of the fp32 model on the test split when the caller
            already has them (a fit's test pass): that model's test split is not read again.
    """
    from recsys.export.quantize import quantize_model
    from recsys.stats import delong
    from recsys.train.evaluation import evaluate, evaluate_with_scores

    arch = model.sparse_arch
    assert isinstance(arch, SparseArch)
    points = []
    plans = {p.value: uniform_plan(arch, p) for p in LADDER}
    known = {"search": result.val_auc, "fp32": result.fp32_val_auc}
    reference: tuple[np.ndarray, np.ndarray] | None = None  # fp32's test labels and probabilities
    for name, plan in [*plans.items(), ("search", result.plan)]:
        quantized = quantize_model(model, plan)
        val_auc = known[name] if name in known else evaluate(quantized, val)["auc"]
        on_test, labels, probs = evaluate_with_scores(quantized, test)
        if name == "fp32":
            reference = (labels, probs)
            on_test = fp32_test if fp32_test is not None else on_test  # the fit's own numbers where given
        assert reference is not None  # fp32 is the ladder's first step
        paired = None if name == "fp32" else delong(labels, probs, reference[1]).to_dict()
        points.append({"technique": name, "bytes": embedding_bytes(arch, plan), "val_auc": val_auc,
                       "test_auc": on_test["auc"], "test_logloss": on_test["logloss"], "tables": plan.to_dict(),
                       "test_vs_fp32": paired})
    return points


@dataclass
class Compressed:
    """What :func:`compress_and_export` found and wrote."""

    result: CompressResult
    frontier: list[dict[str, Any]]
    export_dir: Path
    parity_max_abs_diff: float | None

    def point(self, technique: str) -> dict[str, Any]:
        """The frontier point of ``technique`` (``fp32`` ... ``int4``, ``search``)."""
        return next(p for p in self.frontier if p["technique"] == technique)


def compress_and_export(model: RankingModel, preprocessor: Any, val: Any, test: Any, output_dir: str | Path, *,
                        budget: int | None = None, tolerance: float | None = None,
                        fp32_test: dict[str, float] | None = None, metadata: dict[str, Any] | None = None,
                        parity: bool = True, result: CompressResult | None = None) -> Compressed:
    """The search (:func:`search_precisions`, scored on ``val``), its frontier
    (:func:`precision_frontier`) and the quantized export in ``output_dir``, checked against the
    eager quantized model in a fresh process unless ``parity`` is False: what ``salience
    compress`` and the pipeline's compression step run. ``result``: the search already run on
    this model (:func:`embeddings.compression.layouts.choose_layout` runs it on every layout).

    Raises:
        PrecisionError: the budget is below the smallest plan the tables allow.
        ValueError: the model has no embedding tables.
    """
    from recsys.data.batching import random_batch
    from recsys.export import check_parity_in_fresh_process, export_model
    from recsys.export.quantize import quantize_model
    from recsys.train.evaluation import evaluate

    arch = model.sparse_arch
    if not isinstance(arch, SparseArch):
        raise ValueError("the model has no embedding tables to compress")
    if result is None:
        result = search_precisions(arch, budget, lambda plan: evaluate(quantize_model(model, plan), val)["auc"], tolerance)
    frontier = precision_frontier(model, val, test, result, fp32_test)
    export = export_model(model, preprocessor, output_dir, precision=result.plan.to_dict(), metadata=metadata)
    diff = None
    if parity:
        batches = [random_batch(preprocessor.fitted_schema, b, seed=i) for i, b in enumerate((1, 7, 300))]
        diff = check_parity_in_fresh_process(export.output_dir, quantize_model(model, result.plan), batches)
    return Compressed(result, frontier, Path(export.output_dir), diff)


def plot_frontier(points: Sequence[dict[str, Any]], trace: Sequence[dict[str, Any]] = (), title: str = "") -> Any:
    """Embedding bytes (log scale) against validation (filled) and test AUC (hollow) of each
    technique, with the search's accepted steps (validation AUC) as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {"fp32": "0.3", "fp16": "tab:green", "int8": "tab:orange", "int4": "tab:red", "search": "tab:blue"}
    steps = [t for t in trace if not t.get("undone")]
    if steps and points:
        start = next((p for p in points if p["technique"] == "fp32"), None)
        xs = ([start["bytes"]] if start else []) + [t["bytes"] for t in steps]
        ys = ([start["val_auc"]] if start else []) + [t["val_auc"] for t in steps]
        ax.plot(xs, ys, "-", color="tab:blue", alpha=0.4, lw=1, label="search steps (validation)")
    for p in points:
        c = colors.get(p["technique"], "0.5")
        ax.plot(p["bytes"], p["val_auc"], "o", color=c, label=f"{p['technique']} validation")
        ax.plot(p["bytes"], p["test_auc"], "o", mfc="none", color=c, label=f"{p['technique']} test")
    ax.set_xscale("log")
    ax.set_xlabel("embedding bytes")
    ax.set_ylabel("AUC")
    ax.set_title(title or "bytes vs AUC: uniform precisions and the searched plan")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
