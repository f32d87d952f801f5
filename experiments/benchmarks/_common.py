"""Pieces every benchmark script shares: the result header and an isolated working folder."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["isolated_workdir", "result_header"]


def result_header(benchmark: str, argv: Sequence[str] | None, quick: bool, targets: dict[str, Any]) -> dict[str, Any]:
    """Benchmark name, the exact command, date, hardware, software versions, quick flag, targets."""
    from experiments.benchmarks.quality import _hardware, _versions

    args = list(argv) if argv is not None else sys.argv[1:]
    return {
        "benchmark": benchmark,
        "command": f"python -m experiments.benchmarks.{benchmark} " + " ".join(shlex.quote(a) for a in args),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hardware": _hardware(),
        "versions": _versions(),
        "quick": quick,
        "targets": targets,
    }


@contextmanager
def isolated_workdir(prefix: str) -> Iterator[Path]:
    """A temporary working folder that holds MLflow (its database and ``./mlruns`` artifacts)
    and the run folders; the working directory and ``MLFLOW_TRACKING_URI`` are restored after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        previous_cwd, previous_uri = os.getcwd(), os.environ.get("MLFLOW_TRACKING_URI")
        os.chdir(work)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        try:
            yield work
        finally:
            os.chdir(previous_cwd)
            if previous_uri is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = previous_uri
