"""Tests of :class:`embeddings.DimensionPlan`: exact parameter counts, the alignment policy,
bad input, file round trips, configs, MLflow, and mixed-dim models that train with the plain
and the FBGEMM-fused kernel."""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from embeddings import (
    DimensionAlignmentWarning,
    DimensionPlan,
    DimensionPlanError,
    FrequencyBlock,
    align_dim,
    check_budget,
    min_budget,
)
from recsys.data.batching import random_batch
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.models import DLRM, DCNv2, DeepFM
from recsys.models.backbone import Backbone
from recsys.models.base import EmbeddingKernel, SparseArchConfig


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread avoids barrier waits on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_schema() -> Schema:
    """Hand-countable: tables of 10, 50 (multi-hot) and 200 rows at dim 16; two dense."""
    return Schema(
        features=(
            FeatureSpec("user", num_embeddings=10),
            FeatureSpec("genre", kind=FeatureKind.MULTI_CATEGORICAL, num_embeddings=50),
            FeatureSpec("item", num_embeddings=200),
            FeatureSpec("price", kind=FeatureKind.DENSE),
            FeatureSpec("age", kind=FeatureKind.DENSE),
        ),
        name="toy",
    )


# -- alignment policy ----------------------------------------------------------------------------


def test_align_dim() -> None:
    assert [align_dim(d) for d in (1, 3, 4, 5, 8, 9, 63, 64)] == [4, 4, 4, 8, 8, 12, 64, 64]


def test_non_multiple_of_4_is_rounded_up_with_a_warning_naming_the_feature() -> None:
    with pytest.warns(DimensionAlignmentWarning, match=r"feature 'item'.*dim 6 .*rounded up to 8") as record:
        plan = DimensionPlan({"user": 8, "item": 6})
    assert plan.dims == {"user": 8, "item": 8}
    assert len(record) == 1 and record[0].filename == __file__  # points at the caller's line
    with pytest.warns(DimensionAlignmentWarning, match=r"feature 'item', block 1 \[100, None\).*dim 5"):
        blocked = DimensionPlan(blocks={"item": [(0, 100, 16), (100, None, 5)]})
    assert [b.dim for b in blocked.blocks["item"]] == [16, 8]
    with pytest.warns(DimensionAlignmentWarning, match=r"cluster 1, feature 'user'"):
        DimensionPlan(clusters={0: {"user": 4}, 1: {"user": 2}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # aligned dims warn about nothing
        DimensionPlan({"user": 4, "item": 64})


@pytest.mark.parametrize("bad", [0, -4, 2.5, "8", True, None])
def test_bad_dims_are_refused_naming_the_feature(bad: object) -> None:
    with pytest.raises(DimensionPlanError, match="feature 'item'"):
        DimensionPlan({"user": 8, "item": bad})  # type: ignore[dict-item]


# -- parameter counts ----------------------------------------------------------------------------


def test_exact_parameter_counts_by_hand() -> None:
    schema = make_schema()
    plan = DimensionPlan({"user": 8, "genre": 4, "item": 12})
    assert plan.parameters_per_feature(schema) == {"user": 80, "genre": 200, "item": 2400}
    assert plan.num_parameters(schema) == 80 + 200 + 2400
    # a partial plan: unplanned features keep the schema's dim (16)
    assert DimensionPlan({"item": 4}).num_parameters(schema) == 10 * 16 + 50 * 16 + 200 * 4
    # blocks: range size x block dim; stop=None runs to the end of the table (200 rows)
    blocked = DimensionPlan({"user": 8}, blocks={"item": [(0, 20, 32), FrequencyBlock(20, 120, 8), {"start": 120, "stop": None, "dim": 4}]})
    assert blocked.dims["item"] == 32  # the feature's width is its widest block
    assert blocked.parameters_per_feature(schema)["item"] == 20 * 32 + 100 * 8 + 80 * 4
    assert blocked.num_parameters(schema) == 80 + 50 * 16 + 20 * 32 + 100 * 8 + 80 * 4
    # clusters: one model per cluster, every one counted
    clustered = DimensionPlan(clusters={0: {"user": 4, "genre": 4, "item": 8}, 1: {"user": 16, "genre": 4, "item": 4}})
    assert clustered.dims == {"user": 16, "genre": 4, "item": 8}
    assert clustered.cluster_parameters(schema) == {0: 40 + 200 + 1600, 1: 160 + 200 + 800}
    assert clustered.num_parameters(schema) == 40 + 200 + 1600 + 160 + 200 + 800
    # without a schema: the sizes recorded in the plan
    recorded = DimensionPlan.from_schema(schema)
    assert recorded.num_parameters() == 260 * 16 == recorded.num_parameters(schema)
    with pytest.raises(DimensionPlanError, match=r"table sizes of \['user'\] are unknown"):
        DimensionPlan({"user": 8}).num_parameters()


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_count_matches_the_built_model(kernel: str) -> None:
    schema = make_schema()
    plan = DimensionPlan({"user": 8, "genre": 4, "item": 12})
    model = DCNv2(plan.apply(schema), SparseArchConfig(kernel=EmbeddingKernel(kernel)), cross_layers=1, deep_mlp=[8])
    assert model.embedding_parameters() == plan.num_parameters(schema) == 2680
    assert model.embedding_dims == [8, 4, 12]


# -- bad input against a schema ------------------------------------------------------------------


def test_plan_naming_unknown_or_dense_features_is_refused() -> None:
    schema = make_schema()
    with pytest.raises(DimensionPlanError, match=r"features \['movie'\] that the schema lacks"):
        DimensionPlan({"user": 8, "movie": 8}).apply(schema)
    with pytest.raises(DimensionPlanError, match=r"dense features \['price'\]"):
        DimensionPlan({"price": 8}).num_parameters(schema)


def test_blocks_must_be_contiguous_and_cover_the_table() -> None:
    with pytest.raises(DimensionPlanError, match=r"'item', block 1.*should start at 100"):
        DimensionPlan(blocks={"item": [(0, 100, 8), (120, None, 4)]})
    with pytest.raises(DimensionPlanError, match=r"'item', block 0.*should start at 0"):
        DimensionPlan(blocks={"item": [(5, None, 8)]})
    with pytest.raises(DimensionPlanError, match=r"only the last block may have stop=None"):
        DimensionPlan(blocks={"item": [(0, None, 8), (100, 200, 4)]})
    with pytest.raises(DimensionPlanError, match=r"'item': an empty list"):
        DimensionPlan(blocks={"item": []})
    with pytest.raises(DimensionPlanError, match=r"'item'.*dims says 8 but its largest block dim is 16"):
        DimensionPlan({"item": 8}, blocks={"item": [(0, 10, 16), (10, None, 4)]})
    short = DimensionPlan(blocks={"item": [(0, 100, 8), (100, 150, 4)]})
    with pytest.raises(DimensionPlanError, match=r"'item': its blocks end at id 150 but its table has 200 rows"):
        short.num_parameters(make_schema())


def test_cluster_errors() -> None:
    with pytest.raises(DimensionPlanError, match=r"cluster 1: it names no feature"):
        DimensionPlan(clusters={0: {"user": 4}, 1: {}})
    with pytest.raises(DimensionPlanError, match=r"cluster\(s\) \[1\] ended up empty"):
        DimensionPlan(clusters={0: {"user": 4}, 1: {"user": 8}}, cluster_sizes={0: 10, 1: 0})
    with pytest.raises(DimensionPlanError, match=r"every cluster model needs a dim for every feature"):
        DimensionPlan(clusters={0: {"user": 4}, 1: {"item": 8}})
    with pytest.raises(DimensionPlanError, match=r"not both"):
        DimensionPlan(blocks={"item": [(0, None, 8)]}, clusters={0: {"user": 4}})
    with pytest.raises(DimensionPlanError, match="empty dimension plan"):
        DimensionPlan()
    plan = DimensionPlan(clusters={0: {"user": 4, "item": 8}, 1: {"user": 12, "item": 4}})
    schema = make_schema()
    assert plan.apply_cluster(schema, 1)["user"].embedding_dim == 12
    assert plan.apply(schema)["user"].embedding_dim == 12 and plan.apply(schema)["item"].embedding_dim == 8
    with pytest.raises(DimensionPlanError, match=r"cluster 7 is not in the plan"):
        plan.apply_cluster(schema, 7)


def test_budget_below_one_dim_per_feature_is_refused() -> None:
    schema = make_schema()
    assert min_budget(schema) == 4 * 260
    assert check_budget(schema, 1040) == 1040
    with pytest.raises(DimensionPlanError, match=r"budget=1039 .* needs 1040 \(user: 4 x 10, genre: 4 x 50, item: 4 x 200\)"):
        check_budget(schema, 1039)
    with pytest.raises(DimensionPlanError, match="num_embeddings is unknown"):
        check_budget(Schema((FeatureSpec("user"),)), 10_000)


# -- schema, configs -----------------------------------------------------------------------------


def test_apply_sets_dims_and_keeps_the_rest() -> None:
    schema = make_schema()
    out = DimensionPlan({"item": 4}).apply(schema)
    assert [f.embedding_dim for f in out.sparse] == [16, 16, 4]
    assert out.names == schema.names and out["item"].num_embeddings == 200


def test_config_overrides_and_config(tmp_path: Path) -> None:
    plan = DimensionPlan({"user": 8, "item": 4})
    (arg,) = plan.to_config_overrides()
    assert arg.startswith("--data.embedding_dims=") and json.loads(arg.split("=", 1)[1]) == {"user": 8, "item": 4}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {backbone: {class_path: recsys.models.DCNv2}}\ndata:\n  batch_size: 8\n  embedding_dims: {genre: 12, item: 16}\n")
    out = plan.to_config(cfg)
    assert out["data"] == {"batch_size": 8, "embedding_dims": {"genre": 12, "item": 4, "user": 8}}
    assert out["model"] == {"backbone": {"class_path": "recsys.models.DCNv2"}}


# -- files ---------------------------------------------------------------------------------------


def _rich_plans() -> list[DimensionPlan]:
    return [
        DimensionPlan({"user": 8, "genre": 4}, blocks={"item": [(0, 20, 32), (20, None, 4)]}, method="dnis", dataset="toy",
                      num_embeddings={"user": 10, "genre": 50, "item": 200},
                      config={"budget": 3000, "threshold": 0.5}, extras={"mask": [[1.0, float("nan")]]}),
        DimensionPlan(clusters={0: {"user": 4, "item": 8}, 3: {"user": 12, "item": 4}}, cluster_sizes={0: 7, 3: 5}, method="ihas"),
    ]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_save_load_round_trip(tmp_path: Path, suffix: str) -> None:
    schema = make_schema()
    for i, plan in enumerate(_rich_plans()):
        path = plan.save(tmp_path / f"plan{i}{suffix}")
        assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temporary file
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a saved plan is aligned: loading warns about nothing
            back = DimensionPlan.load(path)
        assert back.dims == plan.dims and back.blocks == plan.blocks and back.clusters == plan.clusters
        assert back.cluster_sizes == plan.cluster_sizes and back.method == plan.method
        assert back.num_parameters(schema) == plan.num_parameters(schema)
        assert back.to_dict() == plan.to_dict()
    text = (tmp_path / f"plan0{suffix}").read_text()
    assert "format_version" in text and "null" in text  # NaN stored as null


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        DimensionPlan.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DimensionPlanError, match=r"bad.json.*invalid JSON"):
        DimensionPlan.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"features": []}')
    with pytest.raises(DimensionPlanError, match=r"not a dimension plan"):
        DimensionPlan.load(tmp_path / "other.json")
    (tmp_path / "typo.yaml").write_text("dims: {user: 8}\nmethd: x\n")
    with pytest.raises(DimensionPlanError, match=r"unknown keys \['methd'\]"):
        DimensionPlan.load(tmp_path / "typo.yaml")
    (tmp_path / "new.json").write_text('{"format_version": 99, "dims": {"user": 8}}')
    with pytest.raises(DimensionPlanError, match=r"format 99 is newer"):
        DimensionPlan.load(tmp_path / "new.json")
    (tmp_path / "user.yaml").write_text("dims: {user: 8, item: 0}\n")
    with pytest.raises(DimensionPlanError, match=r"user.yaml: feature 'item': embedding dim must be >= 1"):
        DimensionPlan.load(tmp_path / "user.yaml")
    (tmp_path / "odd.yaml").write_text("dims: {user: 8, item: 10}\n")  # a hand-written plan
    with pytest.warns(DimensionAlignmentWarning, match="'item'"):
        assert DimensionPlan.load(tmp_path / "odd.yaml").dims["item"] == 12


# -- rendering, MLflow ---------------------------------------------------------------------------


def test_plot_and_format() -> None:
    import matplotlib.pyplot as plt

    schema = make_schema()
    plan, clustered = _rich_plans()
    fig = plan.plot(schema)
    assert len(fig.axes[0].patches) == 3
    assert "1,640 embedding parameters" in fig.axes[0].get_title()  # 10 x 8 + 50 x 4 + 20 x 32 + 180 x 4
    plt.close(fig)
    fig = clustered.plot()  # no sizes known: still plots, without a count
    assert len(fig.axes[0].patches) == 4
    plt.close(fig)
    text = plan.format(schema)
    assert "[0,20):32 [20,):4" in text and f"total embedding parameters: {plan.num_parameters(schema)}" in text


def test_to_mlflow_logs_plan_plot_and_parameters(tmp_cwd: Path) -> None:
    from mlflow import MlflowClient

    from recsys.tracking import RunTracker

    schema = make_schema()
    plan = DimensionPlan({"user": 8, "genre": 4, "item": 12}, method="manual")
    tracker = RunTracker("toy", "dims-toy")
    plan.to_mlflow(tracker, schema)
    tracker.finish()
    client = MlflowClient(tracker.uri)
    names = {a.path for a in client.list_artifacts(tracker.run_id, "dims/manual")}
    assert names == {"dims/manual/plan.json", "dims/manual/plan.txt", "dims/manual/dims.png"}
    assert client.get_run(tracker.run_id).data.metrics["embedding_parameters"] == 2680
    local = client.download_artifacts(tracker.run_id, "dims/manual/plan.json", str(tmp_cwd))
    assert DimensionPlan.load(local).dims == plan.dims


# -- mixed-dim models train with both kernels ----------------------------------------------------

BACKBONES: dict[str, Backbone] = {
    "dcnv2": functools.partial(DCNv2, cross_layers=1, deep_mlp=[8]),
    "deepfm": functools.partial(DeepFM, deep_mlp=[8]),
    "dlrm": functools.partial(DLRM, bottom_mlp=[8, 8], top_mlp=[8]),
}


@pytest.mark.parametrize("kernel", ["plain", "fused"])
@pytest.mark.parametrize("arch", sorted(BACKBONES))
def test_mixed_dim_model_trains(arch: str, kernel: str) -> None:
    torch.manual_seed(0)
    schema = DimensionPlan({"user": 4, "genre": 8, "item": 12}).apply(make_schema())
    model = BACKBONES[arch](schema, SparseArchConfig(kernel=EmbeddingKernel(kernel), fused_lr=0.1))
    assert model.embedding_dims == [4, 8, 12]
    batch = random_batch(schema, 32, seed=1)
    tables = {k: v.detach().clone() for k, v in model.sparse_arch.embedding_bag_collection.state_dict().items()}
    optimizer = torch.optim.Adam(model.dense_parameters(), lr=0.05)
    losses = []
    for _ in range(8):  # the same batch: the loss must fall
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch.dense_features, batch.sparse_features), batch.labels)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    after = model.sparse_arch.embedding_bag_collection.state_dict()
    assert all(not torch.equal(tables[k], after[k]) for k in tables)  # every table was updated


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_plan_files_written_before_the_shared_helper_still_load(tmp_path: Path, suffix: str) -> None:
    """The exact bytes the old ``DimensionPlan.save`` wrote load to the same plan; JSON plans
    are written byte for byte as before."""
    import yaml

    for i, plan in enumerate(_rich_plans()):
        old = tmp_path / f"old{i}{suffix}"
        if suffix == ".json":
            old.write_text(json.dumps(plan.to_dict(), indent=2, allow_nan=False) + "\n")
        else:
            old.write_text(yaml.safe_dump(plan.to_dict(), sort_keys=False))
        assert DimensionPlan.load(old).to_dict() == plan.to_dict()
        assert plan.save(tmp_path / f"new{i}{suffix}").read_bytes() == old.read_bytes()
