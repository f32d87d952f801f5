"""Training: LightningModule, LightningDataModule and the LightningCLI behind ``salience fit``."""

from recsys.train.datamodule import CTRDataModule
from recsys.train.module import ARCHITECTURES, RankingTask, build_model

__all__ = ["ARCHITECTURES", "CTRDataModule", "RankingTask", "build_model"]
