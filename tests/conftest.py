"""Shared fixtures.

Real datasets come from ``$SALIENCE_DATA_DIR``. When the variable is unset, tests that need a
dataset are skipped; when it is set and the dataset is missing, they fail. Under ``CI=true``
(``.ci/run`` sets it) a real-data test (marked ``data`` or using the ``data_dir`` fixture) that
is skipped for any reason is reported as a failure, so CI cannot pass on nothing.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

warnings.filterwarnings("ignore", message=".*is_fx_tracing.*")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest-xdist worker per core: one compute thread each (and in the
    # processes they start), instead of every worker's thread pool spinning on every core
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

DATA_DIR_ENV = "SALIENCE_DATA_DIR"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _needs_data(item: pytest.Item) -> bool:
    return item.get_closest_marker("data") is not None or "data_dir" in getattr(item, "fixturenames", ())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Under ``CI=true`` a skipped real-data test is a failure that says why it was skipped."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and not hasattr(report, "wasxfail") and _in_ci() and _needs_data(item):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"CI=true: real-data test skipped ({reason}); CI must run it: set {DATA_DIR_ENV} to "
                           "the folder that holds the datasets")
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = os.environ.get(DATA_DIR_ENV)
    if not root:
        pytest.skip(f"{DATA_DIR_ENV} is not set")
    path = Path(root).absolute()  # tests may change directory
    if not path.is_dir():
        pytest.fail(f"{DATA_DIR_ENV}={root} is not a directory")
    return path


def require_dataset(data_dir: Path, name: str) -> Path:
    """The dataset folder ``name`` under the data dir; fails the test when it is missing."""
    path = data_dir / name
    if not path.exists():
        pytest.fail(f"dataset {name!r} is missing under {DATA_DIR_ENV}={data_dir}")
    return path


@pytest.fixture(scope="session")
def _empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store with every schema migration applied, made once per worker.

    Creating a store runs MLflow's ~60 alembic migrations (seconds each time); tests start from
    a copy of this one instead. Its default experiment's artifact folder is repointed per copy.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = tmp_path_factory.mktemp("mlflow-template")
    store = SqlAlchemyStore(f"sqlite:///{folder / 'mlflow.db'}", str(folder / "mlruns"))
    store.engine.dispose()
    return folder / "mlflow.db"


@pytest.fixture
def tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _empty_mlflow_db: Path) -> Path:
    """Run in a fresh working directory, holding a fresh, empty ``mlflow.db`` (where MLflow's
    default ``sqlite:///mlflow.db`` store lands)."""
    import shutil
    import sqlite3

    db = tmp_path / "mlflow.db"
    shutil.copyfile(_empty_mlflow_db, db)
    with sqlite3.connect(db) as con:  # the default experiment's artifacts go under this test's folder
        con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (str(tmp_path / "mlruns" / "0"),))
    con.close()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def toy_plugin(cls: type[Any]) -> type[Any]:
    """Class decorator of a toy plug-in: defining the class registered it; this takes it out again,
    so that the other tests (a contract's list of every registered strategy, read when its module is
    collected) see it only inside :func:`registered`."""
    cls._registry.pop(cls.name, None)
    return cls


@contextmanager
def registered(cls: type[Any]) -> Iterator[None]:
    """Register the plug-in class ``cls`` under its ``name`` for the duration (toy plug-ins of the
    "one new class" tests stay out of the other tests' registries)."""
    cls._registry[cls.name] = cls
    try:
        yield
    finally:
        cls._registry.pop(cls.name, None)
