"""``salience compress``'s byte-budget search on a planted score, and its budget parsing."""

from __future__ import annotations

import pytest

from embeddings.compression.precision import parse_budget, search_precisions, uniform_bytes
from recsys.data.encoders import Preprocessor
from recsys.export.quantize import Precision, PrecisionError, PrecisionPlan, embedding_bytes
from recsys.models.base import SparseArch
from tests.recsys.export.test_export import make_frame, make_schema

# planted validation-AUC loss of each (table, precision): user is fragile, item robust
LOSS = {
    "t_user": {"fp32": 0.0, "fp16": 0.0, "int8": 0.02, "int4": 0.05},
    "t_item": {"fp32": 0.0, "fp16": 0.0, "int8": 0.0001, "int4": 0.0002},
    "t_site": {"fp32": 0.0, "fp16": 0.0, "int8": 0.0005, "int4": 0.004},
    "t_genres": {"fp32": 0.0, "fp16": 0.0, "int8": 0.0001, "int4": 0.0003},
}


@pytest.fixture(scope="module")
def arch() -> SparseArch:
    return SparseArch(Preprocessor(make_schema()).fit(make_frame()).fitted_schema)  # dims user 8, item 4, site 12, genres 4


def _score(plan: PrecisionPlan) -> float:
    return 0.8 - sum(LOSS[t][p.value] for t, p in plan.tables.items())


def test_greedy_search_fits_the_budget_and_spends_the_loss_where_it_is_cheapest(arch: SparseArch) -> None:
    fp32 = embedding_bytes(arch)
    budget = int(0.45 * fp32)
    result = search_precisions(arch, budget, _score)
    assert result.bytes == embedding_bytes(arch, result.plan) <= budget
    assert result.fp32_bytes == fp32 and result.fp32_val_auc == pytest.approx(0.8)
    assert result.val_auc == pytest.approx(_score(result.plan))
    # the robust item table (41 rows) goes to int4 while the fragile user table stays at fp16
    assert result.plan.tables["t_item"] is Precision.INT4
    assert result.plan.tables["t_user"] is Precision.FP16
    # and it stopped once inside the budget: undoing the last step would not fit
    assert result.trace[-2]["bytes"] > budget
    # every step saved bytes and the trace ends at the plan
    assert [s["bytes"] for s in result.trace] == sorted((s["bytes"] for s in result.trace), reverse=True)
    assert result.trace[-1]["bytes"] == result.bytes
    # a budget above fp32 changes nothing
    assert search_precisions(arch, fp32, _score).plan.is_fp32


def test_a_budget_below_the_smallest_model_says_the_minimum(arch: SparseArch) -> None:
    lowest = PrecisionPlan({"t_user": Precision.INT4, "t_item": Precision.INT4, "t_site": Precision.INT4,
                            "t_genres": Precision.INT4})
    minimum = embedding_bytes(arch, lowest)
    with pytest.raises(PrecisionError, match=rf"below the smallest model these tables allow: {minimum:,} bytes"):
        search_precisions(arch, minimum - 1, _score)
    assert search_precisions(arch, minimum, _score).plan == lowest


def test_budget_forms(arch: SparseArch) -> None:
    ref = uniform_bytes(arch.schema)
    assert ref == sum(int(f.num_embeddings or 0) for f in arch.schema.sparse) * 16 * 4
    assert parse_budget("0.1x", ref) == int(0.1 * ref)
    assert parse_budget("2MB", ref) == 2_000_000 and parse_budget("500 kb", ref) == 500_000
    for bad in ("ten", "0x", "-1MB", "3 parsecs"):
        with pytest.raises(ValueError, match="--budget"):
            parse_budget(bad, ref)


def test_a_tolerance_undoes_the_steps_that_lose_more_and_goes_as_far_as_it_allows(arch: SparseArch) -> None:
    """With 0.0011 of validation AUC to lose: item and genres go to int4 (0.0002 + 0.0003), the
    site table to int8 (0.0005; its int4 step would lose 0.004), the fragile user table stays at
    fp16 (int8 costs 0.02); the undone steps are in the trace and the plan stays within."""
    result = search_precisions(arch, None, _score, tolerance=0.0011)
    assert result.plan.tables == {"t_user": Precision.FP16, "t_item": Precision.INT4, "t_site": Precision.INT8,
                                  "t_genres": Precision.INT4}
    assert result.val_auc >= 0.8 - 0.0011 and result.val_auc == pytest.approx(_score(result.plan))
    undone = {s["table"]: s["precision"] for s in result.trace if s.get("undone")}
    assert undone == {"t_user": "int8", "t_site": "int4"}
    assert all(s["val_auc"] < 0.8 - 0.0011 for s in result.trace if s.get("undone"))
    assert result.bytes == embedding_bytes(arch, result.plan)
    # a budget the tolerance cannot reach is left unmet (the caller compares), never overspent in AUC
    both = search_precisions(arch, embedding_bytes(arch, PrecisionPlan(dict.fromkeys(result.plan.tables, Precision.INT4))),
                             _score, tolerance=0.0011)
    assert both.plan == result.plan and both.bytes > both.budget
    # zero tolerance: only the free fp16 steps
    assert set(search_precisions(arch, None, _score, tolerance=0.0).plan.tables.values()) <= {Precision.FP16, Precision.FP32}
    with pytest.raises(ValueError, match="budget"):
        search_precisions(arch, None, _score)


def test_uniform_plans_step_back_where_a_dim_does_not_allow_the_precision(arch: SparseArch) -> None:
    from embeddings.compression.precision import uniform_plan

    dims = {c.name: c.embedding_dim for c in arch.embedding_bag_collection.embedding_bag_configs()}
    assert uniform_plan(arch, "int4").tables == {t: Precision.INT4 for t in dims}  # 8, 4, 12, 4: all divisible by 4
    # int8 on a dim-4 row is as large as fp16 (4 bytes of scale and bias): those tables stay at fp16
    assert uniform_plan(arch, "int8").tables == {t: Precision.FP16 if d == 4 else Precision.INT8 for t, d in dims.items()}
    assert uniform_plan(arch, "fp32").is_fp32
