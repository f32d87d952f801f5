"""CI cannot pass on nothing: ``.ci/run`` stops when the data folder is missing, and under
``CI=true`` a real-data test that is skipped is reported as a failure (``tests/conftest.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

REAL_DATA_TESTS = '''
import pytest

@pytest.mark.data
def test_marked(data_dir):
    pass

def test_fixture_only(data_dir):
    pass

@pytest.mark.data
def test_marked_skips_itself():
    pytest.skip("dataset missing")

def test_unrelated_skip():
    pytest.skip("not about data")
'''


def _pytest(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``folder`` (which holds a copy of tests/conftest.py) in a fresh process."""
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "SALIENCE_DATA_DIR", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", str(folder)],
        cwd=folder, env={**base, **env}, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    data: needs the real datasets\n")
    (tmp_path / "test_real_data.py").write_text(REAL_DATA_TESTS)
    return tmp_path


def test_skipped_real_data_tests_fail_under_ci(suite: Path) -> None:
    run = _pytest(suite, CI="true")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 1 skipped, 2 errors" in out, out  # a skip in the fixture fails the setup: an error
    assert "CI=true" in out and "SALIENCE_DATA_DIR" in out
    assert "not about data" in out  # an unrelated skip stays a skip


def test_skipped_real_data_tests_only_skip_outside_ci(suite: Path) -> None:
    for env in ({}, {"CI": "false"}):
        run = _pytest(suite, **env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "4 skipped" in run.stdout, run.stdout


def test_present_data_dir_runs_the_tests_under_ci(suite: Path) -> None:
    (suite / "data").mkdir()
    run = _pytest(suite, CI="true", SALIENCE_DATA_DIR="data")
    assert "2 passed" in run.stdout and "1 failed" in run.stdout, run.stdout  # only the self-skipping one


def _ci_checkout(tmp_path: Path, with_data: bool) -> Path:
    """A clone-shaped folder: ``repo/.ci/run``, a Makefile whose ``test`` prints the env, ``shared/``."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    (repo / "Makefile").write_text('test:\n\t@echo "data=$$SALIENCE_DATA_DIR ci=$$CI"\n')
    if with_data:
        (tmp_path / "shared" / "data").mkdir(parents=True)
    return repo


def test_ci_run_fails_when_the_data_folder_is_missing(tmp_path: Path) -> None:
    repo = _ci_checkout(tmp_path, with_data=False)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SALIENCE_DATA_DIR", "MAKEFLAGS")}
    run = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "shared/data" in run.stderr and "data=" not in run.stdout


def test_ci_run_exports_an_absolute_data_dir_and_ci(tmp_path: Path) -> None:
    repo = _ci_checkout(tmp_path, with_data=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "SALIENCE_DATA_DIR", "MAKEFLAGS")}
    run = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert f"data={(tmp_path / 'shared' / 'data').resolve()} ci=true" in run.stdout
