"""Base class of dataset readers."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from recsys.data.raw import RawData

__all__ = ["Reader"]


class Reader(ABC):
    """Reads one raw dataset into :class:`~recsys.data.raw.RawData`.

    Subclasses take their options as typed constructor arguments (so a LightningCLI config can
    name them with ``class_path``/``init_args``) and implement :meth:`read`. They store every
    constructor argument as an attribute of the same name, which :meth:`fingerprint` uses as
    the encoded-data cache key together with the size and mtime of :meth:`files`.
    """

    #: short dataset name; MLflow uses it as the experiment name
    name: str = "dataset"

    @abstractmethod
    def read(self) -> RawData:
        """Parse the source into a frame indexed by 1-based source line number."""

    def files(self) -> list[Path]:
        """Source files whose size/mtime invalidate caches."""
        return []

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def fingerprint(self) -> str:
        stats = []
        for f in self.files():
            st = Path(f).stat()
            stats.append([str(f), st.st_size, int(st.st_mtime)])
        blob = json.dumps([type(self).__qualname__, self.options(), stats], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
