"""Chunks and shards sized in bytes, so that memory stays bounded at any width.

A fixed number of rows is a fixed amount of memory only at a fixed width: 262,144 rows of
Criteo's 40 columns take ~100 MB parsed, the same rows of 5,000 columns ~20 GB. Readers,
``quality``, OutRank and the shard writer therefore size their chunks from a byte budget and
the schema's estimated bytes per row (:func:`parsed_row_bytes`, :func:`encoded_row_bytes`),
capped at the row counts that were the defaults before (so narrow data reads as before)::

    rows = chunk_rows(schema)              # rows per parsed chunk: <= CHUNK_BYTES of frame
    rows = shard_rows(schema)              # rows per shard: <= SHARD_BYTES of encoded arrays

The bound this gives (stated in ``docs/large-data.md``): a streaming pass holds a chunk being
worked on and one parsed ahead, each about ``CHUNK_BYTES`` as a frame plus its encoded copy,
whatever the number of columns; training holds ``buffer_shards`` shards of about
``SHARD_BYTES`` each.
"""

from __future__ import annotations

from recsys.data.schema import FeatureKind, Schema

__all__ = [
    "CHUNK_BYTES", "MAX_CHUNK_ROWS", "MAX_SHARD_ROWS", "MIN_ROWS", "SAMPLE_BYTES", "SHARD_BYTES", "chunk_rows",
    "encoded_row_bytes", "parsed_row_bytes", "rows_within", "sample_rows", "shard_rows",
]

#: bytes of parsed frame per chunk (one chunk in flight, one read ahead); Criteo's 40 columns
#: still get the 262,144-row chunks they had
CHUNK_BYTES = 192 << 20
#: bytes of encoded arrays per shard
SHARD_BYTES = 256 << 20
#: bytes of parsed frame a raw-row sample may hold (the model-free steps' sample of a streamed split)
SAMPLE_BYTES = 1 << 30
#: the row caps (the fixed defaults of narrow data)
MAX_CHUNK_ROWS = 262_144
MAX_SHARD_ROWS = 262_144
#: never fewer rows than this per chunk (a row of a million columns still gets read)
MIN_ROWS = 256

#: parsed bytes per cell: an id or a bag as an Arrow-backed string (offsets, validity and its
#: characters, about 24 for a short id), a number as float64
_PARSED = {FeatureKind.CATEGORICAL: 24, FeatureKind.MULTI_CATEGORICAL: 48, FeatureKind.DENSE: 8, FeatureKind.VECTOR: 8}


def parsed_row_bytes(schema: Schema) -> int:
    """Estimated bytes of one parsed row of ``schema``'s raw columns (a vector's D floats) and label."""
    return sum(_PARSED[f.kind] * (f.width if f.is_vector else 1) for f in schema.features) + 8


def encoded_row_bytes(schema: Schema) -> int:
    """Bytes of one encoded row: int32 ids and lengths per id feature (a bag's ids counted as 2),
    float32 per dense column, the label."""
    ids = sum(16 if f.kind is FeatureKind.MULTI_CATEGORICAL else 8 for f in schema.sparse)
    return ids + 4 * schema.dense_width + 4


def rows_within(budget: int, row_bytes: int, cap: int) -> int:
    """The rows of ``row_bytes`` each that fit ``budget``, between :data:`MIN_ROWS` and ``cap``."""
    return int(min(cap, max(MIN_ROWS, budget // max(row_bytes, 1))))


def chunk_rows(schema: Schema, budget: int | None = None, cap: int = MAX_CHUNK_ROWS) -> int:
    """Rows per parsed chunk of ``schema``'s data within ``budget`` bytes (default :data:`CHUNK_BYTES`)."""
    return rows_within(CHUNK_BYTES if budget is None else budget, parsed_row_bytes(schema), cap)


def sample_rows(schema: Schema, cap: int, budget: int | None = None) -> int:
    """Rows of a raw sample of ``schema``'s data: ``cap``, or fewer where they would pass
    ``budget`` bytes (default :data:`SAMPLE_BYTES`)."""
    return rows_within(SAMPLE_BYTES if budget is None else budget, parsed_row_bytes(schema), cap)


def shard_rows(schema: Schema, budget: int | None = None, cap: int = MAX_SHARD_ROWS) -> int:
    """Rows per shard of ``schema``'s encoded data within ``budget`` bytes (default :data:`SHARD_BYTES`)."""
    return rows_within(SHARD_BYTES if budget is None else budget, encoded_row_bytes(schema), cap)
