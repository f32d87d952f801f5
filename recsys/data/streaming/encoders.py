"""Encoders fitted and applied chunk by chunk: the same results as :class:`Preprocessor`, in bounded memory.

* :class:`StreamingFit` counts vocabularies and dense statistics over chunks of training rows
  and returns a :class:`~recsys.data.encoders.Preprocessor` equal to
  ``Preprocessor(schema).fit(all_training_rows)`` (vocabularies exactly, with the same
  ``min_count`` cut and frequency-then-token order; dense means and standard deviations to
  the last bits of float64 rounding, exactly when one chunk holds every training row).
* :class:`ChunkEncoder` encodes chunks with a fitted preprocessor; the result equals
  ``pre.transform(chunk)`` array for array.

Both work on Arrow arrays (pandas' ``str`` columns are Arrow-backed, so no Python string is made
per cell): a chunk's distinct tokens come from Arrow's hash kernels, and tokens are compared as
fixed-width byte keys (:func:`token_keys`) in numpy arrays, so counting 10^7 distinct values
costs buffered merges by hash (:func:`sum_by_key`, compiled; ``np.unique`` is its reference),
not a Python loop per row or per value. Memory: per vocabulary feature, distinct tokens x
(longest token + 1) bytes plus 8 bytes per count (about 20 more per key during a merge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.encoders import (
    OOV_ID,
    EncodedData,
    EncodeStats,
    Preprocessor,
    Vocabulary,
    as_str,
    dense_cells,
    dense_matrix,
    dense_values,
    gather_jagged,
    hash_ids,
)
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.streaming.token_table import TokenTable
from recsys.jit import active, jit

__all__ = ["ChunkEncoder", "DenseMoments", "StreamingFit", "TokenCounts", "column_tokens", "string_buffers", "token_keys"]

_TERMINATOR = 1  # byte appended to every key: tokens that differ only by trailing NULs stay distinct


def _string_array(cells: pd.Series | np.ndarray | pa.Array) -> pa.Array:
    """Cells as one Arrow string array, missing as "" (the strings ``Preprocessor`` sees)."""
    if isinstance(cells, (pa.Array, pa.ChunkedArray)):
        arr = cells.combine_chunks() if isinstance(cells, pa.ChunkedArray) else cells
        return pc.fill_null(arr, "")
    if isinstance(cells, pd.Series) and pd.api.types.is_string_dtype(cells.dtype) and cells.dtype != object:
        arr = pa.array(cells, from_pandas=True)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            return pc.fill_null(arr, "")
    return pa.array(as_str(cells), type=pa.string())


def column_tokens(spec: FeatureSpec, cells: pd.Series | np.ndarray | pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A sparse column as (flat tokens, tokens per row): ``Preprocessor``'s reading of the cells
    (missing and ``missing_value`` as "", multi-categorical cells split at the separator with
    empty parts dropped), vectorised in Arrow."""
    arr = _string_array(cells)
    if spec.missing_value is not None:
        arr = pc.if_else(pc.equal(arr, str(spec.missing_value)), "", arr)
    n = len(arr)
    if spec.kind is not FeatureKind.MULTI_CATEGORICAL:
        return arr, np.ones(n, dtype=np.int32)
    lists = pc.split_pattern(arr, pattern=spec.separator)
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    keep = pc.not_equal(flat, "")
    lengths = np.bincount(parents[keep.to_numpy(zero_copy_only=False)], minlength=n).astype(np.int32)
    return flat.filter(keep), lengths


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, data)`` of an Arrow string or binary array (one chunk), without a copy of the
    bytes: cell ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (int64 offsets, N + 1; a null cell's
    bytes are whatever its slot holds, usually none)."""
    _, off_buf, data_buf = arr.buffers()
    off_type = np.int64 if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(off_buf, dtype=off_type)[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def token_keys(arr: pa.Array, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-width byte keys of Arrow strings: the UTF-8 bytes, a terminator byte, NUL padding.

    Equal keys <=> equal tokens (numpy compares ``S`` arrays ignoring trailing NULs; the
    terminator keeps ``"a"`` and ``"a\\x00"`` apart). Returns ``(keys, fits)``: with ``width``,
    tokens of ``width`` bytes or more do not fit (their keys are truncated, ``fits`` False).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=f"S{width or 1}"), np.zeros(0, bool)
    offsets, data = string_buffers(arr)
    lengths = np.diff(offsets)
    w = int(lengths.max()) + 1 if width is None else int(width)
    fits = lengths < w
    lens = np.minimum(lengths, w - 1) if width is not None else lengths
    mat = np.zeros((n, w), dtype=np.uint8)
    if active() == "numba":
        _fill_keys(offsets, data, lens, fits, mat)
        return mat.view(f"S{w}").ravel(), fits
    total = int(lens.sum())
    if total:
        rows = np.repeat(np.arange(n), lens)
        within = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
        mat[rows, within] = data[np.repeat(offsets[:-1], lens) + within]
    mat[np.arange(n)[fits], lens[fits]] = _TERMINATOR
    return mat.view(f"S{w}").ravel(), fits


@jit
def _fill_keys(offsets: np.ndarray, data: np.ndarray, lens: np.ndarray, fits: np.ndarray,
               mat: np.ndarray) -> None:  # pragma: no cover - compiled
    """:func:`token_keys`' rows written in one pass: ``lens[i]`` bytes of token ``i`` from ``data``
    at ``offsets[i]``, then the terminator where it fits (``mat`` is zeroed N x W)."""
    for i in range(mat.shape[0]):
        start, m = offsets[i], lens[i]
        for j in range(m):
            mat[i, j] = data[start + j]
        if fits[i]:
            mat[i, m] = _TERMINATOR


def keys_to_tokens(keys: np.ndarray) -> np.ndarray:
    """Object array of the str tokens of :func:`token_keys` keys."""
    return keys_to_arrow(keys).to_numpy(zero_copy_only=False).astype(object)


def keys_to_arrow(keys: np.ndarray) -> pa.LargeStringArray:
    """The tokens of :func:`token_keys` keys as an Arrow string array (no Python object per token)."""
    n = len(keys)
    if n == 0:
        return pa.array([], type=pa.large_string())
    w = keys.dtype.itemsize
    mat = keys.view(np.uint8).reshape(n, w)
    lengths = key_lengths(keys)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = mat[np.arange(w)[None, :] < lengths[:, None]]
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))


def key_lengths(keys: np.ndarray) -> np.ndarray:
    """Byte length of the token of every :func:`token_keys` key (the terminator's position)."""
    n, w = len(keys), keys.dtype.itemsize
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    nonzero = keys.view(np.uint8).reshape(n, w) != 0
    return (w - 1 - np.argmax(nonzero[:, ::-1], axis=1)).astype(np.int64)


def dictionary_tokens(tokens: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(indices int32 into the distinct tokens, their :func:`token_keys` keys) of ``tokens``."""
    enc = pc.dictionary_encode(tokens)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    keys, _ = token_keys(enc.dictionary)
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False), keys


def sum_by_key(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``keys`` (fixed-width bytes, ``S`` dtype) with their int64 ``counts`` summed,
    in order of first appearance. Keys of one width: equal tokens are equal bytes (see
    :func:`token_keys`). Compiled: one hash probe per key; else ``np.unique`` (the reference)."""
    keys = np.ascontiguousarray(keys)
    counts = np.asarray(counts, dtype=np.int64)
    n, w = len(keys), keys.dtype.itemsize
    if n == 0:
        return keys, counts
    if active() == "numba":
        index = np.int32 if n < 2**31 - 1 else np.int64  # the table's memory: about 20 bytes per key
        first = np.empty(n, dtype=index)
        total = np.zeros(n, dtype=np.int64)
        slots = np.zeros(1 << int(2 * n - 1).bit_length(), dtype=index)  # load <= 1/2
        groups = _sum_by_key_kernel(keys.view(np.uint8).reshape(n, w), counts, slots, first, total)
        del slots  # before the distinct keys are gathered
        return keys[first[:groups]], total[:groups].copy()  # the copy: no view holding all n counts
    uniq, at, inverse = np.unique(keys, return_index=True, return_inverse=True)
    total = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(total, inverse.ravel(), counts)
    order = np.argsort(at, kind="stable")  # first appearance, as the compiled path
    return uniq[order].astype(keys.dtype), total[order]


@jit
def _sum_by_key_kernel(mat: np.ndarray, counts: np.ndarray, slots: np.ndarray, first: np.ndarray,
                       total: np.ndarray) -> int:  # pragma: no cover - compiled
    """Open addressing over the rows of ``mat`` (N x W bytes): ``first[g]`` the first row of group
    ``g``, ``total[g]`` its summed counts; returns the number of groups."""
    mask = slots.shape[0] - 1
    groups = 0
    for i in range(mat.shape[0]):
        h = np.uint64(14695981039346656037)  # FNV-1a
        for b in range(mat.shape[1]):
            h = (h ^ np.uint64(mat[i, b])) * np.uint64(1099511628211)
        s = np.int64(h & np.uint64(mask))
        while True:
            g = slots[s] - 1
            if g < 0:
                slots[s] = groups + 1
                first[groups] = i
                total[groups] = counts[i]
                groups += 1
                break
            r = first[g]
            same = True
            for b in range(mat.shape[1]):
                if mat[r, b] != mat[i, b]:
                    same = False
                    break
            if same:
                total[g] += counts[i]
                break
            s = (s + 1) & mask
    return groups


def _widen(keys: np.ndarray, width: int) -> np.ndarray:
    return keys if keys.dtype.itemsize >= width else keys.astype(f"S{width}")


class TokenCounts:
    """Token counts of one feature, merged chunk by chunk (distinct keys in no set order,
    buffered merges by hash)."""

    #: distinct tokens buffered before a merge into the keys (at least; half the keys when more)
    flush_rows = 1 << 18

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype="S1")
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0

    def add(self, tokens: pa.Array) -> None:
        """Count ``tokens`` (an Arrow string array)."""
        if len(tokens) == 0:
            return
        vc = pc.value_counts(tokens)
        keys, _ = token_keys(vc.field("values"))
        self.add_keys(keys, vc.field("counts").to_numpy())

    def add_keys(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add ``counts`` for the distinct :func:`token_keys` ``keys``."""
        if not len(keys):
            return
        self._pending.append((keys, np.asarray(counts, dtype=np.int64)))
        self._pending_rows += len(keys)
        if self._pending_rows > max(len(self.keys) // 2, self.flush_rows):
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        width = max(self.keys.dtype.itemsize, *(k.dtype.itemsize for k, _ in self._pending))
        keys = np.concatenate([_widen(self.keys, width), *(_widen(k, width) for k, _ in self._pending)])
        counts = np.concatenate([self.counts, *(c for _, c in self._pending)])
        # the old keys and counts live on in the concatenation only (memory: one copy during the merge)
        self.keys, self.counts = np.zeros(0, dtype="S1"), np.zeros(0, dtype=np.int64)
        self._pending, self._pending_rows = [], 0
        self.keys, self.counts = sum_by_key(keys, counts)

    def __len__(self) -> int:
        self._flush()
        return len(self.keys)

    def vocabulary(self, min_count: int = 1) -> Vocabulary:
        """The :class:`Vocabulary` that ``Vocabulary.fit`` makes from the same tokens."""
        self._flush()
        keep = self.counts >= min_count
        return Vocabulary.from_counts(keys_to_arrow(self.keys[keep]), self.counts[keep], min_count)


@dataclass
class DenseMoments:
    """Count, mean and sum of squared deviations, merged chunk by chunk (Chan et al.)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: np.ndarray) -> None:
        """Add the finite values ``x`` (float64)."""
        if not x.size:
            return
        mean = float(x.mean())
        d = x - mean
        m2 = float(np.add.reduce(d * d))
        if self.n == 0:
            self.n, self.mean, self.m2 = int(x.size), mean, m2
            return
        n = self.n + x.size
        delta = mean - self.mean
        self.mean += delta * x.size / n
        self.m2 += m2 + delta * delta * self.n * x.size / n
        self.n = n

    def stats(self) -> tuple[float, float]:
        """(mean, std) as ``Preprocessor.fit`` stores them: (0, 1) without values, std 1 when 0."""
        if self.n == 0:
            return 0.0, 1.0
        std = float(np.sqrt(self.m2 / self.n))
        return self.mean, std if std > 0 else 1.0


class StreamingFit:
    """Fits a :class:`Preprocessor` from chunks of training rows.

    Example::

        fit = StreamingFit(schema)
        for chunk in reader.iter_chunks(rows=262_144):
            fit.update(chunk.frame, rows=train_rows_of(chunk))
        pre = fit.result()   # == Preprocessor(schema).fit(all training rows)
    """

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.counts = {s.name: TokenCounts() for s in schema.sparse if s.hash_size is None}
        self.moments = {s.name: DenseMoments() for s in schema.dense}
        self.rows = 0

    def update(self, frame: pd.DataFrame, rows: np.ndarray | None = None) -> None:
        """Count the rows ``rows`` (positions; default all) of ``frame``."""
        Preprocessor._check_columns(frame, self.schema.columns)
        take = None if rows is None else pa.array(np.asarray(rows, dtype=np.int64))
        self.rows += len(frame) if rows is None else len(rows)
        for spec in self.schema.sparse:
            if spec.name not in self.counts:
                continue
            arr = _string_array(frame[spec.name])
            tokens, _ = column_tokens(spec, arr if take is None else arr.take(take))
            self.counts[spec.name].add(tokens)
        for spec in self.schema.dense:
            cells = dense_cells(frame, spec)
            self.add_dense(spec, cells if rows is None else cells[rows])

    def add_dense(self, spec: FeatureSpec, cells: np.ndarray) -> None:
        """Add one dense column's (or vector's N x D) training values (as parsed; bad values are
        left out as in fit)."""
        x, _ = dense_values(spec, cells)
        self.moments[spec.name].add(x)

    def result(self) -> Preprocessor:
        pre = Preprocessor(self.schema)
        for spec in self.schema.sparse:
            if spec.hash_size is None:
                pre.vocabularies[spec.name] = self.counts[spec.name].vocabulary(spec.min_count)
        pre.dense_stats = {name: m.stats() for name, m in self.moments.items()}
        pre.fitted = True
        return pre


class _Lookup:
    """A vocabulary as sorted keys -> ids (for :class:`ChunkEncoder`)."""

    def __init__(self, vocab: Vocabulary) -> None:
        keys, _ = token_keys(vocab.tokens.arrow) if len(vocab.tokens) else (np.zeros(0, "S1"), None)
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.ids = order.astype(np.int64) + 1
        self.width = self.keys.dtype.itemsize
        self.table = TokenTable(self.keys, self.ids) if TokenTable.usable() else None  # else the binary search

    def encode(self, tokens: pa.Array) -> np.ndarray:
        indices, keys = dictionary_tokens(tokens)
        return self.map_keys(keys)[indices]

    def map_keys(self, keys: np.ndarray) -> np.ndarray:
        """The id (0 = OOV) of every :func:`token_keys` key (by hash where the compiled path is
        on; :meth:`search_keys` is the reference)."""
        if self.table is not None:
            return self.table.lookup(keys, OOV_ID)
        return self.search_keys(keys)

    def search_keys(self, keys: np.ndarray) -> np.ndarray:
        """:meth:`map_keys` by binary search over the sorted vocabulary keys."""
        if keys.dtype.itemsize > self.width:  # longer tokens than any in the vocabulary: never a hit
            fits = key_lengths(keys) < self.width
            keys = keys.astype(f"S{self.width}")
        else:
            fits = np.ones(len(keys), dtype=bool)
            keys = _widen(keys, self.width)
        pos = np.searchsorted(self.keys, keys)
        hit = fits & (pos < len(self.keys))
        hit[hit] = self.keys[pos[hit]] == keys[hit]
        mapping = np.full(len(keys), OOV_ID, dtype=np.int64)
        mapping[hit] = self.ids[pos[hit]]
        return mapping


class ChunkEncoder:
    """Encodes chunks with a fitted preprocessor: ``encode(frame)`` equals ``pre.transform(frame)``.

    Vocabulary lookups are built once (sorted byte keys), so a chunk costs a hash of its own
    distinct tokens and a binary search of them, whatever the vocabulary size.
    """

    def __init__(self, pre: Preprocessor) -> None:
        pre._check_fitted()
        self.pre = pre
        self.schema = pre.schema
        self._lookups = {name: _Lookup(v) for name, v in pre.vocabularies.items()}

    def lookup(self, name: str) -> _Lookup:
        """The id lookup of vocabulary feature ``name``."""
        return self._lookups[name]

    def encode_sparse(self, spec: FeatureSpec, cells: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64, lengths int32) of one sparse column, as ``Preprocessor.encode_sparse``."""
        tokens, lengths = column_tokens(spec, cells)
        if spec.hash_size is not None:
            enc = pc.dictionary_encode(tokens)
            uniq = enc.dictionary.to_numpy(zero_copy_only=False).astype(object)
            ids = hash_ids(uniq, spec.hash_size)[enc.indices.to_numpy(zero_copy_only=False)] if len(uniq) else np.zeros(0, np.int64)
        else:
            ids = self._lookups[spec.name].encode(tokens)
        return ids.astype(np.int64), lengths

    def encode(self, frame: pd.DataFrame, parts: dict[Any, np.ndarray] | None = None) -> dict[Any, EncodedData]:
        """Encode ``frame`` once and return the rows of each part (positions, any hashable key)
        as its own EncodedData with its own stats; default one part ``"all"`` of every row."""
        Preprocessor._check_columns(frame, self.schema.columns)
        sparse = {spec.name: self.encode_sparse(spec, frame[spec.name]) for spec in self.schema.sparse}
        dense = {spec.name: dense_cells(frame, spec) for spec in self.schema.dense}
        label = self.schema.label
        labels = frame[label].to_numpy(dtype=np.float32) if label in frame else np.zeros(len(frame), np.float32)
        return self.assemble(sparse, dense, labels, parts)

    def assemble(
        self, sparse: dict[str, tuple[np.ndarray, np.ndarray]], dense: dict[str, np.ndarray], labels: np.ndarray,
        parts: dict[Any, np.ndarray] | None = None,
    ) -> dict[Any, EncodedData]:
        """EncodedData per part from encoded sparse columns ``(ids, lengths)``, raw dense columns
        (transformed here) and float32 labels; see :meth:`encode`."""
        n = len(labels)
        parts = {"all": np.arange(n)} if parts is None else parts
        offsets = {}
        for spec in self.schema.sparse:  # a multi-categorical row's ids start at its offset (the others': at the row)
            if spec.kind is FeatureKind.MULTI_CATEGORICAL:
                offsets[spec.name] = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(sparse[spec.name][1], out=offsets[spec.name][1:])
        out: dict[Any, EncodedData] = {}
        for part, rows in parts.items():
            rows = np.asarray(rows, dtype=np.int64)
            whole = len(rows) == n
            stats = EncodeStats(rows=len(rows))
            values, lens = {}, {}
            for spec in self.schema.sparse:
                ids, lengths = sparse[spec.name]
                if whole:
                    values[spec.name], lens[spec.name] = ids, lengths
                elif spec.name in offsets:
                    values[spec.name], lens[spec.name] = gather_jagged(ids, offsets[spec.name], lengths, rows)
                else:  # one id per row (column_tokens)
                    values[spec.name], lens[spec.name] = ids[rows], lengths[rows]
                stats.oov[spec.name] = int((values[spec.name] == OOV_ID).sum())
            cols = []
            for spec in self.schema.dense:
                x, filled = self.pre.encode_dense(spec, dense[spec.name] if whole else dense[spec.name][rows])
                cols.append(x)
                stats.dense_filled[spec.name] = filled
            out[part] = EncodedData(
                self.schema.sparse_names, self.schema.dense_names, values, lens, dense_matrix(cols, len(rows)),
                labels if whole else labels[rows], stats, self.schema.dense_widths,
            )
        return out

    def transform(self, frame: pd.DataFrame) -> EncodedData:
        """All rows of ``frame``: equals ``pre.transform(frame)``."""
        return self.encode(frame)["all"]
