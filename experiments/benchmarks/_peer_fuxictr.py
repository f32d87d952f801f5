"""One FuxiCTR 2.3.10 fit on prepared train/valid/test CSVs: the peer arm of ``peers.py``.

Runs inside the peer virtualenv (``.cache/peers/venv``, made by ``peers.ensure_peer_venv``), so it
imports nothing of this project. FuxiCTR's wheel ships its data pipeline, ``BaseModel`` (training
loop, early stopping, LR decay on plateau, regularizers) and layers but not its model zoo; DCNv2
and DeepFM are composed here from those layers the way the zoo arranges them (parallel DCNv2:
``fc([CrossNetV2(e); MLP(e)])``; DeepFM: ``FM(e) + LR(x) + MLP(e)``).

    python _peer_fuxictr.py --model dcnv2 --seed 0 --split-dir DIR --work DIR --out run.json \
        --pred test_pred.npy --settings '{"embedding_dim": 10, ...}'

Writes ``--out`` (JSON: test AUC and log loss, wall and fit seconds, samples/s, peak RSS,
epochs, best validation AUC, versions) and ``--pred`` (the test rows' probabilities in the
order of ``test.csv``; the loader's labels are checked against the file's).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from fuxictr.features import FeatureMap
from fuxictr.metrics import evaluate_metrics
from fuxictr.preprocess import FeatureProcessor, build_dataset
from fuxictr.pytorch.dataloaders import RankDataLoader
from fuxictr.pytorch.layers import CrossNetV2, FactorizationMachine, FeatureEmbedding, MLP_Block
from fuxictr.pytorch.models import BaseModel
from fuxictr.pytorch.torch_utils import seed_everything
from torch import nn


class PeerDCNv2(BaseModel):
    """DCNv2, parallel structure, full-rank cross layers (FuxiCTR's ``model_structure: parallel``)."""

    def __init__(self, feature_map: Any, settings: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(feature_map, embedding_regularizer=settings["embedding_regularizer"],
                         net_regularizer=settings["net_regularizer"], **kwargs)
        self.embedding_layer = FeatureEmbedding(feature_map, settings["embedding_dim"])
        width = feature_map.sum_emb_out_dim()
        self.crossnet = CrossNetV2(width, settings["num_cross_layers"])
        self.parallel_dnn = MLP_Block(input_dim=width, output_dim=None, hidden_units=list(settings["hidden_units"]),
                                      hidden_activations="ReLU", output_activation=None,
                                      dropout_rates=settings["net_dropout"], batch_norm=settings["batch_norm"])
        self.fc = nn.Linear(width + settings["hidden_units"][-1], 1)
        self.compile("adam", "binary_crossentropy", settings["learning_rate"])
        self.reset_parameters()
        self.model_to_device()

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        emb = self.embedding_layer(self.get_inputs(inputs), flatten_emb=True)
        logit = self.fc(torch.cat([self.crossnet(emb), self.parallel_dnn(emb)], dim=-1))
        return {"y_pred": self.output_activation(logit)}


class PeerDeepFM(BaseModel):
    """DeepFM: first-order LR and FM second order on the field embeddings, plus an MLP, summed."""

    def __init__(self, feature_map: Any, settings: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(feature_map, embedding_regularizer=settings["embedding_regularizer"],
                         net_regularizer=settings["net_regularizer"], **kwargs)
        self.embedding_layer = FeatureEmbedding(feature_map, settings["embedding_dim"])
        self.fm = FactorizationMachine(feature_map)
        self.mlp = MLP_Block(input_dim=feature_map.sum_emb_out_dim(), output_dim=1,
                             hidden_units=list(settings["hidden_units"]), hidden_activations="ReLU",
                             output_activation=None, dropout_rates=settings["net_dropout"],
                             batch_norm=settings["batch_norm"])
        self.compile("adam", "binary_crossentropy", settings["learning_rate"])
        self.reset_parameters()
        self.model_to_device()

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = self.get_inputs(inputs)
        emb = self.embedding_layer(x)
        logit = self.fm(x, emb) + self.mlp(emb.flatten(start_dim=1))
        return {"y_pred": self.output_activation(logit)}


MODELS: dict[str, type[BaseModel]] = {"dcnv2": PeerDCNv2, "deepfm": PeerDeepFM}


def _csv_header_and_labels(path: Path) -> tuple[list[str], np.ndarray]:
    with path.open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows)
        labels = np.array([float(r[0]) for r in rows])
    return header, labels


def _ray_helpers_rss_mb() -> float:
    """Resident memory of this process's descendants (Ray's raylet, GCS and workers) now, in MB."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the parquet data, train with early stopping on validation AUC, score the test rows."""
    settings = json.loads(args.settings)
    split_dir = Path(args.split_dir)
    work = Path(args.work)
    header, test_labels = _csv_header_and_labels(split_dir / "test.csv")
    fields = [c for c in header if c != "label"]
    dataset_id = f"frappe_x1_{args.model}_{args.seed}"
    shutil.rmtree(work / dataset_id, ignore_errors=True)  # every run builds its own parquet and vocabularies

    start = time.perf_counter()
    processor = FeatureProcessor(feature_cols=[{"name": fields, "active": True, "dtype": "str", "type": "categorical"}],
                                 label_col={"name": "label", "dtype": "float"}, dataset_id=dataset_id,
                                 data_root=str(work))
    train, valid, test = build_dataset(processor, train_data=str(split_dir / "train.csv"),
                                       valid_data=str(split_dir / "valid.csv"), test_data=str(split_dir / "test.csv"),
                                       min_categr_count=settings["min_categr_count"])
    # test predictions must come back in file order (Ray Data may otherwise reorder blocks)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    feature_map = FeatureMap(dataset_id, str(work / dataset_id))
    feature_map.load(str(work / dataset_id / "feature_map.json"), {"embedding_dim": settings["embedding_dim"]})
    seed_everything(seed=args.seed)
    model = MODELS[args.model](
        feature_map, settings, model_id=f"{args.model}_{args.seed}", gpu=-1, model_root=str(work / "checkpoints"),
        verbose=0, metrics=["AUC", "logloss"], monitor="AUC", monitor_mode="max",
        early_stop_patience=settings["early_stop_patience"], reduce_lr_on_plateau=True,
    )
    os.makedirs(model.model_dir, exist_ok=True)
    n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    train_gen, valid_gen = RankDataLoader(feature_map, stage="train", train_data=train, valid_data=valid,
                                          batch_size=settings["batch_size"], shuffle=True, data_format="parquet")
    fit_start = time.perf_counter()
    model.fit(train_gen, epochs=args.epochs, validation_data=valid_gen)
    fit_seconds = time.perf_counter() - fit_start
    epochs = int(model._epoch_index) + 1
    best_val_auc = float(model._best_metric)

    test_gen = RankDataLoader(feature_map, stage="test", test_data=test, batch_size=settings["batch_size"],
                              shuffle=False, data_format="parquet")
    model.eval()
    preds, labels = [], []
    with torch.no_grad():
        for batch in test_gen:
            preds.append(model.forward(batch)["y_pred"].reshape(-1).double().numpy())
            labels.append(model.get_labels(batch).reshape(-1).double().numpy())
    y_pred, y_true = np.concatenate(preds), np.concatenate(labels)
    if y_true.shape != test_labels.shape or not np.array_equal(y_true, test_labels):
        raise RuntimeError("FuxiCTR's test loader did not return the rows of test.csv in file order")
    metrics = evaluate_metrics(y_true, y_pred, ["AUC", "logloss"])
    wall = time.perf_counter() - start
    _replace_with(Path(args.pred), lambda tmp: np.save(tmp, y_pred))
    helpers = _ray_helpers_rss_mb()
    ray.shutdown()
    train_rows = int(train_gen.num_samples)
    return {
        "library": "fuxictr", "model": args.model, "seed": args.seed,
        "test_auc": float(metrics["AUC"]), "test_logloss": float(metrics["logloss"]), "best_val_auc": best_val_auc,
        "epochs": epochs, "wall_seconds": wall, "fit_seconds": fit_seconds,
        "samples_per_second": train_rows * epochs / fit_seconds, "train_rows": train_rows, "test_rows": int(y_true.size),
        "peak_rss_mb": _peak_rss_mb(),
        "ray_helpers_rss_mb_at_end": helpers, "n_parameters": int(n_parameters), "torch_threads": torch.get_num_threads(),
        "versions": {p: version(p) for p in ("fuxictr", "torch", "ray", "polars")} | {"python": sys.version.split()[0]},
    }



def _replace_with(path: Path, write: Callable[[Path], object]) -> None:
    """Write ``path`` through a temporary file in its folder, then rename it into place (this
    runner imports nothing of the project, so not ``recsys.io``)."""
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    write(tmp)
    os.replace(tmp, path)


def _peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM`` (``ru_maxrss`` keeps the parent's across ``exec``; this
    script runs in the peer's venv, without ``recsys.runtime``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--split-dir", required=True, help="folder with train.csv, valid.csv, test.csv")
    parser.add_argument("--work", required=True, help="folder for the parquet data and checkpoints")
    parser.add_argument("--out", required=True, help="JSON result")
    parser.add_argument("--pred", required=True, help=".npy of the test probabilities, test.csv order")
    parser.add_argument("--settings", required=True, help="the model and training settings, JSON")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    text = json.dumps(result, indent=2)
    _replace_with(Path(args.out), lambda tmp: tmp.write_text(text))
    print(json.dumps({k: result[k] for k in ("test_auc", "test_logloss", "epochs", "wall_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
