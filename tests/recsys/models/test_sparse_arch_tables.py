"""``SparseArch.table_name`` / ``SparseArch.table``: the one place that knows how a feature's
embedding table is named, so no caller spells ``t_<feature>`` itself."""

from __future__ import annotations

import pytest
import torch

from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.models.archs import DLRM
from recsys.models.base import EmbeddingKernel, SparseArch, SparseArchConfig

BLOCKS = {"a": [[0, 3, 8], [3, -1, 4]]}


def make_schema() -> Schema:
    return Schema(
        features=(
            FeatureSpec("a", embedding_dim=8, num_embeddings=11),
            FeatureSpec("b", kind=FeatureKind.MULTI_CATEGORICAL, embedding_dim=4, num_embeddings=6),
            FeatureSpec("x0", kind=FeatureKind.DENSE),
        )
    )


def test_table_names_are_the_ebc_keys() -> None:
    arch = SparseArch(make_schema(), SparseArchConfig(blocks=BLOCKS))
    assert SparseArch.table_name("b") == "t_b" and arch.table_name("a", 1) == "t_a@1"
    names = {arch.table_name("a", 0), arch.table_name("a", 1), arch.table_name("b")}
    assert names == {key.split(".")[1] for key in arch.embedding_bag_collection.state_dict()}  # embedding_bags.<name>.weight


def test_table_returns_the_module_holding_the_weights() -> None:
    arch = SparseArch(make_schema())
    table = arch.table("b")
    assert isinstance(table, torch.nn.EmbeddingBag) and tuple(table.weight.shape) == (6, 4)
    assert table.weight is arch.embedding_bag_collection.state_dict(keep_vars=True)["embedding_bags.t_b.weight"]
    blocked = SparseArch(make_schema(), SparseArchConfig(blocks=BLOCKS))
    assert tuple(blocked.table("a", 0).weight.shape) == (3, 8) and tuple(blocked.table("a", 1).weight.shape) == (8, 4)


def test_table_errors_name_the_feature() -> None:
    arch = SparseArch(make_schema(), SparseArchConfig(blocks=BLOCKS))
    with pytest.raises(ValueError, match=r"no embedding table for 'x0'; the sparse features are \['a', 'b'\]"):
        arch.table("x0")
    with pytest.raises(ValueError, match=r"'a' is split into 2 frequency blocks: pass block=0\.\.1"):
        arch.table("a")
    with pytest.raises(ValueError, match=r"'a' has blocks 0\.\.1, not block 2"):
        arch.table("a", 2)
    with pytest.raises(ValueError, match=r"'b' has no frequency blocks, not block 0"):
        arch.table("b", 0)
    fused = SparseArch(make_schema(), SparseArchConfig(kernel=EmbeddingKernel.FUSED))
    with pytest.raises(ValueError, match="model.embedding_kernel: plain"):
        fused.table("a")


def test_a_model_with_the_accessors_still_scripts() -> None:
    torch.manual_seed(0)
    schema = Schema(
        features=(
            FeatureSpec("a", embedding_dim=8, num_embeddings=11),
            FeatureSpec("b", embedding_dim=8, num_embeddings=6),
            FeatureSpec("x0", kind=FeatureKind.DENSE),
        )
    )
    model = DLRM(schema, bottom_mlp=[8, 8], top_mlp=[8]).eval()
    scripted = torch.jit.script(model)  # table() is jit-unused, table_name() a plain static method
    arch = model.sparse_arch
    assert isinstance(arch, SparseArch) and scripted.sparse_arch is not None and arch.table("a").weight.shape == (11, 8)
