"""Training: LightningModule, LightningDataModule and the LightningCLI behind ``salience fit``.

The names are imported on first use (:mod:`recsys.lazy`): :mod:`recsys.train.recipe`, which the
model-free methods read, does not import torch and Lightning through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recsys.lazy import lazy_exports

__all__ = ["CTRDataModule", "RankingTask"]
__getattr__, __dir__ = lazy_exports(__name__, {"CTRDataModule": "recsys.train.datamodule",
                                               "RankingTask": "recsys.train.module"})

if TYPE_CHECKING:
    from recsys.train.datamodule import CTRDataModule
    from recsys.train.module import RankingTask
