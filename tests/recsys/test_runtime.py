"""``recsys.runtime.peak_rss_window``: the peak RSS of one block, not of the whole process."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from recsys.runtime import peak_rss_window, process_peak_rss_mb

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")

MB = 1024 * 1024


def test_a_window_sees_its_own_allocation_and_a_later_window_does_not():
    with peak_rss_window() as big:
        block = np.ones(300 * MB, dtype=np.uint8)  # touched: 300 MB resident
        del block
    assert big.mb is not None
    with peak_rss_window() as small:
        np.ones(10 * MB, dtype=np.uint8)
    assert small.mb is not None
    # the second window's own peak does not hold the 300 MB block; the process's peak still does
    assert big.mb - small.mb > 200, (big.mb, small.mb)
    assert process_peak_rss_mb() >= big.mb


def test_the_peak_is_set_even_when_the_block_raises():
    with pytest.raises(RuntimeError), peak_rss_window() as peak:
        raise RuntimeError("stage failed")
    assert peak.mb is not None and peak.mb > 0


def test_a_child_of_a_large_parent_reports_its_own_peak():
    """Linux carries ``ru_maxrss`` over ``exec``: a child started by a parent holding 800 MB read
    800 MB as its own peak (the scale benchmark's steps, after it generated a file in-process)."""
    import subprocess

    held = np.ones(800 * MB, dtype=np.uint8)  # touched: resident in this (parent) process
    child = subprocess.run([sys.executable, "-c", "from recsys.runtime import process_peak_rss_mb as p; print(p())"],
                           capture_output=True, text=True, check=True)
    assert held.sum() == 800 * MB
    assert float(child.stdout.strip().splitlines()[-1]) < 400, child.stdout
