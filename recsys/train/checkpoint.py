"""Load a ``salience fit`` checkpoint without pickles, and export it."""

from __future__ import annotations

import pickle  # for pickle.UnpicklingError only: nothing here unpickles
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import instantiate_module

from recsys.data.encoders import Preprocessor
from recsys.data.streaming.split_view import SplitData
from recsys.export.quantize import Precision
from recsys.models import RankingModel
from recsys.train.datamodule import CTRDataModule, saved_preprocessor
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
    data_state = ckpt.get(CTRDataModule.__qualname__) or {}
    encoders = saved_preprocessor(data_state)
    if encoders is None:
        raise ValueError(f"{path}: no fitted encoders in the checkpoint (was it written by `salience fit`?)")
    try:
        task = instantiate_module(RankingTask, _current_hparams(hparams))
    except Exception as e:  # jsonargparse's parse errors
        raise ValueError(f"{path}: its model hyperparameters do not build a RankingTask: {e}") from e
    task.load_state_dict(ckpt["state_dict"])
    task.eval()
    return LoadedCheckpoint(
        task.model, encoders, hparams, data_state.get("summary", {})
    )


#: optimizer names of checkpoints written before optimizers were classes
_LEGACY_OPTIMIZERS = {"adam": "torch.optim.Adam", "adamw": "torch.optim.AdamW", "adagrad": "torch.optim.Adagrad", "sgd": "torch.optim.SGD"}


def _current_hparams(hparams: dict[str, Any]) -> dict[str, Any]:
    """Hyperparameters of a checkpoint written before backbones and optimizers were classes
    (``arch``/``arch_args``, ``optimizer: adam``, ``learning_rate``, ``weight_decay``) in the
    current form; current ones unchanged."""
    if "arch" not in hparams:
        return hparams
    old = dict(hparams)
    arch, args = old.pop("arch"), old.pop("arch_args", None) or {}
    names = {"dlrm": "DLRM", "dcnv2": "DCNv2", "deepfm": "DeepFM"}
    old["backbone"] = {"class_path": f"recsys.models.{names[str(arch)]}", "init_args": args}
    lr, wd = old.pop("learning_rate", 1e-3), old.pop("weight_decay", 0.0)
    old["optimizer"] = {"class_path": _LEGACY_OPTIMIZERS[str(old.get("optimizer", "adam"))], "init_args": {"lr": lr, "weight_decay": wd}}
    return old


def export_checkpoint(
    checkpoint: str | Path,
    output_dir: str | Path,
    check_parity: bool = True,
    parity_batch_sizes: tuple[int, ...] = (1, 7, 300),
    precision: str | Precision = "fp32",
    test: SplitData | None = None,
) -> dict[str, Any]:
    """Export a checkpoint to ``output_dir``; optionally check eager vs exported in a fresh process.

    Args:
        precision: storage of the embedding tables (``fp32``, ``fp16``, ``int8``, ``int4``,
            with per-feature overrides ``"int8,C3=int4"``; see :mod:`recsys.export.quantize`).
            The parity check then compares against the eager *quantized* model.
        test: the test split of the data the checkpoint was trained on (e.g. its config's
            ``Recipe(config).datamodule.split_data("test")``); with a precision other than fp32
            it is scored by the fp32 and the quantized model and the AUC / log-loss change is
            reported (read once, for the report).

    Returns:
        A report with ``output_dir``, ``parity_max_abs_diff`` (None when unchecked),
        ``embedding_precision`` (tables, bytes, fp32 bytes) and, with ``test``, ``test``:
        ``{"fp32": {auc, logloss}, "<precision>": {...}, "auc_change": ...}``.
    """
    from recsys.data.batching import random_batch
    from recsys.export import check_parity_in_fresh_process, export_model, read_export_header, to_plain_kernel
    from recsys.export.quantize import quantize_model

    loaded = load_checkpoint(checkpoint)
    metadata = {"checkpoint": str(checkpoint), "arch": type(loaded.model).__name__.lower()}
    result = export_model(loaded.model, loaded.preprocessor, output_dir, metadata=metadata, precision=precision)
    record = read_export_header(result.output_dir).get("embedding_precision", {})
    quantized = any(p != "fp32" for p in record.get("tables", {}).values())
    # the eager reference of a quantized export (an fp32 export is checked against the trained model itself)
    served = quantize_model(to_plain_kernel(loaded.model), record["tables"]) if quantized else loaded.model
    report: dict[str, Any] = {"output_dir": str(output_dir), "parity_max_abs_diff": None, "embedding_precision": record}
    if check_parity:
        schema = loaded.preprocessor.fitted_schema
        batches = [random_batch(schema, b, seed=i) for i, b in enumerate(parity_batch_sizes)]
        report["parity_max_abs_diff"] = check_parity_in_fresh_process(output_dir, served, batches)
    if test is not None and served is not loaded.model:
        from recsys.train.evaluation import evaluate

        fp32, low = evaluate(loaded.model, test), evaluate(served, test)
        report["test"] = {"fp32": fp32, precision: low, "auc_change": low["auc"] - fp32["auc"],
                          "logloss_change": low["logloss"] - fp32["logloss"]}
    return report
