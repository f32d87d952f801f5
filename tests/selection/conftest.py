"""A tiny synthetic training recipe shared by the selection tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def tiny_config(n_rows: int = 12000, epochs: int = 2, **reader: Any) -> dict[str, Any]:
    """A fast DCNv2 config on the synthetic default (small vocabularies)."""
    return {
        "seed_everything": 0,
        "trainer": {"max_epochs": epochs, "enable_progress_bar": False, "enable_model_summary": False},
        "model": {
            "backbone": {
                "class_path": "recsys.models.DCNv2",
                "init_args": {"cross_layers": 1, "deep_mlp": [32], "structure": "parallel"},
            },
            "embedding_kernel": "plain",
            "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}},
            "early_stopping_patience": 0,
        },
        "data": {
            "reader": {
                "class_path": "recsys.data.synthetic.SyntheticReader",
                "init_args": {"n_rows": n_rows, "seed": 0, "cardinality_scale": 0.01, "n_noise": 2, "n_noise_dense": 1,
                              "embedding_dim": 8, **reader},
            },
            "batch_size": 256,
            "cache_dir": None,
        },
    }


@pytest.fixture
def tiny_recipe(tmp_cwd: Path):  # noqa: ANN201
    from recsys.train.recipe import Recipe

    return Recipe(tiny_config(), workdir=tmp_cwd / "fits", quiet=True)
