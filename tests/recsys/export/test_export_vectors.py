"""A ``vector`` feature through the models, the seam and the export.

The backbones read a vector's D columns in the dense block; LeAP gives it one gate and mixes its
D columns with one permutation; the export's loader and :class:`Predictor` take a vector as a
list of D numbers or as its D prefixed keys and score exactly as the eager model (to 1e-6, the
same float32 kernels).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from recsys.data.batching import random_batch
from recsys.data.encoders import Preprocessor
from recsys.data.schema import FeatureSpec, Schema
from recsys.export import Predictor, export_model
from recsys.models.archs import DLRM, DCNv2, DeepFM
from selection.model_based.leap import LeAPSeam

ATOL = 1e-6


def _schema() -> Schema:
    return Schema(
        (
            FeatureSpec("user", embedding_dim=4),
            FeatureSpec("emb", kind="vector", dim=3),
            FeatureSpec("price", kind="dense", transform="log1p"),
            FeatureSpec("ctx", kind="vector", dim=2, prefix="c", transform="standardize"),
        ),
        label="click",
    )


def _frame(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    cols: dict = {"user": [f"u{i}" for i in rng.integers(0, 6, n)], "price": rng.gamma(2.0, 2.0, n)}
    cols.update({f"emb_{i}": rng.normal(size=n) for i in range(3)})
    cols.update({f"c{i}": rng.normal(2.0, 3.0, n) for i in range(2)})
    cols["click"] = rng.integers(0, 2, n)
    return pd.DataFrame(cols)


@pytest.mark.parametrize("backbone", [DCNv2, DLRM, DeepFM])
def test_backbones_read_a_vectors_columns(backbone: type) -> None:
    torch.manual_seed(0)
    schema = Preprocessor(_schema()).fit(_frame()).fitted_schema
    model = backbone(schema)
    assert model.num_dense == 6
    batch = random_batch(schema, 16)
    assert batch.dense_features.shape == (16, 6)
    logits = model(batch.dense_features, batch.sparse_features)
    assert logits.shape == (16,)
    changed = batch.dense_features.clone()
    changed[:, 2] += 1.0  # the last column of 'emb' reaches the logit
    assert not torch.allclose(model(changed, batch.sparse_features), logits)


def test_leap_gives_a_vector_one_gate_and_one_permutation() -> None:
    schema = Preprocessor(_schema()).fit(_frame()).fitted_schema
    model = DCNv2(schema, seam=LeAPSeam())
    seam = model.seam
    assert isinstance(seam, LeAPSeam)
    assert seam.field_names == ["user", "emb", "price", "ctx"] and seam.offsets == [0, 4, 7, 8, 10]
    b = 12
    sparse = {"user": torch.randn(b, 4)}
    dense = torch.randn(b, 6)
    gates = torch.tensor([1.0, 0.0, 1.0, 1.0])  # 'emb' replaced by its replica outright
    perms = torch.stack([torch.arange(b), torch.arange(b).flip(0), torch.arange(b), torch.arange(b)])
    out, dense_out, _ = seam.mix(sparse, dense, gates, perms)
    torch.testing.assert_close(dense_out[:, :3], dense[:, :3].flip(0))  # all D columns with one permutation
    torch.testing.assert_close(dense_out[:, 3:], dense[:, 3:])
    torch.testing.assert_close(out["user"], sparse["user"])


def test_export_scores_vector_records_as_the_eager_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    frame = _frame()
    pre = Preprocessor(_schema()).fit(frame)
    model = DLRM(pre.fitted_schema, bottom_mlp=[8, 4], top_mlp=[8])
    export_model(model, pre, tmp_path / "export")
    info = json.loads((tmp_path / "export" / "schema.json").read_text())
    assert info["dense_widths"] == [3, 1, 2] and info["dense_columns"][:3] == ["emb_0", "emb_1", "emb_2"]
    as_lists = [{"user": "u1", "emb": [0.1, -0.2, 0.3], "price": 2.0, "ctx": [1.0, None]},
                {"user": "new", "emb": None, "price": float("nan"), "ctx": [0.5, 4.0]}]
    as_keys = [{"user": r["user"], "price": r["price"],
                **{f"emb_{i}": (None if r["emb"] is None else r["emb"][i]) for i in range(3)},
                **{f"c{i}": r["ctx"][i] for i in range(2)}} for r in as_lists]
    eager = Predictor.from_model(model, pre).predict(as_lists)
    exported = Predictor.load(tmp_path / "export")
    np.testing.assert_allclose(exported.predict(as_lists), eager, atol=ATOL)
    np.testing.assert_allclose(exported.predict(as_keys), eager, atol=ATOL)
    np.testing.assert_allclose(exported.predict(pd.DataFrame(as_keys)), eager, atol=ATOL)
    assert exported.dense_filled["emb"] == 3 * 3  # the null vector, three times (lists, keys, frame)
    with pytest.raises(ValueError, match="vector feature 'emb' needs 3 numbers, got 2"):
        exported.predict([{**as_lists[0], "emb": [1.0, 2.0]}])
    (tmp_path / "r.json").write_text(json.dumps([*as_lists, *as_keys]))
    loader = tmp_path / "export" / "loader.py"
    proc = subprocess.run([sys.executable, str(loader), str(tmp_path / "export"), "--records", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(json.loads(proc.stdout)["scores"], [*eager, *eager], atol=ATOL)
