"""Column-wise work on every core: one shared thread pool, results in input order.

The data path's per-column work (pyarrow's hashing and dictionary encoding, the compiled
``nogil`` kernels of :mod:`selection.model_free.kernels`, NumPy's sorts) releases the GIL, so
threads run it in parallel without copying the chunk. :func:`map_ordered` maps a function over
the columns of one chunk or batch on the pool and returns the results in input order, so
whatever the caller does next (merging counts, appending scores) happens in the same order as on
one thread: the results are identical for any thread count.

    scores = map_ordered(lambda col: score(col, label), columns)   # == [score(c, label) for c in columns]

The pool has :func:`thread_count` threads: ``SALIENCE_THREADS`` when set, else the cores this
process may run on (``os.sched_getaffinity``, so ``taskset -c 0-3`` means 4). Work submitted from
inside a pool thread runs inline (no nested pools, no deadlock); a forked child makes its own pool.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

__all__ = ["THREADS_VARIABLE", "OneInFlight", "map_ordered", "thread_count"]

T = TypeVar("T")
R = TypeVar("R")

#: environment variable that sets the pool's size (``1``: everything on the calling thread)
THREADS_VARIABLE = "SALIENCE_THREADS"
#: tasks per thread a call is cut into (contiguous runs of items; a few per thread balance uneven columns)
_TASKS_PER_THREAD = 4

_lock = threading.Lock()
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, threads, pool)
_inside = threading.local()


def thread_count() -> int:
    """Threads of the pool: ``SALIENCE_THREADS``, else the cores this process may use.

    Raises:
        ValueError: ``SALIENCE_THREADS`` is not a positive integer.
    """
    env = os.environ.get(THREADS_VARIABLE, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{THREADS_VARIABLE}={env!r} is not a positive integer")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - platforms without affinity (macOS)
        return max(1, os.cpu_count() or 1)


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid() or _pool[1] != threads:
            if _pool is not None and _pool[0] == os.getpid():
                _pool[2].shutdown(wait=False)
            _pool = (os.getpid(), threads, ThreadPoolExecutor(threads, thread_name_prefix="salience-column"))
        return _pool[2]


def _run(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    _inside.active = True
    try:
        return [fn(x) for x in items]
    finally:
        _inside.active = False


def map_ordered(fn: Callable[[T], R], items: Sequence[T], threads: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, computed on the shared pool.

    Args:
        fn: the per-item work; it should release the GIL for most of its time (pyarrow, numba,
            NumPy) and must not depend on the order in which items run.
        items: the items (columns, features).
        threads: pool size (default :func:`thread_count`); 1 runs inline.

    Returns:
        The results in the order of ``items``. The first item's exception (in input order) is raised.
    """
    threads = thread_count() if threads is None else threads
    if threads <= 1 or len(items) <= 1 or getattr(_inside, "active", False):
        return [fn(x) for x in items]
    tasks = min(len(items), threads * _TASKS_PER_THREAD)
    bounds = [len(items) * i // tasks for i in range(tasks + 1)]
    pool = _executor(threads)
    futures = [pool.submit(_run, fn, items[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
    wait(futures)  # every task finished before anything is raised: no work left running on the caller's data
    out: list[R] = []
    for f in futures:
        out.extend(f.result())
    return out


class OneInFlight:
    """Calls run one after another on a thread of their own, at most one in flight: the caller
    goes on while a write (which releases the GIL) runs, and a call's error is raised to the
    caller by the next :meth:`submit` or :meth:`settle`.

        writes = OneInFlight("shard-writer")
        writes.submit(save, data, path)   # waits for the write before it
        writes.settle()                   # every write done (its error raised)
        writes.stop()                     # on the way out, error or not
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: ThreadPoolExecutor | None = None
        self._future: Future[Any] | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the thread once the call before it has ended."""
        self.settle()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix=self.name)
        self._future = self._thread.submit(fn, *args)

    def settle(self) -> None:
        """Wait for the call in flight; raise its error."""
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def stop(self) -> None:
        """Let the call in flight end (its error dropped: the caller is already failing, or
        :meth:`settle` raised it) and stop the thread."""
        future, self._future = self._future, None
        if future is not None:
            wait([future])
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
