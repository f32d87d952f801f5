"""``salience dims``: search per-feature embedding dims, retrain, and compare with uniform-16.

    salience dims --config experiments/configs/frappe_dcnv2.yaml --method mde --budget 0.5x16
    salience dims --config CFG --method uniform --budget 120000 -- --trainer.max_epochs=5

``--budget`` is either a number of embedding parameters (``120000``, ``120_000``, ``1.2e5``) or
``FxD``: the fraction F of the uniform-D model's embedding parameters (``0.5x16`` = half of the
uniform-16 model). Without it each search uses its own default (``uniform``: dim 16; ``mde``:
``0.5x16``). A budget below one dim of 4 per feature is refused with the minimum.

The command runs the search, trains the recipe with the plan and the reference model (uniform
dim 16 by default, ``--reference config`` for the config's own dims; the same fit when both have
the same dims), prints the comparison and the per-feature dims, and writes ``plan.json``,
``dims.png``, ``comparison.png``, ``summary.json`` and ``config_with_plan.yaml`` under
``runs/dims/<dataset>-<method>/``. Everything is logged to one parent MLflow run with the fits
as nested runs. Arguments after ``--`` go to every ``salience fit``; search settings go through
``--option key=value``.

``--method ihas`` does not go through ``salience fit`` for the searched model: it keeps the
search model (its gates route), retrains one model per cluster (:meth:`IHAS.retrain`), evaluates
the routed model on the test split (rank-sum AUC, BCE log loss), counts every cluster
model's embedding parameters (``plan.num_parameters``), exports the router plus the cluster
models as one TorchScript module to ``<output>/export/`` and logs it as the nested run
``dims-ihas``; the reference is fitted as for the other methods.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from embeddings.plan import DimensionPlan
from recsys.argv import parse_options, split_passthrough
from recsys.data.schema import Schema
from recsys.io import atomic_savefig, atomic_write_text, write_config

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from embeddings.dims.ihas import IHAS
    from recsys.tracking import RunTracker
    from recsys.train.recipe import FitResult, Recipe

__all__ = ["DimsComparison", "DimsPoint", "dims_main", "parse_budget"]

log = logging.getLogger(__name__)

_FRACTION_OF_DIM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*[xX*]\s*([0-9]+)\s*$")


def parse_budget(text: str | int | None, schema: Schema) -> int | None:
    """A ``--budget`` value -> embedding parameters (None for none given).

    Accepts a parameter count (``"120000"``, ``"120_000"``, ``"1.2e5"``) or ``"FxD"``: F times
    the embedding parameters of the uniform-D model of ``schema`` (``"0.5x16"``).

    Raises:
        ValueError: anything else, or a budget that is not positive.
    """
    from embeddings.dims.baselines import budget_of

    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "none", "default")):
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip().replace("_", "")
        m = _FRACTION_OF_DIM.match(raw)
        if m:
            fraction, dim = float(m.group(1)), int(m.group(2))
            if fraction <= 0 or dim <= 0:
                raise ValueError(f"--budget {text!r}: fraction and dim must be positive")
            return int(fraction * budget_of(schema, dim))
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(
                f"--budget {text!r}: give a number of embedding parameters (e.g. 120000) or FxD, "
                "a fraction of the uniform-D model's parameters (e.g. 0.5x16 for half of uniform-16)"
            ) from None
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise ValueError(f"--budget {text!r}: the number of embedding parameters must be a positive integer")
    return int(value)


@dataclass
class DimsPoint:
    """One trained model of the comparison.

    Args:
        label: row name (``mde``, ``uniform-16 (reference)``).
        embedding_parameters: counted on the trained model.
        test_auc, test_logloss, best_val_auc: its metrics.
        seconds: fit wall time.
        run_id: its MLflow run (None untracked).
        dims: per-feature dims it trained with.
    """

    label: str
    embedding_parameters: int
    test_auc: float
    test_logloss: float
    best_val_auc: float = float("nan")
    seconds: float = 0.0
    run_id: str | None = None
    dims: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_fit(cls, label: str, fit: FitResult, dims: dict[str, int]) -> DimsPoint:
        m = fit.metrics
        return cls(
            label=label,
            embedding_parameters=int(fit.task.model.embedding_parameters()),
            test_auc=float(m.get("test_auc", float("nan"))),
            test_logloss=float(m.get("test_logloss", float("nan"))),
            best_val_auc=float(m.get("best_val_auc", float("nan"))),
            seconds=float(fit.seconds),
            run_id=fit.run_id,
            dims=dict(dims),
        )


@dataclass
class DimsComparison:
    """A searched plan's retrained model against the reference model.

    Args:
        method: the search.
        dataset: the recipe's dataset.
        plan: the searched plan.
        budget: the budget given to the search (None: its default).
        points: the plan's model first, the reference model last.
    """

    method: str
    dataset: str
    plan: DimensionPlan
    budget: int | None
    points: list[DimsPoint]

    @property
    def searched(self) -> DimsPoint:
        return self.points[0]

    @property
    def reference(self) -> DimsPoint:
        return self.points[-1]

    def summary(self) -> dict[str, Any]:
        s, r = self.searched, self.reference
        return {
            "method": self.method,
            "dataset": self.dataset,
            "budget": self.budget,
            "embedding_parameters": s.embedding_parameters,
            "reference_embedding_parameters": r.embedding_parameters,
            "parameter_ratio": _ratio(s.embedding_parameters, r.embedding_parameters),
            "test_auc": s.test_auc,
            "reference_test_auc": r.test_auc,
            "auc_delta": s.test_auc - r.test_auc,
            "test_logloss": s.test_logloss,
            "reference_test_logloss": r.test_logloss,
        }

    def format(self) -> str:
        """The comparison table (method, parameters, ratio vs reference, test AUC, log loss)."""
        ref = self.reference.embedding_parameters
        lines = [f"{'model':<26} {'emb. params':>12} {'vs ref':>7} {'test AUC':>9} {'log loss':>9} {'fit s':>7}"]
        for p in self.points:
            ratio = _ratio(p.embedding_parameters, ref)
            lines.append(
                f"{p.label:<26} {p.embedding_parameters:>12,} {ratio:>6.2f}x {p.test_auc:>9.4f} "
                f"{p.test_logloss:>9.4f} {p.seconds:>7.1f}"
            )
        return "\n".join(lines)

    def plot(self) -> Figure:
        """Test AUC against embedding parameters, the reference point marked."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for i, p in enumerate(self.points):
            is_ref = i == len(self.points) - 1
            ax.scatter([p.embedding_parameters], [p.test_auc], s=60, marker="*" if is_ref else "o",
                       color="tab:gray" if is_ref else "tab:blue", zorder=3)
            ax.annotate(p.label, (p.embedding_parameters, p.test_auc), textcoords="offset points", xytext=(6, 4),
                        fontsize=8)
        ax.margins(x=0.3, y=0.25)  # room for the labels
        ax.axhline(self.reference.test_auc, color="tab:gray", lw=0.8, ls="--")
        ax.set_xlabel("embedding parameters")
        ax.set_ylabel("test AUC")
        ax.set_title(f"{self.method} dims on {self.dataset}: parameters vs AUC", fontsize=10)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        return fig

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "plan": self.plan.to_dict(), "points": [asdict(p) for p in self.points]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        atomic_write_text(path, json.dumps(_json_safe(self.to_dict()), indent=2, allow_nan=False) + "\n")
        return path

    def to_mlflow(self, tracker: RunTracker) -> None:
        import matplotlib.pyplot as plt

        s = self.summary()
        tracker.log_metrics({
            "test_auc": s["test_auc"],
            "test_logloss": s["test_logloss"],
            "reference.test_auc": s["reference_test_auc"],
            "reference.test_logloss": s["reference_test_logloss"],
            "reference.embedding_parameters": s["reference_embedding_parameters"],
            "parameter_ratio": s["parameter_ratio"],
            "auc_delta": s["auc_delta"],
        })
        tracker.log_dict(_json_safe(self.to_dict()), "dims/summary.json")
        fig = self.plot()
        tracker.log_figure(fig, "dims/params_vs_auc.png")
        plt.close(fig)


def _ratio(a: int, b: int) -> float:
    return a / b if b else float("nan")


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _reference_plan(text: str, schema: Schema) -> DimensionPlan:
    from embeddings.dims.baselines import uniform_plan

    if text == "config":
        return DimensionPlan.from_schema(schema, method="config")
    try:
        dim = int(text)
    except ValueError:
        raise SystemExit(f"--reference expects a uniform dim (e.g. 16) or 'config', got {text!r}") from None
    return uniform_plan(schema, dim)


def _fit(recipe: Recipe, plan: DimensionPlan, run_name: str, tracking: bool) -> FitResult:
    return recipe.fit(extra_args=plan.to_config_overrides(), run_name=run_name, tracking=tracking)


EXPORT_DIR = "export"  # the routed model's export folder under the output folder


def _routes(search: Any) -> TypeGuard[IHAS]:
    """The search retrains a routed model itself (iHAS: router + one model per cluster)."""
    from embeddings.dims.ihas import IHAS

    return isinstance(search, IHAS)


def evaluate_logits(model: Any, data: Any, batch_size: int = 4096) -> dict[str, float]:
    """``auc`` and ``logloss`` of a ``forward(dense, kjt) -> logits`` module on encoded data, in
    memory or a streamed view of its shards (:func:`recsys.train.evaluation.evaluate`)."""
    from recsys.train.evaluation import evaluate

    return evaluate(model, data, batch_size)


def _retrain_routed(
    search: Any, recipe: Recipe, plan: DimensionPlan, gate_model: Any, method: str, out: Path,
    tracker: RunTracker | None,
) -> DimsPoint:
    """Retrain one model per cluster, evaluate the routed model, export it to ``out/export``
    and log it as a nested run (as ``salience fit`` does for the other methods)."""
    import time

    from recsys.export.serving import export_model

    start = time.perf_counter()
    routed = search.retrain(recipe, plan, gate_model)
    seconds = time.perf_counter() - start
    dm = recipe.datamodule  # the splits in memory, or streamed shard by shard
    test, val = evaluate_logits(routed, dm.split_data("test")), evaluate_logits(routed, dm.split_data("val"))
    params = sum(int(m.embedding_parameters()) for m in routed.models)
    schema = recipe.schema
    if params != plan.num_parameters(schema):
        log.warning("the routed model has %d embedding parameters, the plan counts %d", params,
                    plan.num_parameters(schema))
    point = DimsPoint(
        label=f"{method} (routed, {len(routed.models)} clusters)", embedding_parameters=params,
        test_auc=test["auc"], test_logloss=test["logloss"], best_val_auc=val["auc"], seconds=seconds,
        dims=dict(plan.dims),
    )
    child = None
    if tracker is not None:
        from recsys.tracking import RunTracker

        child = RunTracker(recipe.dataset_name, f"dims-{method}", parent_run_id=tracker.run_id,
                           tags={"salience.dataset": recipe.dataset_name, "salience.stage": "dims"})
        point.run_id = child.run_id
    metrics = {"test_auc": point.test_auc, "test_logloss": point.test_logloss, "val_auc": point.best_val_auc,
               "embedding_parameters": params}
    export = export_model(routed, recipe.datamodule.preprocessor, out / EXPORT_DIR, metadata={
        "method": method, "plan": plan.to_dict(), "metrics": metrics, "run_id": point.run_id})
    log.info("%s routed model: test AUC %.4f, log loss %.4f, %d embedding parameters; exported to %s "
             "(parity %.2g)", method, point.test_auc, point.test_logloss, params, export.output_dir,
             export.max_abs_diff)
    if child is not None:
        with child:
            child.log_params({"method": method, "clusters": len(routed.models), "search": search.describe()})
            child.log_metrics({**metrics, "export_max_abs_diff": export.max_abs_diff, "seconds": seconds})
            child.log_artifact(out / EXPORT_DIR, EXPORT_DIR)
    return point


def dims_main(argv: Sequence[str]) -> int:
    from embeddings.dims.base import get_search, search_names

    parser = argparse.ArgumentParser(
        prog="salience dims",
        description="Search per-feature embedding dims, retrain with them and with the reference dims, and compare.",
        epilog="Arguments after -- are passed to every `salience fit` (e.g. -- --trainer.max_epochs=5).",
    )
    parser.add_argument("--config", required=True, help="a `salience fit` config (data + backbone + trainer)")
    parser.add_argument("--method", required=True, help=f"dimension search, one of {search_names()}")
    parser.add_argument("--budget", default=None,
                        help="embedding-parameter budget: a count (120000) or FxD, F times the uniform-D model's "
                        "parameters (0.5x16 = half of uniform-16); default: the search's own")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="search setting, e.g. --option alpha=0.5 (repeatable)")
    parser.add_argument("--reference", default="16",
                        help="reference model: a uniform dim (default 16) or 'config' for the config's own dims")
    parser.add_argument("--output", default=None, help="output folder (default: runs/dims/<dataset>-<method>)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    parser.add_argument("--curve", default=None, metavar="BUDGETS",
                        help="dnis only: also retrain the searched masks cut at these budgets (e.g. 0.25x16,0.75x16) "
                             "for the parameters-vs-AUC curve across thresholds")
    own, passthrough = split_passthrough(argv)
    args, overrides = parser.parse_known_args(own)
    overrides += passthrough

    from embeddings.dims.dnis import replan
    from recsys.train.recipe import Recipe

    if args.method not in search_names():
        raise SystemExit(f"salience dims: unknown --method {args.method!r}; available: {', '.join(search_names())}")
    curve_budgets = [t.strip() for t in (args.curve or "").split(",") if t.strip()]
    if curve_budgets and args.method != "dnis":
        raise SystemExit("salience dims: --curve cuts DNIS masks at other budgets; it needs --method dnis")
    try:
        search = get_search(args.method, **parse_options(args.option))
    except TypeError as e:
        raise SystemExit(f"--option: {e}") from None
    recipe = Recipe(args.config, overrides, workdir=Path("runs") / "dims" / "fits", quiet=True)
    schema = recipe.schema
    curve: list[tuple[str, int]] = []  # (--curve text, budget)
    try:
        budget = parse_budget(args.budget, schema)
        for text in curve_budgets:
            cut_budget = parse_budget(text, schema)
            if cut_budget is None:
                raise ValueError(f"--curve {text!r}: give a budget to cut the masks at (a count or FxD)")
            curve.append((text, cut_budget))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    reference = _reference_plan(args.reference, schema)
    out = Path(args.output or Path("runs") / "dims" / f"{recipe.dataset_name}-{args.method}")
    tracker = None
    if not args.no_tracking:
        from recsys.tracking import RunTracker

        tracker = RunTracker(recipe.dataset_name, f"dims-{args.method}",
                             tags={"salience.dataset": recipe.dataset_name, "salience.stage": "dims"})
    recipe.parent_run_id = tracker.run_id if tracker is not None else None
    tracking = tracker is not None
    routed = None
    with tracker if tracker is not None else nullcontext():
        if _routes(search):  # iHAS: the plan comes with the search model its router runs on
            plan, gate_model = search.search_with_model(recipe, budget=budget)
        else:
            plan = search.search(recipe, budget=budget)
        out.mkdir(parents=True, exist_ok=True)
        plan.save(out / "plan.json")
        fig = plan.plot(schema)
        atomic_savefig(fig, out / "dims.png", dpi=120)
        import matplotlib.pyplot as plt

        plt.close(fig)
        if tracker is not None:
            tracker.log_params({"method": args.method, "search": search.describe(), "budget": budget,
                                "reference": args.reference, "overrides": " ".join(overrides)})
            plan.to_mlflow(tracker, schema)
        if not _routes(search) and plan.is_clustered:
            log.warning(
                "the %s plan has clusters; `salience dims` retrains one model with its per-feature widths, "
                "so the retrained model has more embedding parameters than the plan counts", args.method,
            )
        ref_dim = next(iter(reference.dims.values()))
        ref_label = f"uniform-{ref_dim}" if reference.method == "uniform" else "config dims"
        if _routes(search):
            routed = _retrain_routed(search, recipe, plan, gate_model, args.method, out, tracker)
            points = [routed]
            ref_fit = _fit(recipe, reference, f"dims-reference-{ref_label.replace(' ', '-')}", tracking)
        else:
            fit = _fit(recipe, plan, f"dims-{args.method}", tracking)
            points = [DimsPoint.from_fit(args.method, fit, plan.dims)]
            for text, cut_budget in curve:
                cut = replan(plan, cut_budget)
                cut_fit = _fit(recipe, cut, f"dims-{args.method}-{text}", tracking)
                points.append(DimsPoint.from_fit(f"{args.method} @ {text}", cut_fit, cut.dims))
            if reference.dims == plan.dims:  # the same model: train it once
                ref_fit = fit
            else:
                ref_fit = _fit(recipe, reference, f"dims-reference-{ref_label.replace(' ', '-')}", tracking)
        points.append(DimsPoint.from_fit(f"{ref_label} (reference)", ref_fit, reference.dims))
        comparison = DimsComparison(args.method, recipe.dataset_name, plan, budget, points)
        comparison.save(out / "summary.json")
        fig = comparison.plot()
        atomic_savefig(fig, out / "comparison.png", dpi=120)
        plt.close(fig)

        searched, summary = comparison.searched, comparison.summary()
        comment = (f"Config with the {args.method} dimension plan ({searched.embedding_parameters:,} embedding "
                   f"parameters, {summary['parameter_ratio']:.2f}x the reference; test AUC "
                   f"{searched.test_auc:.4f} vs {comparison.reference.test_auc:.4f}).\n"
                   f"Written by: salience dims --config {args.config} --method {args.method}"
                   + (f" --budget {args.budget}" if args.budget else "")
                   + "".join(f" --option {o}" for o in args.option))
        write_config(out / "config_with_plan.yaml", plan.to_config(recipe.config), comment)
        if tracker is not None:
            comparison.to_mlflow(tracker)
            tracker.log_artifact(out / "config_with_plan.yaml", "dims")
    print(plan.format(schema))
    print()
    print(comparison.format())
    print(f"\nwrote {out}/plan.json, dims.png, comparison.png, summary.json, config_with_plan.yaml"
          + (f", {EXPORT_DIR}/ (the routed model for serving)" if routed is not None else ""))
    if tracker is not None:
        print(f"MLflow run: {tracker.run_id} (nested runs: one per retrained model)")
    return 0
