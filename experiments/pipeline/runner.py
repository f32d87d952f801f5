"""Runs the pipeline's stages in order under one MLflow parent run, resumably.

``<output>/pipeline_state.json`` records each finished stage (its result is in
``<output>/<stage>/result.json``, written before the state names the stage done). A pipeline
stopped at any point (an error, Ctrl-C, ``kill -9``) and started again with the same config
skips the finished stages, marks the interrupted stage's MLflow runs ``FAILED`` and redoes only
that stage, under the same parent run. A changed config is refused unless ``restart`` is set.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from experiments.pipeline.config import PipelineConfig, PipelineConfigError
from experiments.pipeline.stages import STAGES, StageContext
from recsys.artifacts import check_format_version, plain, read_artifact, write_artifact
from recsys.io import atomic_write_json
from recsys.runtime import peak_rss_window

__all__ = ["Pipeline", "PipelineState", "run_pipeline"]

log = logging.getLogger(__name__)

STATE_FILE = "pipeline_state.json"
FORMAT_VERSION = 1


@dataclass
class PipelineState:
    """What ``pipeline_state.json`` holds.

    Args:
        name: the pipeline.
        config_sha: fingerprint of the config it was started with.
        parent_run_id: its MLflow parent run.
        experiment: its MLflow experiment.
        stages: finished stages -> ``{"seconds", "peak_rss_mb", "run_id", "finished_at"}`` (the
            stage's own peak RSS, see :func:`recsys.runtime.peak_rss_window`; None where unsupported).
        running: the stage in progress (``{"stage", "run_id", "pid"}``), None between stages.
    """

    name: str
    config_sha: str
    parent_run_id: str | None = None
    experiment: str = ""
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: dict[str, Any] | None = None

    @classmethod
    def load(cls, path: Path) -> PipelineState | None:
        if not path.is_file():
            return None
        data = read_artifact(path, "pipeline state", PipelineConfigError, required=("name", "config_sha"))
        check_format_version(data, FORMAT_VERSION, str(path), "pipeline state", PipelineConfigError)
        data.pop("format_version", None)
        return cls(**data)

    def save(self, path: Path) -> None:
        write_artifact(path, {"format_version": FORMAT_VERSION, **asdict(self)})


class Pipeline:
    """One pipeline run into ``config.output_dir``.

    Args:
        config: the pipeline config.
        restart: start over even when the folder holds a pipeline of another config.
    """

    def __init__(self, config: PipelineConfig, restart: bool = False) -> None:
        self.config = config
        self.out = config.output_dir
        self.restart = restart
        self.state_path = self.out / STATE_FILE

    def results(self) -> dict[str, dict[str, Any]]:
        """Results of the finished stages, by name."""
        state = PipelineState.load(self.state_path)
        return self._load_results(state) if state is not None else {}

    def _load_results(self, state: PipelineState) -> dict[str, dict[str, Any]]:
        return {s: _read_result(self.out / s) for s in state.stages}

    def run(self, stop_after: str | None = None) -> dict[str, dict[str, Any]]:
        """Run the stages not yet done (up to ``stop_after``); returns every stage's result."""
        if stop_after is not None and stop_after not in STAGES:
            raise PipelineConfigError(f"--stop-after {stop_after!r} is not a stage: {list(STAGES)}")
        self.out.mkdir(parents=True, exist_ok=True)
        state = self._open_state()
        results = self._load_results(state)
        if not state.experiment:
            state.experiment = self._experiment()
        parent = self._parent_run(state)
        state.save(self.state_path)
        write_artifact(self.out / "config.yaml", plain(self.config.to_dict()))
        status = "FINISHED"
        try:
            for name, stage in STAGES.items():
                if name in state.stages:
                    log.info("pipeline %s: %s done before (%.0f s), skipped", self.config.name, name,
                             state.stages[name]["seconds"])
                elif not getattr(getattr(self.config, name, None), "enabled", True):
                    log.info("pipeline %s: %s turned off (%s.enabled: false)", self.config.name, name, name)
                else:
                    results[name] = self._run_stage(name, stage, state, results, parent.run_id)
                if name == stop_after and name != list(STAGES)[-1]:
                    status = "STOPPED"
                    break
        except BaseException as e:
            from recsys.tracking import end_status

            parent.set_tags({"salience.error": f"{type(e).__name__}: {e}"[:5000]})
            parent.finish(end_status(e))
            raise
        if status == "FINISHED":
            self._close(parent, results)
        else:  # paused on request: the next run reopens the parent for the remaining stages
            parent.set_tags({"salience.pipeline_status": f"stopped after {stop_after}"})
            parent.finish()
        return results

    # -- internals -------------------------------------------------------------------------------
    def _open_state(self) -> PipelineState:
        sha = self.config.fingerprint()
        state = PipelineState.load(self.state_path)
        if state is not None and state.config_sha != sha and not self.restart:
            raise PipelineConfigError(
                f"{self.out} holds pipeline {state.name!r} of another config (fingerprint {state.config_sha}, "
                f"now {sha}); run with --restart to start it over, or choose another --output"
            )
        if state is None or self.restart:
            return PipelineState(self.config.name, sha)
        if state.stages:
            log.info("pipeline %s: resuming in %s after %s", self.config.name, self.out, ", ".join(state.stages))
        return state

    def _experiment(self) -> str:
        """The MLflow experiment: the model config's dataset name."""
        from recsys.train.recipe import Recipe

        return Recipe(self.config.model_config_path, self.config.overrides, workdir=self.out / "fits", quiet=True).dataset_name

    def _parent_run(self, state: PipelineState) -> Any:
        """The pipeline's parent run: the one of the state (reopened), else a new one.

        A parent that cannot be reopened (another MLflow store: a rerun from another folder with
        the default ``sqlite:///mlflow.db``, or the run deleted) is replaced by a new parent run,
        and the finished stages are kept, with a warning that names the store and ``--restart``.
        """
        from experiments.hpo.storage import shown_url
        from recsys.tracking import RunTracker, tracking_uri

        previous = state.parent_run_id
        if previous is not None:
            parent = _reopen(previous)
            if parent is not None:
                if state.running is not None:
                    _fail_subtree(parent.client, state.running["run_id"], "the pipeline stopped during this stage")
                    state.running = None
                return parent
            log.warning(
                "pipeline %s: its MLflow parent run %s is not in %s (another tracking store, or the run was deleted); "
                "the stages done before (%s) are kept and the rest run under a new parent run there. "
                "Set MLFLOW_TRACKING_URI to the first store to keep one parent, or run with --restart to redo every stage",
                self.config.name, previous, shown_url(tracking_uri()), ", ".join(state.stages) or "none")
            state.running = None  # its run lives in the other store
        tags = {"salience.role": "pipeline", "salience.pipeline": self.config.name, "salience.output": str(self.out.resolve())}
        if previous is not None:
            tags |= {"salience.previous_parent_run": previous, "salience.stages_kept": ",".join(state.stages)}
        parent = RunTracker(state.experiment, f"pipeline-{self.config.name}", tags=tags)
        parent.log_params({"pipeline": {k: v for k, v in self.config.to_dict().items() if k != "output"}})
        state.parent_run_id = parent.run_id
        return parent

    def _run_stage(self, name: str, stage: Any, state: PipelineState, results: dict[str, dict[str, Any]],
                   parent_run_id: str) -> dict[str, Any]:
        from recsys.tracking import RunTracker

        folder = self.out / name
        folder.mkdir(parents=True, exist_ok=True)
        tracker = RunTracker(state.experiment, f"{self.config.name}-{name}", parent_run_id=parent_run_id,
                             tags={"salience.stage": name, "salience.pipeline": self.config.name})
        state.running = {"stage": name, "run_id": tracker.run_id, "pid": os.getpid()}
        state.save(self.state_path)
        log.info("pipeline %s: stage %s ...", self.config.name, name)
        start = time.perf_counter()
        with tracker:
            with peak_rss_window() as peak:
                result = stage(StageContext(self.config, name, folder, dict(results), tracker, state.experiment))
                atomic_write_json(folder / "result.json", result, default=str)
                tracker.log_artifact(folder / "result.json", name)
            peak_mb = None if peak.mb is None else round(peak.mb, 1)
            if peak_mb is not None:
                tracker.log_metrics({"stage.peak_rss_mb": peak_mb})
        seconds = round(time.perf_counter() - start, 1)
        state.stages[name] = {"seconds": seconds, "peak_rss_mb": peak_mb, "run_id": tracker.run_id,
                              "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        state.running = None
        state.save(self.state_path)
        log.info("pipeline %s: stage %s done in %.0f s (peak RSS %s MB)", self.config.name, name, seconds, peak_mb)
        return _read_result(folder)

    def _close(self, parent: Any, results: dict[str, dict[str, Any]]) -> None:
        compare = results.get("compare")
        if compare is not None:
            for which in ("original", "final"):
                m = compare[which]
                parent.log_metrics({f"{which}.{k}": m[k] for k in ("test_auc", "test_logloss", "embedding_parameters",
                                                                    "n_features", "export_bytes")})
        report = results.get("report", {}).get("report")
        if report is not None:
            parent.log_artifact(report, "report")
            parent.set_tags({"salience.report": str(Path(report).resolve())})
        parent.finish()


def _reopen(run_id: str) -> Any:
    """A :class:`~recsys.tracking.RunTracker` on an existing run, set RUNNING again (None when the
    run is gone: the MLflow store was wiped, or the run deleted)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from recsys.tracking import RunTracker, tracking_uri

    client = MlflowClient(tracking_uri())
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    if run.info.lifecycle_stage != "active":
        return None
    client.set_tag(run_id, "salience.pipeline_status", "running")
    return RunTracker.attach(run_id, client)


def _fail_subtree(client: Any, run_id: str, why: str) -> None:
    """Mark ``run_id`` and its descendants that are still RUNNING as FAILED."""
    from mlflow.exceptions import MlflowException

    from recsys.tracking import fail_run

    try:
        run = client.get_run(run_id)
    except MlflowException:
        return
    children = client.search_runs([run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
                                  max_results=10_000)
    for child in children:
        _fail_subtree(client, child.info.run_id, why)
    fail_run(client, run_id, why)


def _read_result(folder: Path) -> dict[str, Any]:
    return read_artifact(folder / "result.json", "stage result", PipelineConfigError)


def run_pipeline(config: str | Path | PipelineConfig, output: str | None = None, restart: bool = False,
                 stop_after: str | None = None) -> dict[str, dict[str, Any]]:
    """Load ``config`` (a YAML path or a config) and run it; see :class:`Pipeline`."""
    cfg = config if isinstance(config, PipelineConfig) else PipelineConfig.load(config)
    if output is not None:
        cfg.output = output
    return Pipeline(cfg, restart=restart).run(stop_after)
