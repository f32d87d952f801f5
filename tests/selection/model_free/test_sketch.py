"""Sketches of streamed columns: HyperLogLog error and merging, Misra-Gries guarantees."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from selection.model_free.sketch import HyperLogLog, MisraGries, hash_values


@pytest.mark.parametrize("n", [100_000, 300_000, 1_000_000])
def test_hll_relative_error_at_2_14_registers(n: int) -> None:
    values = pd.Series(np.char.add("id", np.random.default_rng(n).permutation(n).astype(str)).astype(object))
    hll = HyperLogLog(p=14)
    for part in np.array_split(values.to_numpy(), 7):  # chunk by chunk, duplicates included
        hll.add(part)
        hll.add(part[: len(part) // 3])
    assert abs(hll.count() / n - 1) < 0.025
    assert hll.relative_error == pytest.approx(1.04 / 128)


def test_hll_small_counts_and_types() -> None:
    hll = HyperLogLog()
    hll.add(np.array(["a", "b", "a", "c"], dtype=object))
    hll.add(np.array([1, 2, 2, 3]))
    hll.add(np.array([0.5, np.nan, np.nan]))
    assert round(hll.count()) == 8
    assert (hash_values(["x", "y"]) == hash_values(np.array(["x", "y"]))).all()
    assert not (hash_values(["x"], seed=0) == hash_values(["x"], seed=1)).all()


def test_hll_merge_equals_the_sketch_of_the_union() -> None:
    a, b, both = HyperLogLog(seed=3), HyperLogLog(seed=3), HyperLogLog(seed=3)
    left = np.arange(0, 600_000).astype(str).astype(object)
    right = np.arange(400_000, 1_000_000).astype(str).astype(object)
    a.add(left)
    b.add(right)
    both.add(np.concatenate([left, right]))
    merged = a.merge(b)
    assert (merged.registers == both.registers).all()
    assert abs(merged.count() / 1_000_000 - 1) < 0.025
    with pytest.raises(ValueError, match="cannot merge"):
        merged.merge(HyperLogLog(seed=4))
    with pytest.raises(ValueError, match="p must be"):
        HyperLogLog(p=2)


def test_misra_gries_keeps_heavy_values_with_bounded_undercount() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([np.full(3000, "hot"), np.full(1500, "warm"), rng.integers(0, 5000, 5500).astype(str)])
    rng.shuffle(values)
    mg, other = MisraGries(8), MisraGries(8)
    chunks = np.array_split(values, 13)
    for i, c in enumerate(chunks):
        (mg if i % 2 else other).add_counts(pd.Series(c).value_counts(sort=False))
    mg.merge(other)
    assert mg.rows == len(values)
    true = pd.Series(values).value_counts()
    for v in ("hot", "warm"):  # more than N / (k + 1) rows: always kept, undercount bounded
        assert v in mg.counts.index
        assert true[v] - mg.error_bound <= mg.counts[v] <= true[v]
    assert mg.top() is not None and mg.top()[0] == "hot"
    assert len(mg.counts) <= 8
    majority = MisraGries(1)
    for c in (pd.Series(["a"] * 5 + ["b"] * 10), pd.Series(["a"] * 20 + ["c"] * 3)):
        majority.add_counts(c.value_counts())
    assert majority.top() == ("a", 15)  # a has 25 of 38 rows
