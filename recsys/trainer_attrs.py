"""Typed access to the ``Trainer`` attributes Lightning's class does not declare.

Lightning sets ``trainer.callbacks`` and ``trainer.datamodule`` from its connectors (so type
checkers do not see them) and types ``trainer.checkpoint_callback`` as the abstract
``Checkpoint``, which has none of ``ModelCheckpoint``'s paths and scores. These accessors give
them their real types in one place::

    for cb in trainer_callbacks(trainer): ...
    ckpt = model_checkpoint(trainer)          # ModelCheckpoint | None
    if ckpt is not None and ckpt.best_model_path: ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from lightning.pytorch.callbacks import ModelCheckpoint

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

__all__ = ["model_checkpoint", "model_checkpoints", "trainer_callbacks", "trainer_datamodule"]


def trainer_callbacks(trainer: pl.Trainer) -> list[Callback]:
    """``trainer.callbacks``: the live list (appending to it adds a callback)."""
    return cast("list[Callback]", trainer.callbacks)  # type: ignore[attr-defined]


def trainer_datamodule(trainer: pl.Trainer) -> Any:
    """``trainer.datamodule``: the data module of the running stage (None without one)."""
    return trainer.datamodule  # type: ignore[attr-defined]


def model_checkpoint(trainer: pl.Trainer) -> ModelCheckpoint | None:
    """``trainer.checkpoint_callback`` when it is a ``ModelCheckpoint`` (the first one), else None."""
    callback = trainer.checkpoint_callback
    return callback if isinstance(callback, ModelCheckpoint) else None


def model_checkpoints(trainer: pl.Trainer) -> list[ModelCheckpoint]:
    """The ``ModelCheckpoint`` callbacks of ``trainer``, in callback order."""
    return [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
