"""``salience rank``, ``salience select`` and ``salience quality`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from experiments.cli import main
from selection.report import ImportanceReport
from tests.selection.conftest import tiny_config


def _config(tmp_cwd: Path) -> Path:
    path = tmp_cwd / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(n_rows=8000, epochs=1)))
    return path


def test_rank_prints_the_table_and_writes_the_report(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import tracking_uri

    assert main(["rank", "--config", str(_config(tmp_cwd)), "--method", "outrank", "--output", "r.json", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "outrank importance on synthetic" in out and "report: r.json" in out
    report = ImportanceReport.load(tmp_cwd / "r.json")
    assert report.method == "outrank" and len(report) > 10
    run_id = out.split("MLflow run: ")[1].split()[0]
    artifacts = {a.path for a in MlflowClient(tracking_uri()).list_artifacts(run_id, "importance/outrank")}
    assert {"importance/outrank/ranking.png", "importance/outrank/redundancy.png"} <= artifacts


def test_rank_passes_method_options_and_lightning_overrides(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(_config(tmp_cwd))
    assert main(["rank", "--config", cfg, "--method", "permutation", "--option", "repeats=2", "--no-tracking",
                 "--output", "p.json", "--", "--trainer.max_epochs=1"]) == 0
    report = ImportanceReport.load(tmp_cwd / "p.json")
    assert report.config["repeats"] == 2 and report.extras["repeats"] == 2
    with pytest.raises(SystemExit, match="unexpected keyword argument 'bogus'"):
        main(["rank", "--config", cfg, "--method", "leap", "--option", "bogus=1"])
    with pytest.raises(SystemExit):
        main(["rank", "--config", cfg, "--method", "nope"])


def test_select_rejects_a_k_beyond_the_features(tmp_cwd: Path) -> None:
    cfg = str(_config(tmp_cwd))
    with pytest.raises(ValueError, match=r"\[99\] out of range"):
        main(["select", "--config", cfg, "--method", "outrank", "--k", "2,99", "--no-tracking"])


@pytest.mark.slow  # salience select on Frappe; the same command on synthetic data: the other select tests here
def test_select_on_frappe_writes_curve_and_reduced_config(
    tmp_cwd: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's acceptance path: `salience select` on Frappe produces the curve and the reduced config."""
    from tests.conftest import require_dataset

    require_dataset(data_dir, "frappe")
    config = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "frappe_dcnv2.yaml"
    argv = ["select", "--config", str(config), "--method", "outrank", "--k", "1,2", "--random-seeds", "1",
            "--output", "sel", "--", "--trainer.max_epochs=1", "--data.batch_size=4096"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "AUKC" in out and "smallest k within" in out
    for name in ("report.json", "curve.json", "curve.png", "reduced_config.yaml"):
        assert (tmp_cwd / "sel" / name).exists(), name
    curve = json.loads((tmp_cwd / "sel" / "curve.json").read_text())
    assert [p["k"] for p in curve["points"]] == [1, 2] and curve["full"]["k"] == 10
    reduced = yaml.safe_load((tmp_cwd / "sel" / "reduced_config.yaml").read_text())
    k = len(reduced["data"]["features"])
    assert reduced["data"]["features"] == ImportanceReport.load(tmp_cwd / "sel" / "report.json").top_k(k)
    assert reduced["model"]["backbone"]["class_path"] == "recsys.models.DCNv2"  # the rest of the config is kept


def test_quality_on_a_csv_file(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    n = 3000
    label = rng.integers(0, 2, n)
    frame = pd.DataFrame({
        "useful": np.where(rng.random(n) < 0.8, label, 1 - label).astype(str),
        "constant": ["k"] * n,
        "missing": [""] * n,
        "leak": label.astype(str),
        "noise": rng.integers(0, 50, n).astype(str),
        "y": label,
    })
    frame.to_csv(tmp_cwd / "d.csv", index=False)
    assert main(["quality", "d.csv", "--label", "y", "--output", "q.json"]) == 0
    out = capsys.readouterr().out
    assert "useful" in out and "constant" in out and "leak" in out
    saved = json.loads((tmp_cwd / "q.json").read_text())
    flags = saved["flags"]
    text = json.dumps(flags)
    assert "leak" in text and "constant" in text and "missing" in text
    with pytest.raises(SystemExit):
        main(["quality"])  # neither files nor --config


def test_select_reuses_a_saved_report(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(_config(tmp_cwd))
    assert main(["rank", "--config", cfg, "--method", "outrank", "--output", "r.json", "--no-tracking"]) == 0
    ranking = ImportanceReport.load(tmp_cwd / "r.json").ranking
    assert main(["select", "--config", cfg, "--method", "outrank", "--report", "r.json", "--k", "1,2",
                 "--random-seeds", "0", "--output", "sel", "--no-tracking"]) == 0
    curve = json.loads((tmp_cwd / "sel" / "curve.json").read_text())
    assert curve["ranking"] == ranking and curve["random"] == {}
    assert [p["features"] for p in curve["points"]] == [ranking[:1], ranking[:2]]


def test_select_compares_several_methods_in_one_table_plot_and_parent_run(
    tmp_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import tracking_uri

    cfg = str(_config(tmp_cwd))
    assert main(["select", "--config", cfg, "--method", "outrank,lasso", "--k", "2,4", "--random-seeds", "1",
                 "--option", "lasso.C=0.05", "--output", "cmp"]) == 0
    out = capsys.readouterr().out
    assert "| method | validation AUKC | test AUKC |" in out and "k chosen on validation" in out
    table = json.loads((tmp_cwd / "cmp" / "comparison.json").read_text())
    assert {r["method"] for r in table["rows"]} == {"outrank", "lasso"} and table["failed"] == {}
    for r in table["rows"]:
        assert 0.5 < r["test_aukc"] <= 1 and 0.5 < r["val_aukc"] <= 1 and r["smallest_k"] in (2, 4, None)
        assert r["rank_cost_seconds"] > 0 and r["rank_cost_fits"] > 0
        vs_random = r["test_aukc_vs_random"]  # paired on the same test rows (DeLong contrast of the curves)
        assert vs_random["method"] == "delong" and vs_random["low"] <= vs_random["estimate"] <= vs_random["high"]
        assert vs_random["estimate"] == pytest.approx(r["test_aukc"] - r["random_test_aukc"], abs=1e-5)
    assert "test AUKC - random (95% CI, paired)" in out
    vals = [r["val_aukc"] for r in table["rows"]]
    assert vals == sorted(vals, reverse=True)  # best on validation first
    assert ImportanceReport.load(tmp_cwd / "cmp" / "lasso" / "report.json").config["C"] == 0.05
    for name in ("comparison.md", "comparison.png", "outrank/curve.json", "lasso/curve.json"):
        assert (tmp_cwd / "cmp" / name).stat().st_size > 0
    # the all-features model and the random ranking trained once for both methods: 1 + 2 + 2 + 2 fits at most
    run_id = out.split("MLflow run: ")[1].split()[0]
    client = MlflowClient(tracking_uri())
    assert "selection/comparison.json" in {a.path for a in client.list_artifacts(run_id, "selection")}
    children = client.search_runs([client.get_run(run_id).info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{run_id}'")
    assert len(children) <= 7


@pytest.mark.parametrize("argv, message", [
    (["--method", "nope"], "unknown"),
    (["--method", "outrank,lasso", "--option", "C=0.1"], "METHOD.KEY=VALUE"),
    (["--method", "all", "--report", "r.json"], "does not combine"),
])
def test_select_refuses_bad_method_lists(tmp_cwd: Path, argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["select", "--config", str(_config(tmp_cwd)), *argv])
    assert message in str(e.value) + capsys.readouterr().err
