"""Quantized embedding tables (fp16 / int8 / int4 on FBGEMM's inference kernel) and their export.

Tolerances: a min-max quantized row differs from its fp32 row by at most half a step,
``(max - min) / (2^bits - 1) / 2``, plus the fp16 rounding of its scale and bias (relative
2^-11 of the row's magnitude); the exported module runs the same kernel as the eager quantized
model, so their probabilities agree to float32 rounding (1e-6).
"""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.encoders import Preprocessor
from recsys.data.schema import Schema
from recsys.export import check_parity_in_fresh_process, export_model, load_exported, to_plain_kernel
from recsys.export.quantize import (
    Precision,
    PrecisionError,
    QuantizedEmbeddingBags,
    embedding_bytes,
    quantize_model,
    resolve_precision,
)
from recsys.models.archs import DCNv2
from recsys.models.base import SparseArch, SparseArchConfig
from tests.recsys.export.test_export import make_frame, make_model, make_schema, random_batch


@pytest.fixture(scope="module")
def preprocessor() -> Preprocessor:
    return Preprocessor(make_schema()).fit(make_frame())


def _rows_bound(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """Per row: the most a min-max quantized value may differ from the float one."""
    lo, hi = weight.min(dim=1).values, weight.max(dim=1).values
    step = (hi - lo) / (2**bits - 1)
    return step / 2 + 2.0**-10 * weight.abs().max(dim=1).values + 1e-6


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_lookup_equals_embedding_bag_on_the_rows_within_half_a_quantization_step(
    preprocessor: Preprocessor, precision: str, pooling: str
) -> None:
    schema = preprocessor.fitted_schema
    torch.manual_seed(0)
    arch = SparseArch(schema, SparseArchConfig(pooling=pooling))
    ebc = arch.embedding_bag_collection
    with torch.no_grad():
        for bag in ebc.embedding_bags.values():
            bag.weight.normal_(0.0, 0.3)
    quantized = QuantizedEmbeddingBags(ebc, resolve_precision(arch, precision))
    bits = Precision(precision).bits
    # one id per row: the pooled output is the stored row itself
    for f in schema.sparse:
        n = int(f.num_embeddings or 0)
        ids = torch.arange(n)
        kjt = random_batch(schema, n, seed=1).sparse_features  # its keys; only feature f gets ids
        lengths = {k: torch.zeros(n, dtype=torch.int32) for k in kjt.keys()}
        lengths[f.name] = torch.ones(n, dtype=torch.int32)
        single = KeyedJaggedTensor.from_lengths_sync(
            keys=kjt.keys(), values=ids, lengths=torch.cat([lengths[k] for k in kjt.keys()]))
        got = quantized(single)[f.name]
        weight = ebc.embedding_bags[f"t_{f.name}"].weight.detach()
        bound = _rows_bound(weight, bits)
        assert ((got - weight).abs() <= bound[:, None]).all(), f.name
    # bags: sum (or mean) of the stored rows, the plain-PyTorch EmbeddingBag on dequantized rows
    batch = random_batch(schema, 64, seed=3)
    got, ref = quantized(batch.sparse_features).to_dict(), ebc(batch.sparse_features).to_dict()
    for f in schema.sparse:
        rows = batch.sparse_features[f.name].lengths().clamp(min=1).float()[:, None]
        scale = rows if pooling == "sum" else torch.ones_like(rows)
        bound = _rows_bound(ebc.embedding_bags[f"t_{f.name}"].weight.detach(), bits).max() * scale
        assert ((got[f.name] - ref[f.name]).abs() <= bound).all(), f.name


def test_precision_plan_overrides_checks_and_bytes(preprocessor: Preprocessor) -> None:
    schema = preprocessor.fitted_schema
    arch = SparseArch(schema)  # dims user 8, item 4, site 12, genres 4
    plan = resolve_precision(arch, "int8,site=int4,genres=fp16")
    assert plan.to_dict() == {"t_user": "int8", "t_item": "int8", "t_site": "int4", "t_genres": "fp16"}
    rows = {f.name: int(f.num_embeddings or 0) for f in schema.sparse}
    expected = (rows["user"] * (8 + 4) + rows["item"] * (4 + 4) + rows["site"] * (6 + 4) + rows["genres"] * 8)
    assert embedding_bytes(arch, plan) == expected
    assert embedding_bytes(arch) == 4 * sum(rows[f.name] * f.embedding_dim for f in schema.sparse)
    assert resolve_precision(arch, {"default": "fp16", "t_user": "int8"}).to_dict()["t_user"] == "int8"
    with pytest.raises(PrecisionError, match=r"precision='int3' is not one of"):
        resolve_precision(arch, "int3")
    with pytest.raises(PrecisionError, match=r"override 'nope': not a sparse feature"):
        resolve_precision(arch, "int8,nope=int4")
    with pytest.raises(PrecisionError, match=r"start with the default precision"):
        resolve_precision(arch, "user=int4")


def test_int4_on_a_dim_the_kernel_cannot_store_names_the_table(preprocessor: Preprocessor) -> None:
    fitted = preprocessor.fitted_schema
    schema = Schema(tuple(f if f.name != "user" else dataclasses.replace(f, embedding_dim=6) for f in fitted.features),
                    label=fitted.label)
    arch = SparseArch(schema)
    with pytest.raises(PrecisionError, match=r"table t_user has dim 6: int4 rows need a dim divisible by 4.*user=int8"):
        resolve_precision(arch, "int4")
    assert resolve_precision(arch, "int4,user=int8").tables["t_user"] is Precision.INT8


@pytest.mark.parametrize("name", ["dlrm", "deepfm", "dlrm_fused"])
def test_exported_quantized_model_matches_the_eager_quantized_one_in_a_fresh_process(
    preprocessor: Preprocessor, tmp_path: Path, name: str
) -> None:
    schema = preprocessor.fitted_schema
    model = make_model(name, schema).eval()
    result = export_model(model, preprocessor, tmp_path / "e", precision="int8,genres=int4")
    eager = quantize_model(to_plain_kernel(model), "int8,genres=int4")
    assert isinstance(eager.sparse_arch.embedding_bag_collection, QuantizedEmbeddingBags)
    batches = [random_batch(schema, b, seed=i) for i, b in enumerate((1, 7, 300))]
    assert check_parity_in_fresh_process(result.output_dir, eager, batches) <= 1e-6
    record = json.loads(result.schema_path.read_text())["embedding_precision"]
    assert record["tables"]["t_genres"] == "int4" and record["bytes"] < record["fp32_bytes"] / 2
    with torch.no_grad():  # close to the fp32 model, not equal to it
        b = batches[2]
        diff = (torch.sigmoid(model(b.dense_features, b.sparse_features))
                - torch.sigmoid(eager(b.dense_features, b.sparse_features))).abs().max()
    assert 0 < float(diff) < 0.05


def test_frequency_blocks_and_mean_pooling_quantize_and_script(preprocessor: Preprocessor, tmp_path: Path) -> None:
    schema = preprocessor.fitted_schema
    n_user = int(schema["user"].num_embeddings or 0)
    config = SparseArchConfig(pooling="mean", blocks={"user": [(0, n_user // 2, 8), (n_user // 2, n_user, 4)]})
    torch.manual_seed(0)
    model = DCNv2(schema, cross_layers=1, deep_mlp=[8], sparse_arch=config).eval()
    result = export_model(model, preprocessor, tmp_path / "b", precision="fp16")
    eager = quantize_model(model, "fp16")
    tables = json.loads(result.schema_path.read_text())["embedding_precision"]["tables"]
    assert {"t_user@0", "t_user@1"} <= set(tables)
    module = load_exported(result.output_dir)
    batch = random_batch(schema, 50, seed=9)
    from recsys.export.serving import kjt_to_lists

    values, lengths = kjt_to_lists(batch.sparse_features, list(module.feature_names))
    with torch.no_grad():
        want = torch.sigmoid(eager(batch.dense_features, batch.sparse_features))
        torch.testing.assert_close(module(values, lengths, batch.dense_features), want, rtol=0, atol=1e-6)
        fp32 = torch.sigmoid(model(batch.dense_features, batch.sparse_features))
    assert float((want - fp32).abs().max()) < 1e-3  # fp16 rows: ~3 significant digits


def test_an_fbgemm_without_the_quantized_ops_is_a_clear_error(
    preprocessor: Preprocessor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model("dlrm", preprocessor.fitted_schema).eval()
    result = export_model(model, preprocessor, tmp_path / "q", precision="int8")
    monkeypatch.setattr(torch, "ops", types.SimpleNamespace(fbgemm=types.SimpleNamespace()))
    with pytest.raises(RuntimeError, match=r"stored as int8, and this fbgemm_gpu .* lacks the quantized lookup op"):
        load_exported(result.output_dir)
