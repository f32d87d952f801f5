"""Tests of the baselines: uniform dims and the Mixed-Dimension-Embeddings power rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embeddings import (
    DimensionAlignmentWarning,
    DimensionPlan,
    DimensionPlanError,
    budget_of,
    mde_dims,
    mde_plan,
    uniform_plan,
)
from recsys.data.schema import FeatureKind, FeatureSpec, Schema


def make_schema(sizes: dict[str, int] | None = None) -> Schema:
    sizes = sizes or {"user": 11, "genre": 101, "item": 1001, "city": 31}
    sparse = tuple(FeatureSpec(n, num_embeddings=s) for n, s in sizes.items())
    return Schema(features=(*sparse, FeatureSpec("price", kind=FeatureKind.DENSE)), name="toy")


def test_uniform_plan_is_the_schema_at_that_dim() -> None:
    schema = make_schema()
    plan = uniform_plan(schema, 16)
    assert plan.apply(schema) == schema.with_uniform_dim(16)
    assert plan.method == "uniform" and plan.dataset == "toy" and plan.num_parameters() == 16 * (11 + 101 + 1001 + 31)
    assert budget_of(schema, 16) == 16 * 1144 and budget_of(schema, 8) == 8 * 1144
    with pytest.warns(DimensionAlignmentWarning, match=r"uniform plan \(every feature\): embedding dim 6 .* 8") as record:
        assert uniform_plan(schema, 6).dims == dict.fromkeys(schema.sparse_names, 8)
    assert len(record) == 1 and record[0].filename == __file__  # one warning, at the caller's line
    with pytest.raises(DimensionPlanError, match="must be >= 1"):
        uniform_plan(schema, 0)


def test_mde_dims_power_rule() -> None:
    # lambda * n^-alpha, rounded to the nearest multiple of 4, clipped to [4, max_dim]
    dims = mde_dims({"a": 1, "b": 16, "c": 10_000}, lam=40.0, alpha=0.5, max_dim=32)
    assert dims == {"a": 32, "b": 12, "c": 4}  # 40 -> clip 32; 10 -> 12; 0.4 -> clip 4
    assert mde_dims({"a": 1, "b": 10_000}, lam=20.0, alpha=0.0, max_dim=64) == {"a": 20, "b": 20}  # alpha 0: uniform


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_mde_meets_the_budget_and_shrinks_large_vocabularies(fraction: float, alpha: float) -> None:
    schema = make_schema()
    budget = int(budget_of(schema, 16) * fraction)
    plan = mde_plan(schema, budget=budget, alpha=alpha)
    params = plan.num_parameters(schema)
    assert params <= budget
    assert all(d % 4 == 0 and 4 <= d <= 64 for d in plan.dims.values())
    by_size = sorted(schema.sparse, key=lambda f: f.num_embeddings or 0)
    dims = [plan.dims[f.name] for f in by_size]
    assert dims == sorted(dims, reverse=True)  # more rows -> never a larger dim
    # the top-up leaves less than one step of the smallest table unspent (unless capped)
    if any(d < 64 for d in dims):
        assert budget - params < 4 * 1144
    assert plan.method == "mde" and plan.config["budget"] == budget and plan.config["alpha"] == alpha


def test_mde_gives_smaller_dims_to_larger_vocabularies() -> None:
    schema = make_schema()
    plan = mde_plan(schema, budget=budget_of(schema, 16) // 2, alpha=0.3)
    assert plan.dims["user"] > plan.dims["genre"] > plan.dims["item"]
    assert plan.num_parameters(schema) <= budget_of(schema, 16) // 2


def test_mde_edges() -> None:
    schema = make_schema()
    floor = 4 * 1144
    assert mde_plan(schema, budget=floor).dims == dict.fromkeys(schema.sparse_names, 4)
    assert mde_plan(schema, budget=10**9, max_dim=32).dims == dict.fromkeys(schema.sparse_names, 32)
    with pytest.raises(DimensionPlanError, match=rf"budget={floor - 1} .*smaller than one dim of 4 per feature.*needs {floor}"):
        mde_plan(schema, budget=floor - 1)
    with pytest.raises(DimensionPlanError, match="alpha must be in"):
        mde_plan(schema, budget=10**6, alpha=1.5)
    with pytest.raises(DimensionPlanError, match="max_dim must be a positive multiple of 4"):
        mde_plan(schema, budget=10**6, max_dim=30)
    with pytest.raises(DimensionPlanError, match="num_embeddings is unknown"):
        mde_plan(Schema((FeatureSpec("user"),)), budget=10**6)


def test_mde_plan_round_trips(tmp_path) -> None:  # noqa: ANN001
    schema = make_schema()
    plan = mde_plan(schema, budget=budget_of(schema, 16) // 2)
    back = DimensionPlan.load(plan.save(tmp_path / "mde.yaml"))
    assert back.dims == plan.dims and back.config == plan.config and back.num_parameters() == plan.num_parameters(schema)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 5000), min_size=1, max_size=6),
    fraction=st.floats(0.05, 3.0),
    alpha=st.floats(0.0, 1.0),
)
def test_mde_budget_property(sizes: list[int], fraction: float, alpha: float) -> None:
    schema = make_schema({f"f{i}": s for i, s in enumerate(sizes)})
    budget = max(int(budget_of(schema, 16) * fraction), 4 * sum(sizes))
    plan = mde_plan(schema, budget=budget, alpha=alpha)
    assert plan.num_parameters(schema) <= budget
    pairs = sorted((s, plan.dims[f"f{i}"]) for i, s in enumerate(sizes))
    assert all(d1 >= d2 for (s1, d1), (s2, d2) in zip(pairs, pairs[1:]) if s1 < s2)
