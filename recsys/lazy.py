"""A package's public names imported on first use (PEP 562).

A package ``__init__`` that imported every public class would make importing any one of its
light modules import all of them: ``salience rank`` and ``salience quality`` read
``selection.model_free`` alone, and importing the whole of :mod:`selection` through its
``__init__`` took torch and Lightning with it (seconds of start-up, hundreds of MB)::

    __getattr__, __dir__ = lazy_exports(__name__, {"OutRank": "selection.model_free.outrank"})

``from selection import OutRank`` then imports ``selection.model_free.outrank`` when it runs,
and keeps the class on the package (later look-ups are plain attributes).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: each name of ``exports`` (name ->
    the module that defines it) imported from its module on first access."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
