"""Shared fixtures.

Real datasets come from ``$SALIENCE_DATA_DIR``. When the variable is unset, tests that need a
dataset are skipped; when it is set and the dataset is missing, they fail, so CI (which sets
it) cannot pass on nothing.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message=".*is_fx_tracing.*")

DATA_DIR_ENV = "SALIENCE_DATA_DIR"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = os.environ.get(DATA_DIR_ENV)
    if not root:
        pytest.skip(f"{DATA_DIR_ENV} is not set")
    path = Path(root)
    if not path.is_dir():
        pytest.fail(f"{DATA_DIR_ENV}={root} is not a directory")
    return path


def require_dataset(data_dir: Path, name: str) -> Path:
    """The dataset folder ``name`` under the data dir; fails the test when it is missing."""
    path = data_dir / name
    if not path.exists():
        pytest.fail(f"dataset {name!r} is missing under {DATA_DIR_ENV}={data_dir}")
    return path


@pytest.fixture
def tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a fresh working directory (MLflow's sqlite:///mlflow.db lands there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path
