"""What a block of text holds, counted in one compiled pass that releases the GIL.

The block reader asks of every block how many line ends it holds, whether its carriage returns
all end lines (``\\r\\n``) and whether it is ASCII (:func:`~recsys.data.readers.blocks.parse_block`'s
clean-block test). Python's ``bytes.count`` and ``isascii`` answer that in four passes that hold
the GIL, which on the reading thread stalls the threads that work on the previous chunk.
:func:`text_counts` answers it in one pass of a compiled kernel (:mod:`recsys.jit`) for blocks of
at least :data:`COMPILED_BYTES`; the ``bytes`` methods are its reference (tested equal).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["COMPILED_BYTES", "TextCounts", "text_counts"]

#: blocks shorter than this are counted by the ``bytes`` methods (no kernel call to pay for)
COMPILED_BYTES = 1 << 20


class TextCounts(NamedTuple):
    """``newlines`` (``\\n``), ``carriage_returns`` (``\\r``), ``crlf`` (``\\r\\n`` pairs) and whether
    every byte is ASCII."""

    newlines: int
    carriage_returns: int
    crlf: int
    ascii: bool


def _counts(data: np.ndarray) -> tuple[int, int, int, bool]:  # pragma: no cover - compiled
    newlines = 0
    crs = 0
    crlf = 0
    high = 0
    previous = 0
    for i in range(data.shape[0]):
        b = data[i]
        high |= b
        if b == 10:
            newlines += 1
            if previous == 13:
                crlf += 1
        elif b == 13:
            crs += 1
        previous = b
    return newlines, crs, crlf, high < 128


@functools.cache
def _compiled() -> Callable[..., Any]:
    from recsys.jit import jit

    return jit(_counts)


def _kernel() -> Callable[..., Any] | None:
    """The compiled :func:`_counts`, or None where the NumPy path is active (numba is imported
    on the first large block, not with the readers)."""
    from recsys.jit import active

    return _compiled() if active() == "numba" else None


def text_counts(block: bytes | bytearray) -> TextCounts:
    """The counts of ``block`` (see :class:`TextCounts`)."""
    if len(block) >= COMPILED_BYTES and (kernel := _kernel()) is not None:
        newlines, crs, crlf, ascii_ = kernel(np.frombuffer(block, dtype=np.uint8))
        return TextCounts(int(newlines), int(crs), int(crlf), bool(ascii_))
    crs = block.count(b"\r")
    return TextCounts(block.count(b"\n"), crs, block.count(b"\r\n") if crs else 0, block.isascii())
