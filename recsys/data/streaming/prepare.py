"""Raw data larger than memory -> encoded shards on disk, in two streaming passes.

:func:`prepare_shards` is the out-of-core counterpart of :func:`~recsys.data.prepare.prepare_data`:

1. (a time split by fractions only) count the rows, checking the time column's order;
2. pass 1 over the raw rows, read once (the next chunk parsed in a background thread while
   this one is processed): split assignment, vocabularies and dense statistics of the training
   rows (:class:`~recsys.data.streaming.encoders.StreamingFit`; equal to ``Preprocessor.fit`` on those
   rows), and a compact dictionary-encoded copy of each chunk (:mod:`recsys.data.streaming.spill`);
3. pass 2 over that copy: ids from the fitted vocabularies
   (:class:`~recsys.data.streaming.encoders.ChunkEncoder`), appended to fixed-size shards
   (:class:`~recsys.data.streaming.shards.ShardWriter`) written into a temporary folder that replaces
   the cache folder only when everything succeeded.

Memory is bounded by ``chunk_rows`` (a chunk in flight and one read ahead), ``rows_per_shard``
(one shard pending per split) and the vocabularies; it does not grow with the number of rows.
Disk: the compact copy (about 4 bytes per sparse and 8 per dense cell) until the end.

The cache is keyed, like ``prepare_data``'s, by the reader's fingerprint (options plus size
and mtime of its files) and the options. A cached set whose manifest is missing or whose
shards are missing or of another size (another checksum, with ``checksum=True``) is rebuilt.
A raw file that changes between the passes, a split left empty or with one class, and a full
disk stop the preparation with an error and leave no cache behind.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from recsys.data.encoders import EncodeStats
from recsys.data.prepare import PrepareConfig, apply_options, split_readers
from recsys.data.progress import Progress
from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.readers.base import Reader
from recsys.data.readers.blocks import merge_reports
from recsys.data.schema import Schema, SchemaError
from recsys.data.splits import SPLITS, RowSplitter, SplitConfig, SplitMode, rows_by_split
from recsys.data.streaming.chunking import shard_rows
from recsys.data.streaming.encoders import ChunkEncoder, StreamingFit
from recsys.data.streaming.shards import ShardError, ShardSet, ShardWriter
from recsys.data.streaming.spill import SpillFolder, encode_spilled, spill_chunk

__all__ = ["prefetch", "prepare_shards", "shard_cache_folder"]

log = logging.getLogger(__name__)
T = TypeVar("T")


_DONE = object()


def prefetch(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """``items``, produced by a background thread up to ``depth`` ahead (parsing the next chunk
    while this one is encoded: Arrow and numpy release the GIL). Errors surface in order; a
    consumer that stops early stops the producer at its next item."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put((True, item))
            q.put((True, _DONE))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put((False, e))

    worker = threading.Thread(target=produce, name="prefetch", daemon=True)
    worker.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()


def split_sources(reader: Reader, split: SplitConfig) -> dict[str, Reader]:
    """The readers to stream: one per split of a files split, else ``{"all": reader}``."""
    return split_readers(reader, split) if split.kind is SplitMode.FILES else {"all": reader}


def shard_cache_folder(reader: Reader, config: PrepareConfig) -> Path:
    """The cache folder :func:`prepare_shards` uses for ``config`` (its ``cache_dir`` set)."""
    if config.cache_dir is None:
        raise ValueError("streamed preparation writes shards to disk: give it a cache_dir")
    split = config.splitting
    blob = json.dumps(
        [[r.fingerprint() for r in split_sources(reader, split).values()], split.to_dict(), *config.columns,
         {"layout": "shards", "rows_per_shard": config.rows_per_shard}],
        sort_keys=True, default=str,
    )
    return Path(config.cache_dir) / f"{reader.name}-shards-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def file_state(readers: dict[str, Reader]) -> dict[str, tuple[int, int]]:
    out = {}
    for r in readers.values():
        for f in r.files():
            st = Path(f).stat()
            out[str(f)] = (st.st_size, st.st_mtime_ns)
    return out


def check_unchanged(before: dict[str, tuple[int, int]], readers: dict[str, Reader], when: str) -> None:
    for path, (size, mtime) in before.items():
        try:
            st = Path(path).stat()
            now: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            now = None
        if now != (size, mtime):
            what = "was deleted" if now is None else f"changed (size {size} -> {now[0]} bytes, or its mtime)"
            raise DataError(
                f"{path}: the raw file {what} {when}; the preparation reads it twice and refuses a file that "
                "changes in between. Nothing was cached; run again once the file is complete"
            )


class SplitLabels:
    """Rows and positives of one split (for the empty / one-class checks and the CTR)."""

    def __init__(self) -> None:
        self.rows = 0
        self.positives = 0.0

    def add(self, labels: np.ndarray) -> None:
        self.rows += len(labels)
        self.positives += float(labels.sum())

    def check(self, name: str, source: str) -> None:
        """The errors of :func:`recsys.data.prepare.check_split`, from counts."""
        if self.rows == 0:
            raise DataError(f"{source}: the {name} split is empty; use more data or other split fractions")
        if self.positives in (0, self.rows):
            raise DataError(
                f"{source}: the {name} split has only one class (label={1 if self.positives else 0}, {self.rows} rows); "
                "AUC needs both clicks and non-clicks"
            )


class _Stream:
    """Chunks of every source in order, each with its split codes (a fresh splitter per pass)."""

    def __init__(self, sources: dict[str, Reader], split: SplitConfig, chunk_rows: int | None, total_rows: int | None) -> None:
        self.sources, self.split, self.chunk_rows, self.total_rows = sources, split, chunk_rows, total_rows
        self.reports: dict[int, ReadReport] = {}
        self.bytes_total = 1

    @property
    def fraction(self) -> float | None:
        done = sum(r.bytes_read for r in list(self.reports.values()))  # (the prefetch thread adds reports)
        return done / self.bytes_total if done else None

    def chunks(self) -> Iterator[tuple[str, RawData, np.ndarray]]:
        """``(source name, chunk, split codes)`` of every source, in order."""
        splitter = None if self.split.kind is SplitMode.FILES else RowSplitter(self.split, self.total_rows)
        columns = splitter.columns if splitter is not None else []
        self.bytes_total = sum(Path(f).stat().st_size for r in self.sources.values() for f in r.files()) or 1
        for name, reader in self.sources.items():
            for chunk in reader.iter_chunks(self.chunk_rows, columns=columns):
                self.reports.setdefault(id(chunk.report), chunk.report)
                if splitter is not None:
                    codes = splitter.assign(chunk)
                else:
                    codes = np.full(len(chunk), SPLITS.index(name), dtype=np.int8)
                yield name, chunk, codes


def prepare_shards(reader: Reader, config: PrepareConfig | None = None) -> ShardSet:
    """Stream ``reader`` into encoded shards (fit on training rows only); cached in ``config.cache_dir``.

    Args:
        reader: the dataset reader (its :meth:`~Reader.iter_chunks` is streamed).
        config: split, columns, cache folder (required: it holds the shard sets, one per reader
            and options) and the streamed fields (:class:`~recsys.data.prepare.PrepareConfig`). A
            random split draws one uniform number per row (fractions approximate; other rows
            than ``prepare_data``'s permutation).

    Returns:
        The opened :class:`ShardSet`: splits ``train`` and the non-empty ``val``/``test``,
        the fitted preprocessor, and the summary (``prepare_data``'s keys plus ``shards``).

    Raises:
        DataError: bad rows (as the readers raise them), a split empty or with one class, a
            raw file changed between the passes, a time column missing or out of order.
        OSError: the disk filled (``errno.ENOSPC``); nothing is left in the cache.
    """
    if config is None or config.cache_dir is None:
        raise ValueError("prepare_shards writes shards to disk: give it a cache_dir")
    split = config.splitting
    folder = shard_cache_folder(reader, config)
    if folder.exists():
        try:
            shards = ShardSet.open(folder, checksum=config.checksum)
            log.info("loaded %s shards from cache %s", reader.name, folder)
            return shards
        except ShardError as e:  # a damaged cache is rebuilt, never trusted
            log.warning("rebuilding the damaged shard cache %s: %s", folder, e)
    sources = split_sources(reader, split)
    before = file_state(sources)
    try:
        return _build(folder, sources, reader.name, split, config.columns, config.rows_per_shard,
                      config.chunk_rows, config.progress, before)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(
                e.errno, f"disk full while preparing shards in {folder.parent} ({e.strerror or e}); the partial "
                "shards were removed and nothing was cached: free space or set another cache_dir",
            ) from e
        raise


def _build(
    folder: Path, sources: dict[str, Reader], dataset: str, split: SplitConfig,
    options: tuple[list[str] | None, list[str] | None, int | None], rows_per_shard: int | None, chunk_rows: int | None,
    progress: bool, before: dict[str, tuple[int, int]],
) -> ShardSet:
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    total = None
    if RowSplitter.needs_count(split):  # a time split by fractions cuts at row positions
        stream = _Stream(sources, split, chunk_rows, 0)
        with Progress("counting rows (time split)", enabled=progress) as bar:
            for _, chunk, _ in stream.chunks():
                bar.update(len(chunk), stream.fraction)
        total = bar.rows
        timing["count_s"] = time.perf_counter() - t0

    with SpillFolder(folder.with_name(f".{folder.name}.spill{os.getpid()}")) as spill:
        # pass 1: read every row once; fit on the training rows; keep a compact copy
        t1 = time.perf_counter()
        stream = _Stream(sources, split, chunk_rows, total)
        fit: StreamingFit | None = None
        schema: Schema | None = None
        train = SplitLabels()
        with Progress("pass 1/2: reading, counting vocabularies", enabled=progress) as bar:
            for name, chunk, codes in prefetch(stream.chunks()):
                raw = apply_options(chunk, *options)
                if fit is None or schema is None:
                    schema, fit = raw.schema, StreamingFit(raw.schema)
                elif raw.schema != schema:
                    raise SchemaError(f"{chunk.report.source}: the {name} files have another schema than the train files")
                spilled = spill_chunk(raw.frame, schema, codes, fit)
                train.add(spilled.labels[codes == 0])
                spill.write(spilled)
                bar.update(len(raw), stream.fraction)
        reports = list(stream.reports.values())
        source = merge_reports(reports).source if reports else dataset
        if fit is None or schema is None:
            raise DataError(f"{source}: the dataset is empty (no data rows)")
        train.check("train", source)
        check_unchanged(before, sources, "between the two passes")
        pre = fit.result()
        del fit  # the token counts (the vocabularies live on in pre)
        encoder = ChunkEncoder(pre)
        timing["pass1_s"] = time.perf_counter() - t1

        # pass 2: encode every split into shards
        t2 = time.perf_counter()
        labels: dict[str, SplitLabels] = {name: SplitLabels() for name in SPLITS}
        stats: dict[str, EncodeStats] = {name: EncodeStats() for name in SPLITS}
        rows_per_shard = shard_rows(schema) if rows_per_shard is None else rows_per_shard
        with ShardWriter(folder, rows_per_shard) as writer, \
                Progress("pass 2/2: encoding shards", bar.rows, progress) as bar2:
            for spilled in prefetch(spill):
                pieces = shard_pieces(writer, rows_by_split(spilled.codes))
                for (part, _), data in encode_spilled(encoder, spilled, pieces).items():
                    writer.append(part, data)
                    labels[part].add(data.labels)
                    add_stats(stats[part], data.stats)
                bar2.update(len(spilled))
            for name in SPLITS:
                if name == "train" or labels[name].rows:
                    labels[name].check(name, source)
            check_unchanged(before, sources, "while it was being prepared")
            timing["pass2_s"] = time.perf_counter() - t2
            timing["total_s"] = time.perf_counter() - t0
            rows_all = sum(x.rows for x in labels.values())
            timing["rows_per_s"] = rows_all / max(timing["total_s"], 1e-9)
            summary = preparation_summary(dataset, source, reports, sources, split, schema, labels, stats, rows_per_shard, timing)
            shards = writer.finish(pre, summary)
    log.info(
        "prepared %s rows into %s in %s s (%.0f rows/s)", f"{rows_all:,}", folder, f"{timing['total_s']:.1f}",
        timing["rows_per_s"],
    )
    return shards


def shard_pieces(writer: ShardWriter, rows: dict[str, np.ndarray]) -> dict[Any, np.ndarray]:
    """The rows of each split cut where its shards end, keyed ``(split, i)`` in order (so each
    shard is written from whole pieces and its stats are exact)."""
    out: dict[Any, np.ndarray] = {}
    for part, idx in rows.items():
        if not len(idx):
            continue
        first = writer.room(part)
        bounds = [0, *range(first, len(idx), writer.rows_per_shard), len(idx)]
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            if b > a:
                out[(part, i)] = idx[a:b]
    return out


def add_stats(total: EncodeStats, part: EncodeStats) -> None:
    total.rows += part.rows
    for k, v in part.oov.items():
        total.oov[k] = total.oov.get(k, 0) + v
    for k, v in part.dense_filled.items():
        total.dense_filled[k] = total.dense_filled.get(k, 0) + v


def preparation_summary(
    dataset: str, source: str, reports: list[ReadReport], sources: dict[str, Reader], split: SplitConfig,
    schema: Schema, labels: dict[str, SplitLabels], stats: dict[str, EncodeStats], rows_per_shard: int,
    timing: dict[str, float],
) -> dict[str, Any]:
    if split.kind is SplitMode.FILES:  # per split its files' report
        by_split: dict[str, list[ReadReport]] = {}
        files = {name: {str(f) for f in r.files()} for name, r in sources.items()}
        for rep in reports:
            name = next(n for n, fs in files.items() if rep.source in fs)
            by_split.setdefault(name, []).append(rep)
        read: dict[str, Any] = {name: merge_reports(reps).to_dict() for name, reps in by_split.items()}
    else:
        read = merge_reports(reports).to_dict()
    present = [name for name in SPLITS if labels[name].rows]
    return {
        "dataset": dataset,
        "source": source,
        "read": read,
        "split": {**split.to_dict(), **{f"{k}_rows": labels[k].rows for k in SPLITS}},
        "features": {"sparse": len(schema.sparse), "dense": len(schema.dense)},
        "encode": {name: stats[name].to_dict() for name in present},
        "ctr": {name: labels[name].positives / labels[name].rows for name in present},
        "shards": {"rows_per_shard": rows_per_shard},
        "timing": {k: round(v, 3) for k, v in timing.items()},
    }
