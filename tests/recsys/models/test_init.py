"""Initialisation settings: ``model.embedding_init_std`` (tables at N(0, std), every kernel, the
out-of-vocabulary row at zero) and ``model.dense_init: xavier_normal`` (every linear layer outside
the tables), the two settings that close the gap to FuxiCTR on Frappe (peers.md)."""

from __future__ import annotations

import pytest
import torch

from recsys.models.archs import DCNv2
from recsys.models.base import EmbeddingKernel, SparseArch, SparseArchConfig
from tests.recsys.models.test_grouped import make_schema


@pytest.mark.parametrize("kernel", [EmbeddingKernel.PLAIN, EmbeddingKernel.FUSED, EmbeddingKernel.GROUPED])
def test_embedding_init_std_starts_every_kernel_near_zero(kernel: EmbeddingKernel) -> None:
    schema = make_schema()
    torch.manual_seed(0)
    arch = SparseArch(schema, SparseArchConfig(kernel=kernel, init_std=1e-4))
    for name, weight in arch.embedding_bag_collection.state_dict().items():
        assert float(weight[0].abs().max()) == 0.0, name  # the out-of-vocabulary row stays zero
        assert float(weight[1:].std()) == pytest.approx(1e-4, rel=0.5), name
    torch.manual_seed(0)
    default = SparseArch(schema, SparseArchConfig(kernel=kernel))
    assert float(default.embedding_bag_collection.state_dict()["embedding_bags.t_c0.weight"][1:].abs().max()) > 1e-2
    with pytest.raises(ValueError, match="embedding_init_std must be > 0"):
        SparseArchConfig(init_std=0.0)


def test_xavier_dense_init_leaves_the_tables_alone() -> None:
    from recsys.models.base import init_dense_layers

    schema = make_schema()
    torch.manual_seed(0)
    model = DCNv2(schema, SparseArchConfig(), cross_layers=1, deep_mlp=[300, 300])
    tables = {k: v.clone() for k, v in model.sparse_arch.state_dict().items()}
    init_dense_layers(model, "xavier_normal")
    for k, v in model.sparse_arch.state_dict().items():
        assert torch.equal(v, tables[k])
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    big = next(m for m in linears if m.in_features == 300 and m.out_features == 300)
    assert float(big.weight.std()) == pytest.approx((2.0 / 600) ** 0.5, rel=0.05)  # Xavier-normal's std
    assert all(float(m.bias.abs().max()) == 0.0 for m in linears if m.bias is not None)
    with pytest.raises(ValueError, match="model.dense_init must be one of"):
        init_dense_layers(model, "he")  # type: ignore[arg-type]
