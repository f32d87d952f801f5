"""The grouped kernel: one lookup per embedding width, the looked-up rows updated in the backward.

Checked against references: the plain per-table ``EmbeddingBagCollection`` (forward, and the
gradient through an SGD step at lr 1, on mixed widths, pooling, multi-hot and empty bags,
frequency blocks and QR tables) and FBGEMM's fused kernel (the same weights after several
Adagrad and row-wise Adagrad steps); the state dict keeps the per-table keys (checkpoints move
between kernels); one lookup op per width group however many tables; training through the
recipe (in test_blocked.py); export through to_plain_kernel.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.export import to_plain_kernel
from recsys.models.archs import DCNv2
from recsys.models.base import EmbeddingKernel, FusedOptimizer, SparseArch, SparseArchConfig
from recsys.models.grouped import GroupedEmbeddingBags


def make_schema(n_ids: int = 6) -> Schema:
    feats = [
        FeatureSpec(f"c{i}", embedding_dim=8 if i % 3 else 4, num_embeddings=5 + 3 * i) for i in range(n_ids)
    ]
    feats.append(FeatureSpec("m", kind=FeatureKind.MULTI_CATEGORICAL, embedding_dim=8, num_embeddings=9))
    feats.append(FeatureSpec("x0", kind=FeatureKind.DENSE))
    return Schema(features=tuple(feats))


def random_kjt(schema: Schema, batch: int, seed: int = 0) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    values, lengths = [], []
    for f in schema.sparse:
        ln = torch.randint(0, 4, (batch,), generator=g) if f.kind is FeatureKind.MULTI_CATEGORICAL else torch.ones(batch, dtype=torch.long)
        lengths.append(ln)
        values.append(torch.randint(0, int(f.num_embeddings or 1), (int(ln.sum()),), generator=g))
    return KeyedJaggedTensor(keys=schema.sparse_names, values=torch.cat(values), lengths=torch.cat(lengths).int())


def pair(schema: Schema, other: EmbeddingKernel = EmbeddingKernel.PLAIN, **config: object) -> tuple[SparseArch, SparseArch]:
    torch.manual_seed(0)
    reference = SparseArch(schema, SparseArchConfig(kernel=other, **config))  # type: ignore[arg-type]
    torch.manual_seed(0)
    grouped = SparseArch(schema, SparseArchConfig(kernel=EmbeddingKernel.GROUPED, **config))  # type: ignore[arg-type]
    return reference, grouped


def weighted_loss(pooled: dict[str, torch.Tensor], weights: list[float]) -> torch.Tensor:
    return torch.stack([w * p.pow(2).sum() for w, p in zip(weights, pooled.values(), strict=True)]).sum()


@pytest.mark.parametrize(
    "config",
    [{}, {"pooling": "mean"}, {"blocks": {"c1": [[0, 3, 8], [3, -1, 4]]}}, {"rows": {"c5": {"scheme": "qr", "buckets": 4}}}],
    ids=["sum", "mean", "blocks", "qr"],
)
def test_forward_and_row_updates_match_the_plain_kernel(config: dict) -> None:
    schema = make_schema()
    plain, grouped = pair(schema, fused_optimizer=FusedOptimizer.SGD, fused_lr=1.0, **config)
    # the same initial tables: the grouped kernel stacks the plain kernel's initial weights
    before = {k: v.clone() for k, v in grouped.embedding_bag_collection.state_dict().items()}
    for key, value in plain.embedding_bag_collection.state_dict().items():
        torch.testing.assert_close(before[key], value, rtol=0, atol=0)
    kjt = random_kjt(schema, batch=7)
    out_p, out_g = plain(kjt), grouped(kjt)
    assert list(out_p) == list(out_g) == schema.sparse_names
    for name in out_p:
        torch.testing.assert_close(out_g[name], out_p[name], rtol=1e-6, atol=1e-6)
    weights = torch.randn(len(out_p)).tolist()
    weighted_loss(out_p, weights).backward()
    weighted_loss(out_g, weights).backward()  # SGD at lr 1 inside the backward: w <- w - grad
    after = grouped.embedding_bag_collection.state_dict()
    assert all(p.grad is None for p in grouped.parameters())  # nothing left for a dense optimizer
    for name, bag in plain.embedding_bag_collection.embedding_bags.items():
        key = f"embedding_bags.{name}.weight"
        torch.testing.assert_close(before[key] - after[key], bag.weight.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", [FusedOptimizer.ADAGRAD, FusedOptimizer.ROWWISE_ADAGRAD])
def test_training_steps_match_fbgemms_fused_kernel(optimizer: FusedOptimizer) -> None:
    schema = make_schema()
    fused, grouped = pair(schema, EmbeddingKernel.FUSED, fused_optimizer=optimizer, fused_lr=0.1)
    initial = {k: v.clone() for k, v in grouped.embedding_bag_collection.state_dict().items()}
    weights = torch.randn(len(schema.sparse)).tolist()
    for step in range(4):  # repeated ids within and across batches exercise the accumulated squares
        kjt = random_kjt(schema, batch=16, seed=step)
        weighted_loss(fused(kjt), weights).backward()
        weighted_loss(grouped(kjt), weights).backward()
    reference = fused.embedding_bag_collection.state_dict()
    after = grouped.embedding_bag_collection.state_dict()
    for key, value in after.items():
        torch.testing.assert_close(value, reference[key], rtol=1e-4, atol=1e-5)
    assert all(not torch.equal(after[k], initial[k]) for k in after)  # every table moved


def test_one_lookup_per_width_group_however_many_tables() -> None:
    schema = make_schema(n_ids=60)  # 61 tables of two widths
    plain, grouped = pair(schema)
    ebc = grouped.embedding_bag_collection
    assert isinstance(ebc, GroupedEmbeddingBags) and ebc.num_groups == 2 and len(ebc.weights) == 2
    kjt = random_kjt(schema, batch=4)

    def lookups(arch: SparseArch) -> int:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            arch(kjt)
        return sum(e.count for e in prof.key_averages() if e.key in ("aten::embedding_bag", "aten::_embedding_bag"))

    assert lookups(grouped) <= 2 * 2  # embedding_bag may dispatch to _embedding_bag: at most 2 ops per group
    assert lookups(plain) >= 61


def test_state_dict_moves_between_kernels() -> None:
    schema = make_schema()
    plain, grouped = pair(schema)
    with torch.no_grad():
        for bag in plain.embedding_bag_collection.embedding_bags.values():
            bag.weight.normal_()
    state = plain.state_dict()
    assert set(grouped.state_dict()) == set(state)  # per-table keys, no group key
    grouped.load_state_dict(state)
    kjt = random_kjt(schema, batch=5, seed=1)
    for name, value in plain(kjt).items():
        torch.testing.assert_close(grouped(kjt)[name], value)
    back = SparseArch(schema, SparseArchConfig(kernel=EmbeddingKernel.FUSED))
    back.load_state_dict(grouped.state_dict())  # and into FBGEMM's tables
    for name, value in plain(kjt).items():
        torch.testing.assert_close(back(kjt)[name], value, rtol=1e-5, atol=1e-6)


def test_grouped_model_trains_and_converts_for_export() -> None:
    schema = make_schema()
    torch.manual_seed(0)
    model = DCNv2(schema, SparseArchConfig(kernel=EmbeddingKernel.GROUPED), cross_layers=1, deep_mlp=[8])
    kjt, dense = random_kjt(schema, batch=32), torch.randn(32, 1)
    target = (torch.rand(32) < 0.5).float()
    opt = torch.optim.Adam(model.dense_parameters(), lr=0.05)  # the tables update themselves
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    with pytest.raises(ValueError, match="grouped kernel's stacked weights"):
        model.sparse_arch.table("c0")  # type: ignore[operator]
    plain = to_plain_kernel(model)  # raises when the copy differs beyond PARITY_ATOL
    assert plain.sparse_arch.is_plain  # type: ignore[union-attr]
    torch.jit.script(plain)


def test_tables_with_several_features_and_wrong_key_order_are_refused() -> None:
    table = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=3, feature_names=["a", "b"], pooling=PoolingType.SUM)
    with pytest.raises(ValueError, match=r"one feature per table; tables \['t'\]"):
        GroupedEmbeddingBags([table])
    tables = [
        EmbeddingBagConfig(name=f"t_{k}", embedding_dim=4, num_embeddings=3, feature_names=[k]) for k in ("a", "b")
    ]
    kjt = KeyedJaggedTensor(keys=["b", "a"], values=torch.tensor([0, 1]), lengths=torch.tensor([1, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="in table order"):
        GroupedEmbeddingBags(tables)(kjt)


def test_optimizer_state_round_trips_and_refuses_another_optimizer() -> None:
    schema = make_schema()
    _, grouped = pair(schema)
    weighted_loss(grouped(random_kjt(schema, batch=8)), [1.0] * len(schema.sparse)).backward()
    ebc = grouped.embedding_bag_collection
    assert isinstance(ebc, GroupedEmbeddingBags)
    state = ebc.optimizer_state_dict()
    assert state["optimizer"] == "adagrad" and all(float(a.abs().sum()) > 0 for a in state["accumulators"])
    _, fresh = pair(schema)
    fresh_ebc = fresh.embedding_bag_collection
    assert isinstance(fresh_ebc, GroupedEmbeddingBags)
    fresh_ebc.load_optimizer_state_dict(state)
    for g in range(ebc.num_groups):
        torch.testing.assert_close(fresh_ebc.accumulator(g), ebc.accumulator(g), rtol=0, atol=0)
    _, rowwise = pair(schema, fused_optimizer=FusedOptimizer.ROWWISE_ADAGRAD)
    with pytest.raises(ValueError, match="table optimizer is 'adagrad', this model's 'rowwise_adagrad'"):
        rowwise.embedding_bag_collection.load_optimizer_state_dict(state)  # type: ignore[operator]



def test_optimizer_state_of_fewer_groups_is_refused() -> None:
    _, grouped = pair(make_schema())
    ebc = grouped.embedding_bag_collection
    assert isinstance(ebc, GroupedEmbeddingBags) and ebc.num_groups == 2
    state = ebc.optimizer_state_dict()
    with pytest.raises(ValueError, match="optimizer state is for other tables"):
        ebc.load_optimizer_state_dict({**state, "accumulators": state["accumulators"][:1]})
