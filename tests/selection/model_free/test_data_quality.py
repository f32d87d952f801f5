"""The data-quality report: exact counts on a hand-made frame, flags, bad input, files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recsys.data.raw import RawData, ReadReport
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from selection.model_free.data_quality import REPETITION_THRESHOLDS, QualityReport, data_quality
from selection.model_free.outrank import OutRank
from tests.conftest import require_dataset


def _raw(columns: dict[str, object], label: object, kinds: dict[str, FeatureKind] | None = None,
         source: str = "small.csv") -> RawData:
    kinds = kinds or {}
    frame = pd.DataFrame({**columns, "label": label})
    frame.index = pd.RangeIndex(2, len(frame) + 2)
    specs = tuple(FeatureSpec(n, kinds.get(n, FeatureKind.CATEGORICAL)) for n in columns)
    return RawData(frame, Schema(specs, label="label", name="small"), ReadReport(source=source, rows_read=len(frame)))


@pytest.fixture
def small() -> RawData:
    return _raw(
        {
            "cat": ["a", "a", "b", "", "c", "a"],
            "bag": ["x|y", "x", "", "y|y|z", "x", "x"],
            "num": [1.0, 1.0, np.nan, 2.0, 3.0, 1.0],
            "const": ["k"] * 6,
            "dead": [""] * 6,
        },
        [0, 1, 0, 1, 0, 1],
        kinds={"bag": FeatureKind.MULTI_CATEGORICAL, "num": FeatureKind.DENSE},
    )


def test_exact_counts(small: RawData) -> None:
    q = data_quality(small, score=False)
    assert q.rows == 6 and q.label_counts == {"0": 3, "1": 3} and q.scoring is None
    cat = q["cat"]
    assert (cat.cardinality, cat.coverage, cat.missing_share) == (3, pytest.approx(5 / 6), pytest.approx(1 / 6))
    assert (cat.top_value, cat.top_share) == ("a", 0.5)
    assert (cat.rare_values, cat.rare_share) == (2, pytest.approx(2 / 3))  # b and c seen once
    assert cat.repetitions == {0: 3, 1: 1, 10: 0, 100: 0, 1000: 0, 10000: 0, 100000: 0}
    assert list(cat.repetitions) == list(REPETITION_THRESHOLDS)
    assert not (cat.constant or cat.near_constant or cat.all_missing) and cat.flags == []
    bag = q["bag"]  # tokens: x in 4 rows, y in 2 (twice in one bag counts once), z in 1; one empty bag
    assert (bag.kind, bag.cardinality, bag.coverage) == ("multi_categorical", 3, pytest.approx(5 / 6))
    assert (bag.top_value, bag.top_share, bag.rare_values) == ("x", pytest.approx(4 / 6), 1)
    assert bag.repetitions[0] == 3 and bag.repetitions[1] == 2
    num = q["num"]
    assert (num.cardinality, num.coverage, num.top_value, num.top_share) == (3, pytest.approx(5 / 6), "1.0", 0.5)
    assert num.rare_values == 2
    const, dead = q["const"], q["dead"]
    assert (const.cardinality, const.top_value, const.top_share, const.flags) == (1, "k", 1.0, ["constant"])
    assert (dead.cardinality, dead.coverage, dead.top_value, dead.top_share) == (0, 0.0, "<missing>", 1.0)
    assert dead.rare_share == 0.0 and dead.flags == ["missing", "constant"]
    assert q.flags() == {"const": ["constant"], "dead": ["missing", "constant"]}


def test_near_constant_is_a_warning() -> None:
    n = 400
    flag = np.array(["0"] * (n - 3) + ["1"] * 3, dtype=object)
    q = data_quality(_raw({"flag": flag, "other": np.arange(n).astype(str)}, np.arange(n) % 2), score=False)
    assert q["flag"].near_constant and q["flag"].top_share == pytest.approx(397 / 400)
    assert q["flag"].flags == ["near_constant"] and not q["flag"].constant
    assert q["other"].rare_values == n and q["other"].rare_share == 1.0


def test_leakage_and_below_noise_come_from_outrank() -> None:
    rng = np.random.default_rng(0)
    n = 6000
    label = rng.integers(0, 2, n)
    good = np.where(rng.random(n) < 0.6, label, rng.integers(0, 2, n)) * 3 + rng.integers(0, 3, n)
    q = data_quality(_raw({"good": good.astype(str), "leak": np.where(label == 1, "y", "n"),
                           "noise": rng.integers(0, 100, n).astype(str)}, label))
    assert q.scoring_error is None and q.scoring["rows_scored"] == n
    assert q["leak"].leakage is not None and q["leak"].leakage.startswith("leakage: score")
    assert q["good"].leakage is None and q["good"].relevance > 0.05 and q["good"].below_noise is None
    assert q.flags()["leak"] == ["leakage"]
    assert "CONTROL-int100" in q.scoring["controls"]
    # below_noise is OutRank's flag: the noise column's score against its matched control
    matched = q.scoring["controls"]["CONTROL-int100"]["score"]
    assert (q["noise"].below_noise == "CONTROL-int100") == (q["noise"].relevance < matched)
    quiet = data_quality(_raw({"leak": np.where(label == 1, "y", "n")}, label), OutRank(controls=False))
    assert quiet["leak"].leakage and quiet["leak"].below_noise is None


def test_unscorable_label_is_reported_not_raised(small: RawData) -> None:
    one_class = _raw({"cat": ["a", "b", "a"]}, [1, 1, 1], source="one.csv")
    q = data_quality(one_class)
    assert q.scoring is None and "one.csv: label column 'label' has a single class" in q.scoring_error
    assert q["cat"].cardinality == 2 and q["cat"].relevance is None
    assert "OutRank scoring skipped" in q.format()


def test_rendering_and_files(small: RawData, tmp_path: Path) -> None:
    q = data_quality(small)
    text = q.format()
    assert "small.csv" in text and all(f in text for f in small.schema.names)
    md = q.to_markdown()
    assert "| feature | kind | card |" in md and md.count("\n| ") >= 6
    frame = q.to_frame()
    assert list(frame["feature"]) == small.schema.names and frame.loc[0, "seen>1"] == 1
    assert frame.set_index("feature").loc["dead", "flags"] == "missing,constant"
    back = json.loads(q.save(tmp_path / "quality.json").read_text())
    assert back["features"][0]["repetitions"]["0"] == 3 and back["flags"]["dead"] == ["missing", "constant"]
    assert isinstance(q, QualityReport) and len(q) == 5


@pytest.mark.data
def test_criteo_head_matches_its_provenance(data_dir: Path) -> None:
    """Distinct values and missing rates from the dataset's PROVENANCE.md (distinct there counts the empty value)."""
    from recsys.data.readers import CriteoReader

    folder = require_dataset(data_dir, "criteo-kaggle-head10k")
    q = data_quality(CriteoReader(path=str(folder / "train_head10k.txt.gz")).read())
    distinct_c = [175, 386, 5521, 4033, 56, 8, 3184, 93, 3, 2986, 2084, 5284, 1725, 24, 2035, 4724, 9, 1149, 547, 4,
                  5037, 8, 12, 2525, 40, 1939]
    for i, d in enumerate(distinct_c, start=1):
        f = q[f"C{i}"]
        assert f.cardinality + (1 if f.missing_share > 0 else 0) == d, f.feature
    assert q["C22"].missing_share == pytest.approx(0.818, abs=5e-4)
    assert q["I12"].missing_share == pytest.approx(0.773, abs=5e-4)
    assert q.scoring is not None and not any(f.leakage for f in q.features)
