"""Peer benchmark: our DCNv2 and DeepFM against FuxiCTR 2.3.10's, side by side on one Frappe split.

    python -m experiments.benchmarks.peers                     # 3 seeds x 4 arms (needs SALIENCE_DATA_DIR)
    python -m experiments.benchmarks.peers --seeds 2 --models dcnv2
    python -m experiments.benchmarks.peers --quick             # a smoke run: 1 epoch on 5,000 rows

The split: the rows of ``frappe/frappe.validation.libfm.gz`` then ``frappe.test.libfm.gz``
(labels -1/1 or 0/1 -> 0/1; the libFM index of each token is its field's category), shuffled
by ``random.Random(2026)``, cut 80/10/10 into train/valid/test CSVs under
``.cache/peers/frappe_x1/`` (:func:`build_split`). Both libraries read these three files.

Arms, each trained on every seed with the BARS Frappe_x1 settings (embedding dim 10, batch
4096, Adam at 1e-3, L2 0.05 on the embeddings, three hidden layers of 400 with batch norm,
DCNv2 parallel with 4 cross layers and dropout 0.4, DeepFM dropout 0.2, LR x0.1 on a plateau,
early stopping on validation AUC after 2 epochs without gain, at most 100 epochs):

* ours: ``salience fit`` of ``experiments/configs/peers_frappe_{dcnv2,deepfm}.yaml`` through
  :class:`recsys.train.recipe.Recipe`, in its own process (``ours-worker``);
* FuxiCTR: ``_peer_fuxictr.py`` in a separate virtualenv (``.cache/peers/venv``, made by
  :func:`ensure_peer_venv` when missing), DCNv2 and DeepFM composed from FuxiCTR's layers.

Arms run one after another (per seed: ours, FuxiCTR for each model), so machine load hits
both, each fit with one torch thread (``--threads``); no seed beyond the second starts that would
end after ``--budget-minutes`` (75). Per arm: test AUC and log loss, wall seconds (data files to test predictions, imports
excluded), training samples/s, peak RSS of the process, epochs. Paired on the same test rows:
per seed :func:`recsys.stats.delong` of ours - FuxiCTR, combined by :func:`recsys.stats.over_seeds`;
the verdict is the interval's. Writes ``experiments/results/peers.{json,md}``.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recsys.io import atomic_path, atomic_write_text
from recsys.runtime import process_peak_rss_mb
from recsys.stats import BETTER, WORSE

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
CACHE = ROOT / ".cache" / "peers"
SPLIT_DIR = CACHE / "frappe_x1"
VENV = CACHE / "venv"
RUNNER = Path(__file__).resolve().parent / "_peer_fuxictr.py"
SOURCE_FILES = ("frappe.validation.libfm.gz", "frappe.test.libfm.gz")
SPLIT_SEED = 2026
SPLIT_NAMES = ("train", "valid", "test")
QUICK_ROWS = 5000
MODELS = ("dcnv2", "deepfm")
CONFIGS = {m: f"experiments/configs/peers_frappe_{m}.yaml" for m in MODELS}
#: the peer's install (torch first: its CPU wheel comes from the local wheel folder)
PEER_TORCH = "torch==2.13.0"
PEER_PACKAGES = ("fuxictr==2.3.10", "polars<2")
#: BARS Frappe_x1 settings (reczoo/BARS ranking/ctr/{DCNv2,DeepFM}/*_frappe_x1, FuxiCTR 1.1 logs)
_COMMON = {"embedding_dim": 10, "batch_size": 4096, "learning_rate": 1e-3, "embedding_regularizer": 0.05,
           "net_regularizer": 0.0, "hidden_units": [400, 400, 400], "batch_norm": True, "early_stop_patience": 2,
           "epochs": 100, "min_categr_count": 1, "monitor": "AUC"}
PEER_SETTINGS: dict[str, dict[str, Any]] = {
    "dcnv2": {**_COMMON, "model_structure": "parallel", "num_cross_layers": 4, "net_dropout": 0.4},
    "deepfm": {**_COMMON, "net_dropout": 0.2},
}
TARGETS = {"ours_test_auc_at_or_above_fuxictr_mean_over_seeds": True, "ours_wall_seconds_at_most_fuxictr": True}


# -- the split -----------------------------------------------------------------------------
def read_libfm(path: Path) -> tuple[list[int], list[list[str]]]:
    """Labels (0/1) and per-row category strings (each token's libFM index) of a gzip libFM file.

    Raises:
        ValueError: a label other than -1/0/1, a token without ``:``, or rows of different lengths.
    """
    labels: list[int] = []
    rows: list[list[str]] = []
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        for number, line in enumerate(f, start=1):
            tokens = line.rstrip("\r\n").split()
            if not tokens:
                continue
            try:
                label = float(tokens[0])
            except ValueError:
                label = float("nan")
            if label not in (-1.0, 0.0, 1.0):
                raise ValueError(f"{path}:{number}: label {tokens[0]!r} is not -1, 0 or 1")
            if any(":" not in t for t in tokens[1:]):
                raise ValueError(f"{path}:{number}: a token is not 'index:value'")
            row = [t.split(":", 1)[0] for t in tokens[1:]]
            if rows and len(row) != len(rows[0]):
                raise ValueError(f"{path}:{number}: {len(row)} fields, the rows before have {len(rows[0])}")
            labels.append(1 if label > 0 else 0)
            rows.append(row)
    return labels, rows


def split_indices(n: int, seed: int = SPLIT_SEED) -> dict[str, list[int]]:
    """``random.Random(seed).shuffle(range(n))`` cut into the first 80% (train), the next 10%
    (valid) and the rest (test)."""
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    n_train, n_valid = int(0.8 * n), int(0.1 * n)
    return {"train": idx[:n_train], "valid": idx[n_train:n_train + n_valid], "test": idx[n_train + n_valid:]}


def build_split(source_dir: Path, out_dir: Path, fields: Sequence[str] | None = None, seed: int = SPLIT_SEED,
                limit: int | None = None, embedding_dim: int = 10) -> dict[str, Any]:
    """Write ``train.csv``, ``valid.csv``, ``test.csv`` (label + one column per field), the
    ``schema.yaml`` our reader needs and ``manifest.json``; returns the manifest.

    Args:
        source_dir: the folder holding :data:`SOURCE_FILES` (``$SALIENCE_DATA_DIR/frappe``).
        out_dir: where the files go.
        fields: column names (default: Frappe's ten fields, in libFM order).
        seed: the shuffle seed.
        limit: keep only the first ``limit`` shuffled rows before cutting (``--quick``).
        embedding_dim: every field's embedding dim in ``schema.yaml``.
    """
    from recsys.io import atomic_write_json

    labels: list[int] = []
    rows: list[list[str]] = []
    for name in SOURCE_FILES:
        more_labels, more_rows = read_libfm(source_dir / name)
        labels += more_labels
        rows += more_rows
    if fields is None:
        from recsys.data.readers.frappe import FRAPPE_FIELDS

        fields = [f for f, _ in FRAPPE_FIELDS]
    if rows and len(rows[0]) != len(fields):
        raise ValueError(f"{source_dir}: rows have {len(rows[0])} fields, expected {len(fields)} ({list(fields)})")
    order = split_indices(len(rows), seed)
    if limit is not None:
        kept = [i for part in SPLIT_NAMES for i in order[part]]
        order = split_indices(min(limit, len(rows)), seed)
        order = {k: [kept[i] for i in v] for k, v in order.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    for part in SPLIT_NAMES:
        tmp = out_dir / f".{part}.csv.tmp"
        with tmp.open("w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["label", *fields])
            writer.writerows([labels[i], *rows[i]] for i in order[part])
        os.replace(tmp, out_dir / f"{part}.csv")
    schema = "\n".join(["name: frappe_x1", "label: label", "features:",
                        *[f"  - {{name: {f}, embedding_dim: {embedding_dim}, min_count: 1}}" for f in fields]]) + "\n"
    atomic_write_text(out_dir / "schema.yaml", schema)
    manifest = {"sources": list(SOURCE_FILES), "seed": seed, "limit": limit, "source_rows": len(rows),
                "rows": {p: len(order[p]) for p in SPLIT_NAMES},
                "positives": {p: sum(labels[i] for i in order[p]) for p in SPLIT_NAMES}}
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


# -- the peer's virtualenv -----------------------------------------------------------------
def _peer_ready(python: Path) -> bool:
    probe = "import fuxictr, polars, ray, torch; from fuxictr.pytorch.layers import CrossNetV2"
    return python.is_file() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def ensure_peer_venv(venv: Path = VENV) -> Path:
    """The peer virtualenv's python, after creating the venv (``python3 -m venv``) and installing
    :data:`PEER_TORCH` then :data:`PEER_PACKAGES` when it is missing or cannot import FuxiCTR."""
    python = venv / "bin" / "python"
    if _peer_ready(python):
        return python
    if not python.is_file():
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, PEER_TORCH], check=True)
    subprocess.run([*pip, *PEER_PACKAGES], check=True)
    if not _peer_ready(python):
        raise RuntimeError(f"{venv}: FuxiCTR was installed but does not import; remove the folder and run again")
    return python


# -- one fit per arm -----------------------------------------------------------------------
def _run_fit(cmd: list[str], stem: Path, what: str, threads: int, env: dict[str, str] | None = None,
             cwd: Path = ROOT) -> dict[str, Any]:
    """Run one fit's process (its output to ``stem.log``); its result JSON plus ``pred`` (the .npy path)."""
    env = {**(env if env is not None else os.environ), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with atomic_path(f"{stem}.log") as tmp, open(tmp, "w") as log:  # the log stays in place after a failure too
        done = subprocess.run([*cmd, "--threads", str(threads)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if done.returncode != 0:
        tail = Path(f"{stem}.log").read_text()[-3000:]
        raise RuntimeError(f"{what} failed (exit {done.returncode}); log {stem}.log:\n{tail}")
    return {**json.loads(Path(f"{stem}.json").read_text()), "pred": f"{stem}.npy"}


def run_peer(python: Path, model: str, seed: int, split_dir: Path, out_dir: Path, quick: bool,
             threads: int = 1) -> dict[str, Any]:
    """FuxiCTR's fit in a subprocess of its venv (``_peer_fuxictr.py``)."""
    stem = out_dir / f"fuxictr-{model}-{seed}"
    work = out_dir / "fuxictr-work"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [str(python), str(RUNNER), "--model", model, "--seed", str(seed), "--split-dir", str(split_dir),
           "--work", str(work), "--out", f"{stem}.json", "--pred", f"{stem}.npy",
           "--settings", json.dumps(PEER_SETTINGS[model]), "--epochs", str(1 if quick else PEER_SETTINGS[model]["epochs"])]
    result = _run_fit(cmd, stem, f"FuxiCTR {model} seed {seed}", threads, env, cwd=out_dir)
    shutil.rmtree(work, ignore_errors=True)
    return result


def run_ours(model: str, seed: int, split_dir: Path, out_dir: Path, quick: bool, threads: int = 1) -> dict[str, Any]:
    """Our fit in its own process (its own peak RSS): ``python -m experiments.benchmarks.peers ours-worker``."""
    stem = out_dir / f"ours-{model}-{seed}"
    cmd = [sys.executable, "-m", "experiments.benchmarks.peers", "ours-worker", "--model", model, "--seed", str(seed),
           "--split-dir", str(split_dir), "--out", f"{stem}.json", "--pred", f"{stem}.npy", *(["--quick"] if quick else [])]
    return _run_fit(cmd, stem, f"ours {model} seed {seed}", threads)


def fit_overrides(split_dir: Path) -> list[str]:
    """``salience fit`` arguments that point a peers config at the split files in ``split_dir``."""
    files = {p: str(split_dir / f"{p}.csv") for p in SPLIT_NAMES}
    return [f"--data.reader.init_args.path={files['train']}", f"--data.reader.init_args.schema={split_dir / 'schema.yaml'}",
            f"--data.split.files={json.dumps(files)}", "--data.cache_dir=null"]


def _ours_worker(argv: Sequence[str]) -> int:
    """Train one of our models on the split (one process per fit) and write its result JSON and
    test probabilities (test.csv order)."""
    parser = argparse.ArgumentParser(prog="peers ours-worker")
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--split-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pred", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(list(argv))

    import numpy as np
    import torch
    from lightning.pytorch.callbacks import Callback

    import recsys.train.cli  # noqa: F401 - imported before the clock starts, as the peer's imports are
    torch.set_num_threads(args.threads)
    from experiments.benchmarks._common import isolated_workdir
    from recsys.train.recipe import Recipe

    class _Clock(Callback):
        """Epochs trained and seconds of the training loop (training and validation passes)."""

        def __init__(self) -> None:
            self.epochs, self.start, self.seconds = 0, 0.0, 0.0

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.epochs += 1

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self.seconds = time.perf_counter() - self.start

    clock = _Clock()
    with isolated_workdir("salience-peers-") as work:
        recipe = Recipe(ROOT / CONFIGS[args.model], fit_overrides(args.split_dir), workdir=work, quiet=True,
                        keep_checkpoints=False)
        fit = recipe.fit(seed=args.seed, tracking=False, export=False, max_epochs=1 if args.quick else None,
                         extra_args=[f"--data.shuffle_seed={args.seed}"], callbacks=[clock])
        train_rows = len(fit.datamodule.prepared.splits["train"].labels)
        n_parameters = sum(p.numel() for p in fit.task.parameters() if p.requires_grad)
    if fit.test_scores is None:
        raise RuntimeError("the fit kept no test scores")
    labels, probs = fit.test_scores
    with (args.split_dir / "test.csv").open(newline="") as f:
        expected = np.array([float(r[0]) for r in list(csv.reader(f))[1:]])
    if labels.shape != expected.shape or not np.array_equal(labels.astype(np.float64), expected):
        raise RuntimeError("the test scores are not in test.csv order")
    with atomic_path(args.pred) as tmp, open(tmp, "wb") as tmp_file:
        np.save(tmp_file, probs.astype(np.float64))
    result = {
        "library": "ours", "model": args.model, "seed": args.seed,
        "test_auc": fit.metrics["test_auc"], "test_logloss": fit.metrics["test_logloss"],
        "best_val_auc": fit.metrics.get("best_val_auc", float("nan")), "epochs": clock.epochs,
        "wall_seconds": fit.seconds, "fit_seconds": clock.seconds,
        "samples_per_second": train_rows * clock.epochs / max(clock.seconds, 1e-9), "train_rows": train_rows,
        "test_rows": int(labels.size), "peak_rss_mb": process_peak_rss_mb(),
        "n_parameters": int(n_parameters), "torch_threads": torch.get_num_threads(),
    }
    atomic_write_text(args.out, json.dumps(result, indent=2))
    return 0


# -- summaries and verdicts ----------------------------------------------------------------
def _summary(values: Sequence[float]) -> dict[str, float]:
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else 0.0
    return {"mean": mean, "sd": sd, "se": sd / math.sqrt(n), "n": n}


SUMMARIZED = ("test_auc", "test_logloss", "best_val_auc", "wall_seconds", "samples_per_second", "peak_rss_mb", "epochs")


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, sd, se and n over seeds of each reported number of one arm."""
    return {key: _summary([float(r[key]) for r in runs]) for key in SUMMARIZED}


def paired(ours: Sequence[dict[str, Any]], peer: Sequence[dict[str, Any]], labels: Any) -> dict[str, Any]:
    """Ours - FuxiCTR test AUC on the same rows: DeLong per seed pair, combined over seeds."""
    import numpy as np

    from recsys.stats import delong, over_seeds

    per_seed = [delong(labels, np.load(a["pred"]), np.load(b["pred"])) for a, b in zip(ours, peer, strict=True)]
    combined = over_seeds(per_seed)
    return {"seeds": [a["seed"] for a in ours], "per_seed": [i.to_dict() for i in per_seed],
            "combined": combined.to_dict(), "verdict": combined.verdict()}


def _interval(d: dict[str, Any]) -> str:
    return f"{d['estimate']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def target_verdicts(summary: dict[str, dict[str, Any]], comparison: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The target "our DCNv2 and DeepFM at or above FuxiCTR's at no more wall time", per model and
    overall: ``met`` only when the paired 95% interval of our test AUC minus FuxiCTR's (DeLong
    per seed on the shared rows, over seeds) lies above zero and our mean wall time is no more;
    ``NOT met`` when the interval lies below zero or the wall time is more; else ``tie`` (the
    means are printed, but they do not decide)."""
    out: dict[str, str] = {}
    states = []
    for model, c in comparison.items():
        ours, peer = summary[f"ours/{model}"], summary[f"fuxictr/{model}"]
        auc_diff = ours["test_auc"]["mean"] - peer["test_auc"]["mean"]
        wall_ratio = ours["wall_seconds"]["mean"] / peer["wall_seconds"]["mean"]
        wall_ok = wall_ratio <= 1
        state = "NOT met" if c["verdict"] == WORSE or not wall_ok else "met" if c["verdict"] == BETTER else "tie"
        states.append(state)
        out[f"{model}: test AUC at or above FuxiCTR (paired over seeds) at no more wall time"] = (
            f"{state}: paired {_interval(c['combined'])} ({c['verdict']}; means {ours['test_auc']['mean']:.4f} vs "
            f"{peer['test_auc']['mean']:.4f}, {auc_diff:+.4f}); wall time {'no more' if wall_ok else 'more'} "
            f"({ours['wall_seconds']['mean']:.0f} s vs {peer['wall_seconds']['mean']:.0f} s, x{wall_ratio:.2f})")
    overall = ("NOT met" if "NOT met" in states or not states else "met" if all(x == "met" for x in states) else "tie")
    out["our DCNv2 and DeepFM at or above FuxiCTR's (paired over seeds) at no more wall time"] = (
        f"{overall} (models: {', '.join(comparison) or 'none'})")
    return out


def _mean_sd(s: dict[str, float], digits: int) -> str:
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f}"


def to_markdown(result: dict[str, Any]) -> str:
    """The report: arms side by side, the paired comparison, the targets, the settings."""
    from recsys.stats import Interval

    split = result["split"]
    lines = [
        "# Peers: our DCNv2 and DeepFM against FuxiCTR 2.3.10 on one Frappe split",
        "",
        f"Command: `{result['command'].strip()}`  ",
        f"Date: {result['date']}; hardware: {result['hardware']['cpu']} ({result['hardware']['cores']} cores), "
        f"{'GPU ' + result['hardware']['gpu'] if result['hardware'].get('gpu') else 'no GPU'}; seeds: {result['seeds']}; "
        f"torch threads per fit: {result.get('threads', 'default')}; arms run one after another; "
        f"load average {result['load_average']['start']:.1f} at the start, {result['load_average']['end']:.1f} at the end; "
        f"total {result['total_seconds'] / 60:.0f} min.",
        *(["", "**--quick: a smoke run (1 epoch, a subsample); the numbers mean nothing.**"] if result["quick"] else []),
        *(["", f"**Fewer seeds than requested** ({result['stopped_by_budget']})."] if result.get("stopped_by_budget") else []),
        *(["", f"Note: {result['note']}"] if result.get("note") else []),
        *(["", f"Verdicts and text recomputed from these measurements by `{result['rendered_by'].strip()}`."]
          if result.get("rendered_by") else []),
        "",
        f"Split: the rows of `frappe.validation.libfm.gz` then `frappe.test.libfm.gz` ({split['source_rows']:,} rows), "
        f"shuffled by `random.Random({split['seed']})`, cut 80/10/10: {split['rows']['train']:,} train / "
        f"{split['rows']['valid']:,} valid / {split['rows']['test']:,} test rows; each libFM index is its field's "
        "category. Both libraries read the same three CSV files and score the same test rows.",
        "",
        "| arm | test AUC (mean ± sd) | test log loss | best valid AUC | wall s | train samples/s | peak RSS MB | epochs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, s in result["summary"].items():
        lines.append(f"| {arm} | {_mean_sd(s['test_auc'], 4)} | {_mean_sd(s['test_logloss'], 4)} | "
                     f"{_mean_sd(s['best_val_auc'], 4)} | {_mean_sd(s['wall_seconds'], 0)} | "
                     f"{_mean_sd(s['samples_per_second'], 0)} | {_mean_sd(s['peak_rss_mb'], 0)} | "
                     f"{_mean_sd(s['epochs'], 1)} |")
    lines += ["", "Ours - FuxiCTR test AUC on the same test rows (DeLong 95% interval per seed pair; over seeds: "
              "`recsys.stats.over_seeds`, the seeds' spread plus the shared row-sampling variance); the verdict is "
              "the interval's (`better`/`worse` only when it excludes 0):", "",
              "| model | seed | ours - FuxiCTR (95% CI) | verdict |", "|---|---:|---:|---|"]
    for model, c in result["comparison"].items():
        for seed, i in zip(c["seeds"], c["per_seed"], strict=True):
            lines.append(f"| {model} | {seed} | {_interval(i)} | {Interval(**i).verdict()} |")
        lines.append(f"| {model} | over seeds | {_interval(c['combined'])} | **{c['verdict']}** |")
    lines += ["", "Targets:", "", "| target | verdict |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result["verdicts"].items()]
    peer_versions: dict[str, str] = next((r["versions"] for runs in result["runs"].values() for r in runs if "versions" in r), {})
    lines += [
        "",
        "How each number is measured: wall seconds run from the CSV files to the test predictions inside the "
        "fit's own process (imports excluded; FuxiCTR's include starting its local Ray cluster, building its "
        "parquet files and vocabularies; ours include reading, encoding (no cache) and the test pass); train "
        "samples/s = train rows x epochs / seconds of the training loop (training and validation passes); peak "
        "RSS is that process's high-water mark (`VmHWM`; results before 2026-12-07 read `ru_maxrss`, which keeps the parent's RSS across `exec`) (FuxiCTR's Ray helper processes are not in it: their resident memory "
        "at the end is in the JSON, `ray_helpers_rss_mb_at_end`); epochs are the epochs trained, the last ones "
        "without gain included. FuxiCTR shuffles its training rows with Ray Data, unseeded, so its runs differ "
        "beyond the seed: the sd above is that spread.",
        "",
        "Settings of both (BARS Frappe_x1, reczoo/BARS `ranking/ctr/DCNv2/DCNv2_frappe_x1` and "
        "`ranking/ctr/DeepFM/DeepFM_frappe_x1`): embedding dim 10, batch 4096, Adam lr 1e-3, embedding L2 0.05 "
        "(FuxiCTR `embedding_regularizer`; ours `model.embedding_weight_decay` with the plain kernel: the same "
        "gradient 0.05 x E), no dense L2, hidden units [400, 400, 400] with batch norm and ReLU, DCNv2 parallel "
        "with 4 full-rank cross layers and dropout 0.4, DeepFM dropout 0.2, LR x0.1 at every validation epoch "
        "without gain, early stop after 2, at most 100 epochs, gradient norm clipped at 10, monitor validation "
        "AUC, test on the best checkpoint, embeddings initialised N(0, 1e-4) and linear layers Xavier-normal "
        "(FuxiCTR's defaults; ours `model.embedding_init_std: 1.0e-4` and `model.dense_init: xavier_normal`: with "
        "TorchRec's and torch's default initialisation our test AUC was 0.9330 (DCNv2) and 0.9325 (DeepFM), 0.028 "
        "and 0.025 below FuxiCTR's on the same rows). Differences that remain: DeepFM's first-order term "
        "(FuxiCTR: a 1-dim embedding per id, also under the L2; ours: a linear read-out of each field's "
        "embedding), the vocabulary (ids seen in train; unseen ids share one out-of-vocabulary row in both), "
        "and the plateau test (FuxiCTR: any gain above 1e-6; ours: torch's ReduceLROnPlateau, relative 1e-4).",
        "",
        "Versions: ours " + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
        + "; peer " + ", ".join(f"{k} {v}" for k, v in peer_versions.items()) + ".",
    ]
    return "\n".join(lines) + "\n"


# -- the command ---------------------------------------------------------------------------
def another_seed_fits(seed_seconds: Sequence[float], elapsed: float, budget_minutes: float) -> bool:
    """Whether to start the next seed: always for the first two; then only when one more seed
    (the mean of those so far) still ends within ``budget_minutes`` (0: no budget)."""
    if budget_minutes <= 0 or len(seed_seconds) < 2:
        return True
    return elapsed + statistics.fmean(seed_seconds) <= budget_minutes * 60


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm (0 .. N-1)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
    parser.add_argument("--quick", action="store_true", help=f"1 epoch on {QUICK_ROWS:,} rows (a smoke run, not a result)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every fit (1: the arms share a machine with other work; 2 threads on "
                             "a busy 2-core machine stall on every barrier)")
    parser.add_argument("--budget-minutes", type=float, default=75.0,
                        help="start no seed beyond the second that would end after this many minutes (0: no budget)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="a sentence for the report's header")
    parser.add_argument("--render", action="store_true",
                        help="measure nothing: recompute the verdicts of the existing peers.json and rewrite peers.md")
    args = parser.parse_args(list(argv) if argv is not None else None)
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.model_list if m not in MODELS]
    if unknown or not args.model_list:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    if argv[:1] == ["ours-worker"]:
        return _ours_worker(argv[1:])
    args = parse_args(argv)
    if args.render:
        return _render(args.output_dir.resolve(), argv)

    import numpy as np

    from experiments.benchmarks._common import result_header
    from recsys.data.raw import data_dir
    from recsys.io import atomic_write_json

    root = data_dir()
    if root is None:
        raise SystemExit("set SALIENCE_DATA_DIR to the folder that holds frappe/")
    started = time.perf_counter()
    header = result_header("peers", argv, args.quick, TARGETS)
    load_start = os.getloadavg()[0]
    split_dir = SPLIT_DIR.with_name(SPLIT_DIR.name + "_quick") if args.quick else SPLIT_DIR
    manifest = build_split(root / "frappe", split_dir, limit=QUICK_ROWS if args.quick else None)
    with (split_dir / "test.csv").open(newline="") as f:
        labels = np.array([int(float(r[0])) for r in list(csv.reader(f))[1:]])
    python = ensure_peer_venv()
    runs_dir = CACHE / ("runs_quick" if args.quick else "runs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    out = args.output_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {f"{lib}/{m}": [] for m in args.model_list for lib in ("ours", "fuxictr")}
    seed_seconds: list[float] = []

    def write(stopped: str = "") -> str:  # after every seed: a stopped run keeps the seeds it finished
        summary = {arm: summarize(rs) for arm, rs in runs.items()}
        comparison = {m: paired(runs[f"ours/{m}"], runs[f"fuxictr/{m}"], labels) for m in args.model_list}
        result: dict[str, Any] = {
            **header, "seeds": len(seed_seconds), "seeds_requested": args.seeds, "threads": args.threads,
            "budget_minutes": args.budget_minutes, "stopped_by_budget": stopped, "note": args.note,
            "split": manifest, "configs": {m: CONFIGS[m] for m in args.model_list},
            "peer_settings": {m: PEER_SETTINGS[m] for m in args.model_list}, "summary": summary,
            "comparison": comparison, "verdicts": target_verdicts(summary, comparison),
            "runs": {arm: [{k: v for k, v in r.items() if k != "pred"} for r in rs] for arm, rs in runs.items()},
            "seed_seconds": seed_seconds, "load_average": {"start": load_start, "end": os.getloadavg()[0]},
            "total_seconds": time.perf_counter() - started,
        }
        atomic_write_json(out / "peers.json", result, default=str)
        md = to_markdown(result)
        atomic_write_text(out / "peers.md", md)
        return md

    stopped = ""
    for seed in range(args.seeds):
        if not another_seed_fits(seed_seconds, time.perf_counter() - started, args.budget_minutes):
            stopped = (f"seeds: {seed} of {args.seeds} requested; one more (about {statistics.fmean(seed_seconds) / 60:.0f} "
                       f"min, the mean seed so far) would have ended after the {args.budget_minutes:g}-minute budget "
                       "(`--budget-minutes`)")
            break
        seed_start = time.perf_counter()
        for model in args.model_list:
            for lib in ("ours", "fuxictr"):
                r = (run_ours(model, seed, split_dir, runs_dir, args.quick, args.threads) if lib == "ours"
                     else run_peer(python, model, seed, split_dir, runs_dir, args.quick, args.threads))
                runs[f"{lib}/{model}"].append(r)
                print(f"{lib}/{model} seed {seed}: test AUC {r['test_auc']:.4f}, log loss {r['test_logloss']:.4f}, "
                      f"{r['epochs']} epochs, {r['wall_seconds']:.0f} s", flush=True)
        seed_seconds.append(time.perf_counter() - seed_start)
        write()
    print(write(stopped))
    return 0


def _render(out: Path, argv: Sequence[str]) -> int:
    """The verdicts and markdown of ``out/peers.json`` again, from its measurements."""
    from recsys.io import atomic_write_json

    path = out / "peers.json"
    if not path.is_file():
        raise SystemExit(f"--render: no {path} to render")
    result = json.loads(path.read_text())
    result["verdicts"] = target_verdicts(result["summary"], result["comparison"])
    result["rendered_by"] = "python -m experiments.benchmarks.peers " + " ".join(argv)
    atomic_write_json(path, result, default=str)
    atomic_write_text(out / "peers.md", to_markdown(result))
    print(f"rendered {out / 'peers.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
