"""Training: LightningModule, LightningDataModule and the LightningCLI behind ``salience fit``."""

from recsys.train.datamodule import CTRDataModule
from recsys.train.module import RankingTask

__all__ = ["CTRDataModule", "RankingTask"]
