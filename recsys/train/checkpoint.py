"""Load a ``salience fit`` checkpoint without pickles, and export it."""

from __future__ import annotations

import pickle  # for pickle.UnpicklingError only: nothing here unpickles
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recsys.data.encoders import Preprocessor
from recsys.models import RankingModel
from recsys.train.datamodule import CTRDataModule
from recsys.train.module import RankingTask

__all__ = ["LoadedCheckpoint", "export_checkpoint", "load_checkpoint"]


@dataclass
class LoadedCheckpoint:
    model: RankingModel
    preprocessor: Preprocessor
    hparams: dict[str, Any]
    summary: dict[str, Any]


def load_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Rebuild the model and the fitted encoders from a checkpoint.

    Loads with ``weights_only=True``: a checkpoint holds tensors and plain containers only,
    so nothing untrusted is unpickled (a file holding any other object is refused unrun).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is damaged, holds objects other than tensors and plain
            containers, or was not written by ``salience fit``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:  # refused or damaged; nothing was run
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"{path}: refused to load: not a checkpoint of tensors and plain containers "
            f"(loaded with weights_only=True): {reason}"
        ) from e
    if not isinstance(ckpt, dict) or "hyper_parameters" not in ckpt or "state_dict" not in ckpt:
        raise ValueError(f"{path}: not a Lightning checkpoint (no 'hyper_parameters' and 'state_dict')")
    hparams = {k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")}
    data_state = ckpt.get(CTRDataModule.__qualname__)
    if not data_state or "preprocessor" not in data_state:
        raise ValueError(f"{path}: no fitted encoders in the checkpoint (was it written by `salience fit`?)")
    task = RankingTask(**hparams)
    task.load_state_dict(ckpt["state_dict"])
    task.eval()
    return LoadedCheckpoint(
        task.model, Preprocessor.from_state_dict(data_state["preprocessor"]), hparams, data_state.get("summary", {})
    )


def export_checkpoint(
    checkpoint: str | Path, output_dir: str | Path, check_parity: bool = True, parity_batch_sizes: tuple[int, ...] = (1, 7, 300)
) -> dict[str, Any]:
    """Export a checkpoint to ``output_dir``; optionally check eager vs exported in a fresh process.

    Returns:
        A report with ``output_dir`` and ``parity_max_abs_diff`` (None when unchecked).
    """
    from recsys.data.batching import random_batch
    from recsys.export import check_parity_in_fresh_process, export_model

    loaded = load_checkpoint(checkpoint)
    export_model(loaded.model, loaded.preprocessor, output_dir, metadata={"checkpoint": str(checkpoint), "arch": loaded.hparams.get("arch")})
    report: dict[str, Any] = {"output_dir": str(output_dir), "parity_max_abs_diff": None}
    if check_parity:
        schema = loaded.preprocessor.fitted_schema
        batches = [random_batch(schema, b, seed=i) for i, b in enumerate(parity_batch_sizes)]
        report["parity_max_abs_diff"] = check_parity_in_fresh_process(output_dir, loaded.model, batches)
    return report
