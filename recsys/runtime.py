"""How a ``salience`` process runs: logging, SIGTERM, the end of a distributed process.

Used by every command and benchmark entry point (:mod:`experiments.cli` and the scripts that
run on their own, e.g. ``python -m experiments.benchmarks.sharding``)::

    configure_logging()              # INFO lines of the project's packages on stderr
    with sigterm_raises():           # SIGTERM -> Terminated: MLflow runs end KILLED
        run_command()
    exit_distributed(0)              # a finished torchrun process leaves without the teardown
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["PeakRSS", "Terminated", "configure_logging", "exit_distributed", "import_optuna", "peak_rss_window",
           "proc_status_kib", "process_peak_rss_mb", "release_freed_memory", "sigterm_raises"]


def configure_logging(fmt: str = "%(levelname)s %(name)s: %(message)s") -> None:
    """INFO lines of the project's packages on stderr, one line per message."""
    # torchrec calls torch.fx.is_fx_tracing() on every KJT build; torch logs a warning about it
    # once per process that says nothing about the user's run
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(fmt))
    for name in ("recsys", "experiments", "selection", "embeddings", "generative"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not logger.handlers:
            logger.addHandler(handler)
        logger.propagate = False  # one line per message, even when a library configured the root logger


def exit_distributed(code: int) -> None:
    """End a finished process of a distributed run (torchrun, gloo/nccl) at once.

    After a sharded run has finished its work (the MLflow run closed, the checkpoints and the
    export written), the interpreter's teardown occasionally aborts the process ("terminate
    called without an active exception", SIGABRT) from a native thread the distributed stack
    leaves behind, and the launcher then reports a finished job as failed. So the process
    synchronises with the others, flushes its output and leaves without that teardown. A
    process that is not part of a distributed run returns and exits normally.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Terminated(SystemExit):
    """The process got SIGTERM (raised in the main thread; exit status 128 + 15)."""


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """For the duration of a command, SIGTERM raises :class:`Terminated` in the main thread, so
    the paths that end MLflow runs on an exception end them (``KILLED``, see
    :func:`recsys.tracking.end_status`) instead of the process dying with its runs ``RUNNING``.

    While a Lightning trainer runs, its own handler sits over this one and calls it: the trainer
    then stops at the next batch boundary (every process of a distributed run together) by
    raising its ``SIGTERMException``, which exits 0 and so is turned into :class:`Terminated`
    here; this handler only notes the signal (a second SIGTERM raises at once).
    """
    if threading.current_thread() is not threading.main_thread():  # signal handlers live there
        yield
        return
    received = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        deferred = signal.getsignal(signal.SIGTERM) is not handler and not received
        received = True
        if not deferred:
            raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except SystemExit as e:
        if received and not isinstance(e, Terminated):
            raise Terminated(128 + signal.SIGTERM) from e
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def release_freed_memory() -> bool:
    """Hand the C heap's freed pages back to the operating system (glibc ``malloc_trim``), and
    Arrow's pool its unused pages when pyarrow is loaded.

    Freed tensors below glibc's mmap threshold (which grows up to 32 MB as large blocks are
    freed) stay in the process heap, so a short-lived copy of many embedding tables keeps its
    memory in the RSS after it is gone; Arrow's allocator keeps the pages of freed chunks of
    text the same way. Returns False where there is no glibc (nothing to do).
    """
    import ctypes
    import ctypes.util

    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0))
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return False


class PeakRSS:
    """The peak resident set size of this process over one :func:`peak_rss_window`.

    ``mb`` is set when the window closes: the peak in MB since the window opened, or None where
    the kernel cannot reset the peak (not Linux, or ``/proc/self/clear_refs`` not writable).
    """

    mb: float | None = None


def proc_status_kib(field: str) -> int | None:
    """One memory line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...) in KiB; None where
    there is no such file (not Linux) or line."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _vm_hwm_mb() -> float | None:
    kib = proc_status_kib("VmHWM")
    return None if kib is None else kib / 1024.0


#: the process's peak RSS (MB) before the last reset of :func:`peak_rss_window`
_PEAK_BEFORE_RESETS = [0.0]


def process_peak_rss_mb() -> float:
    """The peak RSS of this process since it started, in MB, across the resets of
    :func:`peak_rss_window`: ``VmHWM`` where it can be read (Linux), else ``getrusage``'s
    ``ru_maxrss``. Not ``ru_maxrss`` on Linux: it survives ``exec``, so a child process started
    by a large parent reports at least the parent's RSS when it forked (a benchmark that generated
    its data in the parent measured that instead of its steps)."""
    hwm = _vm_hwm_mb()
    if hwm is not None:
        return max(_PEAK_BEFORE_RESETS[0], hwm)
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (Linux's unit; a fallback only)
    return max(_PEAK_BEFORE_RESETS[0], kib / 1024.0)


@contextmanager
def peak_rss_window() -> Iterator[PeakRSS]:
    """Measure the peak RSS of the work inside the ``with`` block, not of the whole process.

    Linux keeps one peak per process (``VmHWM``); writing ``5`` to ``/proc/self/clear_refs``
    resets it to the current RSS, so a long-lived process (the pipeline: one stage after the
    other) can report each stage's own peak; :func:`process_peak_rss_mb` still gives the whole
    process's. Child processes are not counted::

        with peak_rss_window() as peak:
            run_stage()
        peak.mb  # e.g. 2310.5, or None where unsupported
    """
    out = PeakRSS()
    _PEAK_BEFORE_RESETS[0] = process_peak_rss_mb()  # the reset below forgets it
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        supported = True
    except OSError:
        supported = False
    try:
        yield out
    finally:
        out.mb = _vm_hwm_mb() if supported else None


def import_optuna() -> Any:
    """``import optuna``, without keeping the importer's frames alive.

    Optuna keeps the error of each optional import that failed (redis, ...) to raise it when the
    feature is used, and with the error its traceback: every frame that was running when optuna
    was first imported, with all their locals, for the life of the process. First imported
    inside a command (jsonargparse imports it while resolving the models' annotations), that
    kept a whole CLI with its model and embedding tables (1.4 GB on the 45M-row benchmark).
    The tracebacks are dropped here; the errors and their messages stay.
    """
    import optuna

    for name, module in list(sys.modules.items()):
        if not name.startswith("optuna"):
            continue
        deferred = getattr(getattr(module, "_imports", None), "_deferred", None)
        error = deferred[0] if isinstance(deferred, tuple) and deferred else None
        while isinstance(error, BaseException):
            error.__traceback__ = None
            error = error.__cause__ or error.__context__
    return optuna
