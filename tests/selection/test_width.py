"""Selectors at width: what is pruned, what stays exact, on the wide generator's planted truth.

OutRank scores pairs among its ``pair_features`` most relevant features only, and its noise gate
then keeps the features it never tested for an interaction; the copy check finds exact copies
anywhere by hashing and near copies among the top of the ranking. Small F here (the large sizes
run in ``experiments/benchmarks/wide.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from recsys.data.raw import RawData
from recsys.data.synthetic.wide import WideReader, WideTruth
from selection.model_free.outrank import OutRank, rank_raw
from selection.model_free.outrank_scoring import OutRankConfig, redundant_features, score_raw


@pytest.fixture(scope="module")
def wide() -> tuple[RawData, WideTruth]:
    reader = WideReader(n_features=80, n_rows=40_000, seed=1)
    return reader.read(), reader.ground_truth()


def test_pruned_pairs_rank_the_candidates_then_the_rest_by_relevance(wide: tuple[RawData, WideTruth]) -> None:
    raw, truth = wide
    method = OutRank(pair_features=12, progress=False)
    scores = score_raw(raw, method)
    assert scores.pairs_pruned and scores.pair_features is not None and len(scores.pair_features) == 12
    assert scores.redundancy is not None and scores.redundancy.shape == (12, 12)
    assert scores.synergy is None  # no interaction test once pruned
    report = rank_raw(raw, method)
    ranking = report.ranking
    assert set(ranking[:12]) == set(scores.pair_features)
    rest = [f for f in ranking[12:] if "constant" not in report[f].flags]
    assert rest == sorted(rest, key=lambda f: -scores.relevance[f])
    values = [report[f].score for f in ranking]
    assert all(a >= b for a, b in zip(values, values[1:]))
    # every weak feature was left untested: flagged, and kept out of the noise gate's drops
    assert report.extras["below_noise"] == {}
    untested = report.extras["pairs_untested"]
    assert len(untested) > 20 and not set(truth.names("interaction")) & set(report.extras["below_noise"])
    assert all("untested_pairs" in report[f].flags for f in untested)
    # unpruned (F <= pair_features), the same data keeps the exact behaviour
    full = score_raw(raw, OutRankConfig(pair_features=None, progress=False, pair_batches=1))
    assert not full.pairs_pruned and full.untested() == {} and full.synergy is not None


def test_pruned_pairs_keep_the_signal_at_the_top(wide: tuple[RawData, WideTruth]) -> None:
    raw, truth = wide
    report = rank_raw(raw, OutRank(pair_features=16, progress=False))
    marginal = [f for f in truth.names("signal") if truth.strengths[f] > 0]
    top = set(report.ranking[:30])
    assert len(top & set(marginal)) >= 0.75 * len(marginal)


def test_copies_are_found_beyond_the_candidates_by_their_codes(wide: tuple[RawData, WideTruth]) -> None:
    raw, truth = wide
    exact = {f: s for f, s in truth.sources.items() if truth.roles[f] == "copy"}
    names = list(raw.schema.names)
    ranking = [*exact.values(), *[f for f in names if f not in exact.values()]]
    # no candidates at all: only the exact copies (a relabelled id, a scalar x 100, a vector x 2) are found
    found = redundant_features(raw, ranking, candidates=0)
    assert found == exact
    # with candidates the near copy (10% of rows redrawn) is found too when it is among them
    near = {f: s for f, s in truth.sources.items() if truth.roles[f] == "near_copy"}
    ranking = [*exact.values(), *near.values(), *near, *[f for f in names if f not in (*exact.values(), *near, *near.values())]]
    assert redundant_features(raw, ranking, threshold=0.8, candidates=len(exact) + 2) == {**exact, **near}
    # a feature listed twice, constants and thresholds above 1 find nothing more
    assert redundant_features(raw, ranking, threshold=1.01, candidates=0) == {}


def test_vector_relevance_does_not_grow_with_width() -> None:
    """A noise vector of width 64 scores like a noise scalar: its direction is fitted on other rows."""
    import pandas as pd

    from recsys.data.raw import ReadReport
    from recsys.data.schema import FeatureSpec, Schema

    rng = np.random.default_rng(0)
    n = 32_768
    noise = rng.standard_normal((n, 64))
    signal = rng.standard_normal((n, 16))
    logit = signal @ (rng.standard_normal(16) / 4.0)
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    cols = {f"noise_{i}": noise[:, i] for i in range(64)} | {f"sig_{i}": signal[:, i] for i in range(16)}
    frame = pd.DataFrame({**cols, "scalar": rng.standard_normal(n), "label": label})
    schema = Schema((FeatureSpec("noise", kind="vector", dim=64), FeatureSpec("sig", kind="vector", dim=16),
                     FeatureSpec("scalar", kind="dense")))
    scores = score_raw(RawData(frame, schema, ReadReport("vectors")), OutRankConfig(ranking="relevance", progress=False))
    assert scores.relevance["sig"] > 0.05
    assert abs(scores.relevance["noise"]) < 0.003 and abs(scores.relevance["scalar"]) < 0.003


def test_grouped_permutation_drops_isolate_the_fields_that_matter(monkeypatch) -> None:
    """100 dense fields, 3 in the logit: grouping finds them with exactly their per-field drops,
    in far fewer passes than fields; the rest share their group's (zero) drop."""
    import pandas as pd
    import torch
    from torch import nn

    import selection.model_based.permutation as perm
    from recsys.data.encoders import Preprocessor
    from recsys.data.schema import FeatureSpec, Schema
    from recsys.models.base import RankingModel

    class Linear(RankingModel):
        def __init__(self, schema: Schema) -> None:
            super().__init__(schema)
            self.w = nn.Linear(self.num_dense, 1)

        def interact(self, sparse: dict, dense: torch.Tensor) -> torch.Tensor:
            return self.w(dense).squeeze(-1)

    rng = np.random.default_rng(0)
    n, f = 4000, 100
    x = rng.standard_normal((n, f))
    coef = np.zeros(f)
    coef[[7, 42, 88]] = [1.5, -1.0, 0.6]
    label = (rng.random(n) < 1 / (1 + np.exp(-x @ coef))).astype(int)
    schema = Schema(tuple(FeatureSpec(f"x{i}", kind="dense") for i in range(f)))
    frame = pd.DataFrame({f"x{i}": x[:, i] for i in range(f)} | {"label": label})
    pre = Preprocessor(schema).fit(frame)
    data = pre.transform(frame)
    model = Linear(pre.fitted_schema)
    with torch.no_grad():
        model.w.weight.copy_(torch.tensor(coef, dtype=torch.float32)[None])
        model.w.bias.zero_()
    passes = []
    auc = perm.binary_auc
    monkeypatch.setattr(perm, "binary_auc", lambda *a: passes.append(1) or auc(*a))
    grouped: dict[str, int] = {}
    base, drops = perm.permutation_drops(model, data, repeats=2, grouped=grouped)  # 100 fields: grouped by default
    grouped_passes = len(passes)
    _, alone = perm.permutation_drops(model, data, repeats=2, features=["x7", "x42", "x88", "x3"], group_size=1)
    for name in ("x7", "x42", "x88"):
        assert drops[name] == alone[name] and name not in grouped  # reached alone: the same permutations
    assert sorted(drops, key=lambda k: -np.mean(drops[k]))[:3] == ["x7", "x42", "x88"]
    assert f - 6 <= len(grouped) <= f - 3 and all(abs(np.mean(drops[k])) < 1e-3 for k in grouped)  # a partner of each signal ends alone
    assert grouped_passes < 0.5 * 2 * f  # 2 repeats: 200 passes one field at a time


def test_leap_measures_held_out_drops_for_a_fixed_budget_of_fields(tiny_recipe, monkeypatch) -> None:  # noqa: ANN001
    """Beyond the fit, LeAP's default ranking costs at most ``heldout_fields`` evaluation passes:
    the drops of the fields highest by gate + relevance; the others count as no drop."""
    import selection.model_based.permutation as perm
    from selection.model_based.leap import LeAP
    from selection.model_based.leap_fusion import sum_fusion

    passes = []
    auc = perm.binary_auc
    monkeypatch.setattr(perm, "binary_auc", lambda *a: passes.append(1) or auc(*a))
    report = LeAP(tracking=False, heldout_fields=3, fusion="relevance_heldout").rank(tiny_recipe)
    gates, relevance, heldout = (report.extras[k] for k in ("gates", "relevance", "heldout"))
    top = sorted(gates, key=lambda f: -sum_fusion(gates, relevance)[f])[:3]
    assert report.extras["heldout_fields"] == 3 and len(passes) == 1 + 3  # the base pass and one per field
    assert {f for f, d in heldout.items() if d != 0.0} <= set(top) and len(gates) > 3


def test_selection_by_dimensions() -> None:
    """A report selects by input dimensions; a curve reports the dimensions kept at the k chosen
    on validation and the share removed."""
    from selection.curve import CurvePoint, SelectionCurve
    from selection.report import ImportanceReport

    report = ImportanceReport.from_scores("m", {"vec": 3.0, "id": 2.0, "s1": 1.0, "s2": 0.5},
                                          widths={"vec": 32, "id": 8, "s1": 1, "s2": 1})
    assert report.dimensions == 42 and report.dims_of(2) == 40
    assert report.top_dims(41) == ["vec", "id", "s1"] and report.top_dims(5) == ["vec"]  # the first always fits
    with pytest.raises(ValueError, match="budget must be >= 1"):
        report.top_dims(0)
    full = CurvePoint(4, ["vec", "id", "s1", "s2"], 0.80, 0.4, 0.81, dims=42)
    points = [CurvePoint(1, ["vec"], 0.70, 0.5, 0.72, dims=32), CurvePoint(2, ["vec", "id"], 0.80, 0.4, 0.8095, dims=40)]
    curve = SelectionCurve("m", "d", [1, 2], points, full, tolerance=0.001)
    assert curve.smallest_k == 2 and curve.dims_at_smallest_k == 40
    assert curve.summary()["dims_removed_share"] == pytest.approx(2 / 42) and curve.summary()["n_dims"] == 42
    assert "| 2 (chosen) | 40 |" in curve.to_markdown()
    assert SelectionCurve.from_dict(curve.to_dict()).points[1].dims == 40
    import matplotlib

    matplotlib.use("Agg")
    assert curve.plot(x="dims").axes[0].get_xlabel() == "input dimensions kept"


def test_a_selector_too_costly_for_the_width_refuses_at_once_naming_its_cost(tiny_recipe) -> None:  # noqa: ANN001
    from selection.base import WidthRefusal
    from selection.shallow.gbdt import GBDTImportance

    method = GBDTImportance(max_seconds=1e-3)
    assert method.estimated_seconds(40_000, 12_750) > 3600  # the F = 5,000 wide layout: hours of exact splits
    with pytest.raises(WidthRefusal, match=r"gbdt: fitting [\d,]+ rows x \d+ columns would take about .* min .*lightgbm"):
        method.rank(tiny_recipe)


def test_permutation_refuses_a_width_whose_passes_would_take_too_long(tiny_recipe) -> None:  # noqa: ANN001
    from selection.base import WidthRefusal
    from selection.model_based.permutation import PermutationImportance

    with pytest.raises(WidthRefusal, match=r"permutation: up to [\d,]+ evaluation passes of .* s each .*LeAP ranks them"):
        PermutationImportance(max_seconds=1e-6, tracking=False, repeats=2).rank(tiny_recipe)
