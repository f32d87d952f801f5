"""Fewer embedding rows than ids: compositional (quotient-remainder) embeddings and hashing.

A feature with ``n`` ids normally owns an ``n x D`` table. Two row schemes store fewer rows:

* ``qr`` (Shi et al., *Compositional Embeddings Using Complementary Partitions for
  Memory-Efficient Recommendation Systems*, KDD 2020): id ``v`` reads row ``v // m`` of a
  quotient table (``ceil(n / m)`` rows) and row ``v % m`` of a remainder table (``m`` rows);
  the two partitions are complementary, so no two ids share both rows. The two embeddings are
  combined by ``sum``, ``product`` (element-wise) or ``concat`` (each table ``D / 2`` wide).
  Sum and concat commute with bag pooling, so multi-hot bags pool each table and combine the
  pooled vectors exactly; ``product`` does not, and is refused for multi-hot features.
* ``hash`` (the hashing trick, the baseline QR must beat): id ``v`` reads row
  ``1 + (v * 2654435761) mod (R - 1)`` of an ``R``-row table; id 0 (out of vocabulary) keeps
  row 0, which starts at zero.

Config (``model.embedding_rows``)::

    C3: {scheme: qr, buckets: 1000, combine: sum}      # tables t_C3@q (ceil(n/1000) rows), t_C3@r (1000 rows)
    C7: {scheme: hash, rows: 5000}                     # table t_C7 with 5000 rows

The split into tables runs inside the model (see :class:`~recsys.models.blocked.BlockRouter`),
so serving inputs stay per-feature ids, the model scripts, and the tables are ordinary tables
for the fused kernel, sharding and quantized export.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, unique
from typing import Any, Literal, get_args

from recsys.data.schema import FeatureKind, FeatureSpec, Schema

__all__ = ["HASH_MULTIPLIER", "ROWS_KEY", "Combine", "RowMapping", "RowScheme", "check_row_schemes", "qr_key", "sparse_specs_for"]

#: the config key the errors name
ROWS_KEY = "model.embedding_rows"
#: Knuth's multiplicative hash constant (ids below 2^33 stay inside int64)
HASH_MULTIPLIER = 2654435761
Combine = Literal["sum", "product", "concat"]


@unique
class RowMapping(str, Enum):
    """How a feature's ids map to table rows when its table is smaller than its vocabulary."""

    QR = "qr"  # quotient-remainder: two small tables combined
    HASH = "hash"  # one hashed table (collisions share a row)


def qr_key(feature: str, part: str) -> str:
    """KJT key (``t_``-prefixed: table name) of a QR feature's ``q`` or ``r`` table."""
    return f"{feature}@{part}"


@dataclass(frozen=True)
class RowScheme:
    """A feature's row scheme: ``qr`` with ``buckets`` (m) and ``combine``, or ``hash`` with ``rows``."""

    scheme: Literal["qr", "hash"]  # RowMapping's values (configs hold the values; tested equal)
    rows: int = 0  # hash: table rows
    buckets: int = 0  # qr: remainder rows (m)
    combine: Combine = "sum"

    def table_rows(self, num_ids: int) -> list[int]:
        """Rows of the scheme's tables (qr: quotient, remainder; hash: one table)."""
        if self.scheme == "qr":
            return [math.ceil(num_ids / self.buckets), self.buckets]
        return [self.rows]

    def table_dim(self, dim: int) -> int:
        return dim // 2 if self.scheme == "qr" and self.combine == "concat" else dim

    @property
    def combine_code(self) -> int:
        """0 sum, 1 product, 2 concat (TorchScript reads ints)."""
        return list(get_args(Combine)).index(self.combine)


def sparse_specs_for(raw: Any, schema: Schema, key: str, form: str) -> dict[str, FeatureSpec]:
    """The checks every per-feature table setting (``key``: feature -> ``form``; row schemes
    here, frequency blocks in :mod:`recsys.models.blocked`) shares: a mapping, over a fitted
    schema (table sizes known); returns the sparse specs by name."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{key} must map feature -> {form}, got {raw!r}")
    if not schema.is_fitted:
        raise ValueError(f"{key}: the schema must be fitted (table sizes known)")
    return {f.name: f for f in schema.sparse}


def _positive(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"{where}: {what} must be an integer >= 2, got {value!r}")
    return int(value)


def check_row_schemes(
    raw: Mapping[str, Any] | None, schema: Schema, key: str = ROWS_KEY, align: int = 1, blocked: tuple[str, ...] = ()
) -> dict[str, RowScheme]:
    """Validate per-feature row schemes against a fitted schema.

    Args:
        raw: feature -> ``{scheme: qr, buckets: m, combine: sum|product|concat}`` or
            ``{scheme: hash, rows: R}`` (or a :class:`RowScheme`).
        schema: fitted schema (each feature's id count and dim).
        key: config key the errors name.
        align: table dims must be multiples of this (4 for the fused kernel).
        blocked: features with frequency blocks (a feature takes blocks or a row scheme).

    Raises:
        ValueError naming ``key.<feature>``: unknown or dense feature, unknown scheme or
        combine, a split that does not shrink the table (``buckets`` or ``rows`` not below the
        feature's ids), ``product`` on a multi-hot feature, an odd or misaligned concat width.
    """
    if not raw:
        return {}
    sparse = sparse_specs_for(raw, schema, key, "{scheme: qr|hash, ...}")
    out: dict[str, RowScheme] = {}
    for name, item in raw.items():
        where = f"{key}.{name}"
        if name not in sparse:
            raise ValueError(f"{where}: not a sparse feature of the schema; sparse features: {sorted(sparse)}")
        if name in blocked:
            raise ValueError(f"{where}: the feature has frequency blocks (model.embedding_blocks); use one or the other")
        spec = sparse[name]
        n = int(spec.num_embeddings or 0)
        fields = dict(item.__dict__) if isinstance(item, RowScheme) else dict(item) if isinstance(item, Mapping) else None
        if fields is None:
            raise ValueError(f"{where}: expected {{scheme: qr, buckets: M, combine: sum}} or {{scheme: hash, rows: R}}, got {item!r}")
        scheme = fields.get("scheme")
        if scheme == "qr":
            buckets = _positive(fields.get("buckets"), "buckets", where)
            combine = fields.get("combine", "sum")
            if combine not in get_args(Combine):
                raise ValueError(f"{where}.combine={combine!r} is not one of {list(get_args(Combine))}")
            if buckets >= n:
                raise ValueError(f"{where}: buckets={buckets} but the feature has only {n} ids (0 = OOV included); "
                                 f"a quotient-remainder split needs fewer buckets than ids")
            if combine == "product" and spec.kind is FeatureKind.MULTI_CATEGORICAL:
                raise ValueError(f"{where}: combine=product does not commute with bag pooling; "
                                 "use sum or concat for a multi-hot feature")
            if combine == "concat" and (spec.embedding_dim % 2 or (spec.embedding_dim // 2) % align):
                raise ValueError(f"{where}: combine=concat splits dim {spec.embedding_dim} into two halves, which must be "
                                 f"{'even' if align == 1 else f'multiples of {align} (fused kernel)'}")
            out[name] = RowScheme("qr", buckets=buckets, combine=combine)
        elif scheme == "hash":
            rows = _positive(fields.get("rows"), "rows", where)
            if rows >= n:
                raise ValueError(f"{where}: rows={rows} but the feature has only {n} ids; hashing must shrink the table")
            out[name] = RowScheme("hash", rows=rows)
        else:
            raise ValueError(f"{where}.scheme={scheme!r} is not one of ['qr', 'hash']")
    return {f.name: out[f.name] for f in schema.sparse if f.name in out}  # schema order
