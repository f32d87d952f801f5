"""Row schemes: quotient-remainder (compositional) embeddings and hashed tables.

Every lookup is compared with a plain-PyTorch reference built from the tables' own weights
(exact up to float32 summation order: 1e-6); export parity is the scripted module against eager.
"""

from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.encoders import Preprocessor
from recsys.data.schema import Schema
from recsys.export import export_model, load_exported
from recsys.export.serving import kjt_to_lists
from recsys.models.archs import DCNv2
from recsys.models.base import SparseArch, SparseArchConfig
from recsys.models.rows import HASH_MULTIPLIER
from recsys.train.module import RankingTask
from tests.recsys.export.test_export import make_frame, make_schema, random_batch


@pytest.fixture(scope="module")
def preprocessor() -> Preprocessor:
    return Preprocessor(make_schema()).fit(make_frame())


@pytest.fixture(scope="module")
def schema(preprocessor: Preprocessor) -> Schema:
    return preprocessor.fitted_schema  # user 26 ids dim 8, item 41 dim 4, site 18 dim 12, genres (multi-hot) 7 dim 4


def _bags(kjt: KeyedJaggedTensor, name: str) -> list[list[int]]:
    jt = kjt[name]
    out, i = [], 0
    for n in jt.lengths().tolist():
        out.append(jt.values()[i:i + n].tolist())
        i += n
    return out


def _weights(arch: SparseArch, table: str) -> torch.Tensor:
    return arch.embedding_bag_collection.embedding_bags[table].weight.detach()


@pytest.mark.parametrize("combine", ["sum", "product", "concat"])
def test_quotient_remainder_lookup_equals_the_reference(schema: Schema, combine: str) -> None:
    torch.manual_seed(0)
    arch = SparseArch(schema, SparseArchConfig(rows={"user": {"scheme": "qr", "buckets": 5, "combine": combine}}))
    wq, wr = _weights(arch, "t_user@q"), _weights(arch, "t_user@r")
    assert wq.shape == (6, 4 if combine == "concat" else 8) and wr.shape[0] == 5  # ceil(26 / 5) quotient rows
    batch = random_batch(schema, 40, seed=1)
    got = arch(batch.sparse_features)["user"]
    for row, ids in enumerate(_bags(batch.sparse_features, "user")):
        parts = [(wq[v // 5], wr[v % 5]) for v in ids]
        vecs = [q + r if combine == "sum" else q * r if combine == "product" else torch.cat([q, r]) for q, r in parts]
        want = torch.stack(vecs).sum(0) if vecs else torch.zeros(8)
        torch.testing.assert_close(got[row], want, rtol=0, atol=1e-6)
    # complementary partitions: every id reads its own (quotient, remainder) pair
    ids = torch.arange(26)
    single = KeyedJaggedTensor.from_lengths_sync(
        keys=schema.sparse_names, values=ids,
        lengths=torch.cat([torch.ones(26, dtype=torch.int32) if n == "user" else torch.zeros(26, dtype=torch.int32)
                           for n in schema.sparse_names]))
    rows = arch(single)["user"]
    assert len({tuple(r.tolist()) for r in rows}) == 26


def test_quotient_remainder_pools_multi_hot_bags_exactly(schema: Schema) -> None:
    torch.manual_seed(0)
    arch = SparseArch(schema, SparseArchConfig(pooling="mean", rows={"genres": {"scheme": "qr", "buckets": 3}}))
    wq, wr = _weights(arch, "t_genres@q"), _weights(arch, "t_genres@r")
    batch = random_batch(schema, 40, seed=2)
    got = arch(batch.sparse_features)["genres"]
    for row, ids in enumerate(_bags(batch.sparse_features, "genres")):
        want = torch.stack([wq[v // 3] + wr[v % 3] for v in ids]).mean(0) if ids else torch.zeros(4)
        torch.testing.assert_close(got[row], want, rtol=0, atol=1e-6)


def test_hashed_table_keeps_oov_at_row_zero_and_spreads_the_rest(schema: Schema) -> None:
    torch.manual_seed(0)
    arch = SparseArch(schema, SparseArchConfig(rows={"item": {"scheme": "hash", "rows": 10}}))
    w = _weights(arch, "t_item")
    assert w.shape == (10, 4) and torch.count_nonzero(w[0]) == 0  # the OOV row starts at zero
    batch = random_batch(schema, 40, seed=3)
    got = arch(batch.sparse_features)["item"]
    for row, ids in enumerate(_bags(batch.sparse_features, "item")):
        rows = [0 if v == 0 else 1 + (v * HASH_MULTIPLIER) % 9 for v in ids]
        want = w[rows].sum(0) if rows else torch.zeros(4)
        torch.testing.assert_close(got[row], want, rtol=0, atol=1e-6)
    used = {0 if v == 0 else 1 + (v * HASH_MULTIPLIER) % 9 for v in range(41)}
    assert used == set(range(10))  # 41 ids over all 10 rows


def test_fewer_parameters_and_bad_settings_name_the_key(schema: Schema) -> None:
    full = SparseArch(schema).num_parameters()
    qr = SparseArch(schema, SparseArchConfig(rows={"item": {"scheme": "qr", "buckets": 7}})).num_parameters()
    assert full - qr == 41 * 4 - (6 + 7) * 4
    cases = {
        r"model.embedding_rows.item: buckets=41 but the feature has only 41 ids": {"item": {"scheme": "qr", "buckets": 41}},
        r"model.embedding_rows.genres: combine=product does not commute": {"genres": {"scheme": "qr", "buckets": 3, "combine": "product"}},
        r"model.embedding_rows.item.scheme='tt' is not one of": {"item": {"scheme": "tt"}},
        r"model.embedding_rows.item: rows must be an integer >= 2": {"item": {"scheme": "hash", "rows": 1}},
        r"model.embedding_rows.nope: not a sparse feature": {"nope": {"scheme": "hash", "rows": 3}},
        r"model.embedding_rows.item.combine='max'": {"item": {"scheme": "qr", "buckets": 3, "combine": "max"}},
    }
    for message, rows in cases.items():
        with pytest.raises(ValueError, match=message):
            SparseArch(schema, SparseArchConfig(rows=rows))
    with pytest.raises(ValueError, match=r"halves, which must be multiples of 4 \(fused kernel\)"):
        SparseArch(schema, SparseArchConfig(kernel="fused", rows={"site": {"scheme": "qr", "buckets": 3, "combine": "concat"}}))
    with pytest.raises(ValueError, match=r"frequency blocks .* use one or the other"):
        SparseArch(schema, SparseArchConfig(blocks={"item": [[0, 20, 4], [20, -1, 2]]}, rows={"item": {"scheme": "hash", "rows": 5}}))
    with pytest.raises(ValueError, match=r"stored as quotient and remainder tables"):
        SparseArch(schema, SparseArchConfig(rows={"item": {"scheme": "qr", "buckets": 5}})).table("item")


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_compositional_model_trains_exports_and_quantizes(preprocessor: Preprocessor, schema: Schema, tmp_path, kernel: str) -> None:
    rows = {"user": {"scheme": "qr", "buckets": 5, "combine": "product"}, "genres": {"scheme": "qr", "buckets": 3},
            "item": {"scheme": "hash", "rows": 16}}
    task = RankingTask(backbone=DCNv2, schema=schema.to_dict(), embedding_kernel=kernel, embedding_rows=rows)
    model = task.model
    before = {k: v.clone() for k, v in model.sparse_arch.state_dict().items()}
    batch = random_batch(schema, 32, seed=4)
    logits = model(batch.dense_features, batch.sparse_features)
    torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
    if kernel == "plain":
        torch.optim.SGD(model.parameters(), lr=0.5).step()
    after = model.sparse_arch.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before if k.endswith(("user@q.weight", "user@r.weight")))
    model.eval()
    for precision in ("fp32", "int8"):
        result = export_model(model, preprocessor, tmp_path / precision, precision=precision)
        assert result.max_abs_diff <= 1e-6
    module = load_exported(tmp_path / "fp32")
    values, lengths = kjt_to_lists(batch.sparse_features, list(module.feature_names))
    with torch.no_grad():
        torch.testing.assert_close(module(values, lengths, batch.dense_features),
                                   torch.sigmoid(model(batch.dense_features, batch.sparse_features)), rtol=0, atol=1e-6)
