"""Optuna RDB storages for ``salience tune``: opening one (heartbeats, the race of several
processes creating one database), and storage URLs as shown to users (password hidden)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna

__all__ = ["DEFAULT_STORAGE", "GRACE_PERIOD", "HEARTBEAT_INTERVAL", "StorageError", "open_storage", "shown_url"]

#: default Optuna storage: ``optuna.db`` in the working directory
DEFAULT_STORAGE = "sqlite:///optuna.db"
#: seconds between trial heartbeats, and how long a silent RUNNING trial lives before it is failed
HEARTBEAT_INTERVAL = 15
GRACE_PERIOD = 60
#: tries to open a storage whose tables another process is creating at the same moment
_INIT_ATTEMPTS = 5
_INIT_RACE_MESSAGES = ("already exists", "duplicate", "unique constraint", "database is locked")


class StorageError(RuntimeError):
    """The Optuna storage URL cannot be opened (bad URL, missing driver, unreachable server)."""


def default_storage() -> str:
    """:data:`DEFAULT_STORAGE` as an absolute URL (``optuna.db`` in the working directory)."""
    return f"sqlite:///{Path.cwd() / 'optuna.db'}"


def _parsed_url(url: str) -> Any:
    """``url`` as SQLAlchemy's ``URL``, or None when it is not one (nothing to hide then)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        return None


def shown_url(url: str) -> str:
    """``url`` with its password, if any, as ``***``: for messages, logs and ``summary.json``."""
    parsed = _parsed_url(url)
    return parsed.render_as_string(hide_password=True) if parsed is not None and parsed.password is not None else url


def _init_race(error: BaseException) -> bool:
    """Whether ``error`` is another process initialising the same new database (a table that
    already exists, a duplicate version row, a locked sqlite file)."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    if not isinstance(error, (OperationalError, IntegrityError, ProgrammingError)):
        return False
    text = str(error).lower()
    return any(m in text for m in _INIT_RACE_MESSAGES)


def open_storage(url: str, heartbeat: bool = True) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage with trial heartbeats (a killed worker's trial is failed on resume).

    Several processes may open a new database at once (``salience tune`` started on several
    machines): whoever loses the race to create the tables retries.

    Raises:
        StorageError: naming the URL, when it is malformed, its driver is missing or the
            database cannot be reached.
    """
    if "://" not in url:
        raise StorageError(
            f"storage {url!r} is not a database URL; e.g. sqlite:///{url} (a file in the working directory)"
        )
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}  # several workers write to one file
    elif url.startswith(("postgresql", "mysql")):
        engine_kwargs["connect_args"] = {"connect_timeout": 10}
    hb: dict[str, Any] = {"heartbeat_interval": HEARTBEAT_INTERVAL, "grace_period": GRACE_PERIOD} if heartbeat else {}
    import warnings

    attempt = 0
    try:
        while True:
            attempt += 1
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats
                    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **hb)
            except Exception as e:
                # processes opening a new database at once race to create its tables and version
                # rows; the loser finds them in place on a second try
                if attempt == _INIT_ATTEMPTS or not _init_race(e):
                    raise
                time.sleep(0.2 * attempt)
    except Exception as e:  # sqlalchemy's errors (ArgumentError, OperationalError), missing drivers
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ""
        if url.startswith("sqlite"):
            hint = " (does the folder of the database file exist and is it writable?)"
        elif isinstance(e, ImportError):
            hint = " (install the database driver)"
        else:
            hint = " (is the database server running and reachable?)"
        raise StorageError(
            f"cannot open the Optuna storage {shown_url(url)!r}: {type(e).__name__}: {reason}{hint}"
        ) from e
