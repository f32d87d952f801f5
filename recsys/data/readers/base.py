"""Base class of dataset readers."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from recsys.data.raw import RawData, ReadReport
from recsys.data.schema import Schema, SchemaError

__all__ = ["Reader", "check_columns"]


class Reader(ABC):
    """Reads one raw dataset into :class:`~recsys.data.raw.RawData`.

    Subclasses take their options as typed constructor arguments (so a LightningCLI config can
    name them with ``class_path``/``init_args``) and implement :meth:`read`. They store every
    constructor argument as an attribute of the same name, which :meth:`fingerprint` uses as
    the encoded-data cache key together with the size and mtime of :meth:`files`.

    Readers of large files also override :meth:`iter_chunks`, which streams the same rows in
    bounded memory; the default reads everything at once.
    """

    #: short dataset name; MLflow uses it as the experiment name
    name: str = "dataset"

    @abstractmethod
    def read(self) -> RawData:
        """Parse the source into a frame indexed by 1-based source line number."""

    def schema_hint(self) -> Schema | None:
        """The schema of the data before reading it, where the reader knows it (a schema file, a
        fixed layout); None otherwise. Used to size chunks and shards by bytes."""
        return None

    def default_chunk_rows(self) -> int:
        """Rows per chunk when a caller gives none: sized by bytes from :meth:`schema_hint`
        (:func:`recsys.data.streaming.chunking.chunk_rows`), the row cap without one."""
        from recsys.data.streaming.chunking import MAX_CHUNK_ROWS, chunk_rows

        schema = self.schema_hint()
        return MAX_CHUNK_ROWS if schema is None else chunk_rows(schema)

    def iter_chunks(self, rows: int | None = None, *, columns: Sequence[str] = ()) -> Iterator[RawData]:
        """The rows of :meth:`read`, in order, as chunks of about ``rows`` rows.

        Each chunk comes from one source file: its frame is indexed by line (or row) in that
        file and its ``report`` is that file's :class:`~recsys.data.raw.ReadReport`, shared by
        the file's chunks and complete (rows read and skipped, skipped lines) once the file's
        last chunk has been consumed. A chunk never is empty.

        Args:
            rows: rows per chunk (about; None: :meth:`default_chunk_rows`, sized by bytes; the
                default reader yields one chunk of everything, which suits small datasets such
                as Frappe and MovieLens).
            columns: raw columns to keep besides the schema's features and label (the time
                column of a time-ordered split); a name the source lacks is a ``SchemaError``.
        """
        raw = self.read()
        check_columns(columns, list(raw.frame.columns), self.name)
        yield raw

    def read_with_columns(self, columns: Sequence[str]) -> RawData:
        """:meth:`read`, keeping the raw ``columns`` besides the schema's (see :meth:`iter_chunks`)."""
        raw = self.read()
        check_columns(columns, list(raw.frame.columns), self.name)
        return raw

    def with_path(self, path: str | list[str]) -> Reader:
        """This reader with ``path`` replaced (the per-split files of a predefined split).

        Raises:
            ValueError: the reader has no ``path`` option.
        """
        options = self.options()
        if "path" not in options:
            raise ValueError(
                f"{type(self).__name__} has no 'path' option, so it cannot read predefined split files; "
                "use a reader with a path (CriteoReader, TabularReader) or a random or time split"
            )
        return type(self)(**{**options, "path": path})

    def read_reports(self) -> list[ReadReport]:
        """The reports of the files (or span) the last :meth:`iter_chunks` read, in order, where
        the reader keeps them: a file whose every row was skipped yields no chunk to carry its
        report. Default: none kept."""
        return []

    def with_span(self, start: int, end: int, first_line: int) -> Reader:
        """This reader on the lines in bytes ``[start, end)`` of its one file, numbered from
        ``first_line`` (:mod:`recsys.data.readers.spans`).

        Raises:
            ValueError: the reader cannot read a span (its records may hold line breaks, or it
                has no ``span`` option).
        """
        options = self.options()
        if "span" not in options:
            raise ValueError(f"{type(self).__name__} cannot read a byte span of a file")
        return type(self)(**{**options, "span": (int(start), int(end), int(first_line))})

    @property
    def reads_spans(self) -> bool:
        """Whether :meth:`with_span` works (a record is one line of a plain text file)."""
        return "span" in self.options()

    def files(self) -> list[Path]:
        """Source files whose size/mtime invalidate caches."""
        return []

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def fingerprint(self) -> str:
        stats = []
        for f in self.files():
            st = Path(f).stat()
            stats.append([str(f), st.st_size, int(st.st_mtime)])
        blob = json.dumps([type(self).__qualname__, self.options(), stats], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def check_columns(wanted: Sequence[str], available: Sequence[str], source: str) -> None:
    """Raise a ``SchemaError`` naming the columns of ``wanted`` missing from ``available``."""
    missing = [c for c in wanted if c not in available]
    if missing:
        raise SchemaError(f"{source}: columns {missing} are not in the data; available columns: {list(available)}")
