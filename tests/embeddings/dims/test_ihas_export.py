"""The iHAS routed model (router + one model per cluster) exports through the foundation's
export path as one TorchScript module: eager-vs-exported parity <= 1e-6 in a fresh process on
batch sizes and bag lengths not seen at export, the export's loader scores raw records, and
fused-kernel parts are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from embeddings import DimensionPlan
from embeddings.dims.ihas import IHAS, IHASRoutedModel
from recsys.data.batching import make_batch, random_batch
from recsys.export.predictor import check_parity_in_fresh_process
from recsys.export.serving import ServingModule, export_model, kjt_to_lists, read_export_schema
from recsys.models import DCNv2
from recsys.models.base import EmbeddingKernel, SparseArchConfig
from recsys.train.recipe import Recipe
from tests.selection.conftest import tiny_config

# small and quick (the planted-data quality checks live in test_ihas.py)
SEARCH = {"width": 8, "search_epochs": 3, "num_clusters": 2, "retrain_epochs": 1, "seed": 0}
ATOL = 1e-6


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recipe, DimensionPlan, IHASRoutedModel]:
    recipe = Recipe(tiny_config(n_rows=4000), workdir=tmp_path_factory.mktemp("ihas_export"), quiet=True)
    search = IHAS(**SEARCH)
    plan, gate_model = search.search_with_model(recipe)
    return recipe, plan, search.retrain(recipe, plan, gate_model)


def _parity_file(path: Path, model: torch.nn.Module, names: list[str], batches: list) -> Path:  # noqa: ANN001
    """The inputs file of ``check_parity_in_fresh_process`` (plain tensors + eager probabilities)."""
    plain, expected = [], []
    with torch.no_grad():
        for b in batches:
            values, lengths = kjt_to_lists(b.sparse_features, names)
            plain.append({"values": values, "lengths": lengths, "dense": b.dense_features.float()})
            expected.append(torch.sigmoid(model(b.dense_features, b.sparse_features)))
    torch.save({"feature_names": names, "batches": plain, "expected": expected}, path)
    return path


def test_routed_model_exports_with_fresh_process_parity(
    routed: tuple[Recipe, DimensionPlan, IHASRoutedModel], tmp_path: Path
) -> None:
    recipe, plan, model = routed
    pre = recipe.datamodule.preprocessor
    result = export_model(model, pre, tmp_path / "export", metadata={"plan": plan.to_dict()})
    assert result.max_abs_diff <= ATOL and not result.converted_from_fused
    info = read_export_schema(tmp_path / "export")
    assert info["model_class"] == "IHASRoutedModel" and info["trained_kernel"] == "plain"
    assert info["sparse_features"] == pre.fitted_schema.sparse_names
    assert info["metadata"]["plan"]["clusters"] == {str(c): d for c, d in plan.clusters.items()}
    # batch sizes (export checked 1 and 5) and bag lengths (max 3 there) not seen at export
    test = recipe.datamodule.prepared.splits["test"]
    schema = recipe.schema
    batches = [make_batch(test, np.arange(0, 3)), make_batch(test, np.arange(3, 300)),
               random_batch(schema, 37, seed=7, max_bag=9), random_batch(schema, 2, seed=8, max_bag=12)]
    with torch.no_grad():
        clusters = model.router(batches[1].sparse_features)
    assert len(set(clusters.tolist())) == len(plan.clusters) == 2  # both cluster models are exercised
    inputs = _parity_file(tmp_path / "inputs.pt", model, schema.sparse_names, batches)
    assert check_parity_in_fresh_process(tmp_path / "export", inputs) <= ATOL


def test_exported_loader_scores_raw_records(routed: tuple[Recipe, DimensionPlan, IHASRoutedModel],
                                            tmp_path: Path) -> None:
    recipe, _, model = routed
    pre = recipe.datamodule.preprocessor
    export_model(model, pre, tmp_path / "export")
    frame = recipe.raw_split("test").frame.head(23)
    records = frame[pre.fitted_schema.names].to_dict("records")
    (tmp_path / "r.json").write_text(json.dumps(records))  # NaN cells as NaN (json.loads reads them)
    cmd = [sys.executable, str(tmp_path / "export" / "loader.py"), str(tmp_path / "export"),
           "--records", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    encoded = pre.transform(frame)
    batch = make_batch(encoded, np.arange(len(frame)))
    with torch.no_grad():
        eager = torch.sigmoid(model(batch.dense_features, batch.sparse_features)).numpy()
    np.testing.assert_allclose(json.loads(proc.stdout)["scores"], eager, rtol=0, atol=ATOL)


def test_fused_cluster_models_are_refused(tmp_path: Path) -> None:
    from tests.embeddings.dims.test_ihas import _routed_model, make_schema

    schema = make_schema()
    routed, models = _routed_model(schema)
    with pytest.raises(ValueError, match="has no sparse_names: pass feature_names"):
        ServingModule(routed)
    serving = ServingModule(routed, feature_names=schema.sparse_names, num_dense=len(schema.dense_names))
    assert serving.feature_names == ["user", "genre"] and serving.num_dense == 1
    fused = DCNv2(schema, SparseArchConfig(kernel=EmbeddingKernel.FUSED), cross_layers=1, deep_mlp=[8])
    mixed = IHASRoutedModel(routed.router, [models[0], fused])
    with pytest.raises(ValueError, match=r"fused-kernel embedding parts \['models\.1\.sparse_arch"):
        ServingModule(mixed, feature_names=schema.sparse_names, num_dense=1)
