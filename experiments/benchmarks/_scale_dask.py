"""The scale benchmark's ``prepare_dask`` step: streamed preparation on a local Dask cluster.

Kept apart from :mod:`experiments.benchmarks.scale` (which runs it in a child process like every
step) so that module stays within the project's module size.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

__all__ = ["step_prepare_dask"]


def step_prepare_dask(data: dict[str, Any], stop_clock: Callable[[], None]) -> dict[str, Any]:
    """``prepare`` with ``data.engine: dask`` on a local cluster of one single-threaded worker
    process per core: the file cut into byte spans of whole lines, one partition each
    (``recsys.data.streaming.dask_cluster``), on the data config ``data`` of the ``prepare`` step.
    The clock (stopped by ``stop_clock``) includes starting the cluster."""
    from distributed import Client, LocalCluster

    from recsys.data.prepare import PrepareConfig
    from recsys.data.readers import CriteoReader
    from recsys.data.splits import SplitConfig
    from recsys.data.streaming import dask_cluster
    from recsys.parallel import THREADS_VARIABLE
    from recsys.runtime import process_peak_rss_mb

    shutil.rmtree(data["cache_dir"], ignore_errors=True)
    workers = len(os.sched_getaffinity(0))
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=dask_cluster.LOOPBACK,
                      dashboard_address=None, env={THREADS_VARIABLE: "1"}, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        shards = dask_cluster.prepare_shards_distributed(
            CriteoReader(**data["reader"]["init_args"]),
            PrepareConfig(SplitConfig(**data["split"]), cache_dir=data["cache_dir"], progress=False), client=client,
            span_bytes=dask_cluster.SPAN_BYTES)
        stop_clock()
        peaks = client.run(process_peak_rss_mb)
    parts = shards.splits.values()
    return {"rows": sum(p.rows for p in parts), "shards": sum(len(p.shards) for p in parts), "workers": workers,
            "partitions": shards.summary["engine"]["partitions"],
            "workers_peak_rss_mb": round(max(peaks.values()), 1)}
