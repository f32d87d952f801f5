"""The commands beside ``salience fit`` on a streaming data module (``data.streaming: true``, a
shard set of 500-row shards): permutation importance, LeAP and OutRank (``select``), DNIS and
iHAS (``dims``), one ``tune`` trial, and the pipeline's final-model stage. Each runs with ``CTRDataModule.prepared``
made to raise (the whole splits are never loaded), and where the computation is exactly
defined the streamed result equals the in-memory one on the same rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from recsys.data.batching import BatchDataset
from recsys.train.datamodule import CTRDataModule
from recsys.train.evaluation import evaluate
from recsys.train.recipe import Recipe
from tests.recsys.data.shardsets import same_batch
from tests.selection.conftest import tiny_config

ROWS = 4000


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def never_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CTRDataModule.prepared`` (the whole splits in memory) raises for a streaming module."""
    original = CTRDataModule.prepared

    def prepared(self: CTRDataModule) -> Any:
        if self.streaming:
            raise AssertionError("a streaming data module loaded its whole splits")
        return original.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(CTRDataModule, "prepared", property(prepared))


def streaming_config(root: Path, epochs: int = 1) -> dict[str, Any]:
    config = tiny_config(n_rows=ROWS, epochs=epochs)
    config["data"].update({"streaming": True, "rows_per_shard": 500, "cache_dir": str(root / "cache")})
    return config


@pytest.fixture
def recipe(tmp_cwd: Path, never_whole: None) -> Recipe:
    return Recipe(streaming_config(tmp_cwd), workdir=tmp_cwd / "fits", quiet=True)


def whole(dm: CTRDataModule, split: str) -> Any:
    """The split loaded from the shards (for the in-memory comparison only)."""
    from recsys.data.streaming.split_view import sample_rows

    data = dm.split_data(split)
    assert data is not None
    return sample_rows(data, 10**9)


def test_permutation_importance_scores_a_streamed_split(recipe: Recipe, monkeypatch: pytest.MonkeyPatch) -> None:
    from selection.model_based.permutation import PermutationImportance

    seen: list[tuple[Any, Any]] = []
    rank_model = PermutationImportance.rank_model

    def spy(self: PermutationImportance, model: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((model, data))
        return rank_model(self, model, data, *args, **kwargs)

    monkeypatch.setattr(PermutationImportance, "rank_model", spy)
    report = PermutationImportance(repeats=2, tracking=False).rank(recipe)
    dm = recipe.datamodule
    assert dm.streaming and dm._prepared is None and len(dm.shard_set.split("val").shards) >= 1
    val = whole(dm, "val")
    assert report.extras["rows"] == report.extras["split_rows"] == len(val)  # below the cap: every row
    model, data = seen[0]
    # the scored rows are the whole val split in order, so the scores are the in-memory ones
    assert same_batch(next(iter(BatchDataset(data, len(val)))), next(iter(BatchDataset(val, len(val)))))
    memory = rank_model(PermutationImportance(repeats=2, tracking=False), model, val, recipe.schema)
    assert memory.scores == report.scores
    capped = PermutationImportance(repeats=1, tracking=False, max_rows=150, leakage_threshold=0).rank(recipe)
    assert capped.extras["rows"] == 150 and capped.extras["split_rows"] == len(val)


def test_leap_and_outrank_select_on_streamed_data(recipe: Recipe) -> None:
    from selection.model_based.leap import LeAP
    from selection.model_free.outrank import OutRank

    leap = LeAP(tracking=False, max_epochs=1).rank(recipe)
    assert set(leap.scores) == set(recipe.schema.names)
    outrank = OutRank(progress=False).rank(recipe)
    assert set(outrank.scores) | set(outrank.excluded) >= set(recipe.schema.names)
    assert recipe.datamodule._prepared is None
    raw = recipe.raw_split("train")  # a bounded sample of the streamed training rows (all of them here)
    assert len(raw) == recipe.datamodule.shard_set.split("train").rows
    assert len(recipe.raw_split("train", max_rows=100)) == 100


def test_dnis_searches_on_streamed_splits(recipe: Recipe) -> None:
    from embeddings.dims.dnis import DNIS

    plan = DNIS(width=8, blocks=(1.0,), warm_start_epochs=1, search_epochs=1, max_steps=6, sweep_points=2).search(recipe)
    assert set(plan.dims) <= set(recipe.schema.names) and plan.extras["searched_val_auc"] > 0
    assert recipe.datamodule._prepared is None


def test_ihas_searches_clusters_a_sample_and_retrains_on_streamed_rows(recipe: Recipe) -> None:
    from embeddings.dims.cli import evaluate_logits
    from embeddings.dims.ihas import IHAS

    search = IHAS(width=8, search_epochs=1, retrain_epochs=1, max_steps=6, num_clusters=2, cluster_rows=600)
    plan, gate_model = search.search_with_model(recipe)
    assert sum(plan.cluster_sizes.values()) == 600  # the seeded sample, not every training row
    routed = search.retrain(recipe, plan, gate_model)
    assert len(routed.models) == len(plan.clusters)
    dm = recipe.datamodule
    streamed = evaluate_logits(routed, dm.split_data("test"))
    assert streamed == evaluate(routed, whole(dm, "test"), 4096)  # the same logits, shard by shard
    assert dm._prepared is None


def test_pipeline_final_model_stage_streams_its_test_evaluation(tmp_cwd: Path, never_whole: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.pipeline.config import CompareConfig
    from experiments.pipeline.stages import run_original

    config = streaming_config(tmp_cwd)
    tracker = SimpleNamespace(run_id=None, log_metrics=lambda metrics: None)
    fits: list[Any] = []
    fit = Recipe.fit

    def spy(self: Recipe, **kwargs: Any) -> Any:
        fits.append(fit(self, **kwargs))
        return fits[-1]

    monkeypatch.setattr(Recipe, "fit", spy)

    def make(extra: Any = (), config: Any = config) -> Recipe:
        return Recipe(config, list(extra), workdir=tmp_cwd / "fits", quiet=True)

    ctx = SimpleNamespace(config=SimpleNamespace(compare=CompareConfig(latency_repeats=1, latency_batches=[1, 64]),
                                                 final_overrides=[], name="t", model_config_path=config),
                          recipe=make, folder=tmp_cwd / "stage", tracker=tracker)
    summary = run_original(ctx)  # type: ignore[arg-type]
    assert set(summary["latency_ms"]) == {"1", "64"} and summary["parity_max_abs_diff"] <= 1e-5
    dm = fits[0].datamodule
    assert dm.streaming and dm._prepared is None
    # the fit's streamed test pass = the AUC of the same model on the whole test split in memory
    assert summary["test_auc"] == pytest.approx(evaluate(fits[0].task.model, whole(dm, "test"))["auc"], abs=1e-6)


def test_tune_runs_a_trial_on_streamed_data(tmp_cwd: Path, never_whole: None) -> None:
    from experiments.hpo.tune import tune

    result = tune(streaming_config(tmp_cwd), sampler="random", n_trials=1, max_epochs=1, limit_train_batches=2,
                  tracking=False, pruner=None, output=tmp_cwd / "tune")
    assert result.n_complete == 1 and result.n_failed == 0 and result.best_value is not None and result.best_value > 0.5
