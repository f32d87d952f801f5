"""Frequency-blocked embedding tables (one table per (feature, id range), own dim).

Reference: a full D_f table whose rows in block b are zero beyond column d_b gives the same
pooled embedding as the blocked lookup (zero-padded per-block bags summed, / length for mean).
Tolerance 1e-6: the same float32 sums in another order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.encoders import Preprocessor
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.export import ServingModule, check_parity_in_fresh_process, export_model, synthetic_inputs
from recsys.models.archs import DLRM, DCNv2, DeepFM
from recsys.models.base import RankingModel, SparseArch, SparseArchConfig
from recsys.models.blocked import check_blocks

ATOL = 1e-6
# a: single-hot, 3 blocks; b: multi-hot, 2 blocks (last to the end); c: not blocked
BLOCKS = {"a": [[0, 3, 8], [3, 10, 4], [10, -1, 4]], "b": [[0, 5, 8], [5, None, 4]]}


def make_schema() -> Schema:
    return Schema(
        features=(
            FeatureSpec("a", embedding_dim=8, num_embeddings=23),
            FeatureSpec("b", kind=FeatureKind.MULTI_CATEGORICAL, embedding_dim=8, num_embeddings=12),
            FeatureSpec("c", embedding_dim=4, num_embeddings=6),
            FeatureSpec("x0", kind=FeatureKind.DENSE),
        )
    )


def make_kjt(batch: int = 9, seed: int = 0) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    la = torch.ones(batch, dtype=torch.int32)
    lb = torch.randint(0, 5, (batch,), generator=g, dtype=torch.int32)
    lb[0] = 0  # an empty bag
    lc = torch.ones(batch, dtype=torch.int32)
    va = torch.randint(0, 23, (batch,), generator=g)
    va[:3] = torch.tensor([0, 3, 22])  # block edges
    vb = torch.randint(0, 12, (int(lb.sum()),), generator=g)
    vc = torch.randint(0, 6, (batch,), generator=g)
    return KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.cat([va, vb, vc]), lengths=torch.cat([la, lb, lc]))


def reference(arch: SparseArch, schema: Schema, kjt: KeyedJaggedTensor, mean: bool) -> dict[str, torch.Tensor]:
    """Plain PyTorch: per feature one full D_f table assembled from the block tables (rows of a
    narrow block zero-padded), then an EmbeddingBag."""
    state = arch.embedding_bag_collection.state_dict()
    weights = {k.removeprefix("embedding_bags.t_").removesuffix(".weight"): v for k, v in state.items()}
    out = {}
    for f in schema.sparse:
        if f.name in arch.blocks:
            full = torch.zeros(int(f.num_embeddings or 0), f.embedding_dim)
            for i, (start, stop, dim) in enumerate(arch.blocks[f.name]):
                full[start:stop, :dim] = weights[f"{f.name}@{i}"]
        else:
            full = weights[f.name]
        jt = kjt[f.name]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), jt.lengths().long().cumsum(0)])
        out[f.name] = torch.nn.functional.embedding_bag(jt.values(), full, offsets[:-1], mode="mean" if mean else "sum")
    return out


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_blocked_lookup_matches_a_zero_padded_full_table(pooling: str) -> None:
    schema = make_schema()
    torch.manual_seed(0)
    arch = SparseArch(schema, SparseArchConfig(pooling=pooling, blocks=BLOCKS))
    assert set(arch.embedding_bag_collection.embedding_bags) == {"t_a@0", "t_a@1", "t_a@2", "t_b@0", "t_b@1", "t_c"}
    with torch.no_grad():  # non-zero OOV rows too, so the check sees every row
        for p in arch.parameters():
            p.add_(torch.randn_like(p))
    for seed in range(3):
        kjt = make_kjt(seed=seed)
        got, ref = arch(kjt), reference(arch, schema, kjt, pooling == "mean")
        assert list(got) == ["a", "b", "c"]
        for name in ref:
            assert got[name].shape == ref[name].shape
            torch.testing.assert_close(got[name], ref[name], atol=ATOL, rtol=0)


def test_oov_row_zero_only_in_block_zero_and_parameters_exact() -> None:
    schema = make_schema()
    arch = SparseArch(schema, SparseArchConfig(blocks=BLOCKS))
    bags = arch.embedding_bag_collection.embedding_bags
    assert float(bags["t_a@0"].weight[0].detach().abs().sum()) == 0 and float(bags["t_b@0"].weight[0].detach().abs().sum()) == 0
    assert float(bags["t_a@1"].weight[0].detach().abs().sum()) > 0  # id 3: an ordinary id
    expected = 3 * 8 + 7 * 4 + 13 * 4 + 5 * 8 + 7 * 4 + 6 * 4
    assert arch.num_parameters() == expected


def test_plan_parameter_count_matches_the_model() -> None:
    from embeddings.plan import DimensionPlan

    schema = make_schema()
    plan = DimensionPlan({"c": 4}, blocks={"a": [(0, 3, 8), (3, 10, 4), (10, None, 4)], "b": [(0, 5, 8), (5, None, 4)]})
    blocks = {n: [[b.start, b.stop, b.dim] for b in bl] for n, bl in plan.blocks.items()}
    model = DCNv2(plan.apply(schema), cross_layers=1, deep_mlp=[8], sparse_arch=SparseArchConfig(blocks=blocks))
    assert model.embedding_parameters() == plan.num_parameters(schema)


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ({"a": [[0, 3, 8], [4, -1, 4]]}, r"model\.embedding_blocks\.a\[1\].*gap"),
        ({"a": [[0, 5, 8], [4, -1, 4]]}, r"model\.embedding_blocks\.a\[1\].*overlap"),
        ({"a": [[0, 3, 8], [3, 20, 4]]}, r"model\.embedding_blocks\.a: the blocks end at id 20 .* 23 rows"),
        ({"a": [[0, 3, 8], [3, 30, 4]]}, r"model\.embedding_blocks\.a: the blocks end at id 30"),
        ({"a": [[0, -1, 8], [3, 30, 4]]}, r"model\.embedding_blocks\.a\[0\]: only the last block"),
        ({"zz": [[0, -1, 8]]}, r"model\.embedding_blocks: feature\(s\) \['zz'\]"),
        ({"x0": [[0, -1, 8]]}, r"model\.embedding_blocks: feature\(s\) \['x0'\]"),
        ({"a": [[0, 3, 4], [3, -1, 4]]}, r"model\.embedding_blocks\.a: the widest block has dim 4 .* embedding dim is 8"),
        ({"a": [[0, 3, 8], [3, -1, 0]]}, r"model\.embedding_blocks\.a\[1\]: dim must be >= 1"),
        ({"a": []}, r"model\.embedding_blocks\.a: needs a non-empty list"),
        ({"a": [[0, 3]]}, r"model\.embedding_blocks\.a\[0\]: a block is \[start, stop, dim\]"),
    ],
)
def test_bad_blocks_name_the_config_key(blocks: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_blocks(blocks, make_schema())


def test_fused_kernel_needs_aligned_block_dims() -> None:
    with pytest.raises(ValueError, match=r"model\.embedding_blocks\.a\[1\]: dim 2 is not a multiple of 4"):
        SparseArch(make_schema(), SparseArchConfig(kernel="fused", blocks={"a": [[0, 3, 8], [3, -1, 2]]}))  # type: ignore[arg-type]
    SparseArch(make_schema(), SparseArchConfig(blocks={"a": [[0, 3, 8], [3, -1, 2]]}))  # plain: any dim


def _models(kernel: str) -> dict[str, RankingModel]:
    cfg = SparseArchConfig(kernel=kernel, blocks=BLOCKS, fused_lr=0.1)  # type: ignore[arg-type]
    schema = make_schema()
    return {
        "dlrm": DLRM(schema, bottom_mlp=[8, 4], top_mlp=[8], sparse_arch=cfg),
        "dcnv2": DCNv2(schema, cross_layers=1, deep_mlp=[8], sparse_arch=cfg),
        "deepfm": DeepFM(schema, deep_mlp=[8], sparse_arch=cfg),
    }


@pytest.mark.parametrize("kernel", ["plain", "fused", "grouped"])
def test_blocked_models_train(kernel: str) -> None:
    torch.manual_seed(0)
    for name, model in _models(kernel).items():
        opt = torch.optim.Adam(model.dense_parameters(), lr=0.05)
        before = {k: v.clone() for k, v in model.sparse_arch.state_dict().items()}
        kjt, dense = make_kjt(32, seed=1), torch.randn(32, 1)
        labels = (torch.arange(32) % 2).float()
        losses = []
        for _ in range(8):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        after = model.sparse_arch.state_dict()
        assert losses[-1] < losses[0], (name, losses)
        moved = [k for k in before if k.endswith(("t_a@0.weight", "t_b@1.weight"))]
        assert len(moved) == 2 and all(not torch.equal(before[k], after[k]) for k in moved), name


@pytest.mark.parametrize("arch", ["dlrm", "dcnv2", "deepfm"])
def test_scripted_serving_module_matches_eager(arch: str) -> None:
    torch.manual_seed(0)
    model = _models("plain")[arch].eval()
    scripted = torch.jit.script(ServingModule(model))
    for batch, seed in ((1, 3), (7, 4), (50, 5)):
        values, lengths, dense = synthetic_inputs(model.schema, batch, 4, seed=seed)
        kjt = KeyedJaggedTensor(keys=model.sparse_names, values=torch.cat(values), lengths=torch.cat(lengths).to(torch.int32))
        with torch.no_grad():
            eager = torch.sigmoid(model(dense, kjt))
            got = scripted(values, lengths, dense)
        assert float((eager - got).abs().max()) <= ATOL


def test_export_and_fresh_process_parity(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 300
    frame = pd.DataFrame(
        {
            "user": [f"u{i}" for i in rng.integers(0, 40, n)],
            "genres": ["|".join(rng.choice([f"g{i}" for i in range(9)], rng.integers(0, 4), replace=False)) for _ in range(n)],
            "site": rng.choice(["a", "b", "c"], n),
            "score": rng.normal(0, 1, n),
            "click": rng.integers(0, 2, n),
        }
    )
    schema = Schema(
        (
            FeatureSpec("user", embedding_dim=8),
            FeatureSpec("genres", kind="multi_categorical", embedding_dim=8),
            FeatureSpec("site", embedding_dim=4),
            FeatureSpec("score", kind="dense"),
        ),
        label="click",
    )
    pre = Preprocessor(schema).fit(frame)
    torch.manual_seed(0)
    blocks = {"user": [[0, 10, 8], [10, -1, 4]], "genres": [[0, 4, 8], [4, -1, 4]]}
    model = DCNv2(pre.fitted_schema, cross_layers=1, deep_mlp=[8], sparse_arch=SparseArchConfig(blocks=blocks))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    model.eval()
    result = export_model(model, pre, tmp_path / "export")
    assert result.max_abs_diff <= ATOL
    batches = []
    for b, seed in ((3, 11), (41, 12)):
        values, lengths, dense = synthetic_inputs(model.schema, b, 5, seed=seed)
        from torchrec.datasets.utils import Batch

        kjt = KeyedJaggedTensor(keys=model.sparse_names, values=torch.cat(values), lengths=torch.cat(lengths))
        batches.append(Batch(dense_features=dense, sparse_features=kjt, labels=torch.zeros(b)))
    assert check_parity_in_fresh_process(result.output_dir, model, batches) <= ATOL


# -- a blocked DimensionPlan through `salience fit` ------------------------------------------------
def test_blocked_plan_overrides_and_config() -> None:
    import json

    from embeddings.plan import DimensionPlan

    plan = DimensionPlan({"c": 4}, blocks={"a": [(0, 3, 8), (3, None, 4)]})
    dims_arg, blocks_arg = plan.to_config_overrides()
    assert json.loads(dims_arg.split("=", 1)[1]) == {"c": 4, "a": 8}
    assert blocks_arg.startswith("--model.embedding_blocks=")
    assert json.loads(blocks_arg.split("=", 1)[1]) == {"a": [[0, 3, 8], [3, None, 4]]}
    backbone = {"class_path": "recsys.models.DLRM"}
    out = plan.to_config({"model": {"backbone": backbone, "embedding_blocks": {"c": [[0, -1, 8]], "b": [[0, -1, 8]]}}})
    assert out["model"] == {"backbone": backbone, "embedding_blocks": {"b": [[0, -1, 8]], "a": [[0, 3, 8], [3, None, 4]]}}
    assert "embedding_blocks" not in DimensionPlan({"c": 4}).to_config({"model": {"embedding_blocks": {"c": [[0, -1, 8]]}}})["model"]


@pytest.mark.parametrize("kernel", ["plain", "fused", "grouped"])
def test_blocked_plan_trains_through_the_recipe(tmp_cwd: Path, kernel: str) -> None:
    from embeddings.plan import DimensionPlan
    from recsys.train.recipe import Recipe
    from tests.selection.conftest import tiny_config

    config = tiny_config(n_rows=3000, epochs=1)
    config["model"]["embedding_kernel"] = kernel
    recipe = Recipe(config, workdir=tmp_cwd / "fits", quiet=True)
    schema = recipe.schema
    sparse = sorted(schema.sparse, key=lambda f: -int(f.num_embeddings or 0))[:2]
    assert all(int(f.num_embeddings or 0) >= 4 for f in sparse)
    blocks = {f.name: [(0, int(f.num_embeddings or 0) // 3, 12), (int(f.num_embeddings or 0) // 3, None, 4)] for f in sparse}
    plan = DimensionPlan({}, blocks=blocks)
    result = recipe.fit(extra_args=plan.to_config_overrides(), tracking=False)
    model = result.task.model
    assert model.embedding_parameters() == plan.num_parameters(schema) < sum(
        int(f.num_embeddings or 0) * (12 if f.name in blocks else f.embedding_dim) for f in schema.sparse
    )
    assert set(model.sparse_arch.blocks) == set(blocks)
    assert 0.0 < result.metrics["test_auc"] <= 1.0


def test_bad_blocks_through_the_cli_name_the_key(tmp_cwd: Path) -> None:
    from recsys.train.recipe import Recipe
    from tests.selection.conftest import tiny_config

    recipe = Recipe(tiny_config(n_rows=3000, epochs=1), workdir=tmp_cwd / "fits", quiet=True)
    name = recipe.schema.sparse[0].name
    with pytest.raises(ValueError, match=rf"model\.embedding_blocks\.{name}\[1\].*gap"):
        recipe.fit(extra_args=[f'--model.embedding_blocks={{"{name}": [[0, 1, 8], [2, -1, 8]]}}'], tracking=False)


def test_fused_blocked_model_exports_with_parity() -> None:
    """to_plain_kernel keeps the blocks: a fused blocked model converts and scripts with parity."""
    from recsys.export.serving import kjt_to_lists, to_plain_kernel

    torch.manual_seed(0)
    model = _models("fused")["dcnv2"].eval()
    plain = to_plain_kernel(model)
    assert not plain.sparse_arch.is_fused and plain.embedding_parameters() == model.embedding_parameters()
    kjt, dense = make_kjt(batch=11, seed=4), torch.randn(11, 1)
    values, lengths = kjt_to_lists(kjt, plain.sparse_names)
    scripted = torch.jit.script(ServingModule(plain))
    expected = torch.sigmoid(model(dense, kjt))
    torch.testing.assert_close(scripted(values, lengths, dense), expected, rtol=0, atol=ATOL)
