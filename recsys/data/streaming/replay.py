"""A chunk source parsed once: the first pass keeps a parsed copy on disk, later passes read it.

Two-pass methods over raw text (OutRank's survey then scoring, ``salience quality``) would parse
the file twice; parsing is most of their time. :class:`ChunkReplay` wraps their chunk source:
its first pass reads the origin and writes each chunk's frame, as parsed, to an Arrow IPC file
(uncompressed: written and read back memory-mapped at about the speed of a copy, a small part
of parsing the text again; written on a thread of its own while the caller works on the chunk);
a later pass reads those files. The frames a later pass gets equal the origin's
(values, dtypes, index; the readers' per-chunk reports are replayed with their byte positions,
for progress bars).

It falls back to reading the origin again, whole, when the copy cannot stand for it:

* the first pass stopped early (an error, or the caller left the loop);
* a chunk's frame does not come back from Arrow as it went in (a column of Python objects of
  mixed types; checked on every chunk's dtypes);
* the copy passed ``max_bytes`` (default: half the free space of the folder's disk, at most
  :data:`MAX_REPLAY_BYTES`), or would pass it by the end of the file being read (projected from
  the bytes of that file read so far, so a file too large for it is not copied in vain), or the
  disk filled up.

The copy takes about twice the size of the text (Criteo-shaped rows: 515 MB per million rows)
and is deleted by :meth:`ChunkReplay.close` (or leaving its ``with`` block).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from recsys.data.raw import RawData, ReadReport

__all__ = ["MAX_REPLAY_BYTES", "ChunkReplay"]

log = logging.getLogger(__name__)

#: the most bytes a replay copy takes by default (half the free disk space when less)
MAX_REPLAY_BYTES = 16 << 30


class ChunkReplay:
    """``origin`` (a function returning a fresh iterator of chunks) read once and replayed.

    Args:
        origin: the chunk source.
        max_bytes: the most bytes the parsed copy may take; 0 turns the copy off (every pass
            reads the origin); None: half the free space of ``folder``'s disk, at most
            :data:`MAX_REPLAY_BYTES`.
        folder: where the copy goes (a temporary folder made in it); None: the system's
            temporary folder (``TMPDIR``).

    Attributes:
        replayed: passes served from the copy.
        reason: why the copy was dropped (None while it stands).
    """

    def __init__(self, origin: Callable[[], Iterator[RawData]], max_bytes: int | None = None,
                 folder: str | Path | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0: no copy), got {max_bytes}")
        self.origin = origin
        self.parent = Path(folder) if folder is not None else Path(tempfile.gettempdir())
        self.max_bytes = _default_budget(self.parent) if max_bytes is None else max_bytes
        self.folder: Path | None = None
        self.chunks: list[tuple[Path, Any, ReadReport]] = []  # file, schema, report as of the chunk
        self.bytes = 0
        self.complete = False
        self.passes = 0
        self.replayed = 0
        self.reason: str | None = None if self.max_bytes else "turned off (max_bytes=0)"

    def __call__(self) -> Iterator[RawData]:
        self.passes += 1
        if self.passes == 1 and self.reason is None:
            return self._record()
        if self.complete and self.reason is None:
            self.replayed += 1
            return self._replay()
        return self.origin()

    def _record(self) -> Iterator[RawData]:
        import pyarrow as pa

        self.folder = Path(tempfile.mkdtemp(prefix="salience-replay-", dir=self.parent))
        source, file_start = None, 0  # the file being read, and the copy's bytes before it
        # each chunk's copy is written on a thread of its own while the caller works on the chunk
        # (the write is mostly the kernel's: it releases the GIL); one write in flight at a time
        writer = ThreadPoolExecutor(1, thread_name_prefix="replay")
        pending: _Pending | None = None
        try:
            for i, chunk in enumerate(self.origin()):
                self._settle(pending)  # the previous chunk's bytes are in self.bytes before a new file starts
                pending = None
                if chunk.report.source != source:
                    source, file_start = chunk.report.source, self.bytes
                if self.reason is None and self.folder is not None:
                    try:
                        table = pa.Table.from_pandas(chunk.frame, preserve_index=True)
                        if _dtypes_back(table) != [str(d) for d in chunk.frame.dtypes]:
                            self._drop("a column does not come back from Arrow with its dtype")
                        else:
                            path = self.folder / f"{i:06d}.arrow"
                            pending = _Pending(writer.submit(_write, table, path), path, chunk.schema,
                                               _snapshot(chunk.report), source, file_start)
                        del table
                    except (pa.ArrowException, ValueError, TypeError) as e:
                        self._drop(f"{type(e).__name__}: {e}")
                yield chunk
            self._settle(pending)
            pending = None
            self.complete = True
        finally:
            if pending is not None:  # the caller left early: let the write end before the folder goes
                pending.future.exception()
            writer.shutdown(wait=True)

    def _settle(self, pending: _Pending | None) -> None:
        """Wait for ``pending``'s write and account for it (the byte budget checks), or drop the copy."""
        import pyarrow as pa

        if pending is None:
            return
        try:
            size = pending.future.result()
        except (pa.ArrowException, OSError, ValueError, TypeError) as e:
            if self.reason is None:
                self._drop(f"{type(e).__name__}: {e}")
            return
        if self.reason is not None:
            return
        self.bytes += size
        self.chunks.append((pending.path, pending.schema, pending.report))
        if self.bytes > self.max_bytes:
            self._drop(f"the parsed copy passed {self.max_bytes:,} bytes")
        elif (projected := _projected(self.bytes, pending.file_start, pending.report)) > self.max_bytes:
            self._drop(f"the parsed copy would pass {self.max_bytes:,} bytes (about {projected:,} "
                       f"projected from the part of {pending.source} read so far)")

    def _replay(self) -> Iterator[RawData]:
        import pyarrow.feather as feather

        for path, schema, report in self.chunks:
            # no local name for the frame: a suspended generator would hold it while the caller works
            yield RawData(feather.read_table(str(path), memory_map=True).to_pandas(), schema, dataclasses.replace(report))

    def _drop(self, reason: str) -> None:
        self.reason = reason
        log.info("replay copy dropped, later passes parse the origin again: %s", reason)
        self._remove()

    def _remove(self) -> None:
        self.chunks = []
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def summary(self) -> dict[str, Any]:
        """How the passes were read: ``{"replayed": passes from the copy, "bytes": its size,
        "dropped": why it was dropped, or None}``."""
        return {"replayed": self.replayed, "bytes": self.bytes, "dropped": self.reason}

    def close(self) -> None:
        """Delete the copy."""
        self._remove()

    def __enter__(self) -> ChunkReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass
class _Pending:
    """One chunk's copy being written: its future (the file's size) and what the chunk list keeps."""

    future: Future[int]
    path: Path
    schema: Any
    report: ReadReport
    source: str | None
    file_start: int


def _write(table: Any, path: Path) -> int:
    """``table`` as an uncompressed Arrow IPC file at ``path``; its size in bytes."""
    import pyarrow.feather as feather

    feather.write_feather(table, str(path), compression="uncompressed")
    return path.stat().st_size


def _dtypes_back(table: Any) -> list[str]:
    """The dtypes ``table.to_pandas()`` gives its data columns (from zero rows)."""
    return [str(d) for d in table.slice(0, 0).to_pandas().dtypes]


def _projected(copied: int, file_start: int, report: ReadReport) -> int:
    """The copy's bytes once the current file is read, at the rate of its part copied so far
    (what later files add is not counted: a lower estimate); ``copied`` without byte positions."""
    if not report.bytes_read or report.bytes_total <= report.bytes_read:
        return copied
    return copied + (copied - file_start) * (report.bytes_total - report.bytes_read) // report.bytes_read


def _snapshot(report: ReadReport) -> ReadReport:
    return dataclasses.replace(report, skipped_lines=list(report.skipped_lines), notes=dict(report.notes))


def _default_budget(folder: Path) -> int:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return 0
    return int(min(MAX_REPLAY_BYTES, free // 2))
