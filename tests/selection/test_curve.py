"""Selection curve: AUKC, k parsing, memoised fits, nested MLflow runs, the reduced config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from selection.curve import CurvePoint, FitCache, SelectionCurve, aukc, aukc_weights, parse_ks, selection_curve
from selection.report import ImportanceReport


def test_aukc_golden_values() -> None:
    assert aukc([1, 2, 4], [0.6, 0.7, 0.7]) == pytest.approx((0.65 * 1 + 0.7 * 2) / 3)
    assert aukc([4, 1, 2], [0.7, 0.6, 0.7]) == pytest.approx((0.65 * 1 + 0.7 * 2) / 3)  # order-free
    assert aukc([3], [0.8]) == 0.8
    assert np.isnan(aukc([], []))


def test_aukc_weights_reproduce_aukc_in_any_order() -> None:
    g = np.random.default_rng(0)
    for ks in ([1, 2, 4, 8], [8, 1, 4, 2], [3], [5, 5], [2, 4, 8, 16, 24, 32]):
        aucs = g.uniform(0.5, 0.9, len(ks))
        w = aukc_weights(ks)
        assert w @ aucs == pytest.approx(aukc(ks, aucs), abs=1e-15)
        assert w.sum() == pytest.approx(1.0, abs=1e-15) and (w > 0).all()
    assert aukc_weights([1, 2, 4]).tolist() == pytest.approx([1 / 6, 3 / 6, 2 / 6])  # halves of [1, 2] and [2, 4] over 3


def test_parse_ks() -> None:
    assert parse_ks("4,2,2,8", 10) == [2, 4, 8]
    assert parse_ks("all", 10) == [1, 2, 4, 8, 10]
    assert parse_ks([3, 1], 3) == [1, 3]
    with pytest.raises(ValueError, match=r"\[12\] out of range; the ranking has 10 features"):
        parse_ks("2,12", 10)
    with pytest.raises(ValueError, match="comma-separated list of integers"):
        parse_ks("2,four", 10)


def _curve() -> SelectionCurve:
    # validation AUCs 0.70, 0.74, 0.745 (full 0.75); test AUCs 0.65, 0.70, 0.75 (full 0.76)
    pts = [CurvePoint(k, [f"f{i}" for i in range(k)], 0.6 + 0.05 * k, 0.5, best_val_auc=v)
           for k, v in ((1, 0.70), (2, 0.74), (3, 0.745))]
    rnd = {0: [CurvePoint(k, [], 0.55 + 0.05 * k, 0.5, best_val_auc=0.6 + 0.04 * k) for k in (1, 2, 3)]}
    full = CurvePoint(4, [], 0.76, 0.45, best_val_auc=0.75)
    return SelectionCurve("m", "toy", [1, 2, 3], pts, full, rnd, tolerance=0.02, ranking=["f0"])


def test_curve_summary_plot_and_round_trip(tmp_path: Path) -> None:
    c = _curve()
    s = c.summary()
    assert s["aukc"] == pytest.approx(0.7) and s["random_aukc_mean"] == pytest.approx(0.65)
    assert s["val_aukc"] == pytest.approx((0.72 + 0.7425) / 2) and s["random_val_aukc_mean"] == pytest.approx(0.68)
    # k is chosen on validation (0.74 >= 0.75 - 0.02 at k = 2); on test it would be 3 (reported only)
    assert c.smallest_k == 2 and s["smallest_k_within_tolerance"] == 2 and s["k_chosen_on"] == "validation"
    assert c.smallest_k_test == 3 and s["smallest_k_on_test"] == 3
    fig = c.plot()
    assert len(fig.axes[0].lines) >= 3
    back = SelectionCurve.load(c.save(tmp_path / "c.json"))
    assert back.summary() == s
    c.points[0].best_val_auc = float("nan")  # strict JSON: NaN stored as null, read back as NaN
    assert np.isnan(SelectionCurve.load(c.save(tmp_path / "n.json")).points[0].best_val_auc)
    assert "| 2 (chosen) | 0 | 0.7400 | 0.7000 |  |" in c.to_markdown()  # no paired interval without test scores
    assert s["verdict_at_smallest_k"] is None and s["within_tolerance_on_test"] is None
    c.points[1].best_val_auc = c.points[2].best_val_auc = float("nan")
    assert c.smallest_k is None  # no validation AUC: nothing is chosen (never the test split)


def test_selection_curve_trains_top_k_with_nested_runs(tiny_recipe, tmp_cwd: Path) -> None:  # noqa: ANN001
    from mlflow import MlflowClient

    from recsys.tracking import RunTracker

    names = tiny_recipe.schema.names
    order = ["item_id", "site_category", "tags"] + [n for n in names if n not in ("item_id", "site_category", "tags")]
    report = ImportanceReport.from_scores("planted", {n: float(len(order) - i) for i, n in enumerate(order)})
    parent = RunTracker(tiny_recipe.dataset_name, "select-planted")
    cache = FitCache()
    curve = selection_curve(tiny_recipe, report, [1, 3], random_seeds=[0], cache=cache, tracker=parent)
    parent.finish()
    assert [p.k for p in curve.points] == [1, 3] and curve.points[1].features == ["item_id", "site_category", "tags"]
    assert curve.full.k == len(names)
    print([(p.k, p.test_auc) for p in curve.points], curve.full.test_auc)
    assert all(0.5 < p.test_auc < 1.0 for p in curve.points)
    assert cache.fits <= 1 + 2 + 2  # full + 2 ranked + 2 random (a shared subset would train once)
    # every model is compared with the all-features one on the same test rows (DeLong's paired interval)
    labels, full_scores = cache.test_labels, cache.scores(curve.full.features)
    assert labels is not None and full_scores is not None and len(labels) == len(full_scores)
    from recsys.stats import auc

    assert auc(labels, full_scores) == pytest.approx(curve.full.test_auc, abs=1e-5)  # the fit's own test pass
    for p in [*curve.points, *curve.random[0]]:
        iv = p.test_vs_full
        assert iv is not None and iv["method"] == "delong" and iv["n"] == len(labels)
        assert iv["estimate"] == pytest.approx(p.test_auc - curve.full.test_auc, abs=1e-5)
        assert iv["low"] <= iv["estimate"] <= iv["high"]
    # the AUKC difference of two curves is a DeLong contrast of their fits on the same rows
    vs_random = cache.aukc_difference([curve.points], list(curve.random.values()))
    assert vs_random is not None and vs_random.method == "delong" and vs_random.n == len(labels)
    assert vs_random.estimate == pytest.approx(curve.aukc - curve.random_aukc, abs=1e-5)
    assert vs_random.low < vs_random.estimate < vs_random.high
    same = cache.aukc_difference([curve.points], [curve.points])
    assert same is not None and (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)
    summary = curve.summary()
    if curve.smallest_k is not None:
        assert summary["verdict_at_smallest_k"] in ("better", "worse", "tie")
        assert summary["within_tolerance_on_test"] == (summary["test_vs_full_at_smallest_k"]["low"] >= -curve.tolerance)
    assert SelectionCurve.from_dict(curve.to_dict()).points[0].test_vs_full == curve.points[0].test_vs_full
    client = MlflowClient(parent.uri)
    exp = client.get_experiment_by_name(tiny_recipe.dataset_name)
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.run_id}'")
    assert len(children) == cache.fits
    assert "curve.json" in {Path(a.path).name for a in client.list_artifacts(parent.run_id, "selection")}
    # the same subset is not trained twice
    before = cache.fits
    selection_curve(tiny_recipe, report, [3], random_seeds=[], cache=cache)
    assert cache.fits == before
