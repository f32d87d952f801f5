"""The shared column pool: results in input order whatever the threads, errors raised in order."""

from __future__ import annotations

import os
import threading
import time

import pytest

from recsys import parallel
from recsys.parallel import THREADS_VARIABLE, map_ordered, thread_count


def test_results_keep_the_input_order_and_run_on_several_threads() -> None:
    names: set[str] = set()

    def work(i: int) -> int:
        time.sleep(0.002 * (i % 3))  # uneven items finish out of order
        names.add(threading.current_thread().name)
        return i * i

    items = list(range(37))
    assert map_ordered(work, items, threads=4) == [i * i for i in items]
    assert len(names) > 1 and all(n.startswith("salience-column") for n in names)
    names.clear()
    assert map_ordered(work, items, threads=1) == [i * i for i in items]
    assert names == {threading.current_thread().name}  # one thread: inline
    assert map_ordered(work, [], threads=4) == []


def test_the_first_error_in_input_order_is_raised_after_every_task_ended() -> None:
    done: list[int] = []

    def work(i: int) -> int:
        if i in (5, 30):
            raise ValueError(f"item {i}")
        time.sleep(0.001)
        done.append(i)
        return i

    with pytest.raises(ValueError, match="item 5"):
        map_ordered(work, list(range(40)), threads=4)
    assert len(done) >= 30  # the tasks after the failing one ran to their end, none is left running
    settled = len(done)
    time.sleep(0.05)
    assert len(done) == settled


def test_work_submitted_from_a_pool_thread_runs_inline() -> None:
    def outer(i: int) -> list[str]:
        return map_ordered(lambda _: threading.current_thread().name, [0, 1, 2], threads=4)

    for inner in map_ordered(outer, list(range(8)), threads=2):
        assert len(set(inner)) == 1  # no nested pool: the calling pool thread ran all three


def test_thread_count_reads_the_variable_and_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_VARIABLE, "3")
    assert thread_count() == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(THREADS_VARIABLE, bad)
        with pytest.raises(ValueError, match=THREADS_VARIABLE):
            thread_count()
    monkeypatch.delenv(THREADS_VARIABLE)
    assert thread_count() == len(os.sched_getaffinity(0))


def test_a_forked_child_makes_its_own_pool() -> None:
    map_ordered(abs, [-1, -2, -3], threads=2)  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's pool threads do not exist here
        ok = map_ordered(abs, [-1, -2, -3], threads=2) == [1, 2, 3] and parallel._pool is not None
        os._exit(0 if ok and parallel._pool[0] == os.getpid() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
