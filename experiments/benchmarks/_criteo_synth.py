"""Criteo-shaped synthetic click logs of any size, written as Criteo TSV in bounded memory.

``label I1..I13 C1..C26`` per line, tab-separated, as Kaggle's ``train.txt``:

* 26 categorical fields with cardinalities log-spaced from 10 to ``max_cardinality``
  (default 10^7), each id drawn Zipf-like (``P(id = k) ~ 1 / (k + 1)``, inverse-CDF of a
  log-uniform draw) and written as 8 hex digits (a per-field bijective scramble of the id, so
  hot ids do not look alike across fields); about 4% of the cells are empty;
* 13 integer fields (geometric counts, about 10% empty);
* a planted label: ``P(click) = sigmoid(b + sum of per-id effects of C1..C8 + 0.4 * z(I1))``
  with per-id effects drawn from the id by a fixed hash, so the signal is in the first
  eight categorical fields and the first integer field; the rest are noise.

Rows are made and written ``block_rows`` at a time (numpy for the draws, Arrow's CSV writer
for the text), so memory does not grow with ``rows``, and the same arguments always write the
same bytes::

    python -m experiments.benchmarks.scale generate --rows 1000000 --out /tmp/criteo-1m.txt
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

__all__ = ["NUM_DENSE", "NUM_SPARSE", "SIGNAL_FIELDS", "cardinalities", "chunk_table", "write_criteo_tsv"]

NUM_DENSE, NUM_SPARSE = 13, 26
#: the categorical fields that carry the planted signal (with ``I1``)
SIGNAL_FIELDS = tuple(f"C{i}" for i in range(1, 9))
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_GOLDEN = np.uint64(0x9E3779B1)


def cardinalities(max_cardinality: int = 10**7, n: int = NUM_SPARSE) -> list[int]:
    """``n`` table sizes log-spaced from 10 to ``max_cardinality``."""
    return [int(round(c)) for c in np.geomspace(10, max_cardinality, n)]


def _zipf_ids(u: np.ndarray, card: int) -> np.ndarray:
    """Ids in ``[0, card)`` with ``P(id = k)`` about ``1 / (k + 1)``, from uniforms ``u``."""
    return np.minimum(np.exp(u * np.log(card + 1.0)).astype(np.int64) - 1, card - 1)


def _scramble(ids: np.ndarray, field: int) -> np.ndarray:
    """A bijection of 32-bit ids per field (odd multiplier, field offset), as uint32."""
    x = ids.astype(np.uint64) * np.uint64(2 * field + 0x2545F491) + np.uint64(field) * _GOLDEN
    return (x & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _hex8(x: np.ndarray) -> pa.Array:
    """uint32 values as 8-digit lowercase hex strings (an Arrow string array)."""
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    digits = _HEX[(x[:, None] >> shifts) & np.uint32(0xF)]
    return pa.array(np.ascontiguousarray(digits).view("S8").ravel(), type=pa.binary(8)).cast(pa.string())


def _effect(ids: np.ndarray, field: int) -> np.ndarray:
    """A fixed per-id effect in about [-1, 1] (a hash of the id, so no table is stored)."""
    h = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(((field + 1) * 0xBF58476D1CE4E5B9) % 2**64)
    h ^= h >> np.uint64(31)
    return (h % np.uint64(2001)).astype(np.float64) / 1000.0 - 1.0


def chunk_table(rows: int, start: int, seed: int, cards: list[int]) -> pa.Table:
    """Rows ``start .. start + rows`` of the log as an Arrow table, drawn from a generator seeded
    by ``(seed, start)`` (so a block is the same whichever blocks were written before it)."""
    rng = np.random.default_rng([seed, start])
    cols: dict[str, pa.Array] = {}
    logit = np.full(rows, -1.6)
    dense: list[pa.Array] = []
    for i in range(NUM_DENSE):
        x = rng.geometric(0.02 if i % 3 == 0 else 0.2, rows).astype(np.int64) - 1
        if i == 0:
            logit += 0.4 * (np.log1p(x) - 3.0)
        dense.append(pa.array(x, mask=rng.random(rows) < 0.1))
    sparse: list[pa.Array] = []
    for f, card in enumerate(cards):
        ids = _zipf_ids(rng.random(rows), card)
        if f < len(SIGNAL_FIELDS):
            logit += 0.5 * _effect(ids, f)
        text = _hex8(_scramble(ids, f))
        sparse.append(pa.compute.if_else(pa.array(rng.random(rows) < 0.04), pa.scalar(None, pa.string()), text))
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    cols["label"] = pa.array(label)
    cols.update({f"I{i + 1}": a for i, a in enumerate(dense)})
    cols.update({f"C{f + 1}": a for f, a in enumerate(sparse)})
    return pa.table(cols)


def write_criteo_tsv(path: str | Path, rows: int, *, seed: int = 0, max_cardinality: int = 10**7,
                     block_rows: int = 250_000) -> Path:
    """Write ``rows`` Criteo-shaped lines to ``path`` (see the module docstring); returns the path.

    Rows are drawn in blocks of ``block_rows`` (part of the data's identity: the same
    ``(rows, seed, max_cardinality, block_rows)`` always writes the same bytes).
    """
    if rows <= 0:
        raise ValueError(f"rows must be > 0, got {rows}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cards = cardinalities(max_cardinality)
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    tmp = path.with_name(path.name + ".partial")
    writer: pacsv.CSVWriter | None = None
    try:
        for start in range(0, rows, block_rows):
            table = chunk_table(min(block_rows, rows - start), start, seed, cards)
            if writer is None:
                writer = pacsv.CSVWriter(str(tmp), table.schema, write_options=options)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    tmp.replace(path)
    return path
