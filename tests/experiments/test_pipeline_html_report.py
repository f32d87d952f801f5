"""The pipeline's HTML report, rendered from a run folder built from real stage objects."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from embeddings import DimensionPlan
from experiments.pipeline.html_report import write_report
from recsys.data.raw import RawData, ReadReport
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.io import atomic_write_json
from selection import CurvePoint, ImportanceReport, SelectionCurve, data_quality

EVIL = "<script>x</script>"
IMG = '<img src="data:image/png;base64,'


def html_escaped(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _summary(name: str, features: list[str], params: int, auc: float, logloss: float, size: int,
             lat: tuple[float, float, float, float]) -> dict[str, Any]:
    return {
        "name": name, "features": features, "n_features": len(features), "embedding_parameters": params,
        "test_auc": auc, "test_logloss": logloss, "best_val_auc": auc + 0.001, "export_dir": f"runs/{name}/export",
        "export_bytes": size, "parity_max_abs_diff": 2.5e-7,
        "latency_ms": {"1": {"median": lat[0], "p90": lat[1]}, "1024": {"median": lat[2], "p90": lat[3]}},
        "run_id": f"run-{name}", "config": f"runs/{name}/config.yaml", "dims": {f: 8 for f in features},
    }


def _state(out: Path, stages: list[str], name: str = "synthetic") -> None:
    atomic_write_json(out / "pipeline_state.json", {
        "format_version": 1, "name": name, "config_sha": "abc123", "parent_run_id": "parent-run-42",
        "stages": {s: {"status": "done", "seconds": 1.5 + i, "peak_rss_mb": 1234.5 + i, "run_id": f"r{i}",
                       "finished_at": "2026-05-09T10:00:00"} for i, s in enumerate(stages)},
    })


def _quality(out: Path) -> None:
    frame = pd.DataFrame({
        "user": ["a", "b", "a", "c", "b", "a"], "item": ["x", "y", "x", "x", "z", "y"],
        EVIL: ["p", "q", "p", "q", "p", "q"], "dead": [""] * 6, "label": [0, 1, 0, 1, 0, 1],
    })
    schema = Schema(tuple(FeatureSpec(n, FeatureKind.CATEGORICAL) for n in ["user", "item", EVIL, "dead"]),
                    label="label", name="synthetic")
    quality = data_quality(RawData(frame, schema, ReadReport(source="tiny.csv", rows_read=6)), score=False)
    quality.save(out / "quality" / "quality.json")
    atomic_write_json(out / "quality" / "result.json",
                      {"n_rows": 6, "kept": ["user", "item", EVIL], "dropped": quality.flags()})


def _build(out: Path) -> None:
    """A complete run folder: every stage of the contract, from real objects."""
    _state(out, ["quality", "screening", "selection", "dims", "tuning", "final", "original", "compare"])
    (out / "config.yaml").write_text("name: synthetic\n")
    _quality(out)
    outrank = ImportanceReport.from_scores("outrank", {"user": 0.3, "item": 0.2, EVIL: 0.1, "noise": 0.001},
                                           uncertainty={"user": 0.02, "item": 0.01, EVIL: 0.01, "noise": 0.001},
                                           dataset="synthetic")
    outrank.save(out / "screening" / "outrank.json")
    atomic_write_json(out / "screening" / "result.json",
                      {"kept": ["user", "item", EVIL], "dropped": {"noise": "below the noise control"}})
    leap = ImportanceReport.from_scores("leap", {"user": 0.9, EVIL: 0.5, "item": 0.4}, dataset="synthetic")
    leap.save(out / "selection" / "leap.json")

    def pt(k: int, auc: float, feats: list[str]) -> CurvePoint:
        return CurvePoint(k=k, features=feats, test_auc=auc, test_logloss=0.5 - auc / 10)

    ranking = ["user", EVIL, "item"]
    curve = SelectionCurve(method="leap", dataset="synthetic", ks=[1, 2, 3],
                           points=[pt(k, 0.70 + 0.02 * k, ranking[:k]) for k in (1, 2, 3)],
                           full=pt(3, 0.76, ranking),
                           random={0: [pt(k, 0.68 + 0.02 * k, ranking[:k]) for k in (1, 2, 3)]},
                           tolerance=0.01, ranking=ranking)
    curve.save(out / "selection" / "curve.json")
    atomic_write_json(out / "selection" / "result.json",
                      {"k": 2, "kept": ["user", EVIL], "dropped": ["item"], "curve": curve.summary()})
    plan = DimensionPlan({"user": 16, EVIL: 4}, method="dnis", dataset="synthetic",
                         num_embeddings={"user": 100, EVIL: 10})
    plan.save(out / "dims" / "plan.json")
    atomic_write_json(out / "dims" / "result.json", {
        "method": "dnis", "budget": 2000, "parameters": plan.num_parameters(), "uniform_parameters": 1760,
        "uniform_dim": 16, "dims": plan.dims,
    })
    atomic_write_json(out / "tuning" / "result.json", {
        "sampler": "gif", "n_trials": 6, "values": [0.70, 0.72, None, 0.71, 0.75, 0.74],
        "phases": ["warmup", "warmup", "group", "group", "group", "fallback"], "best_value": 0.75, "best_trial": 4,
        "best_params": {"lr": 0.0031, "optimizer": "adam"}, "best_config": "runs/tuning/best.yaml", "schedule": None,
    })
    original = _summary("original", ["user", "item", EVIL], 123456, 0.7612, 0.4821, 2_500_000, (1.25, 1.5, 9.0, 11.0))
    final = _summary("final", ["user", EVIL], 1640, 0.7598, 0.4833, 500_000, (0.5, 0.75, 3.0, 4.0))
    atomic_write_json(out / "original" / "result.json", original)
    atomic_write_json(out / "final" / "result.json", final)
    atomic_write_json(out / "compare" / "result.json", {
        "original": original, "final": final, "auc_tolerance": 0.002, "within_tolerance": True,
        "delta": {"n_features": -1, "embedding_parameters": 1640 - 123456, "embedding_parameters_ratio": 1640 / 123456,
                  "test_auc": 0.7598 - 0.7612, "test_logloss": 0.4833 - 0.4821, "export_bytes_ratio": 0.2,
                  "latency_ratio": {"1": 0.4, "1024": 3 / 9}},
    })


def _not_run(text: str) -> set[str]:
    return set(re.findall(r'<section id="(\w+)" class="not-run">', text))


def test_full_report(tmp_path: Path) -> None:
    _build(tmp_path)
    figures = set(plt.get_fignums())
    path = write_report(tmp_path)
    assert path == tmp_path / "report" / "report.html" and path.is_file()
    assert set(plt.get_fignums()) == figures  # every figure closed
    text = path.read_text()
    # plots: before/after bars, OutRank, LeAP, selection curve, dims, HPO convergence
    assert text.count(IMG) == 6
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*https?://', text, re.I)
    assert "<script" not in text and "<link" not in text
    assert EVIL not in text and html_escaped(EVIL) in text
    assert _not_run(text) == set() and "could not render" not in text and "plot failed" not in text
    # the header
    assert "synthetic" in text and "parent-run-42" in text and "Stage timings" in text
    assert "peak RSS MB" in text and "1,234" in text  # each stage's own peak
    # before / after first, with its numbers
    assert text.index('id="compare"') < text.index('id="quality"') < text.index('id="screening"')
    for number in ("123,456", "1,640", "-121,816 (0.0133x)", "0.7612", "0.7598", "-0.0014", "0.4821", "0.4833",
                   "+0.0012", "2.50 MB", "500.0 kB", "0.2x", "1.250", "0.500", "0.4x", "9.000", "3.000", "0.333x"):
        assert number in text, number
    assert "within the AUC tolerance of 0.002" in text
    # stage details
    assert "below the noise control" in text and "chosen k = 2" in text and "dnis" in text
    assert "missing, constant" in text  # the dead column's flags
    assert "0.0031" in text and "adam" in text and "runs/final/export" in text and "2.5e-07" in text


def test_partial_folder_says_not_run(tmp_path: Path) -> None:
    _state(tmp_path, ["quality", "tuning"])
    _quality(tmp_path)
    atomic_write_json(tmp_path / "tuning" / "result.json", {  # a plain TPE study: no phases, a failed trial
        "sampler": "tpe", "n_trials": 3, "values": [0.7, None, 0.71], "phases": [None, None, None],
        "best_value": 0.71, "best_trial": 2, "best_params": {}, "best_config": "best.yaml", "schedule": None,
    })
    text = write_report(tmp_path).read_text()
    assert _not_run(text) == {"compare", "screening", "selection", "dims", "final"}
    assert 'id="quality"' in text and "cardinality" in text and text.count(IMG) == 1


def test_empty_and_corrupt_folders_render(tmp_path: Path) -> None:
    text = write_report(tmp_path).read_text()  # nothing at all: every section not run
    assert _not_run(text) == {"compare", "quality", "screening", "selection", "dims", "tuning", "final"}
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "result.json").write_text("{not json")
    text = write_report(tmp_path).read_text()
    assert "tuning" not in _not_run(text) and "could not render this stage" in text


def test_not_within_tolerance_and_no_compare(tmp_path: Path) -> None:
    _build(tmp_path)
    compare = tmp_path / "compare" / "result.json"
    data = json.loads(compare.read_text())
    atomic_write_json(compare, {**data, "within_tolerance": False})
    assert "NOT within the AUC tolerance" in write_report(tmp_path).read_text()
    compare.unlink()  # the table still renders from original/ and final/, without a verdict
    text = write_report(tmp_path).read_text()
    assert "compare" not in _not_run(text) and "no verdict" in text and "0.7598" in text


def test_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _state(tmp_path, ["quality"], name="alpha-run")
    path = write_report(tmp_path)
    assert "alpha-run" in path.read_text()
    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any) -> None:
        renames.append((Path(src), Path(dst)))
        real_replace(src, dst)

    _state(tmp_path, ["quality"], name="beta-run")
    monkeypatch.setattr(os, "replace", spy)
    assert write_report(tmp_path) == path
    assert [dst for _, dst in renames] == [path]
    assert renames[0][0].parent == path.parent and renames[0][0].name.endswith(".tmp")
    assert "beta-run" in path.read_text() and "alpha-run" not in path.read_text()
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.html"]


def test_portable_paths_are_relative_to_the_output_folder_or_the_repository(tmp_path: Path) -> None:
    from experiments.pipeline.paths import REPO_ROOT, portable_path, portable_paths

    out = tmp_path / "pipeline"
    assert portable_path(out / "final" / "export", out) == "final/export"
    assert portable_path(out, out) == "."
    config = REPO_ROOT / "experiments" / "configs" / "pipeline" / ".." / "frappe_dcnv2.yaml"
    assert portable_path(config, out) == "experiments/configs/frappe_dcnv2.yaml"
    assert portable_path("runs/x", out) == "runs/x"  # relative: not a machine path
    assert portable_path("/data/elsewhere/f.csv", out) == "/data/elsewhere/f.csv"  # neither: unchanged
    data = {"plan": str(out / "dims" / "plan.json"), "n": 3, "kept": ["user", "item"],
            "nested": [{"config": str(config)}], "name": "frappe"}
    assert portable_paths(data, out) == {"plan": "dims/plan.json", "n": 3, "kept": ["user", "item"],
                                         "nested": [{"config": "experiments/configs/frappe_dcnv2.yaml"}],
                                         "name": "frappe"}


def test_report_shows_no_absolute_path_of_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the report prints of the run folder is relative: to it, to the working directory or to the
    repository, so a committed report names no machine path."""
    from experiments.pipeline.paths import REPO_ROOT

    out = tmp_path / "pipeline"
    _build(out)
    (out / "config.yaml").write_text(f"name: synthetic\noutput: {out}\nmodel_config: ../x.yaml\n")
    for stage in ("original", "final"):
        path = out / stage / "result.json"
        data = json.loads(path.read_text())
        data["export_dir"] = str(out / stage / "export")
        data["config"] = str(REPO_ROOT / "experiments" / "configs" / "pipeline" / ".." / "frappe_dcnv2.yaml")
        atomic_write_json(path, data)
    tuning = json.loads((out / "tuning" / "result.json").read_text())
    atomic_write_json(out / "tuning" / "result.json", {**tuning, "best_config": str(out / "tuning" / "best.yaml")})
    monkeypatch.chdir(tmp_path)
    text = write_report(out).read_text()
    assert str(tmp_path) not in text and str(REPO_ROOT) not in text
    assert "from pipeline</p>" in text and "output: pipeline" in text
    assert "final/export" in text and "original/export" in text and "tuning/best.yaml" in text
    assert "experiments/configs/frappe_dcnv2.yaml" in text
