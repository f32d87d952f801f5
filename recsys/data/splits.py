"""Which rows train, validate and test: seeded random, predefined files, or time-ordered.

* :attr:`SplitMode.RANDOM`: seeded random rows in the given fractions. In memory
  (:func:`split_indices`) a seeded permutation cut at the exact fractions; streamed
  (:class:`RowSplitter`) one uniform draw per row from a seeded generator, in row order, so the
  assignment does not depend on the chunk size but the fractions hold only approximately
  (binomial: about ``sqrt(n f (1 - f))`` rows off). The two give different rows.
* :attr:`SplitMode.FILES`: predefined files per split (the BARS ``x1`` sets ship
  ``train``/``valid``/``test`` files); every split is read by the same reader with its
  ``path`` replaced (:meth:`Reader.with_path`).
* :attr:`SplitMode.TIME`: rows in time order on ``time_column``; earlier rows train, later ones
  validate, the latest test. With ``time_cuts`` a row goes by its time (``t < cuts[0]``: train,
  ``cuts[0] <= t < cuts[1]``: val, later: test); without, by position: the first ``train``
  fraction of the rows trains, the next ``val`` fraction validates (rows of equal time may then
  fall on both sides of a cut; give ``time_cuts`` to cut between times). The column must hold
  numbers (Unix seconds, a day index) or ISO-8601 times, never missing and never decreasing
  from one row to the next (across files too): a missing or earlier time is a ``DataError``
  naming the file and line.

A random split of time-ordered data (click logs, Criteo's day files) trains on rows later than
some it is evaluated on, so it leaks the future into training and overstates offline AUC; use
a time or files split for such data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, unique
from typing import Any, Literal

import numpy as np
import pandas as pd

from recsys.data.raw import DataError, RawData, ReadReport
from recsys.data.readers.lines import parse_numbers
from recsys.data.schema import SchemaError

__all__ = [
    "SPLITS", "RowSplitter", "SplitConfig", "SplitMode", "SplitName", "rows_by_split", "split_indices",
]

#: the data splits: training rows, validation (selection, early stopping) and test rows
SplitName = Literal["train", "val", "test"]
SPLITS: tuple[SplitName, ...] = ("train", "val", "test")
_ALIASES = {"valid": "val", "validation": "val"}


@unique
class SplitMode(str, Enum):
    """How rows are assigned to splits."""

    RANDOM = "random"  # seeded random rows in the given fractions
    FILES = "files"  # predefined files per split (BARS x1: train/valid/test)
    TIME = "time"  # ordered on time_column: earlier rows train, later validate, latest test


@dataclass(frozen=True)
class SplitConfig:
    """How to split rows into train/val/test (see the module docstring).

    Args:
        train, val, test: fractions (random split, and a time split without ``time_cuts``);
            each >= 0, train > 0, summing to 1.
        seed: seed of the random split.
        mode: ``random``, ``files`` or ``time``; None picks ``files`` when ``files`` is set,
            ``time`` when ``time_column`` is set, else ``random``.
        files: per split (``train``, ``val`` (or ``valid``), ``test``) a path or list of
            paths for the reader; ``train`` is required.
        time_column: the column that orders the rows (read besides the features; it need not
            be a feature).
        time_cuts: one or two times (numbers, or ISO-8601 text for a column of times): where
            validation starts and, optionally, where test starts.
    """

    train: float = 0.8
    val: float = 0.1
    test: float = 0.1
    seed: int = 42
    mode: Literal["random", "files", "time"] | None = None  # SplitMode's values (the config parser reads Enums by name)
    files: dict[str, str | list[str]] | None = None
    time_column: str | None = None
    time_cuts: list[float | str] | None = None

    def __post_init__(self) -> None:
        parts = (self.train, self.val, self.test)
        if any(not p >= 0 for p in parts) or not abs(sum(parts) - 1.0) <= 1e-6 or not self.train > 0:  # NaN fails
            raise ValueError(f"split fractions must be >= 0, train > 0 and sum to 1, got {parts}")
        # mode stays as given (None too: a config merged onto the default may set files or a time column)
        if self.mode is not None and self.mode not in {m.value for m in SplitMode}:
            raise ValueError(f"split mode must be one of {[m.value for m in SplitMode]}, got {self.mode!r}")
        mode = self.kind
        if mode is SplitMode.FILES:
            self._check_files()
        elif self.files:
            raise ValueError(f"split.files is set but the split mode is {mode.value!r}; use mode 'files'")
        if mode is SplitMode.TIME:
            if not self.time_column:
                raise ValueError("a time split needs split.time_column (the column that orders the rows)")
            cuts = self.time_cuts
            if cuts is not None and (not 1 <= len(cuts) <= 2 or len({type(c) is str for c in cuts}) > 1):
                raise ValueError(f"split.time_cuts must be one or two times of one kind, got {cuts!r}")
        elif self.time_cuts is not None:
            raise ValueError(f"split.time_cuts is set but the split mode is {mode.value!r}; use mode 'time'")

    def _check_files(self) -> None:
        files = dict(self.files or {})
        bad = [k for k in files if _ALIASES.get(k, k) not in SPLITS]
        if bad or "train" not in files:
            raise ValueError(
                f"split.files must map 'train' (required), 'val' (or 'valid') and 'test' to paths, got keys {list(files)}"
            )
        object.__setattr__(self, "files", {_ALIASES.get(k, k): v for k, v in files.items()})

    @property
    def kind(self) -> SplitMode:
        """The mode: ``mode`` when set, else files / time / random as ``files`` / ``time_column`` are set."""
        if self.mode is not None:
            return SplitMode(self.mode)
        return SplitMode.FILES if self.files else SplitMode.TIME if self.time_column else SplitMode.RANDOM

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings (the cache key and the summary): the four fields of a random split
        as before, plus the mode and its own fields otherwise."""
        out: dict[str, Any] = {"train": self.train, "val": self.val, "test": self.test, "seed": self.seed}
        if self.kind is SplitMode.FILES:
            out.update(mode="files", files=self.files)
        elif self.kind is SplitMode.TIME:
            out.update(mode="time", time_column=self.time_column, time_cuts=self.time_cuts)
        return out


def split_indices(n: int, split: SplitConfig) -> dict[str, np.ndarray]:
    """In-memory random split: a seeded permutation cut into train/val/test row indices (each sorted)."""
    perm = np.random.default_rng(split.seed).permutation(n)
    n_train = int(round(split.train * n))
    n_val = int(round(split.val * n))
    cuts = {"train": perm[:n_train], "val": perm[n_train : n_train + n_val], "test": perm[n_train + n_val :]}
    return {k: np.sort(v) for k, v in cuts.items()}


def rows_by_split(codes: np.ndarray) -> dict[str, np.ndarray]:
    """Split codes (0 train, 1 val, 2 test) as sorted row positions per split."""
    return {name: np.flatnonzero(codes == i) for i, name in enumerate(SPLITS)}


class RowSplitter:
    """Assigns the rows of a stream of chunks, in row order, to splits (random or time).

    Call :meth:`assign` on every chunk in order (the same chunks, in the same order, give the
    same codes in every pass). A files split assigns by reader and needs no splitter.

    Args:
        split: the split.
        total_rows: rows in the whole stream; needed by a time split without ``time_cuts``
            (see :attr:`needs_count`).
    """

    def __init__(self, split: SplitConfig, total_rows: int | None = None) -> None:
        if split.kind is SplitMode.FILES:
            raise ValueError("a files split assigns rows by reader; RowSplitter handles random and time splits")
        self.split = split
        self.position = 0
        self._rng = np.random.default_rng(split.seed)
        self._time = TimeOrder(split.time_column or "", split.time_cuts) if split.kind is SplitMode.TIME else None
        if self.needs_count(split) and total_rows is None:
            raise ValueError("a time split without time_cuts cuts by position and needs total_rows")
        self._bounds = (0, 0)
        if total_rows is not None:
            n_train = int(round(split.train * total_rows))
            self._bounds = (n_train, n_train + int(round(split.val * total_rows)))

    @staticmethod
    def needs_count(split: SplitConfig) -> bool:
        """True for a time split by fractions: the rows must be counted first."""
        return split.kind is SplitMode.TIME and split.time_cuts is None

    @property
    def columns(self) -> list[str]:
        """Raw columns the splitter reads besides the features (the time column)."""
        return [self.split.time_column] if self._time is not None and self.split.time_column else []

    def assign(self, chunk: RawData) -> np.ndarray:
        """int8 codes of the chunk's rows: 0 train, 1 val, 2 test."""
        n = len(chunk)
        if self._time is None:
            u = self._rng.random(n)
            s = self.split
            codes = (u >= s.train).astype(np.int8) + (u >= s.train + s.val)
        else:
            t = self._time.check(chunk)
            if self.split.time_cuts is None:
                pos = np.arange(self.position, self.position + n)
                codes = (pos >= self._bounds[0]).astype(np.int8) + (pos >= self._bounds[1])
            else:
                codes = self._time.codes(t)
        self.position += n
        return codes.astype(np.int8)


def shown_value(value: Any) -> str:
    """A cell for a message: text quoted, numbers plain."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value) if isinstance(value, str) else str(value)


def line_of(report: ReadReport, index: Any) -> str:
    """``file:line`` of a frame index (pooled indexes of several files resolved to their file)."""
    for f in report.notes.get("files", []):
        if f["offset"] < index <= f["offset"] + f["lines"]:
            return f"{f['file']}:{int(index - f['offset'])}"
    return f"{report.source}:{index}"


class TimeOrder:
    """Parses the time column chunk by chunk and checks it is present and never decreasing."""

    def __init__(self, column: str, cuts: list[float | str] | None) -> None:
        self.column = column
        self.kind: str | None = None if cuts is None else ("time" if isinstance(cuts[0], str) else "number")
        self.raw_cuts = cuts
        self.cuts: np.ndarray | None = None
        self.last: tuple[Any, str, Any] | None = None  # (value, where, text)

    def check(self, chunk: RawData) -> np.ndarray:
        frame = chunk.frame
        if self.column not in frame.columns:
            raise SchemaError(
                f"{chunk.report.source}: the time split's column {self.column!r} is not in the data; "
                f"available columns: {list(frame.columns)}"
            )
        cells = frame[self.column]
        t, missing, bad = self._parse(cells)
        where = lambda i: line_of(chunk.report, frame.index[i])  # noqa: E731
        if missing.any():
            i = int(np.argmax(missing))
            raise DataError(
                f"{where(i)}: the time column {self.column!r} is missing; a time split needs a time on every row"
            )
        if bad.any():
            i = int(np.argmax(bad))
            what = "a number" if self.kind == "number" else "an ISO-8601 time"
            raise DataError(f"{where(i)}: the time column {self.column!r}: {shown_value(cells.iloc[i])} is not {what}")
        if len(t):
            prev = np.concatenate([[self.last[0]], t[:-1]]) if self.last is not None else np.concatenate([t[:1], t[:-1]])
            down = t < prev
            if down.any():
                i = int(np.argmax(down))
                before = self.last[1] if i == 0 and self.last is not None else where(i - 1)
                prev_text = self.last[2] if i == 0 and self.last is not None else cells.iloc[i - 1]
                raise DataError(
                    f"{where(i)}: the time column {self.column!r} goes back in time: {shown_value(cells.iloc[i])} comes "
                    f"after {shown_value(prev_text)} ({before}); a time split needs the rows in time order: sort the data by "
                    f"{self.column!r}, or use a random split"
                )
            self.last = (t[-1], where(len(t) - 1), cells.iloc[-1])
        return t

    def _parse(self, cells: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, missing mask, unparseable mask); values are float64 numbers or int64 ns."""
        if pd.api.types.is_datetime64_any_dtype(cells.dtype):
            kind, out = "time", self._times(cells)
        elif pd.api.types.is_numeric_dtype(cells.dtype) and not pd.api.types.is_bool_dtype(cells.dtype):
            kind, x = "number", cells.to_numpy(dtype=np.float64, na_value=np.nan)
            out = (x, np.isnan(x), np.zeros(len(x), bool))
        else:
            x, bad = parse_numbers(cells)
            text = cells.astype(object).where(cells.notna(), "").astype(str).str.strip()
            empty = text.eq("").to_numpy()
            if self.kind == "number" or (self.kind is None and not bad.any()):
                kind, out = "number", (x, empty | (np.isnan(x) & ~bad), bad)
            else:
                kind, out = "time", self._times(cells)
        if self.kind is None:
            self.kind = kind
        elif kind != self.kind:
            expected = f"{self.kind}s ({'as split.time_cuts are' if self.raw_cuts else 'as in earlier rows'})"
            raise DataError(f"the time column {self.column!r} holds {kind}s where {expected} were expected")
        if self.cuts is None and self.raw_cuts is not None:
            self.cuts = self._cut_values()
        return out

    def _times(self, cells: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        text = cells.astype(object).where(cells.notna(), "").astype(str).str.strip()
        empty = text.eq("").to_numpy()
        parsed = pd.to_datetime(cells.where(~empty, None), format="ISO8601", errors="coerce", utc=True)
        nat = parsed.isna().to_numpy()
        values = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64) if len(parsed) else np.zeros(0, np.int64)
        return values, empty, nat & ~empty

    def _cut_values(self) -> np.ndarray:
        assert self.raw_cuts is not None
        try:
            if self.kind == "time":
                vals = [pd.Timestamp(c) for c in self.raw_cuts]
                vals = [v.tz_localize("UTC") if v.tzinfo is None else v.tz_convert("UTC") for v in vals]
                cuts = np.array([v.value for v in vals], dtype=np.int64)
            else:
                cuts = np.array([float(c) for c in self.raw_cuts], dtype=np.float64)
        except (ValueError, TypeError) as e:
            raise ValueError(f"split.time_cuts {self.raw_cuts!r} do not fit the time column {self.column!r}: {e}") from e
        if cuts.size == 2 and cuts[1] < cuts[0]:
            raise ValueError(f"split.time_cuts must not decrease, got {self.raw_cuts!r}")
        return cuts

    def codes(self, t: np.ndarray) -> np.ndarray:
        assert self.cuts is not None
        out = (t >= self.cuts[0]).astype(np.int8)
        if self.cuts.size == 2:
            out += t >= self.cuts[1]
        return out

