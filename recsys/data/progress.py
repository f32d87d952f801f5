"""Progress of a long pass over rows: rows done, rows/s and ETA.

On a terminal a tqdm bar; otherwise (a log file, a batch job) an INFO log line every
``interval`` seconds and one when the pass ends, so a long preparation is never silent.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import Any

__all__ = ["Progress", "format_seconds"]

log = logging.getLogger("recsys.data.progress")


def format_seconds(seconds: float) -> str:
    """``3h02m``, ``4m05s`` or ``12s``."""
    s = int(round(max(seconds, 0.0)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Counts rows of one pass and shows rows, rows/s and ETA.

    Args:
        desc: what the pass does ("counting vocabularies").
        total: rows in the pass when known (ETA from rows); else pass ``fraction`` to
            :meth:`update` (ETA from, say, the bytes of the files read so far).
        enabled: False shows nothing.
        interval: seconds between log lines when not on a terminal.
        terminal: force (True) or forbid (False) the tqdm bar; default: when stderr is a terminal.
    """

    def __init__(
        self, desc: str, total: int | None = None, enabled: bool = True, interval: float = 30.0,
        terminal: bool | None = None,
    ) -> None:
        self.desc = desc
        self.total = total
        self.enabled = enabled
        self.interval = interval
        self.rows = 0
        self.fraction: float | None = None
        self.start = time.perf_counter()
        self._last_log = self.start
        self._bar: Any = None
        if enabled and (sys.stderr.isatty() if terminal is None else terminal):
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="rows", unit_scale=True, leave=False, dynamic_ncols=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def rate(self) -> float:
        """Rows per second so far."""
        return self.rows / max(self.elapsed, 1e-9)

    def eta(self) -> float | None:
        """Seconds left (None when neither a total nor a fraction is known)."""
        if self.total:
            return (self.total - self.rows) / max(self.rate, 1e-9)
        if self.fraction:
            return self.elapsed * (1 - self.fraction) / self.fraction
        return None

    def update(self, rows: int, fraction: float | None = None) -> None:
        """``rows`` more rows are done; ``fraction``: the share of the pass done (0..1), if known."""
        self.rows += rows
        if fraction is not None:
            self.fraction = min(max(fraction, 0.0), 1.0)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(rows)
            if self.total is None and (eta := self.eta()) is not None:
                self._bar.set_postfix_str(f"~{100 * (self.fraction or 0):.0f}%, ETA {format_seconds(eta)}", refresh=False)
            return
        now = time.perf_counter()
        if now - self._last_log >= self.interval:
            self._last_log = now
            log.info("%s", self.line())

    def line(self) -> str:
        """``desc: 1,234,567 rows, 250,000 rows/s, 40%, ETA 1m23s``."""
        parts = [f"{self.desc}: {self.rows:,} rows", f"{self.rate:,.0f} rows/s"]
        done = self.rows / self.total if self.total else self.fraction
        if done is not None:
            parts.append(f"{100 * done:.0f}%")
        if (eta := self.eta()) is not None:
            parts.append(f"ETA {format_seconds(eta)}")
        return ", ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled:
            log.info("%s: %s rows in %s (%s rows/s)", self.desc, f"{self.rows:,}", format_seconds(self.elapsed),
                     f"{self.rate:,.0f}")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if exc is None:
            self.close()
