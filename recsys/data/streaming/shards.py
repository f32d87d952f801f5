"""Encoded splits as fixed-size shards on disk: the format every streaming path reads and writes.

A shard set is a folder::

    <folder>/manifest.json       {"format": "salience-shards", "format_version": 1,
                                  "splits": {"train": {"rows": N, "shards": [ShardInfo, ...]}, ...},
                                  "summary": {...}}
    <folder>/preprocessor.arrow  the fitted encoders (``Preprocessor.to_bytes``: Arrow IPC, no
                                 Python object per token; sets written before it have
                                 ``preprocessor.json``, still read)
    <folder>/train/00000.npz     one :class:`~recsys.data.encoders.EncodedData` per shard
    <folder>/val/00000.npz ...

Each :class:`ShardInfo` records the shard's rows, byte size and SHA-256, so a shard truncated,
replaced or deleted between runs is detected before a single row is read (:meth:`ShardSet.verify`)
and never read as garbage. :class:`ShardWriter` rolls shards at ``rows_per_shard`` rows as
encoded chunks arrive and writes the manifest last and atomically: a folder without a
manifest is an unfinished write that no reader trusts.

Example::

    with ShardWriter(folder, rows_per_shard=262_144) as writer:
        for chunk in encoded_chunks:          # EncodedData of any size, split by split
            writer.append("train", chunk)
        writer.finish(preprocessor, summary)
    shards = ShardSet.open(folder)
    for part in shards.split("train").iter_shards(order=[2, 0, 1]):
        ...                                   # EncodedData, one shard at a time
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from recsys.artifacts import check_format_version, read_artifact, write_artifact
from recsys.data.encoders import EncodedData, EncodeStats, Preprocessor
from recsys.io import atomic_write_bytes, file_sha256
from recsys.parallel import OneInFlight

__all__ = ["MANIFEST", "ShardError", "ShardInfo", "ShardSet", "ShardWriter", "SplitShards", "concat_encoded",
           "load_preprocessor", "save_preprocessor"]

MANIFEST = "manifest.json"
PREPROCESSOR = "preprocessor.arrow"
LEGACY_PREPROCESSOR = "preprocessor.json"
FORMAT = "salience-shards"
FORMAT_VERSION = 1


class ShardError(ValueError):
    """A shard set that cannot be trusted: a missing, truncated or changed shard, or no manifest."""


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its path relative to the set's folder, rows, bytes and SHA-256."""

    file: str
    rows: int
    bytes: int
    sha256: str

    def check(self, folder: Path, checksum: bool = True) -> None:
        """Raise :class:`ShardError` naming the file when it is gone, of another size or (with
        ``checksum``) of other content than the manifest recorded."""
        path = folder / self.file
        if not path.is_file():
            raise ShardError(f"{path}: shard is missing (the manifest lists it with {self.rows} rows)")
        size = path.stat().st_size
        if size != self.bytes:
            raise ShardError(f"{path}: shard has {size} bytes, the manifest recorded {self.bytes} (truncated or replaced)")
        if checksum and file_sha256(path) != self.sha256:
            raise ShardError(f"{path}: shard content changed since it was written (SHA-256 differs)")


@dataclass
class SplitShards:
    """The shards of one split, in written order (row order of the split)."""

    folder: Path
    name: str
    shards: list[ShardInfo] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def __len__(self) -> int:
        return self.rows

    def load(self, index: int) -> EncodedData:
        """Shard ``index`` as EncodedData (its size is checked first; a read that still fails
        names the file)."""
        info = self.shards[index]
        info.check(self.folder, checksum=False)
        path = self.folder / info.file
        try:
            data = EncodedData.load(path)
        except Exception as e:  # a damaged npz: BadZipFile, ValueError, EOFError, ...
            raise ShardError(f"{path}: unreadable shard ({e})") from e
        if len(data) != info.rows:
            raise ShardError(f"{path}: {len(data)} rows, the manifest recorded {info.rows}")
        return data

    def iter_shards(self, order: Iterable[int] | None = None) -> Iterator[EncodedData]:
        """Yield the shards (in ``order`` when given), one in memory at a time."""
        for i in range(len(self.shards)) if order is None else order:
            yield self.load(int(i))

    def to_encoded(self) -> EncodedData:
        """The whole split in memory (for small data and tests)."""
        return concat_encoded(list(self.iter_shards()))


@dataclass
class ShardSet:
    """An opened shard set: per-split shards, the fitted preprocessor and the summary."""

    folder: Path
    splits: dict[str, SplitShards]
    preprocessor: Preprocessor
    summary: dict[str, Any]

    @classmethod
    def open(cls, folder: str | Path, checksum: bool = False, preprocessor: Preprocessor | None = None) -> ShardSet:
        """Open ``folder``; every shard's size (and with ``checksum`` its SHA-256) is checked.

        ``preprocessor``: the set's preprocessor when the caller holds it already (the writer
        does), instead of reading it from the folder (large vocabularies take a while).

        Raises:
            ShardError: no manifest (an unfinished write), or a shard missing or changed.
            FileNotFoundError: no such folder.
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"shard folder not found: {folder}")
        if not (folder / MANIFEST).is_file():
            raise ShardError(f"{folder}: no {MANIFEST}; the shards were never finished and are not trusted")
        data = read_artifact(folder / MANIFEST, "shard manifest", ShardError, required=("splits",),
                             marker=("format", FORMAT))
        check_format_version(data, FORMAT_VERSION, str(folder / MANIFEST), "shard manifest", ShardError)
        splits = {
            name: SplitShards(folder, name, [ShardInfo(**s) for s in part["shards"]])
            for name, part in data["splits"].items()
        }
        pre = preprocessor if preprocessor is not None else load_preprocessor(folder)
        out = cls(folder, splits, pre, dict(data.get("summary") or {}))
        out.verify(checksum)
        return out

    def verify(self, checksum: bool = True) -> None:
        """Check every shard against the manifest (see :meth:`ShardInfo.check`)."""
        for part in self.splits.values():
            for info in part.shards:
                info.check(self.folder, checksum)

    def split(self, name: str) -> SplitShards:
        if name not in self.splits:
            raise KeyError(f"{self.folder}: no {name!r} split; it holds {sorted(self.splits)}")
        return self.splits[name]


class ShardWriter:
    """Writes encoded chunks into fixed-size shards and, last, the manifest.

    Args:
        folder: the shard set's folder; written into a temporary sibling folder that replaces it
            only in :meth:`finish`, so an interrupted write (an error, a full disk, Ctrl-C) leaves
            nothing a later run would trust.
        rows_per_shard: rows per shard (the last shard of a split may hold fewer).
    """

    def __init__(self, folder: str | Path, rows_per_shard: int = 262_144) -> None:
        if rows_per_shard < 1:
            raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
        self.folder = Path(folder)
        self.rows_per_shard = int(rows_per_shard)
        self.tmp = self.folder.with_name(f".{self.folder.name}.tmp{os.getpid()}")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self._pending: dict[str, list[EncodedData]] = {}
        self._shards: dict[str, list[ShardInfo]] = {}
        self._writes = OneInFlight("shard-writer")
        self._done = False

    def room(self, split: str) -> int:
        """Rows ``split``'s current shard still takes before it is written (``rows_per_shard``
        when none is pending). A caller that appends chunks cut at these boundaries gets shards
        whose stats are exactly their rows' (a chunk cut here keeps its whole stats in each part)."""
        return self.rows_per_shard - sum(len(c) for c in self._pending.get(split, []))

    def append(self, split: str, chunk: EncodedData) -> None:
        """Add encoded rows to ``split``; full shards are written as they fill."""
        self._shards.setdefault(split, [])
        pending = self._pending.setdefault(split, [])
        if len(chunk):
            pending.append(chunk)
        while sum(len(c) for c in pending) >= self.rows_per_shard:
            whole = concat_encoded(pending)
            if len(whole) == self.rows_per_shard:
                self._write(split, whole)
                pending.clear()
                break
            self._write(split, whole.take(np.arange(self.rows_per_shard)))
            rest = whole.take(np.arange(self.rows_per_shard, len(whole)))
            pending[:] = [rest] if len(rest) else []

    #: prefix of the shard file names, ``<split>/<prefix><n>.npz`` (writers sharing one folder differ by it)
    shard_prefix = ""

    def _write(self, split: str, data: EncodedData) -> None:
        """Save ``data`` as ``split``'s next shard on the writer's thread, once the shard before it
        is written (one in flight: the file write and its SHA-256 release the GIL)."""
        shards = self._shards[split]
        rel = f"{split}/{self.shard_prefix}{len(shards):05d}.npz"
        shards.append(ShardInfo(rel, len(data), -1, ""))  # its place; its bytes and hash once written
        self._writes.submit(_save_shard, data, self.tmp, shards, len(shards) - 1)

    def flush(self) -> dict[str, list[ShardInfo]]:
        """Write the partial shards; returns the shards of every split, in order."""
        for split, pending in self._pending.items():
            if pending:
                self._write(split, concat_encoded(pending))
                pending.clear()
        try:
            self._writes.settle()
        finally:
            self._writes.stop()
        return self._shards

    def finish(self, preprocessor: Preprocessor, summary: Mapping[str, Any] | None = None) -> ShardSet:
        """Flush the partial shards, write the preprocessor and the manifest, and move the set
        into place (replacing an older set in ``folder``)."""
        self.flush()
        save_preprocessor(preprocessor, self.tmp)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "splits": {
                name: {"rows": sum(s.rows for s in shards), "shards": [vars(s) for s in shards]}
                for name, shards in self._shards.items()
            },
            "summary": dict(summary or {}),
        }
        write_artifact(self.tmp / MANIFEST, manifest)
        if self.folder.exists():
            shutil.rmtree(self.folder)
        os.replace(self.tmp, self.folder)
        self._done = True
        return ShardSet.open(self.folder, preprocessor=preprocessor)

    def abort(self) -> None:
        """Remove everything written so far (after the write in flight)."""
        self._writes.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._writes.stop()
        if not self._done:
            self.abort()


def _save_shard(data: EncodedData, folder: Path, shards: list[ShardInfo], at: int) -> None:
    """Write shard ``shards[at]`` in ``folder`` and record its size and SHA-256 there."""
    rel = shards[at].file
    path = folder / rel
    data.save(path)
    shards[at] = ShardInfo(rel, len(data), path.stat().st_size, file_sha256(path))


def save_preprocessor(preprocessor: Preprocessor, folder: Path) -> None:
    """Write a shard set's encoders (``preprocessor.arrow``, see the module docstring)."""
    atomic_write_bytes(folder / PREPROCESSOR, preprocessor.to_bytes())


def load_preprocessor(folder: Path) -> Preprocessor:
    """A shard set's encoders: ``preprocessor.arrow``, else an older set's ``preprocessor.json``.

    Raises:
        ShardError: neither file, or a damaged one (the set is rebuilt, never half-read).
    """
    try:
        if (folder / PREPROCESSOR).is_file():
            return Preprocessor.from_bytes((folder / PREPROCESSOR).read_bytes())
        if (folder / LEGACY_PREPROCESSOR).is_file():
            return Preprocessor.load(folder / LEGACY_PREPROCESSOR)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
        raise ShardError(f"{folder}: damaged encoder state ({type(e).__name__}: {e})") from e
    raise ShardError(f"{folder}: no {PREPROCESSOR}; the shards were never finished and are not trusted")


def concat_encoded(parts: list[EncodedData]) -> EncodedData:
    """Rows of ``parts`` one after another (same features); the stats add up."""
    if not parts:
        raise ValueError("concat_encoded needs at least one part")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    oov: dict[str, int] = {}
    filled: dict[str, int] = {}
    for p in parts:
        for k, v in p.stats.oov.items():
            oov[k] = oov.get(k, 0) + v
        for k, v in p.stats.dense_filled.items():
            filled[k] = filled.get(k, 0) + v
    return EncodedData(
        list(first.sparse_names),
        list(first.dense_names),
        {n: np.concatenate([p.values[n] for p in parts]) for n in first.sparse_names},
        {n: np.concatenate([p.lengths[n] for p in parts]) for n in first.sparse_names},
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.labels for p in parts]),
        EncodeStats(rows=sum(len(p) for p in parts), oov=oov, dense_filled=filled),
        first.dense_widths,
    )
