"""Training throughput of DCNv2, plain EBC vs FBGEMM-fused EBC, and data-pipeline rows/s.

A benchmark, not a test: it writes ``train_throughput.json`` and ``train_throughput.md`` to
``--output-dir`` (default ``experiments/results``). Committed command (about 1.5 minutes on
2 idle cores)::

    SALIENCE_DATA_DIR=/path/to/data python -m experiments.benchmarks.train_throughput

Training part: DCNv2 (default hyper-parameters) on Criteo-shaped synthetic batches: 26
categorical fields with cardinalities log-spaced 4..100,000, ids skewed towards small ids
(``id = floor(card * u**3)``, so a few ids are hot as in real click logs), 13 dense
features, embedding dim 16, batch 2048. Both variants use Adagrad on the embeddings and Adam
on everything else:

* ``plain``: torchrec ``EmbeddingBagCollection``; ``torch.optim.Adagrad`` over the (dense)
  embedding gradients + ``torch.optim.Adam`` on the dense parameters;
* ``fused``: FBGEMM ``FusedEmbeddingBagCollection`` with Adagrad fused into backward (sparse
  row updates, ``.grad`` never materialised) + Adam on ``dense_parameters()``.

Both start from the same weights. Every repeat runs warm-up steps (not timed) and then
``--steps`` timed steps; the variants are interleaved (plain, fused, plain, fused, ...) so
drifts of the machine hit both; the report gives the median and spread over repeats and
the median of the per-repeat paired ratios.

Pipeline part: raw Criteo TSV -> ``CriteoReader.read()`` -> ``Preprocessor.fit`` ->
``Preprocessor.transform`` -> one shuffled epoch of ``BatchDataset``, rows/s per stage and end
to end, on the real 10k-row head (when ``$SALIENCE_DATA_DIR`` is set) and on a synthetic
Criteo-format TSV (200k rows) written to a temporary folder.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.io import atomic_write_text

__all__ = ["BenchConfig", "main", "run"]

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.benchmarks.train_throughput"
REAL_CRITEO = "criteo-kaggle-head10k/train_head10k.txt.gz"
NUM_SPARSE, NUM_DENSE = 26, 13


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one benchmark run (``--quick`` shrinks all of them)."""

    steps: int = 10  # timed training steps per repeat and variant
    warmup_steps: int = 2  # untimed steps before each timed block
    batch_size: int = 2048
    repeats: int = 20  # timed blocks per variant, interleaved
    embedding_dim: int = 16
    max_cardinality: int = 100_000
    num_batches: int = 8  # distinct pre-built batches cycled through
    synthetic_rows: int = 200_000  # rows of the synthetic Criteo TSV
    pipeline_repeats: int = 3
    real_rows: int | None = None  # rows read from the real head file (None = all)
    emb_lr: float = 0.05
    dense_lr: float = 1e-3
    seed: int = 0

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(
            steps=3,
            warmup_steps=1,
            batch_size=256,
            repeats=2,
            max_cardinality=1_000,
            num_batches=2,
            synthetic_rows=2_000,
            pipeline_repeats=1,
            real_rows=2_000,
        )


# ---------------------------------------------------------------------------------------------
# synthetic Criteo-shaped data
# ---------------------------------------------------------------------------------------------


def cardinalities(max_cardinality: int, n: int = NUM_SPARSE) -> list[int]:
    """``n`` table sizes log-spaced from 4 to ``max_cardinality``."""
    return [int(round(c)) for c in np.geomspace(4, max_cardinality, n)]


def skewed_ids(rng: np.random.Generator, card: int, size: int) -> np.ndarray:
    """Ids in ``[0, card)`` with ``P(id < k) = (k / card) ** (1/3)``: a few hot ids, a long tail."""
    return np.minimum((card * rng.random(size) ** 3).astype(np.int64), card - 1)


def synthetic_batches(cards: list[int], cfg: BenchConfig) -> list[Batch]:
    """``cfg.num_batches`` one-hot Criteo-shaped batches (built once, outside the timing)."""
    rng = np.random.default_rng(cfg.seed)
    names = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
    out = []
    for _ in range(cfg.num_batches):
        values = np.concatenate([skewed_ids(rng, c, cfg.batch_size) for c in cards])
        kjt = KeyedJaggedTensor(
            keys=names,
            values=torch.from_numpy(values),
            lengths=torch.ones(NUM_SPARSE * cfg.batch_size, dtype=torch.int32),
        )
        dense = torch.from_numpy(np.log1p(rng.exponential(5.0, (cfg.batch_size, NUM_DENSE))).astype(np.float32))
        labels = torch.from_numpy((rng.random(cfg.batch_size) < 0.25).astype(np.float32))
        out.append(Batch(dense_features=dense, sparse_features=kjt, labels=labels))
    return out


def write_synthetic_criteo_tsv(path: Path, rows: int, cards: list[int], seed: int) -> None:
    """A Criteo-format TSV (``label I1..I13 C1..C26``, 8-hex-digit ids, ~10% empty cells)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, np.ndarray] = {"label": (rng.random(rows) < 0.25).astype(np.int8).astype(str).astype(object)}
    for i in range(1, NUM_DENSE + 1):
        x = rng.geometric(0.05, rows).astype(str).astype(object)
        x[rng.random(rows) < 0.1] = ""
        cols[f"I{i}"] = x
    for i, card in enumerate(cards, start=1):
        vocab = np.array([f"{v:08x}" for v in rng.integers(0, 2**32, card)], dtype=object)
        x = vocab[skewed_ids(rng, card, rows)]
        x[rng.random(rows) < 0.1] = ""
        cols[f"C{i}"] = x
    pd.DataFrame(cols).to_csv(path, sep="\t", header=False, index=False)


# ---------------------------------------------------------------------------------------------
# training throughput
# ---------------------------------------------------------------------------------------------


class _Trainer:
    """One variant with its optimizers; ``run(k)`` trains k steps cycling through the batch pool.

    ``loss_fn(batch)`` returns the scalar loss (full model: BCE on the logits; sparse-only:
    a loss on the pooled embeddings, so only the embedding kernel and its optimizer run).
    """

    def __init__(
        self,
        loss_fn: Callable[[Batch], torch.Tensor],
        optimizers: list[torch.optim.Optimizer],
        batches: list[Batch],
    ) -> None:
        self.loss_fn = loss_fn
        self.optimizers = optimizers
        self.batches = batches
        self.i = 0
        self.last_loss = float("nan")

    def run(self, steps: int) -> tuple[float, float]:
        """Train ``steps`` steps; returns (wall seconds, CPU seconds of this process)."""
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = torch.zeros(())
        for _ in range(steps):
            batch = self.batches[self.i % len(self.batches)]
            self.i += 1
            for opt in self.optimizers:
                opt.zero_grad()
            loss = self.loss_fn(batch)
            loss.backward()
            for opt in self.optimizers:
                opt.step()
        self.last_loss = float(loss.detach())
        return time.perf_counter() - start, time.process_time() - cpu_start


def _bce(model: torch.nn.Module) -> Callable[[Batch], torch.Tensor]:
    def loss(batch: Batch) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(model(batch.dense_features, batch.sparse_features), batch.labels)

    return loss


def _embedding_loss(sparse_arch: torch.nn.Module) -> Callable[[Batch], torch.Tensor]:
    def loss(batch: Batch) -> torch.Tensor:
        emb = sparse_arch(batch.sparse_features)
        return torch.cat(list(emb.values()), dim=1).pow(2).mean()

    return loss


def _build_trainers(cfg: BenchConfig, cards: list[int], batches: list[Batch]) -> dict[str, dict[str, _Trainer]]:
    """``{"full": {"plain": ..., "fused": ...}, "sparse_only": {...}}``, all from the same weights."""
    from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema
    from recsys.models import DCNv2, FusedOptimizer, SparseArch, SparseArchConfig

    schema = Schema(
        features=(
            *(FeatureSpec(f"I{i}", FeatureKind.DENSE, transform=DenseTransform.LOG1P) for i in range(1, NUM_DENSE + 1)),
            *(
                FeatureSpec(f"C{i}", embedding_dim=cfg.embedding_dim, num_embeddings=c)
                for i, c in enumerate(cards, start=1)
            ),
        ),
        name="criteo-synthetic",
    )
    fused_cfg = SparseArchConfig(kernel="fused", fused_optimizer=FusedOptimizer.ADAGRAD, fused_lr=cfg.emb_lr)  # type: ignore[arg-type]
    torch.manual_seed(cfg.seed)
    plain = DCNv2(schema)
    fused = DCNv2(schema, sparse_arch=fused_cfg)
    fused.load_state_dict(plain.state_dict())  # same starting point (see the model tests)
    emb_ids = {id(p) for p in plain.sparse_arch.parameters()}
    full = {
        "plain": _Trainer(
            _bce(plain),
            [
                torch.optim.Adagrad(list(plain.sparse_arch.parameters()), lr=cfg.emb_lr, eps=1e-8),
                torch.optim.Adam([p for p in plain.parameters() if id(p) not in emb_ids], lr=cfg.dense_lr),
            ],
            batches,
        ),
        "fused": _Trainer(_bce(fused), [torch.optim.Adam(fused.dense_parameters(), lr=cfg.dense_lr)], batches),
    }
    plain_arch, fused_arch = SparseArch(schema), SparseArch(schema, fused_cfg)
    fused_arch.load_state_dict(plain_arch.state_dict())
    sparse_only = {
        "plain": _Trainer(
            _embedding_loss(plain_arch), [torch.optim.Adagrad(list(plain_arch.parameters()), lr=cfg.emb_lr, eps=1e-8)], batches
        ),
        "fused": _Trainer(_embedding_loss(fused_arch), [], batches),
    }
    return {"full": full, "sparse_only": sparse_only}


def median_quartiles(values: list[float]) -> dict[str, float]:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "iqr": q3 - q1,
        "rel_spread": (max(values) - min(values)) / statistics.median(values),
    }


def _interleaved(trainers: dict[str, _Trainer], cfg: BenchConfig, what: str) -> dict[str, Any]:
    """Samples/s of each variant over ``cfg.repeats`` interleaved repeats, and their ratio."""
    order = ["plain", "fused"]
    rates: dict[str, list[float]] = {k: [] for k in order}
    cpu_rates: dict[str, list[float]] = {k: [] for k in order}
    for r in range(cfg.repeats):
        for name in order:
            t = trainers[name]
            t.run(cfg.warmup_steps)
            seconds, cpu_seconds = t.run(cfg.steps)
            rates[name].append(cfg.steps * cfg.batch_size / seconds)
            cpu_rates[name].append(cfg.steps * cfg.batch_size / cpu_seconds)
            log.info("%s repeat %d %s: %.0f samples/s (loss %.4f)", what, r, name, rates[name][-1], t.last_loss)
    paired = [f / p for f, p in zip(rates["fused"], rates["plain"])]
    ratio = statistics.median(rates["fused"]) / statistics.median(rates["plain"])
    best = max(rates["fused"]) / max(rates["plain"])
    return {
        "samples_per_s": {name: rates[name] for name in order},
        "summary": {name: median_quartiles(rates[name]) for name in order},
        # samples per CPU-second of this process (all threads): less sensitive to being
        # descheduled by other load, but counts OpenMP spin-waiting
        "samples_per_cpu_s": {name: cpu_rates[name] for name in order},
        "cpu_summary": {name: median_quartiles(cpu_rates[name]) for name in order},
        "ratio_fused_over_plain_cpu": statistics.median(cpu_rates["fused"]) / statistics.median(cpu_rates["plain"]),
        "ms_per_step_median": {name: 1000.0 * cfg.batch_size / statistics.median(rates[name]) for name in order},
        "ratio_fused_over_plain": {
            "of_medians": ratio,
            "of_best": best,  # fastest repeat of each: the least disturbed by other load
            "paired_median": statistics.median(paired),
            "paired_min": min(paired),
            "paired_max": max(paired),
            "paired": paired,
        },
        "faster": "fused" if ratio > 1.0 else "plain",
        "faster_by_best": "fused" if best > 1.0 else "plain",
        "final_loss": {name: trainers[name].last_loss for name in order},
    }


def bench_training(cfg: BenchConfig) -> dict[str, Any]:
    """Plain vs fused: the whole DCNv2 training step, then the embedding part alone."""
    cards = cardinalities(cfg.max_cardinality)
    batches = synthetic_batches(cards, cfg)
    trainers = _build_trainers(cfg, cards, batches)
    return {
        "model": "DCNv2(cross_layers=3, deep_mlp=[256, 128], structure=parallel), full-rank cross",
        "cardinalities": cards,
        "embedding_rows": sum(cards),
        "embedding_parameters": sum(cards) * cfg.embedding_dim,
        "optimizers": {
            "plain": f"torch.optim.Adagrad(embeddings, lr={cfg.emb_lr}, eps=1e-8) + torch.optim.Adam(dense, lr={cfg.dense_lr})",
            "fused": f"FBGEMM EXACT_ADAGRAD (lr={cfg.emb_lr}, eps=1e-8) fused into backward + torch.optim.Adam(dense, lr={cfg.dense_lr})",
        },
        "full": _interleaved(trainers["full"], cfg, "full"),
        "sparse_only": _interleaved(trainers["sparse_only"], cfg, "sparse-only"),
    }


# ---------------------------------------------------------------------------------------------
# data pipeline
# ---------------------------------------------------------------------------------------------


def _pipeline_once(path: str, nrows: int | None, batch_size: int, seed: int) -> dict[str, float]:
    from recsys.data.batching import BatchDataset
    from recsys.data.encoders import Preprocessor
    from recsys.data.readers.criteo import CriteoReader

    times: dict[str, float] = {}
    t0 = time.perf_counter()
    raw = CriteoReader(path=path, nrows=nrows).read()
    t1 = time.perf_counter()
    pre = Preprocessor(raw.schema).fit(raw.frame)
    t2 = time.perf_counter()
    data = pre.transform(raw)
    t3 = time.perf_counter()
    seen = 0
    for batch in BatchDataset(data, batch_size=batch_size, shuffle=True, seed=seed):
        seen += int(batch.labels.shape[0])
    t4 = time.perf_counter()
    if seen != len(raw):
        raise RuntimeError(f"BatchDataset yielded {seen} rows, expected {len(raw)}")
    times.update(read=t1 - t0, fit=t2 - t1, transform=t3 - t2, batches=t4 - t3, end_to_end=t4 - t0)
    return {"rows": float(len(raw)), **times}


def bench_pipeline(path: str, nrows: int | None, cfg: BenchConfig) -> dict[str, Any]:
    """Rows/s per stage (median over ``cfg.pipeline_repeats`` runs) and end to end."""
    runs = [_pipeline_once(path, nrows, cfg.batch_size, cfg.seed) for _ in range(cfg.pipeline_repeats)]
    rows = int(runs[0]["rows"])
    stages = ["read", "fit", "transform", "batches", "end_to_end"]
    out: dict[str, Any] = {"rows": rows, "repeats": len(runs), "rows_per_s": {}, "seconds": {}}
    for stage in stages:
        secs = [r[stage] for r in runs]
        out["seconds"][stage] = secs
        out["rows_per_s"][stage] = median_quartiles([rows / s for s in secs])
    return out


# ---------------------------------------------------------------------------------------------
# environment and reports
# ---------------------------------------------------------------------------------------------


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    import fbgemm_gpu
    import torchrec

    try:
        from importlib.metadata import version

        fbgemm_version = version("fbgemm-gpu-cpu")
    except Exception:  # noqa: BLE001 - any metadata problem: fall back to the module
        fbgemm_version = getattr(fbgemm_gpu, "__version__", "unknown")
    return {
        "cpu_model": cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchrec": getattr(torchrec, "__version__", "unknown"),
        "fbgemm_gpu": fbgemm_version,
        "numpy": np.__version__,
        "pandas": pd.__version__,
    }


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def _busy_note(env: dict[str, Any]) -> list[str]:
    """A warning line when other processes loaded the machine around the run.

    The 1-min load at the end includes this benchmark's own threads, so it is compared with
    ``torch_threads`` plus a margin; the load at the start is (almost) all other processes.
    """
    cpus = env.get("cpus_available") or 1
    start = (env.get("load_average_at_start") or [0.0])[0]
    end = (env.get("load_average_at_end") or [0.0])[0]
    if start > 0.5 * cpus or end > env.get("torch_threads", cpus) + 0.5 * cpus:
        return [
            "",
            f"**Warning: the machine was busy** (1-min load {start:.2f} at the start, {end:.2f} at the end, "
            f"on {cpus} CPUs): other processes slowed some repeats; the fastest repeat of each variant is the "
            "better estimate.",
        ]
    return []


def _load(values: list[float] | None) -> str:
    return "n/a" if values is None else "/".join(f"{v:.2f}" for v in values)


def _training_table(part: dict[str, Any], optimizers: dict[str, str], batch_size: int) -> list[str]:
    s, ratio = part["summary"], part["ratio_fused_over_plain"]
    lines = [
        "| kernel | optimizers | samples/s (median) | min | max (best) | IQR | ms/step (median) | samples/CPU-s (median) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in ("plain", "fused"):
        lines.append(
            f"| {name} | {optimizers[name]} | {_fmt(s[name]['median'])} | {_fmt(s[name]['min'])} | "
            f"{_fmt(s[name]['max'])} | {_fmt(s[name]['iqr'])} | {part['ms_per_step_median'][name]:.1f} | "
            f"{_fmt(part['cpu_summary'][name]['median'])} |"
        )
    lines += [
        "",
        f"**fused / plain = {ratio['of_medians']:.2f}x** (ratio of medians; {ratio['of_best']:.2f}x for the fastest "
        f"repeat of each); per-repeat paired ratios: median {ratio['paired_median']:.2f}x, range "
        f"{ratio['paired_min']:.2f}x to {ratio['paired_max']:.2f}x; per CPU-second {part['ratio_fused_over_plain_cpu']:.2f}x. "
        f"Faster: **{part['faster']}**.",
    ]
    return lines


def to_markdown(result: dict[str, Any]) -> str:
    env, cfg, tr = result["environment"], result["config"], result["training"]
    lines = [
        "# Training throughput: plain EBC vs FBGEMM-fused EBC (DCNv2)",
        "",
        f"Generated {result['date']} by `{result['command']}` ({result['wall_seconds']:.0f} s).",
        f"{env['cpu_model']}, {env['cpus_available']} CPUs available, {env['torch_threads']} torch threads; "
        f"torch {env['torch']}, torchrec {env['torchrec']}, fbgemm-gpu-cpu {env['fbgemm_gpu']}; "
        f"load average (1/5/15 min) at start {_load(env['load_average_at_start'])}, at end {_load(env.get('load_average_at_end'))}.",
        *_busy_note(env),
        "",
        f"Criteo-shaped synthetic data: {NUM_SPARSE} categorical fields (cardinalities log-spaced 4..{cfg['max_cardinality']:,}, "
        f"{tr['embedding_rows']:,} rows, {tr['embedding_parameters']:,} embedding parameters, skewed ids), {NUM_DENSE} dense, "
        f"embedding dim {cfg['embedding_dim']}, batch {cfg['batch_size']}. {cfg['repeats']} interleaved repeats "
        f"(plain, fused, plain, ...) of {cfg['steps']} timed steps, each after {cfg['warmup_steps']} untimed warm-up steps; "
        f"seed {cfg['seed']}.",
        "",
        f"## Full training step ({tr['model']})",
        "",
        *_training_table(tr["full"], tr["optimizers"], cfg["batch_size"]),
        "",
        "## Embedding part alone (SparseArch forward + backward + embedding optimizer)",
        "",
        *_training_table(
            tr["sparse_only"],
            {"plain": f"torch.optim.Adagrad(lr={cfg['emb_lr']}, eps=1e-8)", "fused": "FBGEMM EXACT_ADAGRAD (fused)"},
            cfg["batch_size"],
        ),
        "",
        "## Data pipeline (raw Criteo TSV -> batches)",
        "",
        f"Rows/s per stage, median over repeats (batch {cfg['batch_size']}, shuffled).",
        "",
        "| data | rows | read | fit | transform | batches | end to end |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, p in result["pipeline"].items():
        if "skipped" in p:
            lines.append(f"| {name} | skipped: {p['skipped']} | | | | | |")
            continue
        r = p["rows_per_s"]
        lines.append(
            f"| {name} | {p['rows']:,} | "
            + " | ".join(_fmt(r[k]["median"]) for k in ("read", "fit", "transform", "batches", "end_to_end"))
            + " |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------


def run(cfg: BenchConfig, output_dir: Path, command: str) -> dict[str, Any]:
    """Run both parts, write ``train_throughput.{json,md}`` into ``output_dir``, return the result."""
    env = environment()
    result: dict[str, Any] = {
        "benchmark": "train_throughput",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "seeds": {"torch": cfg.seed, "numpy": cfg.seed},
        "config": asdict(cfg),
        "environment": env,
    }
    t0 = time.perf_counter()
    result["training"] = bench_training(cfg)
    pipeline: dict[str, Any] = {}
    data_dir = os.environ.get("SALIENCE_DATA_DIR")
    if data_dir and (Path(data_dir) / REAL_CRITEO).is_file():
        pipeline["criteo_head10k"] = {"path": f"$SALIENCE_DATA_DIR/{REAL_CRITEO}", **bench_pipeline(REAL_CRITEO, cfg.real_rows, cfg)}
    else:
        pipeline["criteo_head10k"] = {"skipped": f"$SALIENCE_DATA_DIR/{REAL_CRITEO} not found"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.txt"
        write_synthetic_criteo_tsv(path, cfg.synthetic_rows, cardinalities(cfg.max_cardinality), cfg.seed)
        pipeline["synthetic_tsv"] = {"path": "synthetic Criteo-format TSV (temporary)", **bench_pipeline(str(path), None, cfg)}
    result["pipeline"] = pipeline
    env["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result["wall_seconds"] = time.perf_counter() - t0

    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / "train_throughput.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(output_dir / "train_throughput.md", to_markdown(result))
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    default = BenchConfig()
    parser.add_argument("--steps", type=int, default=None, help=f"timed steps per repeat (default {default.steps})")
    parser.add_argument("--batch-size", type=int, default=None, help=f"batch size (default {default.batch_size})")
    parser.add_argument("--repeats", type=int, default=None, help=f"interleaved repeats (default {default.repeats})")
    parser.add_argument("--output-dir", type=Path, default=Path("experiments/results"), help="where the JSON/markdown go")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test; numbers are meaningless)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cfg = BenchConfig.quick() if args.quick else BenchConfig()
    overrides = {k: v for k, v in {"steps": args.steps, "batch_size": args.batch_size, "repeats": args.repeats}.items() if v is not None}
    if overrides:
        cfg = BenchConfig(**{**asdict(cfg), **overrides})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    previous_threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        result = run(cfg, args.output_dir, " ".join([COMMAND, *argv]))
    finally:  # main() may run inside another process (the smoke test): leave it as it was
        torch.set_num_threads(previous_threads)
    full = result["training"]["full"]
    print(to_markdown(result))
    ratio = full["ratio_fused_over_plain"]
    print(
        f"full step: fused / plain = {ratio['of_medians']:.2f}x (medians), {ratio['of_best']:.2f}x (best) "
        f"-> faster: {full['faster']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
