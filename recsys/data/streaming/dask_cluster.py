"""Streamed shard preparation on a Dask cluster: :func:`prepare_shards` past one machine.

:func:`prepare_shards_distributed` runs the two passes of
:func:`~recsys.data.streaming.prepare.prepare_shards` as Dask tasks, one per **partition**, and
writes the same shard format (:mod:`recsys.data.streaming.shards`) that ``ShardSet.open`` and the
streaming data module read. A partition is one input file: each entry of the reader's ``path``
list (every split's files of a predefined split). A reader with one file (or without a
``path``) is one partition. A plain text file larger than ``span_bytes`` whose reader reads
byte spans (:attr:`~recsys.data.readers.base.Reader.reads_spans`: Criteo's TSV) is cut into spans
of whole lines (:mod:`recsys.data.readers.spans`), one partition each, so that one large file
is read by every worker; a first parallel pass counts each span's lines, so its rows keep their
line numbers in the file (errors and skipped rows name them as for the whole file).

1. (a time split by fractions only) every partition counts its rows; the client turns the
   counts into each partition's first row position;
2. pass 1, on the workers: each partition reads its file once, assigns its rows to splits,
   counts vocabularies and dense moments over its training rows and keeps pass 1's compact
   copy (:mod:`recsys.data.streaming.spill`) in the build folder. The counts come back as sorted
   ``(keys, counts)`` arrays and moments; the client merges them into one
   :class:`~recsys.data.encoders.Preprocessor` (vocabularies equal to the single-machine
   ones; dense statistics to the last bits of float64 rounding);
3. pass 2, on the workers: each partition encodes its copy into its own shards,
   ``<split>/p<partition>-<n>.npz``, so partitions never collide. The client writes the
   preprocessor and the manifest (rows, bytes, SHA-256 of every shard) and renames the build
   folder into place, as :meth:`ShardWriter.finish` does.

Splits: predefined files and time splits give the rows of the single-machine path (the time
order is also checked across partitions). A **random** split draws each row's number from a
generator seeded by ``(seed, file position in the path list)``, in the file's row order, so
the result does not depend on the number of workers or the chunk size. The first file's draws
equal the single-machine ones (``default_rng([seed, 0]) == default_rng(seed)``); later files
differ from the single-machine draw, which runs one generator through all files. A span's
generator is the file's, advanced by the lines before the span: on a file without blank or
skipped lines its rows draw what they draw in the uncut file.

Storage: the cache folder (and the input files) must be on storage every worker and the client
see at the same path (NFS, a shared volume). Bad input behaves as in ``prepare_shards``: a bad
row is a ``DataError`` naming its file and line, a raw file that changes between the passes is
refused, and on any error the running tasks stop at their next chunk and the build folder is
removed, so nothing half-written is ever trusted.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from recsys.artifacts import write_artifact
from recsys.data.encoders import EncodedData, EncodeStats, Preprocessor
from recsys.data.prepare import PrepareConfig, apply_options
from recsys.data.progress import Progress
from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.readers.base import Reader
from recsys.data.readers.blocks import join_spans, merge_reports
from recsys.data.readers.lines import is_gzip
from recsys.data.readers.spans import SPAN_BYTES, byte_spans, count_lines
from recsys.data.schema import Schema, SchemaError
from recsys.data.splits import (
    SPLITS,
    RowSplitter,
    SplitConfig,
    SplitMode,
    TimeOrder,
    line_of,
    rows_by_split,
    shown_value,
)
from recsys.data.streaming.chunking import MAX_SHARD_ROWS, shard_rows
from recsys.data.streaming.encoders import ChunkEncoder, DenseMoments, StreamingFit
from recsys.data.streaming.prepare import (
    SplitLabels,
    add_stats,
    check_unchanged,
    file_state,
    prefetch,
    preparation_summary,
    shard_cache_folder,
    shard_pieces,
    split_sources,
)
from recsys.data.streaming.shards import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    ShardError,
    ShardInfo,
    ShardSet,
    ShardWriter,
    save_preprocessor,
)
from recsys.data.streaming.spill import SpilledChunk, SpillFolder, chunk_path, encode_spilled, spill_chunk
from recsys.parallel import THREADS_VARIABLE, OneInFlight

__all__ = ["SPAN_BYTES", "dask_cache_folder", "partitions", "prepare_shards_distributed"]

_MARKER = ".building"  # removed by the client on an error: running tasks stop at their next chunk
_Options = tuple[list[str] | None, list[str] | None, int | None]
_TimeEnd = tuple[Any, str, Any, str]  # (value, file:line, cell text, "number" | "time")


# -- partitions and the shared settings --------------------------------------------------
@dataclass
class _Part:
    """One partition: an input file, the split it feeds (``all``: assigned by row), its
    position in the reader's path list (the random split's draws) and its files' states."""

    index: int
    source: str
    reader: Reader
    file_index: int
    before: dict[str, tuple[int, int]] = field(default_factory=dict)
    span: tuple[int, int] | None = None  # bytes of the file (a span of a cut file)
    first_line: int = 1  # of the span, once its lines before were counted


@dataclass(frozen=True)
class _Job:
    build: str
    split: SplitConfig
    options: _Options
    chunk_rows: int
    rows_per_shard: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # this build (the workers' encoder cache)


class _Stopped(Exception):
    """A task stopped because another one failed (never shown to the user)."""


def partitions(reader: Reader, split: SplitConfig, span_bytes: int | None = None) -> list[Reader]:
    """The partition readers, in row order: one per entry of the ``path`` list of the reader
    (of every split's reader, train first, for a files split), a file larger than
    ``span_bytes`` cut into spans (each span's reader set to its line numbers)."""
    parts = _partitions(reader, split, span_bytes)
    _number_spans([p for p in parts if p.span is not None], _span_lines)
    return [_span_reader(p) for p in parts]


def _partitions(reader: Reader, split: SplitConfig, span_bytes: int | None = None) -> list[_Part]:
    out: list[_Part] = []
    for name, source in split_sources(reader, split).items():
        path = source.options().get("path")
        entries = list(path) if isinstance(path, (list, tuple)) and len(path) > 1 else None
        readers = [source.with_path(p) for p in entries] if entries else [source]
        for i, r in enumerate(readers):
            before = file_state({"p": r})
            spans: list[tuple[int, int] | None] = [*_cuts(r, span_bytes)] or [None]
            for span in spans:
                out.append(_Part(len(out), name, r, i, before, span))
    return out


def _cuts(reader: Reader, span_bytes: int | None) -> list[tuple[int, int]]:
    """The spans a partition's file is cut into (none: read whole)."""
    if span_bytes is None or not reader.reads_spans:
        return []
    files = reader.files()
    if len(files) != 1 or Path(files[0]).stat().st_size <= span_bytes or is_gzip(files[0]):
        return []
    cuts = byte_spans(files[0], span_bytes)
    return cuts if len(cuts) > 1 else []


def _number_spans(spans: list[_Part], lines: Callable[[_Part], int]) -> None:
    """Set each span's first line from the ``lines`` of the spans before it in its file (the
    parts are in row order: a file's spans in byte order)."""
    seen: dict[tuple[str, int], int] = {}
    for p in spans:
        key = (p.source, p.file_index)
        p.first_line = seen.get(key, 0) + 1
        seen[key] = seen.get(key, 0) + lines(p)


def _span_reader(part: _Part) -> Reader:
    """The partition's reader, on its span once its first line is known."""
    return part.reader if part.span is None else part.reader.with_span(*part.span, part.first_line)


@dataclass
class _Lines:
    index: int
    rows: int  # lines (the progress bar's count)


def _span_lines(part: _Part) -> int:
    assert part.span is not None
    return count_lines(part.reader.files()[0], *part.span)


def _count_span(part: _Part, job: _Job) -> _Lines:
    """Lines of a span (the first phase when a file is cut)."""
    _alive(job)
    return _Lines(part.index, _span_lines(part))


def dask_cache_folder(reader: Reader, config: PrepareConfig, span_bytes: int | None = None) -> Path:
    """The cache folder of :func:`prepare_shards_distributed` (``<reader>-dask-shards-<key>``:
    the key of ``prepare_shards``, another name, since a random split assigns other rows; with
    ``span_bytes`` where a file is cut, ``-s<span_bytes>`` too)."""
    base = shard_cache_folder(reader, config)
    key = base.name.rsplit("-", 1)[1]
    if any(p.span is not None for p in _partitions(reader, config.splitting, span_bytes)):
        key += f"-s{span_bytes}"
    return base.parent / f"{reader.name}-dask-shards-{key}"


def _alive(job: _Job) -> None:
    if not (Path(job.build) / _MARKER).exists():
        raise _Stopped(job.build)


def _time_end(chunk: RawData, split: SplitConfig, i: int) -> _TimeEnd:
    """Row ``i`` of a chunk's time: value, where, text and kind (for the order across files)."""
    order = TimeOrder(split.time_column or "", split.time_cuts)
    row = RawData(chunk.frame.iloc[[i]], chunk.schema, chunk.report)
    t = order.check(row)
    return t[0], line_of(chunk.report, chunk.frame.index[i]), chunk.frame[split.time_column].iloc[i], order.kind or ""


# -- tasks (run on the workers) ----------------------------------------------------------
@dataclass
class _Counted:
    """Pass 1 of one partition (or the row count of a time split by fractions)."""

    index: int
    rows: int
    chunks: int = 0
    schema: Schema | None = None
    counts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    moments: dict[str, DenseMoments] = field(default_factory=dict)
    fit_rows: int = 0
    train: SplitLabels = field(default_factory=SplitLabels)
    reports: list[ReadReport] = field(default_factory=list)
    ends: tuple[_TimeEnd, _TimeEnd] | None = None
    bytes: int = 0


def _chunks(part: _Part, job: _Job, splitter: RowSplitter | None,
            reader: Reader | None = None) -> Iterator[tuple[RawData, np.ndarray]]:
    """The partition's chunks with their split codes (see the module docstring), read by
    ``reader`` (default: the partition's)."""
    split = job.split
    bits = np.random.PCG64(np.random.SeedSequence([split.seed, part.file_index]))  # default_rng's
    if part.span is not None:
        bits.advance(part.first_line - 1)  # one draw per row: the draws of the rows before the span
    rng = np.random.Generator(bits)
    columns = splitter.columns if splitter is not None else []
    for chunk in (reader or _span_reader(part)).iter_chunks(job.chunk_rows, columns=columns):
        if split.kind is SplitMode.FILES:
            codes = np.full(len(chunk), SPLITS.index(part.source), dtype=np.int8)
        elif splitter is not None:
            codes = splitter.assign(chunk)
        else:
            u = rng.random(len(chunk))
            codes = ((u >= split.train).astype(np.int8) + (u >= split.train + split.val)).astype(np.int8)
        yield chunk, codes


def _splitter(job: _Job, total: int | None, offset: int) -> RowSplitter | None:
    if job.split.kind is not SplitMode.TIME:
        return None
    splitter = RowSplitter(job.split, total)
    splitter.position = offset
    return splitter


def _count(part: _Part, job: _Job) -> _Counted:
    """Rows of a partition (time split by fractions), its time order checked."""
    _alive(job)
    out = _Counted(part.index, 0)
    first = last = None
    for chunk, _ in _chunks(part, job, _splitter(job, 0, 0)):
        _alive(job)
        first = first or _time_end(chunk, job.split, 0)
        last, out.rows = chunk, out.rows + len(chunk)
    if first is not None and last is not None:
        out.ends = (first, _time_end(last, job.split, len(last) - 1))
    return out


def _pass1(part: _Part, job: _Job, total: int | None, offset: int) -> _Counted:
    """Pass 1 of a partition: split codes, counts of its training rows, the compact copy."""
    _alive(job)
    spill = SpillFolder(Path(job.build) / "spill" / f"p{part.index:05d}")
    splitter = _splitter(job, total, offset)
    out = _Counted(part.index, 0)
    fit: StreamingFit | None = None
    reports: dict[int, ReadReport] = {}
    first = last = None
    reader = _span_reader(part)
    try:
        for chunk, codes in prefetch(_chunks(part, job, splitter, reader)):
            _alive(job)
            reports.setdefault(id(chunk.report), chunk.report)
            if splitter is not None:
                first, last = first or _time_end(chunk, job.split, 0), chunk
            raw = apply_options(chunk, *job.options)
            if fit is None or out.schema is None:
                out.schema, fit = raw.schema, StreamingFit(raw.schema)
            elif raw.schema != out.schema:
                raise SchemaError(f"{chunk.report.source}: another schema than the file's first rows")
            spilled = spill_chunk(raw.frame, out.schema, codes, fit)
            out.train.add(spilled.labels[codes == 0])
            spill.write(spilled)
            out.rows += len(raw)
        spill.settle()  # on disk for pass 2 (maybe on another worker)
    finally:
        spill.stop()
    for r in reader.read_reports():  # with those of a file or span whose every row was skipped
        reports.setdefault(id(r), r)
    check_unchanged(part.before, {}, "while it was read")
    if first is not None and last is not None:
        out.ends = (first, _time_end(last, job.split, len(last) - 1))
    out.chunks, out.reports = spill.count, list(reports.values())
    out.bytes = sum(r.bytes_total or r.bytes_read for r in out.reports)
    if fit is not None:
        for c in fit.counts.values():
            len(c)  # merges the pending counts into the keys
        out.counts = {name: (c.keys, c.counts) for name, c in fit.counts.items()}
        out.moments, out.fit_rows = fit.moments, fit.rows
    return out


class _PartWriter(ShardWriter):
    """A :class:`ShardWriter` for one partition: its shards go straight into the shared build
    folder (already temporary) as ``<split>/<prefix>-<n>.npz``; the client writes the manifest."""

    def __init__(self, build: Path, prefix: str, rows_per_shard: int) -> None:  # no temporary folder of its own
        self.folder = self.tmp = build
        self.shard_prefix = f"{prefix}-"
        self.rows_per_shard = int(rows_per_shard)
        self._pending: dict[str, list[EncodedData]] = {}
        self._shards: dict[str, list[ShardInfo]] = {}
        self._writes = OneInFlight("shard-writer")
        self._done = True


@dataclass
class _Written:
    index: int
    rows: int
    shards: dict[str, list[ShardInfo]]
    labels: dict[str, SplitLabels]
    stats: dict[str, EncodeStats]


_ENCODER: dict[str, ChunkEncoder] = {}  # per worker process: the lookups of the current build


def _encoder(key: str, pre: Preprocessor) -> ChunkEncoder:
    if key not in _ENCODER:
        _ENCODER.clear()
        _ENCODER[key] = ChunkEncoder(pre)
    return _ENCODER[key]


def _pass2(part: _Part, job: _Job, chunks: int, pre: Preprocessor) -> _Written:
    """Pass 2 of a partition: its compact copy encoded into its own shards."""
    _alive(job)
    encoder = _encoder(job.tag, pre)
    folder = Path(job.build) / "spill" / f"p{part.index:05d}"
    labels: dict[str, SplitLabels] = {name: SplitLabels() for name in SPLITS}
    stats: dict[str, EncodeStats] = {name: EncodeStats() for name in SPLITS}
    rows = 0
    with _PartWriter(Path(job.build), f"p{part.index:05d}", job.rows_per_shard) as writer:  # its write in flight ends here
        for spilled in prefetch(SpilledChunk.load(chunk_path(folder, i)) for i in range(chunks)):
            _alive(job)
            pieces = shard_pieces(writer, rows_by_split(spilled.codes))
            for (name, _), data in encode_spilled(encoder, spilled, pieces).items():
                writer.append(name, data)
                labels[name].add(data.labels)
                add_stats(stats[name], data.stats)
            rows += len(spilled)
        shards = writer.flush()
    shutil.rmtree(folder, ignore_errors=True)
    return _Written(part.index, rows, shards, labels, stats)


# -- the client ----------------------------------------------------------------------------
#: where a local cluster's scheduler, workers and dashboard listen
LOOPBACK = "127.0.0.1"


@contextmanager
def _connect(client: Any, n_workers: int | None) -> Iterator[Any]:
    """A ``distributed.Client``: the one given, one connected to a scheduler address, or a
    local cluster of ``n_workers`` single-threaded processes (closed afterwards)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:  # pragma: no cover - the extra is in the test requirements
        raise ImportError(
            "the dask engine needs dask's distributed scheduler: pip install 'salience[distributed]'"
        ) from e
    if isinstance(client, Client):
        yield client
        return
    if isinstance(client, str):
        with Client(client) as c:
            yield c
        return
    # loopback only: Dask unpickles what its clients send, so a local cluster never listens beyond this host
    # single-threaded workers keep the column pool (recsys.parallel) inline: one process per core already
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host=LOOPBACK,
                      dashboard_address=f"{LOOPBACK}:8787", env={THREADS_VARIABLE: "1"}) as cluster, Client(cluster) as c:
        yield c


def _run(
    client: Any, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], job: _Job, desc: str, progress: bool,
    total: int | None = None, weight: Callable[[Any], float] | None = None,
    in_order: Callable[[Any], None] | None = None,
) -> list[Any]:
    """``fn(*args)`` for every ``calls`` entry on the cluster, results in order. On the first
    error the others stop at their next chunk; then the error of the earliest partition is
    raised (as the worker raised it). ``in_order`` sees each result in call order as soon as it
    and those before it are in (while later calls still run), until the first error."""
    from distributed import as_completed

    futures = [client.submit(fn, *args, key=f"salience-{fn.__name__.strip('_')}-{i:05d}-{job.tag}", pure=False)
               for i, args in enumerate(calls)]
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    errors: dict[int, BaseException] = {}
    done, handed = [False] * len(futures), 0  # results in; results handed to in_order
    done_weight, all_weight = 0.0, sum(weight(c) for c in calls) if weight else 0.0
    with Progress(desc, total, progress) as bar:
        try:
            for fut in as_completed(futures):
                i = index[fut.key]
                if fut.status == "error":
                    exc = fut.exception()
                    if not isinstance(exc, _Stopped):
                        errors[i] = exc
                        (Path(job.build) / _MARKER).unlink(missing_ok=True)  # the others stop
                    continue
                results[i] = fut.result()
                done[i] = True
                done_weight += weight(calls[i]) if weight else 0.0
                bar.update(results[i].rows, done_weight / all_weight if all_weight else None)
                while in_order is not None and not errors and handed < len(done) and done[handed]:
                    in_order(results[handed])
                    handed += 1
        except BaseException:  # Ctrl-C, a lost scheduler: stop what still runs
            (Path(job.build) / _MARKER).unlink(missing_ok=True)
            client.cancel(futures)
            raise
    if errors:
        raise errors[min(errors)]
    return results


def _check_time_order(parts: list[_Part], counted: list[_Counted], column: str) -> None:
    """The time column never goes back from one file to the next (checked within a file on
    the workers); all files hold times of one kind."""
    prev: _TimeEnd | None = None
    for c in counted:
        if c.ends is None:
            continue
        first, last = c.ends
        if prev is not None and first[3] != prev[3]:
            raise DataError(f"{first[1]}: the time column {column!r} holds {first[3]}s where {prev[3]}s "
                            f"(as in {prev[1]}) were expected")
        if prev is not None and first[0] < prev[0]:
            raise DataError(
                f"{first[1]}: the time column {column!r} goes back in time: {shown_value(first[2])} comes after "
                f"{shown_value(prev[2])} ({prev[1]}); a time split needs the rows in time order: sort the data by "
                f"{column!r}, or use a random split"
            )
        prev = last


class _FitMerger:
    """One :class:`StreamingFit` from the partitions' counts, merged in partition order as pass 1's
    results come in (token counts summed by key, moments combined as Chan et al.): the client merges
    while the workers still read, and drops each partition's counts once merged. A partition
    of another schema than the first is left out here (the client refuses it after pass 1)."""

    def __init__(self) -> None:
        self.fit: StreamingFit | None = None

    def add(self, c: _Counted) -> None:
        if c.schema is None:
            return
        if self.fit is None:
            self.fit = StreamingFit(c.schema)
        fit = self.fit
        if c.schema != fit.schema:
            return
        fit.rows += c.fit_rows
        for name, (keys, counts) in c.counts.items():
            fit.counts[name].add_keys(keys, counts)
        for name, m in c.moments.items():
            total = fit.moments[name]
            if m.n == 0:
                continue
            if total.n == 0:
                total.n, total.mean, total.m2 = m.n, m.mean, m.m2
                continue
            n = total.n + m.n
            delta = m.mean - total.mean
            total.mean += delta * m.n / n
            total.m2 += m.m2 + delta * delta * total.n * m.n / n
            total.n = n
        c.counts, c.moments = {}, {}  # merged: the client holds one copy of the counts


def prepare_shards_distributed(
    reader: Reader, config: PrepareConfig | None = None, client: Any = None, n_workers: int | None = None,
    span_bytes: int | None = SPAN_BYTES,
) -> ShardSet:
    """:func:`~recsys.data.streaming.prepare.prepare_shards` on a Dask cluster (module docstring).

    Args:
        reader: as in ``prepare_shards``.
        config: as in ``prepare_shards`` (``rows_per_shard`` per partition: each file's last
            shard of a split may hold fewer rows; it and ``chunk_rows`` sized by bytes from the
            reader's :meth:`~recsys.data.readers.base.Reader.schema_hint` when None); its
            ``cache_dir`` on storage every worker sees at the same path.
        client: a ``distributed.Client``, a scheduler address (``"tls://host:8786"``; see docs/multi-node.md for TLS), or None
            for a local cluster of ``n_workers`` single-threaded worker processes.
        n_workers: workers of the local cluster (None: one per core).
        span_bytes: cut a plain text file larger than this into spans of about this many
            bytes, one partition each (:attr:`~recsys.data.readers.base.Reader.reads_spans`
            readers; None: one partition per file). Part of the cache key.

    Returns:
        The opened :class:`ShardSet` (cached in ``cache_dir/<reader>-dask-shards-<key>``).

    Raises:
        DataError, SchemaError: as ``prepare_shards`` (bad rows name their file and line).
        OSError: the disk filled (``errno.ENOSPC``); nothing is left in the cache.
        ImportError: dask's ``distributed`` is not installed (the ``distributed`` extra).
    """
    if config is None or config.cache_dir is None:
        raise ValueError("prepare_shards_distributed writes shards to disk: give it a cache_dir")
    split = config.splitting
    hint = reader.schema_hint()
    rows_per_shard = config.rows_per_shard or (shard_rows(hint) if hint is not None else MAX_SHARD_ROWS)
    chunk_rows = config.chunk_rows or reader.default_chunk_rows()
    if span_bytes is not None and span_bytes < 1:
        raise ValueError(f"span_bytes must be >= 1 or None, got {span_bytes}")
    folder = dask_cache_folder(reader, replace(config, rows_per_shard=rows_per_shard), span_bytes)
    if folder.exists():
        try:
            return ShardSet.open(folder, checksum=config.checksum)
        except ShardError as e:
            import logging

            logging.getLogger(__name__).warning("rebuilding the damaged shard cache %s: %s", folder, e)
    parts = _partitions(reader, split, span_bytes)
    sources = split_sources(reader, split)
    build = folder.with_name(f".{folder.name}.build-{socket.gethostname()}-{os.getpid()}")  # one per client
    job = _Job(str(build), split, config.columns, chunk_rows, rows_per_shard)
    try:
        with _connect(client, n_workers) as c:
            if build.exists():
                shutil.rmtree(build)
            build.mkdir(parents=True)
            (build / _MARKER).touch()
            return _build(c, folder, parts, sources, reader.name, job, config.progress)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(
                e.errno, f"disk full while preparing shards in {folder.parent} ({e.strerror or e}); the partial "
                "shards were removed and nothing was cached: free space or set another cache_dir",
            ) from e
        raise
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _build(
    client: Any, folder: Path, parts: list[_Part], sources: dict[str, Reader], dataset: str, job: _Job,
    progress: bool,
) -> ShardSet:
    split, build = job.split, Path(job.build)
    before = {k: v for p in parts for k, v in p.before.items()}
    size = lambda call: float(sum(s for s, _ in call[0].before.values()))  # noqa: E731 - bytes of a partition
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    total, offsets = None, [0] * len(parts)
    spans = [p for p in parts if p.span is not None]
    if spans:  # the line numbers of the spans of cut files
        lines = _run(client, _count_span, [(p, job) for p in spans], job, "counting lines of the file spans (dask)",
                     progress, weight=lambda call: float(call[0].span[1] - call[0].span[0]))
        counts = {p.index: n.rows for p, n in zip(spans, lines)}
        _number_spans(spans, lambda p: counts[p.index])
        timing["lines_s"] = time.perf_counter() - t0
    if RowSplitter.needs_count(split):
        counted = _run(client, _count, [(p, job) for p in parts], job, "counting rows (time split, dask)", progress,
                       weight=size)
        _check_time_order(parts, counted, split.time_column or "")
        offsets = [int(x) for x in np.cumsum([0, *(c.rows for c in counted)])[:-1]]
        total = sum(c.rows for c in counted)
        timing["count_s"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    merger = _FitMerger()
    counted = _run(client, _pass1, [(p, job, total, off) for p, off in zip(parts, offsets)], job,
                   "pass 1/2: reading, counting vocabularies (dask)", progress, weight=size, in_order=merger.add)
    reports = join_spans([r for c in counted for r in c.reports])
    source = merge_reports(reports).source if reports else dataset
    schemas = [(p, c.schema) for p, c in zip(parts, counted) if c.schema is not None]
    if not schemas:
        raise DataError(f"{source}: the dataset is empty (no data rows)")
    schema = schemas[0][1]
    assert schema is not None
    for p, s in schemas:
        if s != schema:
            raise SchemaError(f"{p.reader.files()[0] if p.reader.files() else p.source}: the {p.source} files have "
                              "another schema than the train files")
    if split.kind is SplitMode.TIME:
        _check_time_order(parts, counted, split.time_column or "")
    train = SplitLabels()
    for c in counted:
        train.rows, train.positives = train.rows + c.train.rows, train.positives + c.train.positives
    train.check("train", source)
    check_unchanged(before, sources, "between the two passes")
    assert merger.fit is not None and merger.fit.schema == schema
    pre = merger.fit.result()
    timing["pass1_s"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    shared = client.scatter(pre, broadcast=True)
    written = _run(client, _pass2, [(p, job, c.chunks, shared) for p, c in zip(parts, counted)], job,
                   "pass 2/2: encoding shards (dask)", progress, total=sum(c.rows for c in counted))
    labels: dict[str, SplitLabels] = {name: SplitLabels() for name in SPLITS}
    stats: dict[str, EncodeStats] = {name: EncodeStats() for name in SPLITS}
    shards: dict[str, list[ShardInfo]] = {}
    for w in written:
        for name in SPLITS:
            labels[name].rows += w.labels[name].rows
            labels[name].positives += w.labels[name].positives
            add_stats(stats[name], w.stats[name])
            shards.setdefault(name, []).extend(w.shards.get(name, []))
    for name in SPLITS:
        if name == "train" or labels[name].rows:
            labels[name].check(name, source)
    check_unchanged(before, sources, "while it was being prepared")
    timing["pass2_s"] = time.perf_counter() - t2
    timing["total_s"] = time.perf_counter() - t0
    rows_all = sum(x.rows for x in labels.values())
    timing["rows_per_s"] = rows_all / max(timing["total_s"], 1e-9)
    summary = preparation_summary(dataset, source, reports, sources, split, schema, labels, stats, job.rows_per_shard, timing)
    summary["engine"] = {"name": "dask", "partitions": len(parts), **({"spans": len(spans)} if spans else {})}
    return _finish(folder, build, pre, shards, summary)


def _finish(folder: Path, build: Path, pre: Preprocessor, shards: dict[str, list[ShardInfo]],
            summary: dict[str, Any]) -> ShardSet:
    """Write the preprocessor and the manifest (last), then move the build folder into place."""
    (build / _MARKER).unlink(missing_ok=True)
    shutil.rmtree(build / "spill", ignore_errors=True)
    save_preprocessor(pre, build)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "splits": {
            name: {"rows": sum(s.rows for s in infos), "shards": [vars(s) for s in infos]}
            for name, infos in shards.items() if infos
        },
        "summary": summary,
    }
    write_artifact(build / MANIFEST, manifest)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(build, folder)
    return ShardSet.open(folder, preprocessor=pre)
