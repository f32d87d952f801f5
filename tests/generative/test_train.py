"""``salience gen fit|test|recommend`` and ``salience sid build`` end to end on the synthetic catalogue."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from generative.cli import GenerativeCLI, gen_main, sid_main
from generative.codebook import Codebook
from generative.train import GenerativeTask, SequenceDataModule, load_task

SMALL = '{"d_model": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ff_dim": 64, "history_tokens": "item"}'


def _fit(tmp: Path, *extra: str) -> GenerativeCLI:
    return GenerativeCLI(
        args=[
            "fit",
            "--data.dataset=synthetic",
            "--data.val_users=300",
            "--data.codebook={class_path: rq-kmeans, init_args: {levels: 2, codebook_size: 32}}",
            f"--model.arch={{class_path: sid, init_args: {SMALL}}}",
            "--model.optimizer={class_path: torch.optim.AdamW, init_args: {lr: 0.005}}",
            "--trainer.max_epochs=2",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp / 'runs'}",
            "--after_fit.verbose=false",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[GenerativeCLI, Path]:
    tmp = tmp_path_factory.mktemp("gen")
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp)
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        cli = _fit(tmp, "--model.weighting=multi", f"--after_fit.export_dir={tmp / 'export'}")
    finally:
        mp.undo()
    return cli, tmp


def test_fit_learns_the_planted_sequences_tests_and_exports(fitted: tuple[GenerativeCLI, Path]) -> None:
    cli, tmp = fitted
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    # a most-popular list gets Recall@10 ~0.14 on this catalogue; the planted transitions ~0.66
    assert metrics["test_recall_10"] > 0.25
    assert 0 < metrics["test_ndcg_10"] <= metrics["test_recall_10"]
    assert {"test_recall_10_head", "test_recall_10_tail", "test_ndcg_10_tail"} <= set(metrics)
    report = cli.export_report
    assert report is not None and report["items_equal"] and report["max_abs_score_diff"] <= 1e-5
    assert (tmp / "export" / "model.pt").is_file()
    # the multi-target weights were recorded every epoch and moved with the curriculum
    history = cli.model.weight_history
    assert len(history) == 2 and history[-1]["t"] > history[0]["t"] > 0


def test_run_is_tracked_with_codebook_and_token_weights(fitted: tuple[GenerativeCLI, Path]) -> None:
    from mlflow.tracking import MlflowClient

    cli, tmp = fitted
    run_id = cli.tracking.tracker.run_id
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert "codebook.collision_rate_before" in run.data.metrics
    assert "test_recall_10" in run.data.metrics and "weights.mixture.plain" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"token_weights.json", "token_weights.png", "training_curve.png", "codebook_stats.json", "model"} <= artifacts


def test_checkpoint_rebuilds_the_model_without_the_data(fitted: tuple[GenerativeCLI, Path]) -> None:
    cli, _ = fitted
    best = cli.trainer.checkpoint_callback.best_model_path
    task = load_task(best)
    assert task.catalog is not None and task.catalog.codes is not None
    history = torch.as_tensor(cli.datamodule.split.test_history[:64])
    reference = GenerativeTask.load_from_checkpoint(best, map_location="cpu").eval()
    items, scores = task.recommender.recommend(history, 10)
    items_ref, scores_ref = reference.recommender.recommend(history, 10)
    assert torch.equal(items, items_ref) and torch.allclose(scores, scores_ref)
    assert ((items >= 1) & (items <= task.catalog.num_items)).all()


def test_recommend_command_reads_the_export(fitted: tuple[GenerativeCLI, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, tmp = fitted
    assert gen_main(["recommend", "--model", str(tmp / "export"), "--history", "1 2 3", "--history", "5 999999", "--k", "5"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("history")]
    assert len(lines) == 2 and all(line.count("(") == 5 for line in lines)
    assert "1 history id(s) outside the catalogue" in out


def test_sasrec_trains_through_the_same_task(tmp_cwd: Path) -> None:
    cli = _fit(tmp_cwd, '--model.arch={class_path: sasrec, init_args: {"dim": 32, "layers": 1, "heads": 1}}')
    assert float(cli.trainer.callback_metrics["test_recall_10"]) > 0.25
    assert cli.export_report is None  # export is for the generative model


def test_sid_build_writes_a_codebook_that_loads_back(tmp_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_cwd / "sid"
    assert sid_main(["build", "--dataset", "synthetic", "--levels", "2", "--size", "16", "--output", str(out)]) == 0
    book = Codebook.load(out / "codebook.json")
    dm = SequenceDataModule(dataset="synthetic", codebook={"class_path": "rq-kmeans", "init_args": {"levels": 2, "codebook_size": 16}})
    assert book == dm.codebook
    assert (out / "codebook.png").is_file()
    assert "MLflow run" in capsys.readouterr().out
    # a saved codebook is what `gen fit --data.codebook_path` reuses
    reused = SequenceDataModule(dataset="synthetic", codebook_path=str(out / "codebook.json"))
    assert reused.codebook == book


def test_bad_settings_name_the_key(tmp_cwd: Path) -> None:
    with pytest.raises(ValueError, match="model.arch: unknown next-item model 'gpt'"):
        GenerativeTask(arch="gpt")
    with pytest.raises(ValueError, match="model.weighting: unknown token weighting 'nope'"):
        GenerativeTask(weighting="nope")  # refused at construction, before any data is read
    with pytest.raises(ValueError, match=r"model.arch.init_args: unknown argument\(s\) \['width'\] of SIDRecommender"):
        GenerativeTask(arch={"class_path": "sid", "init_args": {"width": 3}})
    with pytest.raises(ValueError, match="model.weighting: 'torch.nn.Linear' is not a token weighting"):
        GenerativeTask(weighting={"class_path": "torch.nn.Linear"})
    with pytest.raises(ValueError, match="data.codebook: cannot import 'nowhere.Builder'"):
        SequenceDataModule(codebook={"class_path": "nowhere.Builder"})
    with pytest.raises(ValueError, match="data.content: expected"):
        SequenceDataModule(content={"name": "attributes"})
    # a class path names any subclass, registered or not, as a registered name does
    from generative.weighting.front import FrontGreater

    by_path = GenerativeTask(weighting={"class_path": "generative.weighting.front.FrontGreater",
                                        "init_args": {"gain": "entropy"}})
    by_name = GenerativeTask(weighting={"class_path": "front", "init_args": {"gain": "entropy"}})
    catalog = SequenceDataModule(dataset="synthetic").catalog()
    for task in (by_path, by_name):
        loss = task.build(catalog).loss_fn
        assert isinstance(loss, FrontGreater) and loss.gain == "entropy"
    # a codebook of another catalogue is refused, naming the key
    from generative.data import synthetic_sequences

    book_path = tmp_cwd / "cb.json"
    SequenceDataModule(dataset="synthetic", codebook={"class_path": "rq-kmeans", "init_args": {"levels": 2, "codebook_size": 16}}).codebook.save(book_path)
    dm = SequenceDataModule(dataset="synthetic", codebook_path=str(book_path))
    dm._data = synthetic_sequences(num_items=300)
    with pytest.raises(ValueError, match="codebook_path.*500 items.*300"):
        _ = dm.codebook


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "experiments" / "configs" / "generative").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_committed_configs_parse(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        GenerativeCLI(args=["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "dataset:" in capsys.readouterr().out
    # the plug-ins' init_args name real constructor arguments
    import yaml

    from generative.base import NextItemModel
    from generative.codebook import CodebookBuilder
    from generative.content import ItemContent
    from generative.weighting import TokenWeighting

    loaded = yaml.safe_load(config.read_text())
    model, data = loaded["model"], loaded["data"]
    NextItemModel.resolve_spec(model.get("arch", "sid"), "model.arch")
    TokenWeighting.from_spec(model.get("weighting", "plain"), "model.weighting")
    ItemContent.from_spec(data.get("content", "attributes"), "data.content")
    CodebookBuilder.from_spec(data.get("codebook", "rq-kmeans"), "data.codebook")


def test_there_are_generative_configs() -> None:
    assert {"beauty.yaml", "beauty_h200.yaml", "synthetic.yaml"} <= {p.name for p in CONFIGS}


def test_fit_resumes_from_the_last_checkpoint(tmp_cwd: Path) -> None:
    """A run stopped after epoch 1 resumes from ``last.ckpt``: weights, optimiser and the
    multi-target step counter (the curriculum clock) carry on instead of restarting."""
    first = _fit(tmp_cwd, "--model.weighting=multi", "--trainer.max_epochs=1", "--after_fit.test=false",
                 "--after_fit.export=false")
    steps = int(first.model.recommender.loss_fn.step)
    last = tmp_cwd / "runs" / "checkpoints" / "last.ckpt"
    assert last.is_file() and steps > 0
    resumed = _fit(tmp_cwd, "--model.weighting=multi", "--trainer.max_epochs=2", f"--ckpt_path={last}",
                   "--after_fit.export=false")
    assert resumed.trainer.current_epoch == 2
    assert int(resumed.model.recommender.loss_fn.step) == 2 * steps


def test_sid_build_help_lists_every_item_content(capsys: pytest.CaptureFixture[str]) -> None:
    from generative.content import ItemContent

    with pytest.raises(SystemExit):
        sid_main(["build", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ItemContent.registered_names():
        assert name in text.split("options:")[1].split("--content CONTENT")[1].split("--content-dim")[0], name
