"""Backbones and optimizers as config (``class_path``/``init_args``), the LightningCLI way.

* adding a backbone is one new class: a toy ``RankingModel`` defined here trains through
  ``salience fit``, exports, and reloads from its checkpoint, with nothing else edited;
* a bad ``model.backbone`` is an error that names the key;
* ``recsys.config.as_spec`` turns plug-in objects back into their config form, so the
  hyperparameters of a checkpoint are plain containers;
* a checkpoint written before backbones and optimizers were classes (``arch``/``arch_args``,
  ``optimizer: sgd``, ``learning_rate``, ``weight_decay``) still loads.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.cli import instantiate_module
from torch import nn

from recsys.config import as_spec, class_path
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.models import DLRM, RankingModel, SeamTransform, SparseArchConfig
from recsys.models.backbone import backbone_class, build_backbone, resolve_backbone
from recsys.train.checkpoint import _current_hparams, load_checkpoint
from recsys.train.cli import SalienceCLI
from recsys.train.datamodule import CTRDataModule
from recsys.train.module import RankingTask

CONFIG = Path(__file__).resolve().parents[3] / "experiments" / "configs" / "synthetic_dcnv2.yaml"


class Toy(RankingModel):
    """A backbone added by one class: a one-hidden-layer net on the concatenated seam output.

    Args:
        schema: fitted schema.
        sparse_arch: embedding kernel settings.
        hidden: width of the hidden layer.
        seam: transform at the seam.
    """

    def __init__(
        self, schema: Schema, sparse_arch: SparseArchConfig | None = None, hidden: int = 4, seam: SeamTransform | None = None
    ) -> None:
        super().__init__(schema, sparse_arch, seam)
        self.layer = nn.Linear(sum(self.embedding_dims) + self.num_dense, hidden)
        self.out = nn.Linear(hidden, 1)

    def interact(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        x = torch.cat(self.stacked(sparse) + [dense], dim=1)
        return self.out(torch.relu(self.layer(x))).squeeze(-1)


class Scale(SeamTransform):
    """A seam that scales every field by a constant (its argument kept as an attribute)."""

    def __init__(self, factor: float = 1.0) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {k: v * self.factor for k, v in sparse.items()}, dense


TOY = class_path(Toy)


def small_schema() -> Schema:
    return Schema(
        features=(
            FeatureSpec("a", embedding_dim=4, num_embeddings=5),
            FeatureSpec("b", kind=FeatureKind.MULTI_CATEGORICAL, embedding_dim=8, num_embeddings=7),
            FeatureSpec("x", kind=FeatureKind.DENSE),
        )
    )


def fit_args(root: Path, *extra: str) -> list[str]:
    return [
        "fit", "--config", str(CONFIG),
        "--data.reader.init_args.n_rows", "3000", "--data.reader.init_args.embedding_dim", "8",
        "--data.batch_size", "256", "--data.cache_dir", str(root / "cache"),
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
        "--trainer.limit_test_batches", "2", "--trainer.default_root_dir", str(root / "run"),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--tracking.enabled", "false", "--after_fit.verbose", "false",
        *extra,
    ]  # fmt: skip


def plain_containers(value: Any, where: str = "hparams") -> list[str]:
    """Paths inside ``value`` that hold anything but dicts, lists, str, int, float, bool, None."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in plain_containers(v, f"{where}.{k}")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in plain_containers(v, f"{where}[{i}]")]
    return [] if isinstance(value, (str, int, float, bool, type(None))) else [f"{where}: {type(value).__name__}"]


@pytest.fixture(scope="module")
def toy_fit(tmp_path_factory: pytest.TempPathFactory) -> SalienceCLI:
    root = tmp_path_factory.mktemp("toy")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    try:
        return SalienceCLI(args=fit_args(root, "--model.backbone", f'{{"class_path": "{TOY}", "init_args": {{"hidden": 3}}}}'))
    finally:
        mp.undo()


# ---------------------------------------------------------------------------------------------
# a new backbone is one class
# ---------------------------------------------------------------------------------------------


def test_a_new_backbone_trains_exports_and_reloads_through_salience_fit(toy_fit: SalienceCLI) -> None:
    cli = toy_fit
    assert isinstance(cli.model.ranking_model, Toy) and cli.model.ranking_model.layer.out_features == 3
    assert cli.model.backbone_name == "toy"
    assert 0.0 <= float(cli.trainer.callback_metrics["test_auc"]) <= 1.0
    assert cli.export_report is not None and cli.export_report["parity_max_abs_diff"] <= 1e-6
    loaded = load_checkpoint(cli.trainer.checkpoint_callback.best_model_path)  # weights_only=True inside
    assert isinstance(loaded.model, Toy)
    assert loaded.hparams["backbone"]["class_path"] == TOY and loaded.hparams["backbone"]["init_args"]["hidden"] == 3
    batch = next(iter(cli.datamodule.test_dataloader()))
    cli.model.eval()  # the best checkpoint's weights: `fit` tested it
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(batch.dense_features, batch.sparse_features), cli.model(batch), rtol=0, atol=0)


def test_a_checkpoint_holds_plain_containers_only(toy_fit: SalienceCLI) -> None:
    ckpt = torch.load(toy_fit.trainer.checkpoint_callback.best_model_path, map_location="cpu", weights_only=True)
    hparams = ckpt["hyper_parameters"]
    assert not plain_containers(hparams)
    assert hparams["optimizer"]["class_path"] == "torch.optim.Adam" and hparams["optimizer"]["init_args"]["lr"] == 0.001


def test_a_backbone_spec_resolves_from_each_form() -> None:
    schema = small_schema()
    for spec in (Toy, TOY, "Toy", {"class_path": TOY, "init_args": {"hidden": 5}}):
        model = build_backbone(spec, schema, SparseArchConfig())
        assert isinstance(model, Toy), spec
    assert model.layer.out_features == 5
    assert backbone_class(TOY) is Toy and backbone_class({"class_path": "recsys.models.DLRM"}) is DLRM
    assert isinstance(build_backbone(None, schema), RankingModel)  # the default backbone (DCNv2)


# ---------------------------------------------------------------------------------------------
# errors name the key
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backbone", "error"),
    [
        ({"class_path": TOY, "init_args": {"hiden": 3}}, "'hiden' is not accepted"),
        ({"class_path": "torch.nn.Linear", "init_args": {"in_features": 2, "out_features": 1}}, "RankingModel"),
        ({"class_path": "nope.Missing"}, "nope.Missing"),
    ],
    ids=["unknown-arg", "not-a-ranking-model", "missing"],
)
def test_a_bad_backbone_names_model_backbone(backbone: dict, error: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(ValueError, match=r"^model\.backbone: ") as info:
        resolve_backbone(backbone)
    assert error in str(info.value)
    with pytest.raises(SystemExit) as exit_info:  # jsonargparse rejects it before the data is read
        SalienceCLI(args=fit_args(tmp_path, "--model.backbone", json.dumps(backbone)))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert 'Parser key "model.backbone"' in err and error in err


# ---------------------------------------------------------------------------------------------
# objects back to their config form
# ---------------------------------------------------------------------------------------------


def test_as_spec_round_trips_classes_partials_and_instances() -> None:
    # a class
    assert as_spec(Toy) == {"class_path": TOY}
    assert isinstance(build_backbone(as_spec(Toy), small_schema()), Toy)
    # a partial of a class, and jsonargparse's own factory
    spec = as_spec(functools.partial(Toy, hidden=6))
    assert spec == {"class_path": TOY, "init_args": {"hidden": 6}}
    factory = resolve_backbone(spec)
    assert as_spec(factory) == {"class_path": TOY, "init_args": {"hidden": 6, "seam": None}}
    assert build_backbone(as_spec(factory), small_schema()).layer.out_features == 6
    assert as_spec(functools.partial(torch.optim.SGD, lr=0.1)) == {"class_path": class_path(torch.optim.SGD), "init_args": {"lr": 0.1}}
    # an instance, through its constructor arguments kept as attributes
    assert as_spec(Scale(2.0)) == {"class_path": class_path(Scale), "init_args": {"factor": 2.0}}
    # plain values are their own config form; a function has none
    assert as_spec({"class_path": TOY}) == {"class_path": TOY} and as_spec(None) is None
    with pytest.raises(TypeError, match="no config form"):
        as_spec(lambda schema, sparse_arch: Toy(schema, sparse_arch))


def test_a_task_built_in_python_keeps_the_config_form_and_rebuilds_from_it() -> None:
    schema = small_schema().to_dict()
    task = RankingTask(
        backbone=functools.partial(Toy, hidden=2),
        schema=schema,
        embedding_kernel="plain",
        optimizer=functools.partial(torch.optim.SGD, lr=0.1, weight_decay=0.01),
        seam=Scale(3.0),
    )
    assert not plain_containers(dict(task.hparams))
    assert task.hparams["backbone"] == {"class_path": TOY, "init_args": {"hidden": 2}}
    assert task.hparams["seam"] == {"class_path": class_path(Scale), "init_args": {"factor": 3.0}}
    optimizer = task.configure_optimizers()
    assert isinstance(optimizer, torch.optim.SGD)
    # weight decay on the dense parameters only
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    again = instantiate_module(RankingTask, dict(task.hparams))
    assert isinstance(again.model, Toy) and again.model.layer.out_features == 2
    assert isinstance(again.model.seam, Scale) and again.model.seam.factor == 3.0
    assert isinstance(again.configure_optimizers(), torch.optim.SGD)


# ---------------------------------------------------------------------------------------------
# checkpoints of the former form
# ---------------------------------------------------------------------------------------------

LEGACY = {
    "arch": "dlrm",
    "arch_args": {"bottom_mlp": [8], "top_mlp": [8]},
    "embedding_kernel": "plain",
    "fused_optimizer": "adagrad",
    "fused_lr": 0.05,
    "optimizer": "sgd",
    "learning_rate": 0.1,
    "weight_decay": 0.01,
    "embedding_weight_decay": 0.0,
    "lr_plateau_factor": 1.0,
    "lr_plateau_patience": 0,
    "early_stopping_patience": 2,
    "seam": None,
    "embedding_blocks": None,
}


def test_old_style_hparams_are_migrated() -> None:
    new = _current_hparams({**LEGACY, "schema": {}})
    assert "arch" not in new and "arch_args" not in new and "learning_rate" not in new and "weight_decay" not in new
    assert new["backbone"] == {"class_path": "recsys.models.DLRM", "init_args": {"bottom_mlp": [8], "top_mlp": [8]}}
    assert new["optimizer"] == {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "weight_decay": 0.01}}
    assert new["embedding_kernel"] == "plain" and new["schema"] == {}
    current = {"backbone": {"class_path": TOY}, "schema": {}}
    assert _current_hparams(current) == current


def test_an_old_style_checkpoint_loads(toy_fit: SalienceCLI, tmp_path: Path) -> None:
    fitted = torch.load(toy_fit.trainer.checkpoint_callback.best_model_path, map_location="cpu", weights_only=True)
    schema = toy_fit.datamodule.schema_dict
    torch.manual_seed(0)
    task = RankingTask(backbone=functools.partial(DLRM, bottom_mlp=[8], top_mlp=[8]), schema=schema, embedding_kernel="plain")
    old = {
        "hyper_parameters": {**LEGACY, "schema": schema},
        "state_dict": task.state_dict(),
        CTRDataModule.__qualname__: fitted[CTRDataModule.__qualname__],
    }
    path = tmp_path / "old.ckpt"
    torch.save(old, path)
    loaded = load_checkpoint(path)
    assert isinstance(loaded.model, DLRM) and loaded.hparams["arch"] == "dlrm"
    batch = next(iter(toy_fit.datamodule.test_dataloader()))
    task.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.model(batch.dense_features, batch.sparse_features), task.model(batch.dense_features, batch.sparse_features)
        )
