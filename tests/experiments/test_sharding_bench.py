"""Smoke test of the sharding benchmark: ``--quick`` runs the three arms end to end (one
spawned process, then two 2-process gloo groups) at tiny sizes.

The throughput numbers of a quick run are meaningless; the memory accounting is exact and is
checked: the shards of the 2-process arms add up to the single process's tables byte for byte,
and row-wise gives each process about half of them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.benchmarks import sharding

SHARDED = ("table_wise", "row_wise")


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("sharding")
    assert sharding.main(["--quick", "--output-dir", str(out)]) == 0
    return json.loads((out / "sharding.json").read_text()), out


def test_quick_run_writes_the_three_arms_with_positive_throughput(quick_result: tuple[dict, Path]) -> None:
    result, out = quick_result
    assert result["benchmark"] == "sharding" and result["quick"] is True and "--quick" in result["command"]
    assert set(result["arms"]) == {"single", "table_wise", "row_wise"}
    assert result["arms"]["single"]["processes"] == 1 and result["arms"]["single"]["threads_per_process"] == [1, 2]
    for arm in SHARDED:
        assert result["arms"][arm]["processes"] == 2 and result["arms"][arm]["threads_per_process"] == [1]
        assert {p["type"] for p in result["arms"][arm]["plan"].values()} == {arm}
    for arm, block in result["arms"].items():
        for key, rates in block["samples_per_s"].items():
            assert len(rates) == result["config"]["repeats"], (arm, key)
            assert all(math.isfinite(r) and r > 0 for r in rates), (arm, key, rates)
        assert math.isfinite(block["final_loss"])
    assert len(result["table"]) == 4  # single x {1, 2} threads, table_wise, row_wise
    markdown = (out / "sharding.md").read_text()
    assert all(f"| {arm} |" in markdown for arm in result["arms"])


def test_shards_split_the_single_process_tables_exactly(quick_result: tuple[dict, Path]) -> None:
    result, _ = quick_result
    arms, model = result["arms"], result["model"]
    single = arms["single"]["memory"]
    # the single process holds every table: rows x dim x 4 B, and one fp32 of row-wise Adagrad state per row
    assert single["embedding_weight_bytes_max"] == model["embedding_weight_bytes"]
    assert single["optimizer_state_bytes_max"] == model["optimizer_state_bytes"]
    for arm in SHARDED:
        per_rank = arms[arm]["memory"]["per_rank"]
        weights = [p["embedding_weight_bytes"] for p in per_rank]
        assert len(weights) == 2
        assert all(0 < w < single["embedding_weight_bytes_max"] for w in weights), (arm, weights)
        assert sum(weights) == single["embedding_weight_bytes_max"], arm
        assert sum(p["optimizer_state_bytes"] for p in per_rank) == single["optimizer_state_bytes_max"], arm
        assert sum(p["embedding_rows"] for p in per_rank) == model["embedding_rows"], arm
        assert result["checks"]["sharded_weight_bytes_sum_to_single"][arm] is True
    shares = result["ratios"]["embedding_weight_bytes_per_rank_vs_single"]["row_wise"]
    assert shares == [pytest.approx(0.5, rel=0.05)] * 2
    # row-wise: every table on both processes; table-wise: each table on exactly one
    assert all(len(p["tables"]) == 26 for p in arms["row_wise"]["memory"]["per_rank"])
    table_wise = [set(p["tables"]) for p in arms["table_wise"]["memory"]["per_rank"]]
    assert not table_wise[0] & table_wise[1] and len(table_wise[0] | table_wise[1]) == 26
