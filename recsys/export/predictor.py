"""Scoring raw records in-library, and parity checks of an export against the eager model.

* :class:`Predictor`: raw records (dicts or a DataFrame of strings/numbers) -> probabilities,
  through the saved vocabularies (``Preprocessor.from_state_dict`` + ``make_batch``), with
  per-feature counts of out-of-vocabulary ids and filled dense values.
* :func:`check_parity`: max |eager - exported| in this process.
* :func:`save_parity_inputs` + :func:`check_parity_in_fresh_process`: the same check in a fresh
  interpreter that runs the export's own ``loader.py`` (only torch + fbgemm_gpu imported).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.data.batching import make_batch
from recsys.data.encoders import EncodedData, Preprocessor
from recsys.data.schema import FeatureSpec, SchemaError
from recsys.export.serving import (
    LOADER_FILE,
    eval_mode,
    export_schema,
    kjt_to_lists,
    load_exported,
    model_device,
    read_export_schema,
)
from recsys.io import atomic_path
from recsys.models.base import RankingModel

__all__ = [
    "MissingFeatureError",
    "Predictor",
    "check_parity",
    "check_parity_in_fresh_process",
    "preprocessor_from_export",
    "run_loader_in_fresh_process",
    "save_parity_inputs",
]

Records: TypeAlias = Sequence[Mapping[str, Any]] | pd.DataFrame


class MissingFeatureError(SchemaError):
    """A record (or frame) lacks a feature the model needs."""


def preprocessor_from_export(info: Mapping[str, Any]) -> Preprocessor:
    """Rebuild the fitted :class:`Preprocessor` from a parsed ``schema.json``.

    Vocabulary counts are not exported (only the id order matters for encoding): they read 0.
    """
    vocabs = {n: {"tokens": list(tokens), "counts": [0] * len(tokens)} for n, tokens in info["vocabularies"].items()}
    state = {"schema": info["schema"], "vocabularies": vocabs, "dense_stats": info["dense_stats"]}
    return Preprocessor.from_state_dict(state)


class Predictor:
    """Scores raw records with an exported module or an eager model.

    Args:
        preprocessor: fitted encoders (vocabularies, dense statistics) for the model's features.
        score: ``(batch) -> probabilities B``; see :meth:`load` and :meth:`from_model`.
        batch_size: rows scored per call of ``score``.

    Attributes:
        oov_counts: per sparse feature, ids mapped to the OOV id so far (unseen categories).
        dense_filled: per dense feature, missing/NaN/inf values filled so far.
        rows: records scored so far. :meth:`reset_counts` zeroes all three.

    Example::

        pred = Predictor.load("exports/dlrm")
        pred.predict([{"user": "u7", "genres": "a|b", "age": 31}])  # array([0.42], dtype=float32)
        pred.oov_counts  # {"user": 1, "genres": 0}
    """

    def __init__(
        self, preprocessor: Preprocessor, score: Callable[[Batch], torch.Tensor], batch_size: int = 4096
    ) -> None:
        self.preprocessor = preprocessor
        self.schema = preprocessor.fitted_schema
        self._score = score
        self.batch_size = batch_size
        self.reset_counts()

    @classmethod
    def load(cls, export_dir: str | Path, batch_size: int = 4096) -> Predictor:
        """A predictor on an export directory's TorchScript module and saved vocabularies."""
        info = read_export_schema(export_dir)
        module = load_exported(export_dir)
        names = list(info["sparse_features"])

        def score(batch: Batch) -> torch.Tensor:
            values, lengths = kjt_to_lists(batch.sparse_features, names)
            return module(values, lengths, batch.dense_features)

        return cls(preprocessor_from_export(info), score, batch_size)

    @classmethod
    def from_model(cls, model: RankingModel, preprocessor: Preprocessor, batch_size: int = 4096) -> Predictor:
        """A predictor on an eager model (sigmoid of its logits, eval mode, no grad)."""
        schema = export_schema(model, preprocessor)
        pre = Preprocessor(schema)
        pre.vocabularies = {f.name: preprocessor.vocabularies[f.name] for f in schema.sparse if f.hash_size is None}
        pre.dense_stats = {f.name: preprocessor.dense_stats[f.name] for f in schema.dense}
        pre.fitted = True

        device = model_device(model)

        def score(batch: Batch) -> torch.Tensor:
            batch = batch.to(device)
            with eval_mode(model):
                return torch.sigmoid(model(batch.dense_features, batch.sparse_features)).cpu()

        return cls(pre, score, batch_size)

    def reset_counts(self) -> None:
        self.oov_counts: dict[str, int] = {f.name: 0 for f in self.schema.sparse}
        self.dense_filled: dict[str, int] = {f.name: 0 for f in self.schema.dense}
        self.rows = 0

    def frame(self, records: Records) -> pd.DataFrame:
        """Records as a frame with every feature column; raises :class:`MissingFeatureError`.

        Dict records keep their Python values (object columns), so ``5`` stays the token
        ``"5"`` as in the standalone loader even when another record holds ``None``. A vector
        feature is given as a list of its D numbers under its name, or as its D prefixed columns
        (``emb_0`` .. ``emb_{D-1}``).
        """
        vectors = {f.name: f for f in self.schema.vectors}
        names = [n for n in self.schema.names if n not in vectors]
        if isinstance(records, pd.DataFrame):
            frame = records
            for name, spec in vectors.items():
                if name in frame.columns and not set(spec.columns) <= set(frame.columns):
                    frame = frame.drop(columns=[name]).join(pd.DataFrame(_vector_rows(frame[name].tolist(), spec, "row"),
                                                                         index=frame.index, columns=list(spec.columns)))
            lacking = [n for n in names if n not in frame.columns]
            lacking += [n for n, s in vectors.items() if not set(s.columns) <= set(frame.columns)]
            if lacking:
                raise MissingFeatureError(
                    f"records lack feature {lacking[0]!r} (missing: {lacking}); "
                    f"available columns: {list(records.columns)}"
                )
            return frame
        for i, rec in enumerate(records):
            lacking = [n for n in names if n not in rec]
            lacking += [n for n, s in vectors.items() if n not in rec and not all(c in rec for c in s.columns)]
            if lacking:
                raise MissingFeatureError(
                    f"record {i} lacks feature {lacking[0]!r} (missing: {lacking}); available keys: {sorted(rec)}"
                )
        out = {n: pd.Series([rec[n] for rec in records], dtype=object) for n in names}
        for name, spec in vectors.items():
            cells = [rec[name] if name in rec else [rec[c] for c in spec.columns] for rec in records]
            out.update(zip(spec.columns, _vector_rows(cells, spec, "record").T))
        return pd.DataFrame(out)

    def encode(self, records: Records) -> EncodedData:
        """Encode records with the saved vocabularies; updates the OOV / filled counts."""
        data = self.preprocessor.transform(self.frame(records))
        for name, n in data.stats.oov.items():
            self.oov_counts[name] += n
        for name, n in data.stats.dense_filled.items():
            self.dense_filled[name] += n
        self.rows += len(data)
        return data

    def predict(self, records: Records) -> np.ndarray:
        """Click probabilities of ``records`` (float32, N); a label column is not needed."""
        data = self.encode(records)
        offsets = {name: data.offsets(name) for name in data.sparse_names}
        out = []
        with torch.no_grad():
            for start in range(0, len(data), self.batch_size):
                rows = np.arange(start, min(start + self.batch_size, len(data)))
                out.append(self._score(make_batch(data, rows, offsets)).numpy())
        return np.concatenate(out) if out else np.zeros(0, np.float32)


def _vector_rows(cells: list[Any], spec: FeatureSpec, unit: str) -> np.ndarray:
    """A vector feature's cells (each D numbers, or None for missing) as an N x D float array."""
    out = np.full((len(cells), spec.width), np.nan)
    for i, cell in enumerate(cells):
        if cell is None or (isinstance(cell, float) and np.isnan(cell)):
            continue
        row = np.asarray(cell, dtype=np.float64).reshape(-1)
        if row.size != spec.width:
            raise ValueError(f"{unit} {i}: vector feature {spec.name!r} needs {spec.width} numbers, got {row.size}")
        out[i] = row
    return out


# -- parity -------------------------------------------------------------------------------------
def _plain_batches(batches: Iterable[Batch], names: list[str]) -> list[dict[str, Any]]:
    out = []
    for b in batches:
        values, lengths = kjt_to_lists(b.sparse_features.to(torch.device("cpu")), names)
        out.append({"values": values, "lengths": lengths, "dense": b.dense_features.to("cpu", torch.float32)})
    return out


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise ValueError(f"output shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _eager(model: RankingModel, batches: list[Batch]) -> list[torch.Tensor]:
    device = model_device(model)
    with eval_mode(model):
        return [torch.sigmoid(model(*_on(b, device))).cpu() for b in batches]


def _on(batch: Batch, device: torch.device) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    return batch.dense_features.to(device), batch.sparse_features.to(device)


def check_parity(export_dir: str | Path, model: RankingModel, batches: Iterable[Batch]) -> float:
    """Max |sigmoid(model(batch)) - exported(batch)| over ``batches``, in this process.

    Args:
        export_dir: an export directory.
        model: the eager model (plain or fused kernel).
        batches: torchrec ``Batch`` objects (``make_batch``), any sizes.
    """
    module = load_exported(export_dir)
    names = list(module.feature_names)
    batches = list(batches)
    diff = 0.0
    with torch.no_grad():
        for b, ref in zip(_plain_batches(batches, names), _eager(model, batches), strict=True):
            diff = max(diff, _max_abs_diff(module(b["values"], b["lengths"], b["dense"]), ref))
    return diff


def save_parity_inputs(path: str | Path, model: RankingModel, batches: Iterable[Batch]) -> Path:
    """Save ``batches`` as plain tensors plus the eager model's probabilities (``torch.save``).

    The file holds ``{"feature_names", "batches": [{"values", "lengths", "dense"}], "expected"}``
    and loads with ``torch.load(path, weights_only=True)``.
    """
    batches = list(batches)
    names = list(model.sparse_names)
    payload = {"feature_names": names, "batches": _plain_batches(batches, names), "expected": _eager(model, batches)}
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


def run_loader_in_fresh_process(
    export_dir: str | Path, inputs_file: str | Path, timeout: float = 600
) -> list[torch.Tensor]:
    """Outputs of the export's own ``loader.py`` run by a fresh ``sys.executable`` on saved inputs.

    The child imports only torch, fbgemm_gpu and the stdlib; raises ``RuntimeError`` when it
    fails or when it ended up importing recsys, torchrec or pandas.
    """
    export_dir = Path(export_dir).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "outputs.pt"
        cmd = [sys.executable, str(export_dir / LOADER_FILE), str(export_dir)]
        cmd += ["--inputs", str(Path(inputs_file).resolve()), "--outputs", str(out_file)]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"loader.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        result = torch.load(out_file, weights_only=True)
    if result["modules"]:
        raise RuntimeError(f"the standalone loader imported {result['modules']}; it must need only torch + fbgemm_gpu")
    return list(result["outputs"])


def check_parity_in_fresh_process(
    export_dir: str | Path, inputs: str | Path | RankingModel, batches: Iterable[Batch] | None = None
) -> float:
    """Max |eager - exported| with the exported module run through ``loader.py`` in a fresh interpreter.

    Two call forms:

    * ``check_parity_in_fresh_process(export_dir, inputs_file)`` with a file written by
      :func:`save_parity_inputs` (it holds the eager outputs);
    * ``check_parity_in_fresh_process(export_dir, model, batches)``: saves the inputs to a
      temporary file first.
    """
    if isinstance(inputs, torch.nn.Module):
        if batches is None:
            raise TypeError("check_parity_in_fresh_process(export_dir, model, batches) needs batches")
        with tempfile.TemporaryDirectory() as tmp:
            inputs_file = save_parity_inputs(Path(tmp) / "inputs.pt", inputs, batches)
            return check_parity_in_fresh_process(export_dir, inputs_file)
    saved = torch.load(inputs, weights_only=True)
    outputs = run_loader_in_fresh_process(export_dir, inputs)
    diff = 0.0
    for out, ref in zip(outputs, saved["expected"], strict=True):
        diff = max(diff, _max_abs_diff(out, ref))
    return diff
