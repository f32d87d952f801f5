"""ImportanceReport: ranking, top-k, applying the selection, plot, MLflow, save/load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from selection.base import RandomRanking, feature_widths, get_method, method_names
from selection.report import FeatureImportance, ImportanceReport


def _schema() -> Schema:
    return Schema(
        (
            FeatureSpec("user", FeatureKind.CATEGORICAL, embedding_dim=16),
            FeatureSpec("item", FeatureKind.CATEGORICAL, embedding_dim=8),
            FeatureSpec("tags", FeatureKind.MULTI_CATEGORICAL, embedding_dim=4),
            FeatureSpec("price", FeatureKind.DENSE),
        ),
        name="toy",
    )


def _report() -> ImportanceReport:
    schema = _schema()
    return ImportanceReport.from_scores(
        "toy",
        {"user": 0.1, "item": 0.5, "tags": float("nan"), "price": 0.3},
        uncertainty={"item": 0.01},
        widths=feature_widths(schema),
        kinds={f.name: f.kind.value for f in schema.features},
        flags={"tags": ["below_noise"]},
        config={"alpha": 1.0},
        cost_seconds=1.5,
        dataset="toy",
        excluded={"leak": "leakage: equals the label"},
        extras={"matrix": [[1.0, float("nan")]]},
    )


def test_from_scores_ranks_descending_with_nan_last() -> None:
    r = _report()
    assert r.ranking == ["item", "price", "user", "tags"]
    assert [f.rank for f in r.features] == [1, 2, 3, 4]
    assert r["item"].uncertainty == 0.01 and r["user"].uncertainty is None
    assert r["user"].width == 16 and r["price"].width == 1 and r["price"].kind == "dense"
    assert r["tags"].flags == ("below_noise",)


def test_ties_keep_input_order() -> None:
    r = ImportanceReport.from_scores("t", {"b": 1.0, "a": 1.0, "c": 2.0})
    assert r.ranking == ["c", "b", "a"]


def test_top_k_and_bad_k() -> None:
    r = _report()
    assert r.top_k(2) == ["item", "price"]
    with pytest.raises(ValueError, match=r"k=5 is out of range.*4 features.*leak"):
        r.top_k(5)
    with pytest.raises(ValueError, match="k=0"):
        r.top_k(0)


def test_ranks_must_be_contiguous_and_excluded_disjoint() -> None:
    with pytest.raises(ValueError, match="ranks must be"):
        ImportanceReport("m", [FeatureImportance("a", 1.0, 2)])
    with pytest.raises(ValueError, match="both ranked and excluded"):
        ImportanceReport("m", [FeatureImportance("a", 1.0, 1)], excluded={"a": "x"})


def test_reduced_schema_and_config(tmp_path: Path) -> None:
    r = _report()
    reduced = r.reduced_schema(_schema(), 2)
    assert reduced.names == ["item", "price"]  # schema order kept
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {backbone: {class_path: recsys.models.DCNv2}}\ndata:\n  batch_size: 8\n  drop_features: [user]\n")
    out = r.reduced_config(cfg, 3)
    assert out["data"]["features"] == ["item", "price", "user"]
    assert "drop_features" not in out["data"] and out["data"]["batch_size"] == 8
    assert out["model"] == {"backbone": {"class_path": "recsys.models.DCNv2"}}


def test_save_load_round_trip(tmp_path: Path) -> None:
    r = _report()
    path = r.save(tmp_path / "r.json")
    data = json.loads(path.read_text())  # strict JSON: NaN stored as null
    assert data["features"][3]["score"] is None and data["extras"]["matrix"] == [[1.0, None]]
    back = ImportanceReport.load(path)
    assert back.ranking == r.ranking and back.excluded == r.excluded and back.config == r.config
    assert math.isnan(back["tags"].score) and back["item"].score == 0.5 and back.cost_seconds == 1.5
    assert back.to_frame().shape == (4, 7)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*invalid JSON"):
        ImportanceReport.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        ImportanceReport.load(tmp_path / "missing.json")


def test_plot_and_format() -> None:
    r = _report()
    fig = r.plot()
    assert len(fig.axes[0].patches) == 4
    with pytest.raises(ValueError, match="no redundancy matrix"):
        r.plot_redundancy()
    r.extras["redundancy"] = {"features": ["user", "item"], "matrix": [[1.0, 0.2], [0.2, None]]}
    heat = r.plot_redundancy()
    assert [t.get_text() for t in heat.axes[0].get_yticklabels()] == ["item", "user"]  # ranking order
    text = r.format()
    assert "item" in text.splitlines()[2] and "excluded: leakage" in text


def test_to_mlflow_logs_table_plot_and_json(tmp_cwd: Path) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import RunTracker

    tracker = RunTracker("toy", "rank-toy")
    _report().to_mlflow(tracker)
    tracker.finish()
    client = MlflowClient(tracker.uri)
    names = {a.path for a in client.list_artifacts(tracker.run_id, "importance/toy")}
    assert names == {"importance/toy/ranking.csv", "importance/toy/ranking_table.json", "importance/toy/ranking.png",
                     "importance/toy/report.json"}
    assert client.get_run(tracker.run_id).data.metrics["toy.features_ranked"] == 4


def test_random_ranking_is_seeded_and_registered() -> None:
    schema = _schema()
    a = RandomRanking(seed=3).rank_schema(schema)
    b = RandomRanking(seed=3).rank_schema(schema)
    c = RandomRanking(seed=4).rank_schema(schema)
    assert a.ranking == b.ranking and sorted(a.ranking) == sorted(schema.names)
    assert any(RandomRanking(seed=s).rank_schema(schema).ranking != a.ranking for s in range(5)) or c.ranking != a.ranking
    assert "random" in method_names() and isinstance(get_method("random", seed=1), RandomRanking)
    with pytest.raises(ValueError, match="unknown importance method 'nope'"):
        get_method("nope")


def test_run_tracker_as_a_context_finishes_the_run(tmp_cwd: Path) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import RunTracker

    with RunTracker("toy", "ok") as ok:
        ok.log_metrics({"x": 1.0})
    with pytest.raises(RuntimeError, match="boom"), RunTracker("toy", "bad") as bad:
        raise RuntimeError("boom")
    client = MlflowClient(ok.uri)
    assert client.get_run(ok.run_id).info.status == "FINISHED"
    assert client.get_run(bad.run_id).info.status == "FAILED"


def test_report_files_written_before_the_shared_helper_still_load(tmp_path: Path) -> None:
    """The old ``ImportanceReport.save`` wrote JSON without a final newline, whatever the
    suffix; such files load unchanged (YAML reads JSON), and the suffix now picks the format."""
    r = _report()
    for name in ("old.json", "old.yaml"):
        (tmp_path / name).write_text(json.dumps(r.to_dict(), indent=2, allow_nan=False))
        assert ImportanceReport.load(tmp_path / name).to_dict() == r.to_dict()
    assert r.save(tmp_path / "new.json").read_text() == (tmp_path / "old.json").read_text() + "\n"
    assert ImportanceReport.load(r.save(tmp_path / "new.yaml")).to_dict() == r.to_dict()
    (tmp_path / "other.json").write_text('{"method": "x"}')
    with pytest.raises(ValueError, match=r"other\.json: not an importance report \(needs 'method' and 'features'"):
        ImportanceReport.load(tmp_path / "other.json")
    (tmp_path / "new_format.json").write_text(json.dumps({**r.to_dict(), "format_version": 9}))
    with pytest.raises(ValueError, match=r"new_format\.json: report format 9 is newer than this Salience reads"):
        ImportanceReport.load(tmp_path / "new_format.json")


def test_demoted_moves_features_after_the_rest_keeping_scores_falling() -> None:
    report = ImportanceReport.from_scores("m", {"a": 0.9, "b": 0.8, "c": 0.5, "d": 0.1}, flags={"b": ("x",)})
    moved = report.demoted({"b": "a"})
    assert moved.ranking == ["a", "c", "d", "b"] and [f.rank for f in moved.features] == [1, 2, 3, 4]
    scores = [f.score for f in moved.features]
    assert scores == sorted(scores, reverse=True) and moved["b"].score == pytest.approx(0.8 - (0.9 - 0.1 + 1.0))
    assert moved["b"].flags == ("x", "copy") and moved.extras["copies"] == {"b": "a"}
    assert report.ranking == ["a", "b", "c", "d"] and "copies" not in report.extras  # the original is unchanged
    assert report.demoted({}) is report and report.demoted({"zz": "a"}) is report
    two = report.demoted({"a": "x", "c": "y"})
    assert two.ranking == ["b", "d", "a", "c"]  # the moved keep their own order
