"""Small file helpers shared by every package: atomic, durable writes so that a crash (or a
power cut) never leaves a half-written artifact that a later stage would read: write a new
file, flush it to the disk, rename it onto the target, flush the folder."""

from __future__ import annotations

import functools
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
    "write_config",
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
            _fsync(tmp_path)  # the bytes reach the disk before the name points at them
        os.replace(tmp_path, path)
        _fsync(path.parent)  # and the rename itself survives a power cut
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to the disk."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:  # a file system without fsync on folders (some network mounts): nothing more to do
        pass
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` (``folder`` last)."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            _fsync(Path(root) / name)
        for name in dirs:
            _fsync(Path(root) / name)
    _fsync(folder)


@functools.cache
def _renameat2() -> Any:
    """libc's ``renameat2`` (looked up once: ``find_library`` runs ``ldconfig``), or None off
    Linux, with a glibc older than 2.28 or another libc."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).renameat2
    except (OSError, AttributeError):
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap the entries ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``);
    False where the system cannot (then nothing was changed)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


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
    """Yield a temp folder next to ``output_dir``; on success it replaces ``output_dir``: its
    files are flushed to the disk, then it takes the name in one atomic swap (Linux), so a reader
    sees the old folder or the new one, never none.

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
        _fsync_tree(tmp)  # every file of the new folder is on the disk before it takes the name
        if output_dir.exists():
            if _exchange(tmp, output_dir):  # one atomic swap: the name never points at nothing
                shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous folder
            else:  # elsewhere: the previous folder steps aside for the moment of two renames
                old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".old", dir=output_dir.parent))
                os.replace(output_dir, old)
                os.replace(tmp, output_dir)
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output_dir)
        _fsync(output_dir.parent)
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


def write_config(path: str | Path, config: Any, comment: str = "") -> Path:
    """A ``salience fit`` config (or any mapping) as YAML, atomically: keys in their order, values
    made plain (paths and other objects as text), ``comment`` (lines, without ``#``) on top.

    Every command that writes a training config (``select``'s and the pipeline's
    ``reduced_config.yaml``, ``dims``' ``config_with_plan.yaml``, a recipe's or a study's copy of
    a dict config) goes through here, so they read back alike.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> path = write_config(folder / "c.yaml", {"trainer": {"max_epochs": 2}, "out": folder}, "top-4 features")
    >>> path.read_text().splitlines()[:3]
    ['# top-4 features', 'trainer:', '  max_epochs: 2']
    """
    import yaml

    header = "".join(f"# {line}\n" for line in comment.splitlines())
    body = yaml.safe_dump(json.loads(json.dumps(config, default=str)), sort_keys=False)
    atomic_write_text(path, header + body)
    return Path(path)

