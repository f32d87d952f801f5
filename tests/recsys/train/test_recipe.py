"""Recipe (re-trainable config) and the model.seam plug-in of RankingTask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recsys.models.seam import SeamTransform
from recsys.train.recipe import Recipe

CONFIG = {
    "seed_everything": 0,
    "trainer": {"max_epochs": 1},
    "model": {
        "backbone": {"class_path": "recsys.models.DLRM", "init_args": {"bottom_mlp": [8], "top_mlp": [8]}},
        "embedding_kernel": "plain",
    },
    "data": {
        "reader": {
            "class_path": "recsys.data.synthetic.SyntheticReader",
            "init_args": {"n_rows": 3000, "cardinality_scale": 0.01, "n_noise": 1, "n_noise_dense": 0, "embedding_dim": 8},
        },
        "batch_size": 256,
        "cache_dir": None,
    },
}


class ScaleSeam(SeamTransform):
    """Test seam: multiplies every field by a learned per-field scale (created in bind)."""

    learning_rate = 0.5

    def __init__(self, init: float = 1.0) -> None:
        super().__init__()
        self.init = init
        self.bound: list[str] = []

    def bind(self, sparse_names: list[str], sparse_dims: list[int], dense_names: list[str]) -> None:
        self.bound = list(sparse_names) + list(dense_names)
        self.scale = torch.nn.Parameter(torch.full((len(sparse_names),), self.init))
        self.names = list(sparse_names)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {n: sparse[n] * self.scale[i] for i, n in enumerate(self.names)}, dense


def test_raw_split_matches_the_encoded_split(tmp_cwd: Path) -> None:
    recipe = Recipe(CONFIG, workdir=tmp_cwd / "w", quiet=True)
    raw = recipe.raw_split("train")
    train = recipe.datamodule.prepared.splits["train"]
    assert len(raw) == len(train)
    np.testing.assert_array_equal(raw.labels, train.labels)
    assert raw.schema.names == recipe.schema.names
    with pytest.raises(ValueError, match="split must be one of"):
        recipe.raw_split("holdout")


def test_fit_on_a_subset_with_a_seam(tmp_cwd: Path) -> None:
    recipe = Recipe(CONFIG, workdir=tmp_cwd / "w", quiet=True)
    seam = {"class_path": f"{__name__}.ScaleSeam", "init_args": {"init": 2.0}}
    result = recipe.fit(features=["item_id", "tags", "price"], seam=seam, tracking=False, run_name="sub")
    model = result.task.model
    assert model.sparse_names == ["item_id", "tags"] and model.schema.dense_names == ["price"]
    assert isinstance(model.seam, ScaleSeam) and model.seam.bound == ["item_id", "tags", "price"]
    assert not torch.equal(model.seam.scale.detach(), torch.full((2,), 2.0))  # trained
    assert {"test_auc", "test_logloss", "best_val_auc"} <= set(result.metrics)
    # the seam parameters get their own group with the seam's learning rate
    groups = result.task.configure_optimizers()
    optimizer = groups["optimizer"] if isinstance(groups, dict) else groups
    seam_group = [g for g in optimizer.param_groups if any(p is model.seam.scale for p in g["params"])]
    assert len(seam_group) == 1 and seam_group[0]["lr"] == 0.5 and seam_group[0]["weight_decay"] == 0.0
    # a second fit with the same name gets its own folder
    again = recipe.fit(features=["item_id"], tracking=False, run_name="sub", max_epochs=2)
    assert again.root_dir != result.root_dir
    assert (result.epochs_run, again.epochs_run) == (1, 2)  # the config's 1 epoch, then the override's 2


@pytest.mark.parametrize(
    ("seam", "error"),
    [
        ({"class_path": "nope.Missing"}, "No module named 'nope'"),
        ({"class_path": "torch.nn.Linear"}, "does not correspond to a subclass of SeamTransform"),
        ({"class_path": f"{__name__}.ScaleSeam", "init_args": {"bogus": 1}}, "bogus"),
    ],
    ids=["missing", "not-a-seam", "unknown-arg"],
)
def test_a_bad_seam_is_an_error_naming_the_key(seam: dict, error: str, tmp_cwd: Path, capsys) -> None:
    recipe = Recipe(CONFIG, workdir=tmp_cwd / "w", quiet=True)
    with pytest.raises(SystemExit) as exit_info:  # jsonargparse rejects it before anything is built
        recipe.fit(seam=seam, tracking=False)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert 'Parser key "model.seam"' in err and error in err


def test_missing_config_file() -> None:
    with pytest.raises(FileNotFoundError, match="config file not found"):
        Recipe("does/not/exist.yaml")


def test_checkpoint_round_trip_rebuilds_the_seam(tmp_cwd: Path) -> None:
    recipe = Recipe(CONFIG, workdir=tmp_cwd / "w", quiet=True)
    seam = {"class_path": f"{__name__}.ScaleSeam"}
    result = recipe.fit(features=["item_id", "site_category"], seam=seam, tracking=False)
    ckpt = next(Path(result.root_dir).rglob("last.ckpt"))
    from recsys.train.checkpoint import load_checkpoint

    loaded = load_checkpoint(ckpt)
    assert isinstance(loaded.model.seam, ScaleSeam)
    torch.testing.assert_close(loaded.model.seam.scale, result.task.model.seam.scale)


def test_search_fits_can_drop_their_checkpoints_and_the_data_module_keeps_no_model(
    tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``keep_checkpoints=False`` deletes a tested fit's checkpoints (its metrics stay); building
    the data module builds its model on the meta device and leaves none behind, and a fit's model goes with its result (the CLI that
    built them is kept reachable by its parser)."""
    import functools
    import gc
    import weakref

    from recsys.train.module import RankingTask

    built: list[weakref.ref] = []
    on_meta: list[bool] = []
    init = RankingTask.__init__

    @functools.wraps(init)  # the CLI reads the signature
    def recorded(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        built.append(weakref.ref(self))
        on_meta.append(all(p.is_meta for p in self.model.parameters()))

    monkeypatch.setattr(RankingTask, "__init__", recorded)
    for kernel in ("fused", "plain"):  # the data module's model: shapes only, no tables allocated
        config = {**CONFIG, "model": {**CONFIG["model"], "embedding_kernel": kernel}}
        assert Recipe(config, workdir=tmp_cwd / kernel, quiet=True).datamodule is not None
        assert on_meta.pop() is True
    built.clear()
    recipe = Recipe(CONFIG, workdir=tmp_cwd / "w", quiet=True, keep_checkpoints=False)
    assert recipe.datamodule is not None
    gc.collect()
    assert len(built) == 1 and built[0]() is None
    result = recipe.fit(features=["item_id", "price"], tracking=True)
    assert "test_auc" in result.metrics and not (Path(result.root_dir) / "checkpoints").exists()
    assert Path(result.root_dir).is_dir()
    fitted = weakref.ref(result.task)
    del result
    gc.collect()
    assert fitted() is None  # the fit's model lives as long as its result, not until the next fit


def test_a_dropped_fit_is_freed_before_the_next_fit_builds_its_model(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trained module and its trainer form a reference cycle, so a dropped result outlives its
    last reference until the cyclic collector runs; the next fit collects it before it builds its
    own model, so two fits' tables and optimizer state are never alive at once."""
    import functools
    import gc
    import weakref

    from recsys.train.module import RankingTask

    earlier: list[weakref.ref] = []
    alive_at_build: list[bool] = []
    init = RankingTask.__init__

    @functools.wraps(init)  # the CLI reads the signature
    def recorded(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        alive_at_build.append(any(ref() is not None for ref in earlier))
        init(self, *args, **kwargs)

    recipe = Recipe(CONFIG, workdir=tmp_cwd / "w", quiet=True, keep_checkpoints=False)
    result = recipe.fit(tracking=False)
    earlier.append(weakref.ref(result.task))
    del result
    assert earlier[0]() is not None  # held by its cycle with the trainer: what the next fit must free
    gc.disable()  # no automatic pass may do the next fit's work for it
    try:
        monkeypatch.setattr(RankingTask, "__init__", recorded)
        recipe.fit(tracking=False)
    finally:
        gc.enable()
    assert alive_at_build and not any(alive_at_build)


def test_optuna_import_errors_keep_no_frames() -> None:
    """Optuna keeps its optional-import errors; their tracebacks (every frame running at its first
    import, locals and all) are dropped by ``import_optuna``."""
    from recsys.runtime import import_optuna

    optuna = import_optuna()
    import sys

    kept = [getattr(m, "_imports", None) for n, m in list(sys.modules.items()) if n.startswith("optuna")]
    errors = [k._deferred[0] for k in kept if getattr(k, "_deferred", None)]
    assert all(e.__traceback__ is None for e in errors) and optuna.__version__


def test_a_default_workdir_is_removed_when_the_process_exits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recipe's own temporary folder outlives the fits (their run folders are in it) but not the
    process: it is registered for removal at exit; a named workdir is not."""
    import atexit
    import tempfile

    registered: list[tuple] = []
    monkeypatch.setattr(atexit, "register", lambda fn, *args, **kwargs: registered.append((fn, args, kwargs)))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    recipe = Recipe({"trainer": {"max_epochs": 1}})
    assert recipe.workdir.parent == tmp_path and recipe.workdir.name.startswith("salience-recipe-")
    assert recipe.workdir.is_dir() and (recipe.workdir / "recipe_config.yaml").is_file()
    ((fn, args, kwargs),) = registered
    fn(*args, **kwargs)  # what the interpreter runs at exit
    assert not recipe.workdir.exists()
    config = Path(__file__).resolve().parents[3] / "experiments" / "configs" / "synthetic_dcnv2.yaml"
    kept = Recipe(config, workdir=tmp_path / "kept")
    assert kept.workdir == tmp_path / "kept" and len(registered) == 1
