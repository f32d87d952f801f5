"""``salience compress``'s byte-budget search on a planted score, and its budget parsing."""

from __future__ import annotations

import pytest

from embeddings.compress import parse_budget, search_precisions, uniform_bytes
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
