"""Assertions shared by the data tests."""

from __future__ import annotations

import numpy as np

from recsys.data.encoders import EncodedData


def assert_same_encoding(a: EncodedData, b: EncodedData) -> None:
    """Same names, arrays, dtypes and stats (ids: the same values as int32 or int64, since a
    loaded shard keeps ids that fit as int32)."""
    assert a.sparse_names == b.sparse_names and a.dense_names == b.dense_names
    for n in a.sparse_names:
        np.testing.assert_array_equal(a.values[n], b.values[n])
        np.testing.assert_array_equal(a.lengths[n], b.lengths[n])
        assert {a.values[n].dtype, b.values[n].dtype} <= {np.dtype(np.int32), np.dtype(np.int64)}
        assert a.lengths[n].dtype == b.lengths[n].dtype
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.dense.dtype == b.dense.dtype and a.labels.dtype == b.labels.dtype
    assert a.stats.to_dict() == b.stats.to_dict()
