"""Pass 1's compact copy of each chunk, so pass 2 encodes without parsing the raw text again.

While pass 1 of :func:`~recsys.data.streaming.prepare.prepare_shards` counts vocabularies, it
dictionary-encodes every sparse column of the chunk anyway; :func:`spill_chunk` keeps that
encoding (int32 indices into the chunk's own distinct tokens, and those tokens as byte keys),
hashed features' final ids, the dense values as parsed (float64) and the labels. Pass 2 maps
each chunk's distinct tokens to vocabulary ids (:meth:`ChunkEncoder.assemble`) in time
proportional to the distinct tokens, not the rows. The spill is deleted when the shards are
written (or the preparation fails). On disk it takes about 4 bytes per sparse cell, 8 per dense
cell and the chunk dictionaries.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from recsys.data.encoders import EncodedData, dense_cells, hash_ids
from recsys.data.schema import FeatureKind, FeatureSpec, Schema
from recsys.data.streaming.encoders import ChunkEncoder, StreamingFit, TokenCounts, column_tokens, dictionary_tokens
from recsys.parallel import OneInFlight, map_ordered

__all__ = ["SpillFolder", "SpilledChunk", "chunk_path", "spill_chunk"]


@dataclass
class SpilledChunk:
    """One chunk after pass 1.

    Attributes:
        codes: split code per row (int8: 0 train, 1 val, 2 test).
        labels: float32 (N,).
        dense: per dense feature the parsed values (float64, N, or N x D for a vector; NaN = missing).
        indices: per vocabulary feature, int32 per token into ``keys`` (multi-categorical:
            ``sum(lengths)`` tokens).
        keys: per vocabulary feature, the chunk's distinct tokens as byte keys.
        ids: per hashed feature, the final ids (int64).
        lengths: per sparse feature, tokens per row (int32, N).
    """

    codes: np.ndarray
    labels: np.ndarray
    dense: dict[str, np.ndarray]
    indices: dict[str, np.ndarray]
    keys: dict[str, np.ndarray]
    ids: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.labels)

    def save(self, path: Path) -> None:
        """Write the arrays raw after a JSON header (no zip, no checksum, no fsync: the spill is
        scratch, deleted with its folder, and a crash discards the folder)."""
        arrays: list[tuple[str, np.ndarray]] = [("codes", self.codes), ("labels", self.labels)]
        names: dict[str, list[str]] = {}
        for kind in _GROUPS:
            group: dict[str, np.ndarray] = getattr(self, kind)
            names[kind] = list(group)
            arrays += [(f"{kind}{i}", arr) for i, arr in enumerate(group.values())]
        arrays = [(key, np.ascontiguousarray(arr)) for key, arr in arrays]
        offsets = np.cumsum([0] + [-(-arr.nbytes // _ALIGN) * _ALIGN for _, arr in arrays]).tolist()
        layout = [[key, arr.dtype.str, list(arr.shape), at] for (key, arr), at in zip(arrays, offsets)]
        header = json.dumps({"names": names, "arrays": layout}).encode()
        start = -(-(8 + len(header)) // _ALIGN) * _ALIGN
        with open(path, "wb") as fh:  # scratch (see the docstring): written in place
            fh.write(start.to_bytes(8, "little") + header.ljust(start - 8))
            for (_, arr), at in zip(arrays, offsets):
                fh.seek(start + at)
                fh.write(arr.view(np.uint8).reshape(-1).data if arr.nbytes else b"")

    @classmethod
    def load(cls, path: Path) -> SpilledChunk:
        data = path.read_bytes()
        start = int.from_bytes(data[:8], "little")
        head = json.loads(data[8:start].rstrip(b" ").decode())
        buf = memoryview(data)[start:]
        arrays = {key: np.frombuffer(buf, dtype=np.dtype(dtype), count=int(np.prod(shape)), offset=at).reshape(shape)
                  for key, dtype, shape, at in head["arrays"]}
        groups = {kind: {n: arrays[f"{kind}{i}"] for i, n in enumerate(head["names"][kind])} for kind in _GROUPS}
        return cls(arrays["codes"], arrays["labels"], **groups)


_GROUPS = ("dense", "indices", "keys", "ids", "lengths")
_ALIGN = 64  # every array starts on a 64-byte boundary of the file


def _spill_sparse(spec: FeatureSpec, cells: pd.Series, train: np.ndarray, counter: TokenCounts | None) -> dict[str, Any]:
    """One sparse column of a chunk: its lengths and hashed ids, or its dictionary encoding; the
    training rows' counts of its distinct tokens go into ``counter`` (this feature's own: the
    pool's threads never share one, and each sees the chunks in order)."""
    tokens, lens = column_tokens(spec, cells)
    if spec.hash_size is not None:
        enc = pc.dictionary_encode(tokens)
        uniq = enc.dictionary.to_numpy(zero_copy_only=False).astype(object)
        mapping = hash_ids(uniq, spec.hash_size) if len(uniq) else np.zeros(0, np.int64)
        return {"lengths": lens, "ids": mapping[enc.indices.to_numpy(zero_copy_only=False)]}
    idx, keys = dictionary_tokens(tokens)
    out: dict[str, Any] = {"lengths": lens, "indices": idx, "keys": keys}
    if counter is not None:
        train_idx = idx[train] if spec.kind is not FeatureKind.MULTI_CATEGORICAL else idx[np.repeat(train, lens)]
        counts = np.bincount(train_idx, minlength=len(keys))
        seen = counts > 0
        counter.add_keys(keys[seen], counts[seen])
    return out


def _parsed(cells: np.ndarray) -> np.ndarray:
    """Dense cells as float64 (NaN = missing), a vector's N x D kept 2-D."""
    flat = pd.to_numeric(pd.Series(cells.reshape(-1), copy=False), errors="coerce").to_numpy(dtype=np.float64)
    return flat.reshape(cells.shape)


def spill_chunk(frame: pd.DataFrame, schema: Schema, codes: np.ndarray, fit: StreamingFit | None) -> SpilledChunk:
    """Dictionary-encode one chunk's columns and, when ``fit`` is given, count its training rows
    (``codes == 0``) into ``fit`` (what ``fit.update(frame, train_rows)`` counts).

    Every column is encoded on the column pool (:func:`recsys.parallel.map_ordered`), one
    column per task; each column's counts go into its own counter of ``fit``, chunk after chunk,
    so the result does not depend on the pool.
    """
    train = codes == 0
    rows = np.flatnonzero(train)
    counting = fit if fit is not None and len(rows) > 0 else None  # where the training rows are counted
    specs = list(schema.sparse)

    def column(spec: FeatureSpec) -> Any:  # the task takes its own cells: one column's copy per thread at a time
        if not spec.is_sparse:  # a dense scalar or vector: parsed, its training values counted
            x = _parsed(dense_cells(frame, spec))
            if counting is not None:
                counting.add_dense(spec, x[rows])
            return x
        return _spill_sparse(spec, frame[spec.name], train, counting.counts.get(spec.name) if counting is not None else None)

    done = map_ordered(column, [*specs, *schema.dense])
    indices, keys, ids, lengths = {}, {}, {}, {}
    for spec, col in zip(specs, done):
        lengths[spec.name] = col["lengths"]
        if "ids" in col:
            ids[spec.name] = col["ids"]
            continue
        indices[spec.name], keys[spec.name] = col["indices"], col["keys"]
    dense = {spec.name: x for spec, x in zip(schema.dense, done[len(specs):])}
    if counting is not None:
        counting.rows += len(rows)
    labels = frame[schema.label].to_numpy(dtype=np.float32)
    return SpilledChunk(codes.astype(np.int8), labels, dense, indices, keys, ids, lengths)


def encode_spilled(encoder: ChunkEncoder, chunk: SpilledChunk, parts: dict[Any, np.ndarray]) -> dict[Any, EncodedData]:
    """Pass 2: the EncodedData of each part of a spilled chunk (equal to encoding the raw chunk);
    the columns' vocabulary look-ups run on the column pool (:mod:`recsys.parallel`)."""

    def ids(spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray]:
        name = spec.name
        if name in chunk.ids:
            return chunk.ids[name].astype(np.int64, copy=False), chunk.lengths[name]
        return encoder.lookup(name).map_keys(chunk.keys[name])[chunk.indices[name]], chunk.lengths[name]

    specs = list(encoder.schema.sparse)
    sparse = dict(zip((s.name for s in specs), map_ordered(ids, specs)))
    return encoder.assemble(sparse, chunk.dense, chunk.labels, parts)


def chunk_path(folder: Path, i: int) -> Path:
    """The file of spilled chunk number ``i`` in ``folder``."""
    return folder / f"{i:06d}.spill"


class SpillFolder:
    """Numbered spilled chunks in a folder that is removed on :meth:`close` (or exit). Each chunk
    is saved on a writer thread while the caller reads on (one in flight; its error is raised by
    the next :meth:`write`, :meth:`settle` or the iteration)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        self.count = 0
        self._writes = OneInFlight("spill-writer")

    def write(self, chunk: SpilledChunk) -> None:
        self._writes.submit(chunk.save, chunk_path(self.folder, self.count))
        self.count += 1

    def settle(self) -> None:
        """Wait until every chunk written is on disk."""
        self._writes.settle()

    def __iter__(self) -> Iterator[SpilledChunk]:
        self.settle()
        for i in range(self.count):
            yield SpilledChunk.load(chunk_path(self.folder, i))

    def stop(self) -> None:
        """Let the write in flight end (its error dropped: the caller is already failing, or
        :meth:`settle` raised it) and stop the writer's thread; the files stay."""
        self._writes.stop()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> SpillFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

