"""Frappe app-usage CTR set in libFM format (NFM/AFN version): ``label idx:1 ... idx:1``.

Line numbering when several files are pooled
--------------------------------------------
The frame index must be unique, so it cannot be the line number within each file. It is the
line number in the *concatenation* of the files in the order given: file k's line ``j`` gets
index ``offset_k + j`` where ``offset_k`` is the total line count of the files before it (so
for a single file the index is exactly its line number, and skipped lines still use up their
numbers). ``report.notes["files"]`` records, per file, its path, ``offset``, ``lines`` and
``rows`` kept; :func:`locate` turns an index back into ``(file, line)``. Errors found while
parsing name the real ``file:line`` directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from recsys.data.raw import DataError, RawData, ReadReport, resolve_data_path
from recsys.data.readers.base import Reader
from recsys.data.readers.lines import check_parsed, int_strings, parse_numbers, parse_table, read_bytes, scan_lines
from recsys.data.schema import FeatureKind, FeatureSpec, Schema

__all__ = ["FRAPPE_FIELDS", "FrappeReader", "locate"]

#: (field, cardinality) in libFM order; global index blocks are the cumulative sums
FRAPPE_FIELDS: list[tuple[str, int]] = [
    ("user", 957),
    ("item", 4082),
    ("daytime", 7),
    ("weekday", 7),
    ("isweekend", 2),
    ("homework", 3),
    ("cost", 2),
    ("weather", 9),
    ("country", 80),
    ("city", 233),
]
_NAMES = [n for n, _ in FRAPPE_FIELDS]
_PAIRS = [f"pair{k}" for k in range(1, len(_NAMES) + 1)]
_CARD = np.array([c for _, c in FRAPPE_FIELDS], dtype=np.int64)
_START = np.concatenate([[0], np.cumsum(_CARD)[:-1]])
_TOTAL = int(_CARD.sum())
_DEFAULT = "frappe"
_DEFAULT_FILES = ["frappe.validation.libfm.gz", "frappe.test.libfm.gz"]


def _explain(row: pd.Series, malformed: np.ndarray, field: np.ndarray) -> str:
    """Why one parsed line is bad (called for the first bad line only)."""
    for k, bad in enumerate(malformed):
        if bad:
            cell = str(row[_PAIRS[k]]).rstrip("\r")
            return f"pair {k + 1} {cell!r} is not 'index:1' with 0 <= index < {_TOTAL}"
    seen = [_NAMES[f] for f in field]
    missing = [n for n in _NAMES if n not in seen]
    repeated = sorted({n for n in seen if seen.count(n) > 1})
    return f"expected one pair per field; missing {missing}, repeated {repeated}"


def locate(report: ReadReport, index: int) -> tuple[str, int]:
    """The ``(file, line)`` of a frame index produced by :class:`FrappeReader`."""
    for f in report.notes.get("files", []):
        if f["offset"] < index <= f["offset"] + f["lines"]:
            return f["file"], int(index - f["offset"])
    raise KeyError(f"index {index} is outside every file of {report.source}")


class FrappeReader(Reader):
    """Reads Frappe libFM files into 10 categorical fields.

    Each line is a label (``1`` = used, ``-1`` = sampled negative, mapped to 1/0) and exactly
    10 ``index:1`` pairs. The field of an index is the global index block it falls in (see
    ``frappe/PROVENANCE.md``; pair order does not matter) and every field must occur exactly
    once per line. A cell holds the local id ``index - block start`` as a string.
    See the module docstring for the frame index when several files are pooled.

    Args:
        path: the Frappe folder (default ``frappe`` under ``$SALIENCE_DATA_DIR``) or one file;
            when it is a file, ``filenames`` is ignored.
        filenames: files inside the folder to pool, in order. (Named ``filenames``, not
            ``files``, because :meth:`Reader.files` is taken.)
        skip_bad_rows: drop rows with a wrong pair count, a malformed or out-of-range pair, or
            a field missing or repeated (counted in the report) instead of raising. A label other
            than 1/-1 always raises.
        embedding_dim: embedding width of every field.
        min_count: vocabulary threshold of every field.
    """

    name = "frappe"

    def __init__(
        self,
        path: str | None = None,
        filenames: list[str] = _DEFAULT_FILES,  # noqa: B006 - copied, never mutated
        skip_bad_rows: bool = False,
        embedding_dim: int = 16,
        min_count: int = 1,
    ) -> None:
        self.path = path
        self.filenames = list(filenames)
        self.skip_bad_rows = skip_bad_rows
        self.embedding_dim = embedding_dim
        self.min_count = min_count

    def files(self) -> list[Path]:
        root = resolve_data_path(self.path, _DEFAULT)
        if root.is_file():
            return [root]
        if not self.filenames:
            raise ValueError("FrappeReader: filenames is empty")
        out = [root / f for f in self.filenames]
        missing = [str(p) for p in out if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"Frappe file(s) not found: {missing}; {root} holds {sorted(p.name for p in root.iterdir())}"
            )
        return out

    def build_schema(self) -> Schema:
        """The Frappe schema built from this reader's options."""
        feats = [
            FeatureSpec(n, FeatureKind.CATEGORICAL, embedding_dim=self.embedding_dim, min_count=self.min_count)
            for n in _NAMES
        ]
        return Schema(features=tuple(feats), label="label", name=self.name)

    def read(self) -> RawData:
        paths = self.files()
        source = str(paths[0]) if len(paths) == 1 else str(paths[0].parent)
        report = ReadReport(source=source)
        frames: list[pd.DataFrame] = []
        notes: list[dict[str, Any]] = []
        offset = 0
        for path in paths:
            part = ReadReport(source=str(path))
            data = read_bytes(path)
            n_lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
            frame = self._read_one(data, str(path), part)
            frame.index = frame.index + offset
            report.skip([x + offset for x in part.skipped_lines])
            report.rows_skipped += part.rows_skipped - len(part.skipped_lines)  # beyond the first 1000
            notes.append(
                {"file": str(path), "offset": offset, "lines": n_lines, "rows": len(frame),
                 "rows_skipped": part.rows_skipped, "skipped_lines": part.skipped_lines[:50]}
            )
            frames.append(frame)
            offset += n_lines
        frame = pd.concat(frames) if len(frames) > 1 else frames[0]
        report.rows_read = len(frame)
        report.notes["files"] = notes
        return RawData(frame=frame, schema=self.build_schema(), report=report)

    def _read_one(self, data: bytes, source: str, report: ReadReport) -> pd.DataFrame:
        """Parse one libFM file; the index is its own 1-based line number."""
        scanned = scan_lines(
            data, source=source, sep=" ", expected=len(_NAMES) + 1, report=report,
            skip_bad_rows=self.skip_bad_rows,
            message=lambda e, f: f"expected {e - 1} 'index:value' pairs after the label, found {f - 1}",
        )
        raw = parse_table(scanned.data, source=source, sep=" ", names=["label", *_PAIRS])
        raw = check_parsed(raw, scanned.lines, source)

        label = raw["label"].str.strip()
        lab = np.select([label.eq("1").to_numpy(), label.eq("-1").to_numpy()], [1, 0], -1).astype(np.int8)
        if (lab < 0).any():
            pos = int(np.argmax(lab < 0))
            raise DataError(
                f"{source}:{raw.index[pos]}: label {raw['label'].iloc[pos]!r} is not 1 or -1 "
                f"({int((lab < 0).sum())} bad label(s) in all)"
            )

        n, m = len(raw), len(_NAMES)
        idx = np.empty((n, m), dtype=np.float64)
        malformed = np.empty((n, m), dtype=bool)
        for k, col in enumerate(_PAIRS):
            arr = pa.array(raw[col].str.rstrip("\r"), from_pandas=True)
            one_hot = pc.ends_with(arr, ":1").to_numpy(zero_copy_only=False)
            idx[:, k], bad_idx = parse_numbers(pd.Series(pc.utf8_slice_codeunits(arr, 0, -2), dtype=str), integer=True)
            malformed[:, k] = ~one_hot | bad_idx | np.isnan(idx[:, k])
        malformed |= (idx < 0) | (idx >= _TOTAL)
        # the field of an index is the block it falls in; every field must occur exactly once
        field = np.where(malformed, -1, np.searchsorted(_START, np.nan_to_num(idx), side="right") - 1)
        bad = malformed.any(axis=1) | (np.sort(field, axis=1) != np.arange(m)).any(axis=1)
        if bad.any() and not self.skip_bad_rows:
            pos = int(np.argmax(bad))
            raise DataError(
                f"{source}:{raw.index[pos]}: {_explain(raw.iloc[pos], malformed[pos], field[pos])} "
                f"({int(bad.sum())} bad row(s) in all; skip_bad_rows=True drops them)"
            )
        good = np.flatnonzero(~bad)
        local = np.zeros((n, m), dtype=np.int64)
        f_good = field[good]
        local[good[:, None], f_good] = idx[good[:, None], np.arange(m)] - _START[f_good]
        out = {name: int_strings(local[:, k], raw.index) for k, name in enumerate(_NAMES)}
        frame = pd.DataFrame(out, index=raw.index)
        frame["label"] = lab
        if bad.any():
            report.skip(raw.index[bad].to_numpy())
            frame = frame[~bad]
            if len(frame) == 0:
                raise DataError(f"{source}: no data rows left after skipping {int(bad.sum())} bad row(s)")
        return frame
