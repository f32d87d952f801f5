"""Paths as a pipeline's records show them: relative to its output folder or to the repository.

A stage result holds working paths (absolute when the output folder was given as one). What the
HTML report prints and what a benchmark commits name them relative to the run's output folder
(``final/export``) or to the repository (``experiments/configs/frappe_dcnv2.yaml``), so no record
carries the path of the machine it was made on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["REPO_ROOT", "portable_path", "portable_paths", "shown_folder"]

#: the repository (source checkout) root
REPO_ROOT = Path(__file__).resolve().parents[2]


def _under(path: str, base: str | os.PathLike[str]) -> str | None:
    """``path`` relative to ``base`` (POSIX separators), or None when it is not inside it."""
    root = os.path.normpath(os.path.abspath(base))
    if path == root:
        return "."
    if path.startswith(root.rstrip(os.sep) + os.sep):
        return Path(os.path.relpath(path, root)).as_posix()
    return None


def portable_path(path: str | os.PathLike[str], output_dir: str | os.PathLike[str]) -> str:
    """An absolute ``path`` relative to ``output_dir`` when inside it, else to the repository when
    inside it; a relative path, or one outside both, is returned unchanged."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    normal = os.path.normpath(text)
    for base in (output_dir, REPO_ROOT):
        relative = _under(normal, base)
        if relative is not None:
            return relative
    return text


def portable_paths(data: Any, output_dir: str | os.PathLike[str]) -> Any:
    """``data`` (JSON-like) with every absolute-path string made portable by :func:`portable_path`."""
    if isinstance(data, dict):
        return {k: portable_paths(v, output_dir) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [portable_paths(v, output_dir) for v in data]
    if isinstance(data, str) and os.path.isabs(data):
        return portable_path(data, output_dir)
    return data


def shown_folder(folder: str | os.PathLike[str]) -> str:
    """How a report names a run folder: relative to the working directory or to the repository
    when inside one of them, else as given."""
    text = os.fspath(folder)
    if not os.path.isabs(text):
        return Path(text).as_posix()
    normal = os.path.normpath(text)
    for base in (os.getcwd(), REPO_ROOT):
        relative = _under(normal, base)
        if relative is not None:
            return relative
    return text
