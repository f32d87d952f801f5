"""OutRank: the package's golden scores, a loop reference, planted truth, streaming, bad input."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.data.raw import RawData, ReadReport
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.synthetic import GroundTruth, SyntheticConfig, generate
from selection.base import get_method
from selection.model_free.outrank import (
    CONTROL_PREFIX,
    OutRank,
    combined_ranking,
    conditional_entropy,
    encode_column,
    entropy,
    factorize,
    outrank_score,
    plain_mi,
    rank_raw,
    score_raw,
)
from selection.report import ImportanceReport
from tests.conftest import require_dataset

CRITEO_COLUMNS = ["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]]
#: the package's ranking: label-vs-feature scores, the label's own row dropped
PACKAGE = {"null": "package", "dense_bins": None, "ranking": "relevance", "controls": False, "progress": False}
#: what the README claims: the package's scores reproduced to 3.2e-7 (measured max |diff| 3.21e-7)
GOLDEN_TOLERANCE = 3.5e-7


# ---------------------------------------------------------------------------------------------
# a plain-Python reference of the score (loops, Counter): what the vectorised code must equal
# ---------------------------------------------------------------------------------------------
def _h(values: list[int]) -> float:
    n = len(values)
    return -sum(c / n * math.log(c / n) for c in Counter(values).values())


def reference_cond_entropy(x: list[int], y: list[int]) -> float:
    n = len(x)
    out = 0.0
    for c in set(y):
        rows = [i for i in range(n) if y[i] == c]
        if len(rows) >= 2:
            out += len(rows) / n * _h([x[i] for i in rows])
    return out


def reference_score(x: list[int], y: list[int], null: str = "package", rotations: int = 4) -> float:
    n = len(x)
    h = reference_cond_entropy(x, y)
    if null == "package":
        h_null = 0.0
        for c in set(y):
            rows = [i for i in range(n) if y[i] == c]
            if len(rows) >= 2:
                h_null += len(rows) / n * _h([x[(i + len(rows)) % n] for i in rows])
    else:
        rolled = [[x[(i - (j + 1) * n // (rotations + 1)) % n] for i in range(n)] for j in range(rotations)]
        h_null = sum(reference_cond_entropy(r, y) for r in rolled) / rotations
    return h_null - h


def _random_pair(rng: np.random.Generator, n: int, kx: int, ky: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.integers(0, kx, n)
    y = rng.integers(0, ky, n)
    x[: n // 3] = y[: n // 3] % kx  # some dependence
    y[-1] = ky + 3  # a label value seen once (skipped) and non-compact codes
    return x, y


@pytest.mark.parametrize("n,kx,ky", [(50, 3, 2), (97, 20, 2), (120, 7, 5), (64, 64, 3)])
def test_vectorised_score_equals_loop_reference(n: int, kx: int, ky: int) -> None:
    rng = np.random.default_rng(n + kx)
    x, y = _random_pair(rng, n, kx, ky)
    xs, ys = x.tolist(), y.tolist()
    assert conditional_entropy(x, y) == pytest.approx(reference_cond_entropy(xs, ys), abs=1e-12)
    assert outrank_score(x, y) == pytest.approx(reference_score(xs, ys), abs=1e-12)
    assert outrank_score(x, y, null="rotation") == pytest.approx(reference_score(xs, ys, "rotation"), abs=1e-12)
    assert outrank_score(x, y, null="rotation", rotations=2) == pytest.approx(
        reference_score(xs, ys, "rotation", 2), abs=1e-12)
    assert plain_mi(x, y) == pytest.approx(_h(xs) - reference_cond_entropy(xs, ys), abs=1e-12)


def test_score_basic_properties() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 5000)
    assert outrank_score(np.zeros(5000, dtype=np.int64), y) == 0.0  # a constant scores exactly 0
    assert outrank_score(y, y) > 0.9 * entropy(y)  # a copy of the label scores ~H(L)
    assert plain_mi(y, y) == pytest.approx(entropy(y), abs=1e-12)  # label vs itself: plain MI
    ids = np.arange(5000)  # row-unique ID: plain MI is maximal (= H(L)), the corrected score is 0
    assert plain_mi(ids, y) == pytest.approx(entropy(y), abs=1e-12)
    assert outrank_score(ids, y) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="equal length"):
        outrank_score(np.zeros(3, dtype=np.int64), np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="non-negative"):
        outrank_score(np.array([-1, 0]), np.array([0, 1]))


def test_rotation_null_spreads_less_than_the_package_null() -> None:
    """Why ``null="rotation"`` is the default: on a skewed many-valued noise column the
    package's per-group shift (groups that do not partition the rows) is several times noisier."""
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, 501)
    p /= p.sum()
    pkg, rot = [], []
    for _ in range(40):
        x = rng.choice(500, 4096, p=p)
        y = (rng.random(4096) < 0.25).astype(np.int64)
        pkg.append(outrank_score(x, y, null="package"))
        rot.append(outrank_score(x, y, null="rotation"))
    assert np.std(rot) < 0.5 * np.std(pkg)
    assert abs(np.mean(rot)) < 2 * np.std(rot) / math.sqrt(40) + 1e-4


def test_factorize_and_pairs() -> None:
    codes = factorize(pd.Series(["b", "", "a", "b", None, np.nan, ""]))
    assert codes.tolist() == [0, 1, 2, 0, 3, 3, 1]  # NaN and None share a code, "" is its own
    col = encode_column(pd.Series(["b", "", None, "b"]), FeatureSpec("c"))
    assert col.codes.tolist() == [0, 1, 1, 0] and col.missing.tolist() == [False, True, True, False]


# ---------------------------------------------------------------------------------------------
# golden: the outrank 0.97.5 package on the Criteo head
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def criteo(data_dir: Path) -> tuple[pd.DataFrame, pd.Series]:
    folder = require_dataset(data_dir, "criteo-kaggle-head10k")
    frame = pd.read_csv(folder / "train_head10k.txt.gz", sep="\t", header=None, names=CRITEO_COLUMNS, dtype=str,
                        keep_default_na=False)
    ref = pd.read_csv(folder / "outrank-0.97.5-scores.tsv", sep="\t").set_index("feature")["score"]
    return frame, ref


@pytest.mark.data
def test_golden_scores_match_the_package(criteo: tuple[pd.DataFrame, pd.Series]) -> None:
    frame, ref = criteo
    label = factorize(frame["label"])
    ours = pd.Series({c: outrank_score(factorize(frame[c]), label) for c in CRITEO_COLUMNS[1:]})
    diff = (ours - ref.reindex(ours.index)).abs()
    assert diff.max() <= GOLDEN_TOLERANCE, diff.sort_values().tail()
    assert ours.rank().corr(ref.reindex(ours.index).rank()) == pytest.approx(1.0, abs=1e-12)
    assert list(ours.sort_values(ascending=False).index) == list(ref.index)
    # the label-vs-itself pair (the package's top row, dropped from the file): plain MI = H(L)
    p = frame["label"].eq("1").mean()
    assert plain_mi(label, label) == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)), abs=1e-12)
    print(f"\ngolden max |diff| = {diff.max():.2e}")


@pytest.mark.data
def test_golden_through_the_reader(criteo: tuple[pd.DataFrame, pd.Series], data_dir: Path) -> None:
    """CriteoReader turns I* into floats (NaN = missing): the same partition, the same scores."""
    from recsys.data.readers import CriteoReader

    _, ref = criteo
    raw = CriteoReader(path=str(data_dir / "criteo-kaggle-head10k" / "train_head10k.txt.gz")).read()
    report = rank_raw(raw, OutRank(**PACKAGE))
    rel = pd.Series(report.extras["relevance"])
    assert (rel - ref.reindex(rel.index)).abs().max() <= GOLDEN_TOLERANCE
    assert report.ranking == list(ref.index)
    assert report.extras["batches"] == 1 and report.extras["rows_scored"] == 10_000
    # speed of the whole default method (controls and 3MR pairs included), printed only
    full = rank_raw(raw, OutRank(progress=False))
    print(f"\nCriteo head10k, 39 features: relevance {report.extras['rows_per_second']:,.0f} rows/s; "
          f"default (rotation null, controls, 3MR pairs) {full.extras['rows_per_second']:,.0f} rows/s")
    assert set(full.ranking) == set(rel.index) and not full.excluded


# ---------------------------------------------------------------------------------------------
# planted truth on the synthetic data
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic() -> tuple[RawData, GroundTruth, ImportanceReport, ImportanceReport]:
    raw, truth = generate(SyntheticConfig(n_rows=40_000, seed=0, cardinality_scale=0.1))
    combined = rank_raw(raw, OutRank(progress=False))
    relevance = rank_raw(raw, OutRank(ranking="relevance", progress=False))
    return raw, truth, combined, relevance


def _precision(report: ImportanceReport, relevant: list[str], k: int = 10) -> float:
    return len(set(report.top_k(k)) & set(relevant)) / k


def test_planted_truth_combined_ranking(synthetic: tuple) -> None:
    raw, truth, report, relevance = synthetic
    rank = {f.feature: f.rank for f in report.features}
    informative = truth.names("informative", "sparse_informative")
    noise = truth.names("noise")
    assert max(rank[f] for f in informative) < min(rank[f] for f in noise), report.ranking
    # 9 of the 11 signal features have single-feature signal; the 10th slot can only hold a
    # non-signal feature or one of the interaction pair, so 0.9 is the ceiling here
    assert _precision(report, truth.signal) == pytest.approx(0.9)
    assert _precision(relevance, truth.signal) < _precision(report, truth.signal)
    # exact copies are demoted below their source, to the bottom of the ranking
    assert rank["user_id_copy"] > rank["user_id"] and rank["price_cents"] > rank["price"]
    assert rank["user_id_copy"] > 15 and rank["price_cents"] > 15
    # a many-valued noise ID is not ranked high despite its cardinality
    assert rank["noise_id"] > 10
    assert relevance.ranking.index("noise_id") >= 10


def test_planted_interaction_shows_in_the_relation_matrix(synthetic: tuple) -> None:
    _, truth, report, _ = synthetic
    feats = report.extras["relation"]["features"]
    q = np.asarray(report.extras["relation"]["matrix"])
    rel = report.extras["relevance"]
    a, d = feats.index("ad_slot"), feats.index("daypart")
    # alone: no signal by design; together: a clear one, far above either with any noise feature
    assert abs(rel["ad_slot"]) < 1e-3 and abs(rel["daypart"]) < 1e-3
    assert q[a, d] == q[d, a] > 0.005
    for n in truth.names("noise"):
        assert q[a, d] > 3 * max(q[a, feats.index(n)], q[d, feats.index(n)])
    # redundancy: the copy is the most redundant partner of its source
    dm = np.asarray(report.extras["redundancy"]["matrix"])
    u = feats.index("user_id")
    partners = [j for j in range(len(feats)) if j != u]
    assert feats[max(partners, key=lambda j: dm[u, j])] == "user_id_copy"


def test_the_interaction_pair_survives_the_noise_gate_and_noise_does_not(synthetic: tuple) -> None:
    raw, truth, report, relevance = synthetic
    partners = report.extras["interaction_partners"]
    # the planted pair: each is the other's significant partner, flagged, not below noise
    assert partners["ad_slot"]["partner"] == "daypart" and partners["daypart"]["partner"] == "ad_slot"
    assert partners["ad_slot"]["synergy"] > 0.005
    for f in ("ad_slot", "daypart"):
        assert "interaction" in report[f].flags and "below_noise" not in report[f].flags
        assert f not in report.extras["below_noise"]
    # no noise field finds a partner (the tests are Bonferroni-corrected over the pairs)
    assert not set(truth.names("noise")) & set(partners), partners
    # without pair scores (ranking by relevance alone) the single-feature gate decides, as before
    assert {"ad_slot", "daypart"} <= set(relevance.extras["below_noise"])
    assert relevance.extras["interaction_partners"] == {}
    plain = rank_raw(raw, OutRank(progress=False, interactions=False))
    assert {"ad_slot", "daypart"} <= set(plain.extras["below_noise"]) and plain.extras["interaction_partners"] == {}


def test_no_partner_on_pure_noise() -> None:
    rng = np.random.default_rng(3)
    n = 40_000
    columns = {f"n{i}": rng.integers(0, k, n).astype(str) for i, k in enumerate((2, 6, 6, 30, 200, 1000))}
    raw = _frame_raw(columns, (rng.random(n) < 0.3).astype(int))
    report = rank_raw(raw, OutRank(progress=False))
    assert report.extras["interaction_partners"] == {}


def test_report_schema_and_controls(synthetic: tuple, tmp_path: Path) -> None:
    raw, _, report, relevance = synthetic
    assert report.method == "outrank" and report.config["ranking"] == "combined"
    assert sorted(report.ranking) == sorted(raw.schema.names) and not report.excluded
    for f in report.features:
        spec = raw.schema[f.feature]
        assert f.width == (1 if spec.kind is FeatureKind.DENSE else spec.embedding_dim)
        assert f.kind == spec.kind.value
        assert f.uncertainty is not None and f.uncertainty >= 0  # 3 batches: an IQR
    for r in (report, relevance):
        scores = [f.score for f in r.features]
        assert scores == sorted(scores, reverse=True)
    assert relevance.scores == pytest.approx({f: relevance.extras["relevance"][f] for f in relevance.ranking})
    controls = report.extras["controls"]
    assert all(name.startswith(CONTROL_PREFIX) for name in controls)
    assert not any(f.startswith(CONTROL_PREFIX) for f in report.ranking)
    assert controls["CONTROL-label-copy"]["score"] == pytest.approx(report.extras["label_copy_score"])
    assert controls["CONTROL-label-copy"]["score"] > 0.9 * report.extras["label_entropy"]
    assert controls["CONTROL-constant"] == {"score": 0.0, "cardinality": 1.0}
    for name in ("binary", "int100", "int2000", "int10000", "int50000", "gaussian", "uniform", "row-hash"):
        assert abs(controls[CONTROL_PREFIX + name]["score"]) < 0.01, name
    assert controls["CONTROL-int100"]["cardinality"] == 101
    assert report["promo_flag"].flags == ("near_constant",)
    assert report.extras["batches"] == 3 and report.extras["rows_scored"] == 40_000
    json.dumps(report.to_dict(), allow_nan=False)
    back = ImportanceReport.load(report.save(tmp_path / "r.json"))
    assert back.ranking == report.ranking and back.extras["controls"] == controls


# ---------------------------------------------------------------------------------------------
# streaming, determinism, options
# ---------------------------------------------------------------------------------------------
def _frame_raw(columns: dict[str, object], label: np.ndarray, kinds: dict[str, FeatureKind] | None = None,
               source: str = "test.csv") -> RawData:
    kinds = kinds or {}
    frame = pd.DataFrame({**columns, "label": label}, index=pd.RangeIndex(1, len(label) + 1))
    specs = tuple(FeatureSpec(n, kinds.get(n, FeatureKind.CATEGORICAL), embedding_dim=4) for n in columns)
    return RawData(frame, Schema(specs, label="label", name="t"), ReadReport(source=source, rows_read=len(label)))


def _planted(n: int, seed: int = 0, classes: int = 2) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    good = rng.integers(0, 5, n)
    label = np.where(rng.random(n) < 0.7, good % classes, rng.integers(0, classes, n))
    cols = {"good": good.astype(str), "noise": rng.integers(0, 50, n).astype(str)}
    return cols, label


def test_median_over_batches_and_the_trailing_batch_rule() -> None:
    cols, label = _planted(6500)
    raw = _frame_raw(cols, label)
    method = OutRank(minibatch_size=2000, null="package", controls=False, ranking="relevance", progress=False)
    scores = score_raw(raw, method)
    assert scores.batches == 3 and scores.rows_scored == 6000  # the trailing 500 rows are dropped
    g = factorize(raw.frame["good"])
    lab = factorize(raw.frame["label"])
    per_batch = [outrank_score(g[s:s + 2000], lab[s:s + 2000], null="package") for s in (0, 2000, 4000)]
    assert scores.batch_relevance["good"] == pytest.approx(per_batch, abs=1e-12)
    assert scores.relevance["good"] == pytest.approx(float(np.median(per_batch)), abs=1e-12)
    q1, q3 = np.percentile(per_batch, [25, 75])
    assert scores.spread("good") == pytest.approx(q3 - q1)
    # a trailing batch of more than 1024 rows is scored
    raw2 = _frame_raw(*_planted(7100))
    assert score_raw(raw2, method).batches == 4
    # a small file is one batch even below 1024 rows (the package would score nothing)
    small = score_raw(_frame_raw(*_planted(500)), method)
    assert small.batches == 1 and small.rows_scored == 500 and small.spread("good") is None


def test_subsampling_and_max_rows() -> None:
    cols, label = _planted(3000)
    raw = _frame_raw(cols, label)
    base = {"controls": False, "ranking": "relevance", "progress": False}
    sub = score_raw(raw, OutRank(subsampling=3, **base))
    assert sub.rows_scored == 1000
    every_third = _frame_raw({k: v[::3] for k, v in cols.items()}, label[::3])
    assert sub.relevance == pytest.approx(score_raw(every_third, OutRank(**base)).relevance, abs=1e-12)
    capped = score_raw(raw, OutRank(max_rows=1234, **base))
    assert capped.rows_scored == 1234
    assert score_raw(raw, OutRank(max_rows=1234, **base)).relevance == capped.relevance


def test_deterministic_for_a_seed() -> None:
    raw, _ = generate(SyntheticConfig(n_rows=5000, seed=1, cardinality_scale=0.01, n_noise=2, n_noise_dense=1))
    method = OutRank(minibatch_size=2048, seed=3, progress=False)

    def strip(r: ImportanceReport) -> dict:
        d = r.to_dict()
        d.pop("cost_seconds")
        d["extras"].pop("rows_per_second")
        return d

    a, b = rank_raw(raw, method), rank_raw(raw, method)
    assert strip(a) == strip(b)
    c = rank_raw(raw, OutRank(minibatch_size=2048, seed=4, progress=False))
    assert c.extras["controls"] != a.extras["controls"]  # controls are redrawn from the seed
    assert c.extras["relevance"] == a.extras["relevance"]  # the features' scores do not depend on it


def test_multi_hot_scored_on_exploded_tokens_and_dense_binned() -> None:
    rng = np.random.default_rng(0)
    n = 3000
    label = rng.integers(0, 2, n)
    tokens = np.array(["a", "b", "c", "d"])
    bags = ["|".join(sorted(set(rng.choice(tokens, rng.integers(0, 3)).tolist() + (["z"] if y else []))))
            for y in label]
    dense = np.where(rng.random(n) < 0.05, np.nan, rng.normal(size=n) + label)
    raw = _frame_raw({"tags": np.array(bags, dtype=object), "x": dense}, label,
                     kinds={"tags": FeatureKind.MULTI_CATEGORICAL, "x": FeatureKind.DENSE})
    method = OutRank(null="package", controls=False, ranking="relevance", dense_bins=8, progress=False)
    scores = score_raw(raw, method)
    # reference: one instance per (row, token), an empty bag is the token "<empty>"
    rows, toks = [], []
    for i, cell in enumerate(bags):
        parts = sorted(set(p for p in cell.split("|") if p)) or ["<empty>"]
        rows += [i] * len(parts)
        toks += parts
    order = np.lexsort((factorize(np.array(toks, dtype=object)), np.array(rows)))
    ref = outrank_score(factorize(np.array(toks, dtype=object))[order], label[np.array(rows)][order], null="package")
    assert scores.relevance["tags"] == pytest.approx(ref, abs=1e-12)
    assert scores.cardinality["tags"] == 6  # a b c d z <empty>
    col = encode_column(raw.frame["x"], raw.schema["x"], dense_bins=8)
    assert col.binned and len(np.unique(col.codes)) == 9  # 8 quantile bins + NaN
    assert scores.relevance["x"] > 0.05
    raw_values = encode_column(raw.frame["x"], raw.schema["x"], dense_bins=None)
    assert not raw_values.binned and len(np.unique(raw_values.codes)) > 2000


def test_combined_ranking_demotes_copies() -> None:
    r = [1.0, 0.99, 0.5, 0.1]  # feature 1 copies feature 0
    d = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=float)
    q = np.zeros((4, 4))
    order, gains = combined_ranking(r, d, q, redundancy_agg="max")
    assert order == [0, 2, 3, 1] and gains[0] == 1.0
    assert combined_ranking(r, np.zeros((4, 4)), q)[0] == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def test_single_class_label_is_a_clear_error() -> None:
    cols, _ = _planted(200)
    raw = _frame_raw(cols, np.ones(200, dtype=np.int8), source="clicks.csv")
    with pytest.raises(ValueError, match=r"clicks\.csv: label column 'label' has a single class"):
        rank_raw(raw, OutRank(progress=False))


def test_missing_constant_and_leaking_features() -> None:
    cols, label = _planted(4000)
    cols = {**cols, "dead": np.full(4000, "", dtype=object), "const": np.full(4000, "k", dtype=object),
            "leak": np.where(label == 1, "yes", "no")}
    raw = _frame_raw(cols, label)
    for ranking in ("combined", "relevance"):
        report = rank_raw(raw, OutRank(ranking=ranking, progress=False))
        assert "leak" not in report.ranking
        assert report.excluded["leak"].startswith("leakage: score") and "1.00 x the label copy's" in report.excluded[
            "leak"]
        assert report.ranking[0] == "good"
        assert report.ranking[-2:] == ["dead", "const"]
        assert report["dead"].flags == ("missing", "constant")
        assert report["const"].flags == ("constant",)
        scores = [f.score for f in report.features]
        assert scores == sorted(scores, reverse=True)
    assert "noise" in rank_raw(raw, OutRank(ranking="relevance", progress=False)).ranking


def test_multi_class_label() -> None:
    cols, label = _planted(6000, classes=3)
    report = rank_raw(_frame_raw(cols, label), OutRank(progress=False))
    assert report.ranking[0] == "good" and report.extras["relevance"]["good"] > 0.2
    assert report.extras["label_entropy"] == pytest.approx(entropy(factorize(label)), abs=1e-12)
    assert report.extras["controls"]["CONTROL-label-copy"]["cardinality"] == 3


def test_continuous_target_needs_target_bins() -> None:
    cols, label = _planted(3000)
    rng = np.random.default_rng(0)
    target = label + rng.normal(scale=0.3, size=3000)
    raw = _frame_raw(cols, target)
    with pytest.raises(ValueError, match=r"continuous target.*pass target_bins=K"):
        rank_raw(raw, OutRank(progress=False))
    many = _frame_raw(cols, np.arange(3000) % 500)
    with pytest.raises(ValueError, match=r"500 distinct values \(max_classes=50\)"):
        rank_raw(many, OutRank(progress=False))
    report = rank_raw(raw, OutRank(target_bins=5, progress=False))
    assert report.ranking[0] == "good"


def test_registry_and_config_errors() -> None:
    method = get_method("outrank", ranking="relevance", seed=2)
    assert isinstance(method, OutRank) and method.describe()["ranking"] == "relevance"
    assert method.describe()["null"] == "rotation"
    with pytest.raises(ValueError, match=r"ranking='best' is not one of \['combined', 'relevance'\]"):
        OutRank(ranking="best")
    with pytest.raises(ValueError, match="minibatch_size must be >= 2"):
        OutRank(minibatch_size=1)


def test_rank_reads_only_the_training_split() -> None:
    cols, label = _planted(3000)
    raw = _frame_raw(cols, label)

    class FakeRecipe:
        dataset_name = "fake"
        splits: list[str] = []

        def raw_split(self, split: str = "train") -> RawData:
            self.splits.append(split)
            return raw

    recipe = FakeRecipe()
    report = OutRank(progress=False).rank(recipe)  # type: ignore[arg-type]
    assert recipe.splits == ["train"] and report.dataset == "fake" and report.ranking[0] == "good"


def test_redundant_features_finds_the_planted_copies_and_not_id_like_noise() -> None:
    """The lower of each mutual copy (a relabelled id, a rescaled price) is named with its source;
    a feature merely determined by another (the user's attributes by user_id) and ID-like
    noise (a distinct value in most rows of the batch, which "determines" anything) are not."""
    from recsys.data.synthetic import SyntheticReader
    from selection.model_free.outrank_scoring import redundant_features

    raw = SyntheticReader(n_rows=20_000, seed=0, cardinality_scale=0.05).read()
    names = list(raw.schema.names)
    assert redundant_features(raw, names) == {"user_id_copy": "user_id", "price_cents": "price"}
    assert redundant_features(raw, names[::-1]) == {"user_id": "user_id_copy", "price": "price_cents"}
    frame = raw.frame.copy()
    n = len(frame)
    frame["row_id"] = np.arange(n).astype(str)  # unique per row: determines every column of the sample
    frame["row_id_2"] = (np.arange(n) * 7 % n).astype(str)  # and a relabelling of it
    frame["user_group"] = frame["user_id"].astype(str).str[:-1]  # a function of user_id, not a copy of it
    from dataclasses import replace

    from recsys.data.raw import RawData
    from recsys.data.schema import FeatureKind, FeatureSpec

    schema = replace(raw.schema, features=(*raw.schema.features, *(FeatureSpec(c, FeatureKind.CATEGORICAL)
                                                                   for c in ("row_id", "row_id_2", "user_group"))))
    wider = RawData(frame, schema, raw.report)
    found = redundant_features(wider, ["row_id", "row_id_2", "user_id", "user_group", *names])
    assert found == {"user_id_copy": "user_id", "price_cents": "price"}
    assert redundant_features(wider, names, threshold=1.01) == {}  # nothing keeps more than its own score


@pytest.mark.parametrize("threshold", [0.8, 0.9, 0.95])
def test_redundant_features_skips_only_pairs_that_cannot_be_copies(threshold: float, monkeypatch) -> None:
    """The own-score pre-filter (two columns share at most the smaller one's own score) gives the
    result of scoring every pair, and scores fewer pairs."""
    from dataclasses import replace

    import selection.model_free.outrank_scoring as scoring
    from recsys.data.synthetic import SyntheticReader
    from selection.model_free.mutual_info import NullModel, outrank_score

    raw = SyntheticReader(n_rows=20_000, seed=0, cardinality_scale=0.05).read()
    frame = raw.frame.copy()
    noisy = np.random.default_rng(0).random(len(frame)) < 0.04  # a near copy: 4% of its rows relabelled
    frame["user_near"] = np.where(noisy, frame["user_id"].sample(frac=1.0, random_state=0).to_numpy(), frame["user_id"])
    schema = replace(raw.schema, features=(*raw.schema.features, FeatureSpec("user_near", FeatureKind.CATEGORICAL)))
    raw = RawData(frame, schema, raw.report)
    names = list(raw.schema.names)
    specs = {s.name: s for s in raw.schema.features}
    frame = raw.frame.iloc[: 2**14]
    codes = {f: scoring._compact(scoring.encode_column(frame[f], specs[f], 32).codes) for f in names}
    own = {f: outrank_score(c, c, NullModel.ROTATION) for f, c in codes.items()}

    def every_pair(order: list[str]) -> dict[str, str]:
        kept: list[str] = []
        out: dict[str, str] = {}
        for f in order:
            src = next((g for g in kept if own[f] > 0 and own[g] > 0
                        and outrank_score(codes[f], codes[g], NullModel.ROTATION) >= threshold * own[f]
                        and outrank_score(codes[g], codes[f], NullModel.ROTATION) >= threshold * own[g]), None)
            kept.append(f) if src is None else out.__setitem__(f, src)
        return out

    calls = []
    monkeypatch.setattr(scoring, "outrank_score", lambda *a, **k: calls.append(1) or outrank_score(*a, **k))
    found = {}
    for order in (names, names[::-1]):
        found = scoring.redundant_features(raw, order, threshold)
        assert found == every_pair(order)
    # (the reversed ranking lists user_near first) the near copy counts, except at the strictest threshold
    assert found.get("user_id_copy") == ("user_near" if threshold < 0.95 else None), found
    pairs = len(names) * (len(names) - 1) // 2
    assert len(calls) < 2 * (len(names) + pairs) * 0.6  # own scores plus fewer than 60% of the pairs
