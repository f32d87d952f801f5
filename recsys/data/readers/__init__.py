"""Dataset readers: each turns one raw source into :class:`~recsys.data.raw.RawData`.

``SyntheticReader`` lives in :mod:`recsys.data.synthetic` and is imported lazily (on first
attribute access) so that module may itself import from this package without a cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recsys.data.readers.base import Reader
from recsys.data.readers.criteo import CriteoReader
from recsys.data.readers.frappe import FrappeReader
from recsys.data.readers.movielens import MovieLensReader
from recsys.data.readers.tabular import TabularReader

if TYPE_CHECKING:
    from recsys.data.synthetic import SyntheticReader

__all__ = ["CriteoReader", "FrappeReader", "MovieLensReader", "Reader", "SyntheticReader", "TabularReader"]


def __getattr__(name: str) -> Any:
    if name == "SyntheticReader":
        from recsys.data.synthetic import SyntheticReader

        return SyntheticReader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
