"""Pieces every benchmark script shares: the result header, an isolated working folder, and the
verdict rule every comparison of two arms goes through.

The verdict rule (:mod:`recsys.stats`'s): arm A is ``better`` (or ``worse``) than arm B only when
the 95% interval of the difference of their means over seeds excludes zero (the difference beyond
1.96 standard errors of the difference, :func:`spread_of_difference`); otherwise it is a ``tie``. Over several tasks, A is better (worse)
only when it is better (worse) on most of them, each beyond its own spread
(:func:`majority_verdict`). "Beats" claims need ``better``; "worse" claims need ``worse``.
"""

from __future__ import annotations

import math
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recsys.stats import BETTER, TIE, WORSE  # the three outcomes of a comparison, one definition

__all__ = [
    "epoch_budget",
    "BETTER", "TIE", "WORSE", "hardware", "hardware_text", "isolated_workdir", "majority_verdict", "result_header",
    "Z95", "spread_of_difference", "verdict", "versions",
]



def spread_of_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """The standard error of ``mean(a) - mean(b)`` over independent seeds: ``sqrt(se_a^2 + se_b^2)``.

    Each of ``a`` and ``b`` is a summary with ``se``, or with ``std`` and ``n`` (``se = std /
    sqrt(n)``; ``n`` defaults to 1); a summary with neither contributes 0.
    """

    def se(s: Mapping[str, Any]) -> float:
        if s.get("se") is not None:
            return float(s["se"])
        if s.get("std") is not None:
            return float(s["std"]) / math.sqrt(max(int(s.get("n") or 1), 1))
        return 0.0

    return math.hypot(se(a), se(b))


#: standard errors a difference must exceed: the half-width of a 95% normal interval
Z95 = 1.959963984540054


def verdict(a: float, b: float, spread: float, lower_is_better: bool = False, z: float = Z95) -> str:
    """``BETTER`` when ``a`` beats ``b`` by more than ``z`` standard errors ``spread`` of the
    difference (the 95% interval excludes zero), ``WORSE`` when it trails by more, else ``TIE``
    (a NaN anywhere is a ``TIE``: no claim without numbers)."""
    if spread < 0:
        raise ValueError(f"spread must be >= 0, got {spread}")
    diff = (b - a) if lower_is_better else (a - b)
    margin = z * spread
    if not (math.isfinite(diff) and math.isfinite(margin)):
        return TIE
    if diff > margin:
        return BETTER
    if diff < -margin:
        return WORSE
    return TIE


def majority_verdict(per_task: Sequence[str]) -> str:
    """``BETTER`` (``WORSE``) when more than half of the tasks say so, else ``TIE``."""
    for outcome in (BETTER, WORSE):
        if sum(v == outcome for v in per_task) * 2 > len(per_task):
            return outcome
    return TIE


def versions() -> dict[str, str]:
    """Installed versions, read from package metadata (nothing is imported: a GPU image may
    lack Lightning)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(*names: str) -> str:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                continue
        return "not installed"

    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchrec": installed("torchrec"),
        "fbgemm_gpu": installed("fbgemm-gpu-cpu", "fbgemm-gpu"),
        "lightning": installed("lightning"),
    }


def hardware() -> dict[str, Any]:
    """CPU model, core count and the visible GPU's name (None without one)."""
    import torch

    from experiments.benchmarks.train_throughput import cpu_model_name

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model_name(), "cores": os.cpu_count(), "gpu": gpu}


def hardware_text(record: Mapping[str, Any]) -> str:
    """``AMD EPYC (2 cores), no GPU`` or ``... , GPU NVIDIA H200``: a result's ``hardware`` in words."""
    gpu = record.get("gpu")
    return f"{record['cpu']} ({record['cores']} cores), " + (f"GPU {gpu}" if gpu else "no GPU")


def result_header(benchmark: str, argv: Sequence[str] | None, quick: bool, targets: dict[str, Any]) -> dict[str, Any]:
    """Benchmark name, the exact command, date, hardware, software versions, quick flag, targets."""
    args = list(argv) if argv is not None else sys.argv[1:]
    return {
        "benchmark": benchmark,
        "command": f"python -m experiments.benchmarks.{benchmark} " + " ".join(shlex.quote(a) for a in args),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hardware": hardware(),
        "versions": versions(),
        "quick": quick,
        "targets": targets,
    }


def epoch_budget(overrides: Sequence[str]) -> str | None:
    """The epoch count a run's ``--trainer.max_epochs=N`` override cuts every fit to (the last one
    wins, as on the command line), or None when the fits train to their config's early stopping."""
    cut = [o.split("=", 1)[1] for o in overrides if o.startswith("--trainer.max_epochs=")]
    return cut[-1] if cut else None


@contextmanager
def isolated_workdir(prefix: str) -> Iterator[Path]:
    """A temporary working folder that holds MLflow (its database and ``./mlruns`` artifacts)
    and the run folders. A relative ``$SALIENCE_DATA_DIR`` is made absolute before the change of
    directory; the working directory and both variables are restored after."""
    from recsys.data.raw import DATA_DIR_ENV, data_dir

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        previous_cwd = os.getcwd()
        previous = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", DATA_DIR_ENV)}
        root = data_dir()
        if root is not None:
            os.environ[DATA_DIR_ENV] = str(root)
        os.chdir(work)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        try:
            yield work
        finally:
            os.chdir(previous_cwd)
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
