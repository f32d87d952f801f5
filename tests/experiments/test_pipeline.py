"""``salience pipeline``: the config, every stage end to end (tiny synthetic data), resume after a
stop and after ``kill -9``, and the MLflow layout (one parent, one nested run per stage)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from experiments.pipeline import STAGES, Pipeline, PipelineConfig, PipelineConfigError, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
MODEL_CONFIG = ROOT / "experiments" / "configs" / "synthetic_dcnv2.yaml"

TINY = {
    "name": "tiny",
    "model_config": str(MODEL_CONFIG),
    "overrides": ["--data.reader.init_args.n_rows=6000", "--data.reader.init_args.cardinality_scale=0.05"],
    "search_overrides": ["--trainer.max_epochs=1"],
    "final_overrides": ["--trainer.max_epochs=1"],
    "selection": {"ks": [4, 8], "random_seeds": [0]},
    "dims": {"options": {"blocks": [1.0], "warm_start_epochs": 1, "search_epochs": 1}},
    "tuning": {"n_trials": 3, "max_epochs": 1, "limit_train_batches": 2},
    "compare": {"latency_repeats": 3},
}


def _config(tmp: Path, **changes: object) -> Path:
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump({**TINY, "output": str(tmp / "out"), **changes}))
    return path


def _runs(tmp: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=10_000)]


# -- config -------------------------------------------------------------------------------------
def test_config_errors_name_the_file_and_key(tmp_path: Path) -> None:
    path = _config(tmp_path, selection={"tolerence": 0.001})
    with pytest.raises(PipelineConfigError, match=r"pipeline\.yaml.*selection\.tolerence"):
        PipelineConfig.load(path)
    with pytest.raises(PipelineConfigError, match=r"tuning\.n_trials: expected int"):
        PipelineConfig.load(_config(tmp_path, tuning={"n_trials": "many"}))
    with pytest.raises(PipelineConfigError, match="model_config: file not found"):
        PipelineConfig.load(_config(tmp_path, model_config="missing.yaml"))
    with pytest.raises(PipelineConfigError, match=r"pipeline\.yaml: compress\.budget: expected a fraction like 0\.1x"):
        PipelineConfig.load(_config(tmp_path, compress={"enabled": True, "budget": "tiny"}))
    with pytest.raises(PipelineConfigError, match=r"compress\.auc_tolerance: must be >= 0"):
        PipelineConfig.load(_config(tmp_path, compress={"auc_tolerance": -0.1}))
    with pytest.raises(PipelineConfigError, match="not a stage"):
        Pipeline(PipelineConfig.load(_config(tmp_path))).run(stop_after="everything")


def test_committed_pipeline_configs_load() -> None:
    for path in sorted((ROOT / "experiments" / "configs" / "pipeline").glob("*.yaml")):
        config = PipelineConfig.load(path)
        assert config.model_config_path.is_file(), path
        assert config.fingerprint() == PipelineConfig.load(path).fingerprint()


def test_fingerprint_follows_settings_and_model_config(tmp_path: Path) -> None:
    a = PipelineConfig.load(_config(tmp_path))
    b = PipelineConfig.load(_config(tmp_path, seed=1))
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == PipelineConfig.load(_config(tmp_path, output=str(tmp_path / "elsewhere"))).fingerprint()
    # the compression step counts when it is on; off (its default) it leaves the fingerprint of
    # the folders written before it existed as it was
    assert a.fingerprint() == PipelineConfig.load(_config(tmp_path, compress={"enabled": False})).fingerprint()
    assert a.fingerprint() != PipelineConfig.load(_config(tmp_path, compress={"enabled": True})).fingerprint()


# -- end to end, stop and resume ---------------------------------------------------------------
def test_pipeline_end_to_end_with_stop_and_resume(tmp_cwd: Path) -> None:
    compress = {"enabled": True, "auc_tolerance": 0.002, "eval_rows": 400}
    path = _config(tmp_cwd, compress=compress)
    first = run_pipeline(path, stop_after="screening")
    assert list(first) == ["quality", "screening"]
    out = tmp_cwd / "out"
    state = json.loads((out / "pipeline_state.json").read_text())
    done_at = {s: state["stages"][s]["finished_at"] for s in first}
    mtimes = {s: (out / s / "result.json").stat().st_mtime_ns for s in first}

    # another config in the same folder is refused, naming the way out
    with pytest.raises(PipelineConfigError, match="--restart"):
        run_pipeline(_config(tmp_cwd, seed=3, compress=compress))
    path = _config(tmp_cwd, compress=compress)

    results = run_pipeline(path)
    assert list(results) == list(STAGES)
    state = json.loads((out / "pipeline_state.json").read_text())
    assert {s: state["stages"][s]["finished_at"] for s in first} == done_at  # not redone
    assert {s: (out / s / "result.json").stat().st_mtime_ns for s in first} == mtimes
    assert state["running"] is None
    if sys.platform.startswith("linux"):  # each stage's own peak RSS (a model is loaded: > 100 MB)
        assert all(state["stages"][s]["peak_rss_mb"] > 100 for s in STAGES), state["stages"]

    # what each stage hands on
    quality, screening, selection = results["quality"], results["screening"], results["selection"]
    assert set(screening["kept"]) <= set(quality["kept"])
    assert all("noise" in reason for reason in screening["dropped"].values())
    assert selection["k"] in (4, 8, len(screening["kept"])) and len(selection["kept"]) == selection["k"]
    assert results["dims"]["parameters"] <= results["dims"]["budget"]
    assert set(results["dims"]["dims"]) == set(selection["kept"]) - {"price", "relevance_score", "engagement_score",
                                                                      "price_cents"}  # sparse ones only
    tuning = results["tuning"]
    assert len(tuning["values"]) == 3 and tuning["chosen"] in ("tuned", "incumbent")
    compare = results["compare"]
    final, original = compare["final"], compare["original"]
    assert sorted(final["features"]) == sorted(selection["kept"])
    assert original["n_features"] == len(quality["kept"]) + len(quality["dropped"])
    assert final["embedding_parameters"] < original["embedding_parameters"]
    assert final["dims"] == {k: v for k, v in results["dims"]["dims"].items()}
    for model in (final, original):
        assert model["parity_max_abs_diff"] <= 1e-5
        assert set(model["latency_ms"]) == {"1", "1024"} and all(v["median"] > 0 for v in model["latency_ms"].values())
        assert (Path(model["export_dir"]) / "model.pt").is_file() and model["export_bytes"] > 0
    assert compare["delta"]["test_auc"] == pytest.approx(final["test_auc"] - original["test_auc"])
    # the verdict: DeLong's interval of the paired difference on the same test rows, the fit's own test scores
    interval = compare["test_auc_interval"]
    assert interval["method"] == "delong" and interval["low"] < interval["estimate"] < interval["high"]
    assert interval["estimate"] == pytest.approx(compare["delta"]["test_auc"], abs=1e-5)
    assert compare["within_tolerance"] == (interval["low"] >= -compare["auc_tolerance"])
    assert compare["verdict"] in ("better", "worse", "tie")
    # the compression step: within its validation tolerance, smaller, exported with parity, on the frontier
    packed = final["compressed"]
    assert packed["val_rows"] == 400 and packed["val_auc"] >= packed["fp32_val_auc"] - 0.002
    assert packed["embedding_bytes"] < packed["fp32_embedding_bytes"] == 4 * final["embedding_parameters"]
    assert set(packed["tables"].values()) <= {"fp32", "fp16", "int8", "int4"} and packed["parity_max_abs_diff"] <= 1e-5
    assert [p["technique"] for p in packed["frontier"]] == ["fp32", "fp16", "int8", "int4", "search"]
    assert packed["frontier"][0]["test_auc"] == final["test_auc"]  # the fit's own number
    assert all(p["test_vs_fp32"]["method"] == "delong" for p in packed["frontier"][1:])  # paired with fp32 on the test rows
    assert (Path(packed["export_dir"]) / "model.pt").is_file() and (out / "final" / "frontier.png").is_file()
    assert compare["delta"]["compressed"]["test_auc"] == pytest.approx(packed["test_auc"] - original["test_auc"])
    report = Path(results["report"]["report"])
    assert report.is_file() and "data:image/png;base64," in report.read_text()

    # MLflow: one parent, a nested run per stage, every run ended
    runs = _runs(tmp_cwd)
    parents = [r for r in runs if r.data.tags.get("salience.role") == "pipeline"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.info.run_id == state["parent_run_id"]
    stages = {r.data.tags["salience.stage"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(stages) == set(STAGES)
    assert all(r.info.status == "FINISHED" for r in runs)
    assert parent.data.metrics["final.test_auc"] == pytest.approx(final["test_auc"])
    assert stages["final"].data.metrics["compressed.test_auc"] == pytest.approx(packed["test_auc"])
    assert stages["final"].data.metrics["frontier.int8.bytes"] == packed["frontier"][2]["bytes"]
    assert "bytes vs AUC" in report.read_text()
    assert parent.data.tags["salience.report"] == str(report.resolve())
    # the fits of a stage nest under that stage's run
    fits = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == stages["selection"].info.run_id]
    assert {r.info.run_name for r in fits} >= {"leap", "all-features", "leap-top4", "random0-top8"}

    # a finished pipeline re-run does nothing again; --restart starts over under a new parent
    again = run_pipeline(path, stop_after="quality")
    assert again["quality"] == results["quality"]
    assert json.loads((out / "pipeline_state.json").read_text())["parent_run_id"] == parent.info.run_id


@pytest.mark.slow  # kill -9 of a real pipeline; the stop-and-resume path: test_pipeline_end_to_end_with_stop_and_resume
def test_kill_9_mid_stage_resumes_after_the_last_finished_stage(tmp_path: Path) -> None:
    """``kill -9`` during the selection stage; the same command again redoes only that stage,
    under the same parent run, and the killed stage's runs end FAILED instead of RUNNING."""
    path = _config(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    command = [sys.executable, "-m", "experiments.cli", "pipeline", "--config", str(path), "--stop-after", "dims"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    state_path = out / "pipeline_state.json"
    deadline = time.time() + 180
    try:
        while time.time() < deadline:
            state = json.loads(state_path.read_text()) if state_path.is_file() else {}
            running = state.get("running") or {}
            if running.get("stage") == "selection" and list((out / "selection" / "fits").glob("*/checkpoints/*.ckpt")):
                break  # a fit of the stage is under way
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("the pipeline never reached the selection stage")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed = json.loads(state_path.read_text())
    assert set(killed["stages"]) == {"quality", "screening"} and killed["running"]["stage"] == "selection"
    assert any(r.info.status == "RUNNING" for r in _runs(tmp_path))  # what kill -9 leaves behind

    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quality done before" in done.stderr and "screening done before" in done.stderr
    state = json.loads(state_path.read_text())
    assert list(state["stages"]) == ["quality", "screening", "selection", "dims"]
    assert {s: state["stages"][s]["finished_at"] for s in ("quality", "screening")} == {
        s: killed["stages"][s]["finished_at"] for s in ("quality", "screening")}
    assert state["parent_run_id"] == killed["parent_run_id"]
    runs = {r.info.run_id: r for r in _runs(tmp_path)}
    assert not [r.info.run_name for r in runs.values() if r.info.status == "RUNNING"]
    stale = runs[killed["running"]["run_id"]]
    assert stale.info.status == "FAILED" and "stopped" in stale.data.tags["salience.failure"]
    assert runs[state["stages"]["selection"]["run_id"]].info.status == "FINISHED"
    parent = runs[state["parent_run_id"]]
    assert parent.info.status == "FINISHED" and parent.data.tags["salience.pipeline_status"] == "stopped after dims"


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.pipeline.cli import pipeline_main

    with pytest.raises(SystemExit) as exit_info:
        pipeline_main(["--config", str(_config(tmp_path, dims={"budjet": 0.5}))])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("salience pipeline: error:") and "dims.budjet" in err


def test_stages_turned_off_are_skipped(tmp_cwd: Path) -> None:
    """screening, dims and tuning off: selection ranks every gated feature and the final model
    trains the kept features at the model config's dims and hyperparameters."""
    path = _config(tmp_cwd, screening={"enabled": False}, dims={"enabled": False}, tuning={"enabled": False},
                   selection={"ks": [4], "random_seeds": []})
    results = run_pipeline(path, stop_after="final")
    assert list(results) == ["quality", "selection", "final"]
    assert len(results["selection"]["kept"]) + len(results["selection"]["dropped"]) == len(results["quality"]["kept"])
    final = results["final"]
    assert sorted(final["features"]) == sorted(results["selection"]["kept"])
    assert set(final["dims"].values()) == {16}  # the model config's dims
    assert final["config"].endswith("final/reduced_config.yaml")
    assert not (tmp_cwd / "out" / "tuning").exists() and not (tmp_cwd / "out" / "dims").exists()


def test_seeded_passes_the_seed_at_construction_to_every_method_and_search() -> None:
    """Frozen dataclasses (OutRank) get the pipeline's seed too; an explicit option wins."""
    import embeddings  # noqa: F401  (registers the searches)
    import selection  # noqa: F401  (registers the methods)
    from embeddings import get_search, search_names
    from experiments.pipeline.stages import _seeded
    from selection import get_method, method_names

    for create, names in ((get_method, method_names()), (get_search, search_names())):
        for name in names:
            made = _seeded(create, name, {}, 7)
            if hasattr(made, "seed"):
                assert made.seed == 7, name
                assert _seeded(create, name, {"seed": 3}, 7).seed == 3, name
    assert _seeded(get_method, "outrank", {}, 11).seed == 11


def test_paired_auc_reads_both_stages_scores_of_the_same_rows(tmp_path: Path) -> None:
    from experiments.pipeline.stages import StageError, paired_auc

    rng = np.random.default_rng(0)
    labels = (rng.random(4000) < 0.3).astype(np.float32)
    strong = labels + rng.normal(0, 0.8, labels.size)  # planted: A ranks better than B on every row set
    weak = labels + rng.normal(0, 2.0, labels.size)
    a, b, other = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    np.savez(a, labels=labels, scores=strong)
    np.savez(b, labels=labels, scores=weak)
    np.savez(other, labels=labels[::-1].copy(), scores=weak)
    interval = paired_auc(a, b)
    assert interval is not None and interval.verdict() == "better" and interval.n == labels.size
    assert paired_auc(a, tmp_path / "missing.npz") is None
    with pytest.raises(StageError, match="score different test rows"):
        paired_auc(a, other)


def test_a_parent_run_in_another_store_keeps_the_finished_stages(
    tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rerun whose MLflow store lacks the pipeline's parent run (another folder's default
    ``mlflow.db``): the finished stages are not redone; the rest run under a new parent run that
    names the old one, with a warning naming the store and ``--restart``."""
    import logging
    import shutil

    path = _config(tmp_cwd)
    run_pipeline(path, stop_after="quality")
    out = tmp_cwd / "out"
    first = json.loads((out / "pipeline_state.json").read_text())
    other = tmp_cwd / "elsewhere"
    other.mkdir()
    shutil.copyfile(tmp_cwd / "mlflow.db", other / "mlflow.db")
    from mlflow import MlflowClient

    MlflowClient(f"sqlite:///{other / 'mlflow.db'}").delete_run(first["parent_run_id"])  # gone from that store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other / 'mlflow.db'}")
    with caplog.at_level(logging.WARNING, logger="experiments.pipeline.runner"):
        results = run_pipeline(path, stop_after="screening")
    assert list(results) == ["quality", "screening"]
    state = json.loads((out / "pipeline_state.json").read_text())
    assert state["stages"]["quality"]["finished_at"] == first["stages"]["quality"]["finished_at"]  # not redone
    assert state["parent_run_id"] != first["parent_run_id"]
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert first["parent_run_id"] in warning and str(other / "mlflow.db") in warning and "--restart" in warning
    parent = MlflowClient(f"sqlite:///{other / 'mlflow.db'}").get_run(state["parent_run_id"])
    assert parent.data.tags["salience.previous_parent_run"] == first["parent_run_id"]
    assert parent.data.tags["salience.stages_kept"] == "quality"
