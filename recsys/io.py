"""Small file helpers shared by every package: atomic writes so that a crash never leaves a
half-written artifact that a later stage would read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_dir",
    "atomic_path",
    "atomic_savefig",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "file_sha256",
    "read_marked_json",
]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``path`` on success.

    Example::

        with atomic_path("model.pt") as tmp:
            torch.save(obj, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():  # mkstemp makes it owner-only; give it the mode of a plain new file
            os.chmod(tmp_path, 0o666 & ~_UMASK)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: the process's umask, read once (reading it means setting it, which is not thread-safe)
_UMASK = _umask()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_savefig(figure: Any, path: str | Path, **kwargs: Any) -> Path:
    """``figure.savefig(path, **kwargs)`` through a temporary file (format from ``path``'s suffix)."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".") or "png")
    with atomic_path(path) as tmp:
        figure.savefig(tmp, **kwargs)
    return path


def atomic_write_json(path: str | Path, obj: Any, default: Callable[[Any], Any] | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=default) + "\n")


@contextmanager
def atomic_dir(output_dir: str | Path, marker: str) -> Iterator[Path]:
    """Yield a temp folder next to ``output_dir``; on success it replaces ``output_dir``.

    An existing ``output_dir`` is replaced only when it is empty or a previous export (holds the
    file ``marker``); anything else raises ``FileExistsError`` before any work is done.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and not (
        output_dir.is_dir() and ((output_dir / marker).is_file() or not any(output_dir.iterdir()))
    ):
        raise FileExistsError(f"{output_dir} exists and is not an export directory; refusing to overwrite it")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".tmp", dir=output_dir.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if output_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".old", dir=output_dir.parent))
            os.replace(output_dir, old)
            os.replace(tmp, output_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_marked_json(folder: str | Path, name: str, expected_format: str, what: str) -> dict[str, Any]:
    """The parsed JSON file ``name`` of ``folder``, whose ``format`` key must be ``expected_format``.

    A missing file raises ``FileNotFoundError`` saying the folder is not ``what``.
    """
    path = Path(folder) / name
    if not path.is_file():
        raise FileNotFoundError(f"no {name} in {folder}: not {what}")
    info = json.loads(path.read_text(encoding="utf-8"))
    if info.get("format") != expected_format:
        raise ValueError(f"{path}: format {info.get('format')!r} is not {expected_format!r}")
    return info


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
