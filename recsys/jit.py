"""Which path the compiled (numba) kernels of the data path take, and how they are compiled.

Kernels live next to their callers (:mod:`selection.model_free.kernels` for OutRank,
:mod:`recsys.data.streaming.token_table` for preparation's vocabulary look-ups); each keeps a
pure-NumPy reference that its tests hold it to. :func:`active` says which runs: ``numba`` where
it is installed, unless ``SALIENCE_KERNELS=numpy`` (or :func:`use`) selects the reference.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal

__all__ = ["Kernels", "active", "available", "jit", "use"]

Kernels = Literal["numba", "numpy"]

try:  # numba is a dependency; the NumPy path stays the reference and the fallback
    import numba
except ImportError:  # pragma: no cover - exercised where numba is not installed
    numba = None  # type: ignore[assignment]

_forced: list[Kernels] = []


def available() -> bool:
    """Whether the compiled kernels can run (numba imports)."""
    return numba is not None


def active() -> Kernels:
    """The path the kernels take now: :func:`use`'s choice, else ``SALIENCE_KERNELS``, else
    ``numba`` where it is installed."""
    if _forced:
        return _forced[-1]
    env = os.environ.get("SALIENCE_KERNELS", "").strip().lower()
    if env and env not in ("numba", "numpy"):
        raise ValueError(f"SALIENCE_KERNELS={env!r} is not one of ['numba', 'numpy']")
    if env == "numpy" or not available():
        return "numpy"
    return "numba"


@contextlib.contextmanager
def use(kernels: Kernels) -> Iterator[None]:
    """Run the block on one path (tests compare them)."""
    if kernels not in ("numba", "numpy"):
        raise ValueError(f"kernels={kernels!r} is not one of ['numba', 'numpy']")
    if kernels == "numba" and not available():
        raise RuntimeError("the numba kernels need numba: pip install numba")
    _forced.append(kernels)
    try:
        yield
    finally:
        _forced.pop()


def jit(fn: Callable[..., Any]) -> Any:
    """``fn`` compiled by numba (cached on disk, releasing the GIL); ``fn`` itself without numba."""
    return numba.njit(cache=True, nogil=True)(fn) if numba is not None else fn
