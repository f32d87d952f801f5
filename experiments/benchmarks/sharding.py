"""Sharded training on CPU: 1 process vs 2 gloo processes (table-wise, row-wise plans), and
the embedding memory each process holds.

A benchmark, not a test: it writes ``sharding.json`` and ``sharding.md`` to ``--output-dir``
(default ``experiments/results``). Committed command (about 1.5 minutes on 2 idle cores)::

    python -m experiments.benchmarks.sharding

Model and data. DCNv2 (cross_layers=3, deep_mlp=[256, 128], parallel) built by
``recsys.models.DCNv2`` with the FBGEMM-fused embedding kernel and row-wise Adagrad
fused into the backward (lr 0.05); Adam (lr 1e-3) on the dense part. Criteo-shaped synthetic
batches from :mod:`experiments.benchmarks.train_throughput` (its generator, imported): 26
one-hot categorical fields with cardinalities log-spaced 4..1,000,000 (2,552,646 rows in all,
the largest table 1,000,000 rows = 39% of them), ids skewed towards small ids, 13 dense
features; embedding dim 16 (a multiple of 8, so a column-wise split would work too). The
embedding weights are 2,552,646 x 16 x 4 B = 163.4 MB, the row-wise Adagrad state
2,552,646 x 4 B = 10.2 MB; the dense part (696,944 parameters, 2.8 MB, replicated by DDP on
every process) is not counted. Every arm starts from the same weights (seed 0) and trains on
the same global batches, B = 4096 rows each.

Arms:

* ``single``: one process, no DMP: the fused kernel as in normal training, whole batches;
  timed with 1 torch thread and with 2 threads (interleaved per repeat, same process);
* ``table_wise``: 2 gloo processes, ``recsys.train.sharded.shard_model`` with
  ``ShardingConfig(sharding="table_wise")`` (TorchRec's planner places whole tables);
* ``row_wise``: 2 gloo processes, ``ShardingConfig(sharding="row_wise")`` (every table's rows
  split in two contiguous blocks; the hand-written plan, TorchRec's planner does not offer
  row-wise on CPU).

In the 2-process arms every process takes B/2 rows of each global batch and runs 1 torch thread
(``LOCAL_WORLD_SIZE=2``). Each arm runs in freshly spawned processes
(``torch.multiprocessing.start_processes``, spawn), so its memory numbers are its own.

Throughput: every repeat runs ``--warmup-steps`` untimed steps, then a barrier, ``--steps``
timed steps and a barrier; rank 0's wall clock between the barriers gives the global samples/s
(steps x B / seconds); the median over ``--repeats`` repeats is reported, with min and max.

Memory (per process; the byte model):

* embedding weights: the bytes of the table rows the process holds, rows x dim x 4 B summed
  over its local shards (``ShardedTensor.local_shards()`` of the sharded model's state dict;
  the full tables for ``single``). Table-wise: the whole tables placed on it; row-wise: its
  block of every table (ceil(rows / 2) rows on rank 0, the rest on rank 1). Summed over the
  processes it is exactly the single process's total;
* optimizer state: the fused optimizer's state tensors held locally (row-wise Adagrad: one
  fp32 per row, so rows x 4 B);
* RSS, as secondary numbers: the process's ``VmHWM`` (the peak of the whole
  run, set-up included) and VmRSS after training (after ``malloc_trim``: the steady state).
  Both include torch, TorchRec and Lightning themselves (about 0.5 GB: VmRSS at the start of
  the arm, ``rss_start_bytes``); "RSS added" = VmRSS at the end minus at the start counts what
  the process holds besides the libraries: its shards, the dense part, the batches, and any
  unsharded copy of the tables that the set-up leaves alive.

Caveats:

* 2 processes on 2 cores share those cores with each other and with gloo's communication
  threads: the 2-process throughput shows what sharding costs (the all-to-all of ids and
  pooled embeddings, DDP's all-reduce of the dense gradients), not a speed-up. On one host
  sharding buys memory per process, not speed; the single arm is shown with 1 thread (the
  per-process compute of a sharded process) and 2 threads (the whole machine).
* Peak RSS includes the set-up: ``shard_model`` builds the full unsharded model on every
  process (same seed) and copies it into the shards, so a sharded process's *peak* is above the
  single process's; the split shows in the embedding bytes, and in the RSS added only as far as
  the set-up frees the unsharded tables. Tables that do not fit one host would need meta-device
  initialisation, which ``shard_model`` does not do.
* Table-wise balance is the planner's placement of whole tables; with one table holding 39% of
  the rows the split cannot be exactly even. Row-wise splits every table in half.
* The arms are not interleaved with each other (each pays its own process-group and sharding
  set-up, reported as ``setup_seconds``); the two thread counts of the single arm are.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from recsys.io import atomic_write_text

if TYPE_CHECKING:
    from recsys.models.base import RankingModel, SparseArch

__all__ = ["ARMS", "ShardingBenchConfig", "main", "run"]

log = logging.getLogger(__name__)

NAME = "sharding"
COMMAND = f"python -m experiments.benchmarks.{NAME}"
ARMS = ("single", "table_wise", "row_wise")
WORLD = 2  # processes of the sharded arms
ARCH_ARGS: dict[str, Any] = {"cross_layers": 3, "deep_mlp": [256, 128], "structure": "parallel"}
TARGETS = {
    # what the run checks (reported under "checks", not asserted: a benchmark reports)
    "sharded_weight_bytes_sum_to_single": True,  # exact, for table_wise and row_wise
    "row_wise_rank_share_of_single": [0.475, 0.525],  # each process holds about half
}
MB = 1e6


@dataclass(frozen=True)
class ShardingBenchConfig:
    """Sizes of one benchmark run (``--quick`` shrinks all of them)."""

    steps: int = 20  # timed steps per repeat
    warmup_steps: int = 3  # untimed steps before each timed block
    repeats: int = 5
    batch_size: int = 4096  # global batch: B/2 rows per process in the sharded arms
    embedding_dim: int = 16
    max_cardinality: int = 1_000_000
    num_batches: int = 4  # distinct global batches cycled through
    single_threads: tuple[int, ...] = (1, 2)  # torch threads of the single arm
    emb_lr: float = 0.05
    dense_lr: float = 1e-3
    seed: int = 0

    @classmethod
    def quick(cls) -> ShardingBenchConfig:
        return cls(steps=3, warmup_steps=1, repeats=2, batch_size=256, max_cardinality=2_000, num_batches=2)


# ---------------------------------------------------------------------------------------------
# model and data (the same in every process)
# ---------------------------------------------------------------------------------------------


def cardinalities(cfg: ShardingBenchConfig) -> list[int]:
    from experiments.benchmarks.train_throughput import cardinalities as log_spaced

    return log_spaced(cfg.max_cardinality)


def criteo_schema(cards: list[int], dim: int) -> Any:
    """A fitted Criteo-shaped schema: I1..I13 dense, C1..C26 with the given cardinalities."""
    from experiments.benchmarks.train_throughput import NUM_DENSE
    from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema

    return Schema(
        features=(
            *(FeatureSpec(f"I{i}", FeatureKind.DENSE, transform=DenseTransform.LOG1P) for i in range(1, NUM_DENSE + 1)),
            *(FeatureSpec(f"C{i}", embedding_dim=dim, num_embeddings=c) for i, c in enumerate(cards, start=1)),
        ),
        name="criteo-synthetic",
    )


def build(cfg: ShardingBenchConfig) -> Any:
    """The DCNv2 of every arm (same seed: the same initial weights in every process)."""
    from recsys.models import DCNv2
    from recsys.models.base import EmbeddingKernel, FusedOptimizer, SparseArchConfig

    torch.manual_seed(cfg.seed)
    sparse = SparseArchConfig(kernel=EmbeddingKernel.FUSED, fused_optimizer=FusedOptimizer.ROWWISE_ADAGRAD, fused_lr=cfg.emb_lr)
    return DCNv2(criteo_schema(cardinalities(cfg), cfg.embedding_dim), sparse, **ARCH_ARGS)


def global_batches(cfg: ShardingBenchConfig) -> list[Any]:
    """``cfg.num_batches`` one-hot global batches of ``cfg.batch_size`` rows (train_throughput's generator)."""
    from experiments.benchmarks import train_throughput as tt

    data = tt.BenchConfig(batch_size=cfg.batch_size, num_batches=cfg.num_batches, seed=cfg.seed)
    return tt.synthetic_batches(cardinalities(cfg), data)


def local_batch(batch: Any, rank: int, world: int) -> Any:
    """Rows ``[rank * B/world, (rank + 1) * B/world)`` of a one-hot global batch."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = batch.sparse_features
    size = int(batch.labels.shape[0])
    if not bool((kjt.lengths() == 1).all()):
        raise ValueError("local_batch splits one-hot batches only")
    n = size // world
    lo, hi = rank * n, (rank + 1) * n
    keys = kjt.keys()
    values = kjt.values().view(len(keys), size)[:, lo:hi].reshape(-1)
    local = KeyedJaggedTensor(keys=keys, values=values, lengths=torch.ones(len(keys) * n, dtype=torch.int32))
    return Batch(dense_features=batch.dense_features[lo:hi].contiguous(), sparse_features=local, labels=batch.labels[lo:hi].contiguous())


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------


def _local_bytes(value: Any) -> tuple[int, int]:
    """(bytes, rows) of the part of ``value`` this process holds (its local shards)."""
    if hasattr(value, "local_shards"):  # ShardedTensor
        shards = [s.tensor for s in value.local_shards()]
    else:
        shards = [value]
    nbytes = sum(t.numel() * t.element_size() for t in shards)
    rows = sum(int(t.shape[0]) if t.dim() else 1 for t in shards)
    return nbytes, rows


def embedding_memory(model: torch.nn.Module) -> dict[str, Any]:
    """Bytes of the embedding weights and of the fused optimizer state this process holds."""
    from recsys.train.sharded import EBC_PATH, is_sharded, unwrap

    if is_sharded(model):
        prefix = EBC_PATH + ".embedding_bags."
        weights = {k[len(prefix) :]: v for k, v in model.state_dict().items() if k.startswith(prefix)}
        opt_state = model.fused_optimizer.state_dict()["state"]  # type: ignore[union-attr]
    else:
        arch = cast("SparseArch", unwrap(model).sparse_arch)  # the fused kernel (see build)
        weights = {k.removeprefix("embedding_bags."): v for k, v in arch.embedding_bag_collection.state_dict().items()}
        opt_state = arch.fused_optimizer().state_dict()["state"]
    tables: dict[str, int] = {}
    weight_bytes = 0
    for key, value in weights.items():
        nbytes, rows = _local_bytes(value)
        weight_bytes += nbytes
        if nbytes:
            tables[key.removesuffix(".weight")] = rows
    opt_bytes = 0
    for state in opt_state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) or hasattr(value, "local_shards"):
                opt_bytes += _local_bytes(value)[0]
    return {
        "embedding_weight_bytes": weight_bytes,
        "embedding_rows": sum(tables.values()),
        "optimizer_state_bytes": opt_bytes,
        "tables": tables,  # table -> rows held here
    }


def _rss_now() -> int:
    """Resident set size of this process now (bytes; 0 off Linux)."""
    from recsys.runtime import proc_status_kib

    return (proc_status_kib("VmRSS") or 0) * 1024


def _rss_peak() -> int:
    """Peak resident set size of this process (bytes; ``VmHWM``, not ``ru_maxrss``: that survives ``exec``)."""
    from recsys.runtime import process_peak_rss_mb

    return int(process_peak_rss_mb() * 1024 * 1024)


def _trim() -> None:
    """Free Python garbage and hand freed heap pages back to the OS (glibc), so VmRSS is the steady state."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------------------------------------
# one arm, in every process of it
# ---------------------------------------------------------------------------------------------


class _Stepper:
    """Training steps cycling through the local batches: BCE, backward (the fused embedding
    optimizer steps inside it), Adam on the dense part."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[Any]) -> None:
        self.model, self.optimizer, self.batches = model, optimizer, batches
        self.i = 0
        self.loss = torch.zeros(())

    def run(self, steps: int) -> None:
        for _ in range(steps):
            batch = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.optimizer.zero_grad()
            logits = self.model(batch.dense_features, batch.sparse_features)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
            loss.backward()
            self.optimizer.step()
            self.loss = loss.detach()


def _barrier(distributed: bool) -> None:
    if distributed:
        torch.distributed.barrier()


def train_arm(arm: str, rank: int, world: int, cfg: ShardingBenchConfig) -> dict[str, Any]:
    """Build, (shard,) train and measure one arm in this process; collectives when ``world > 1``."""
    from recsys.models.base import FusedOptimizer
    from recsys.train.sharded import ShardingConfig, replica_optimizer, shard_model, unwrap

    distributed = world > 1
    rss_start = _rss_now()
    t0 = time.perf_counter()
    model = build(cfg)
    plan = None
    if arm != "single":
        model = shard_model(model, ShardingConfig(sharding=arm), torch.device("cpu"))  # type: ignore[arg-type]
        plan = model.sharding_description
        if replica_optimizer(model, FusedOptimizer.ROWWISE_ADAGRAD, cfg.emb_lr) is not None:
            raise RuntimeError(f"{arm}: unexpected data-parallel tables")
    batches = [local_batch(b, rank, world) for b in global_batches(cfg)]
    _trim()
    setup_seconds = time.perf_counter() - t0
    rss_setup = _rss_now()
    dense_params = cast("RankingModel", unwrap(model)).dense_parameters()
    stepper = _Stepper(model, torch.optim.Adam(dense_params, lr=cfg.dense_lr), batches)

    threads = list(cfg.single_threads) if arm == "single" else [1]
    rates: dict[str, list[float]] = {f"{t}_threads": [] for t in threads}
    seconds: dict[str, list[float]] = {f"{t}_threads": [] for t in threads}
    for r in range(cfg.repeats):
        for t in threads:
            torch.set_num_threads(t)
            stepper.run(cfg.warmup_steps)
            _barrier(distributed)
            start = time.perf_counter()
            stepper.run(cfg.steps)
            _barrier(distributed)
            elapsed = time.perf_counter() - start
            rates[f"{t}_threads"].append(cfg.steps * cfg.batch_size / elapsed)
            seconds[f"{t}_threads"].append(elapsed)
            if rank == 0:
                log.info("%s repeat %d, %d thread(s): %.0f samples/s", arm, r, t, rates[f"{t}_threads"][-1])
    loss = stepper.loss.clone()
    if distributed:
        torch.distributed.all_reduce(loss)
        loss /= world
    memory = embedding_memory(model)
    _trim()
    return {
        "arm": arm,
        "rank": rank,
        "world": world,
        "plan": plan,
        "setup_seconds": setup_seconds,
        "samples_per_s": rates,
        "timed_seconds": seconds,
        "final_loss": float(loss),
        "memory": {
            **memory,
            "rss_start_bytes": rss_start,
            "rss_after_setup_bytes": rss_setup,
            "rss_end_bytes": (rss_end := _rss_now()),
            "rss_added_bytes": rss_end - rss_start,
            "rss_peak_bytes": _rss_peak(),
        },
    }


def _worker(rank: int, arm: str, world: int, port: int, cfg_json: str, out_dir: str) -> None:
    """Entry point of a spawned process: one rank of one arm; writes ``<arm>_rank<r>.json``."""
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")  # TorchRec's planner and DDP warnings, once per process
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    for noisy in ("torchrec", "torch", "fbgemm_gpu", "recsys"):  # planner, DDP and TBE chatter
        logging.getLogger(noisy).setLevel(logging.ERROR)
    log.setLevel(logging.INFO)  # the per-repeat lines
    raw = json.loads(cfg_json)
    cfg = ShardingBenchConfig(**{**raw, "single_threads": tuple(raw["single_threads"])})
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = train_arm(arm, rank, world, cfg)
        atomic_write_text(Path(out_dir) / f"{arm}_rank{rank}.json", json.dumps(result))
    except BaseException:
        if world > 1:
            dist.destroy_process_group()
        raise
    from recsys.runtime import exit_distributed

    exit_distributed(0)  # without the teardown that can abort a finished distributed process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_arm(arm: str, cfg: ShardingBenchConfig, work: Path) -> list[dict[str, Any]]:
    """Spawn the processes of ``arm`` (1 for single, ``WORLD`` otherwise); their per-rank results."""
    import torch.multiprocessing as mp

    world = 1 if arm == "single" else WORLD
    start = time.perf_counter()
    mp.start_processes(
        _worker, args=(arm, world, _free_port(), json.dumps(asdict(cfg)), str(work)), nprocs=world, start_method="spawn"
    )
    results = [json.loads((work / f"{arm}_rank{r}.json").read_text()) for r in range(world)]
    for r in results:
        r["arm_wall_seconds"] = time.perf_counter() - start  # spawn + imports + set-up + training
    return results


# ---------------------------------------------------------------------------------------------
# summary and reports
# ---------------------------------------------------------------------------------------------


def median_quartiles(values: list[float]) -> dict[str, float]:
    from experiments.benchmarks.train_throughput import median_quartiles as summary

    return summary(values)


def summarise(per_rank: dict[str, list[dict[str, Any]]], cfg: ShardingBenchConfig) -> dict[str, Any]:
    """Per-arm results (throughput from rank 0, memory per rank), ratios vs single, checks."""
    arms: dict[str, Any] = {}
    for arm, ranks in per_rank.items():
        rank0 = ranks[0]
        mem = [r["memory"] for r in ranks]
        arms[arm] = {
            "processes": len(ranks),
            "threads_per_process": [int(k.split("_")[0]) for k in rank0["samples_per_s"]],
            "plan": rank0["plan"],
            "samples_per_s": rank0["samples_per_s"],
            "summary": {k: median_quartiles(v) for k, v in rank0["samples_per_s"].items()},
            "ms_per_step_median": {k: 1000.0 * cfg.batch_size / statistics.median(v) for k, v in rank0["samples_per_s"].items()},
            "setup_seconds": max(r["setup_seconds"] for r in ranks),
            "wall_seconds": rank0["arm_wall_seconds"],
            "final_loss": rank0["final_loss"],
            "memory": {
                "per_rank": [{"rank": r["rank"], **m} for r, m in zip(ranks, mem)],
                "embedding_weight_bytes_max": max(m["embedding_weight_bytes"] for m in mem),
                "embedding_weight_bytes_total": sum(m["embedding_weight_bytes"] for m in mem),
                "optimizer_state_bytes_max": max(m["optimizer_state_bytes"] for m in mem),
                "optimizer_state_bytes_total": sum(m["optimizer_state_bytes"] for m in mem),
                "rss_peak_bytes_max": max(m["rss_peak_bytes"] for m in mem),
                "rss_end_bytes_max": max(m["rss_end_bytes"] for m in mem),
                "rss_added_bytes_max": max(m["rss_added_bytes"] for m in mem),
            },
        }
    single = arms["single"]
    base = {k: v["median"] for k, v in single["summary"].items()}
    w_single = single["memory"]["embedding_weight_bytes_max"]
    o_single = single["memory"]["optimizer_state_bytes_max"]
    sharded = [a for a in arms if a != "single"]
    throughput: dict[str, dict[str, float]] = {}
    for key, value in base.items():
        throughput[f"vs_single_{key}"] = {
            f"{arm}_{k}": s["median"] / value for arm in arms for k, s in arms[arm]["summary"].items() if (arm, k) != ("single", key)
        }
    ratios = {
        "samples_per_s": throughput,
        "embedding_weight_bytes_max_process_vs_single": {a: arms[a]["memory"]["embedding_weight_bytes_max"] / w_single for a in sharded},
        "embedding_weight_bytes_per_rank_vs_single": {
            a: [p["embedding_weight_bytes"] / w_single for p in arms[a]["memory"]["per_rank"]] for a in sharded
        },
        "optimizer_state_bytes_max_process_vs_single": {
            a: arms[a]["memory"]["optimizer_state_bytes_max"] / o_single for a in sharded
        },
        "rss_end_max_process_vs_single": {
            a: arms[a]["memory"]["rss_end_bytes_max"] / single["memory"]["rss_end_bytes_max"] for a in sharded
        },
        "rss_added_max_process_vs_single": {
            a: arms[a]["memory"]["rss_added_bytes_max"] / max(single["memory"]["rss_added_bytes_max"], 1) for a in sharded
        },
        "rss_peak_max_process_vs_single": {
            a: arms[a]["memory"]["rss_peak_bytes_max"] / single["memory"]["rss_peak_bytes_max"] for a in sharded
        },
    }
    lo, hi = cast("list[float]", TARGETS["row_wise_rank_share_of_single"])
    checks = {
        "sharded_weight_bytes_sum_to_single": {a: arms[a]["memory"]["embedding_weight_bytes_total"] == w_single for a in sharded},
        "sharded_optimizer_state_bytes_sum_to_single": {
            a: arms[a]["memory"]["optimizer_state_bytes_total"] == o_single for a in sharded
        },
        "row_wise_rank_share_of_single_within_target": (
            all(lo <= s <= hi for s in ratios["embedding_weight_bytes_per_rank_vs_single"]["row_wise"])
            if "row_wise" in arms
            else None
        ),
    }
    return {"arms": arms, "ratios": ratios, "checks": checks}


def _mb(x: float) -> str:
    return f"{x / MB:,.1f}"


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (arm, thread count): what the markdown table shows."""
    arms = result["arms"]
    base = {k: v["median"] for k, v in arms["single"]["summary"].items()}
    rows = []
    for arm, a in arms.items():
        m = a["memory"]
        for key, s in a["summary"].items():
            rows.append(
                {
                    "arm": arm,
                    "processes": a["processes"],
                    "threads": int(key.split("_")[0]),
                    "samples_per_s": s["median"],
                    "samples_per_s_min": s["min"],
                    "samples_per_s_max": s["max"],
                    "vs_single": {k: s["median"] / v for k, v in base.items()},
                    "embedding_mb_max": m["embedding_weight_bytes_max"] / MB,
                    "embedding_mb_per_rank": [p["embedding_weight_bytes"] / MB for p in m["per_rank"]],
                    "optimizer_state_mb_max": m["optimizer_state_bytes_max"] / MB,
                    "rss_end_mb_max": m["rss_end_bytes_max"] / MB,
                    "rss_added_mb_max": m["rss_added_bytes_max"] / MB,
                    "rss_peak_mb_max": m["rss_peak_bytes_max"] / MB,
                }
            )
    return rows


def _load(values: list[float] | None) -> str:
    return "n/a" if values is None else "/".join(f"{v:.2f}" for v in values)


def _rss_note(result: dict[str, Any]) -> list[str]:
    """What the RSS added says: whether it follows the embedding split (stated from the numbers)."""
    arms = result["arms"]
    single = arms["single"]["memory"]["rss_added_bytes_max"]
    parts, above = [], []
    for arm, a in arms.items():
        if arm == "single":
            continue
        added = a["memory"]["rss_added_bytes_max"]
        parts.append(f"{arm} {_mb(added)} MB")
        if added >= single:
            above.append(arm)
    line = f"RSS added per process (max): single {_mb(single)} MB, " + ", ".join(parts) + "."
    if above:
        line += (
            f" For {', '.join(above)} it is not below the single process's although the process holds fewer embedding "
            "bytes: it holds memory besides its shards (gloo, DDP's gradient buckets, and whatever the set-up leaves "
            "alive, such as references to the unsharded tables), so the embedding bytes, not the RSS, show the split."
        )
    return [line]


def to_markdown(result: dict[str, Any]) -> str:
    cfg, model = result["config"], result["model"]
    threads = [f"{k.split('_')[0]} thr" for k in result["arms"]["single"]["summary"]]
    lines = [
        "# Sharded training on CPU: 1 process vs 2 gloo processes (DCNv2, TorchRec DMP)",
        "",
        f"Generated {result['date']} by `{result['command']}` ({result['wall_seconds']:.0f} s). "
        f"{result['hardware']['cpu']}, {result['hardware']['cores']} cores; torch {result['versions'].get('torch')}, "
        f"torchrec {result['versions'].get('torchrec')}; load average (1/5/15 min) at start {_load(result['load_average']['start'])}, "
        f"at end {_load(result['load_average']['end'])}.",
        "",
        f"{model['name']}, fused kernel with {model['embedding_optimizer']}, {model['dense_optimizer']} on the dense part. "
        f"Criteo-shaped synthetic data: 26 one-hot fields (cardinalities log-spaced 4..{cfg['max_cardinality']:,}, "
        f"{model['embedding_rows']:,} rows, largest table {max(model['cardinalities']):,}), 13 dense, embedding dim "
        f"{cfg['embedding_dim']}: embedding weights {_mb(model['embedding_weight_bytes'])} MB, optimizer state "
        f"{_mb(model['optimizer_state_bytes'])} MB in all. Global batch {cfg['batch_size']} in every arm (the 2-process "
        f"arms take {cfg['batch_size'] // WORLD} rows per process per step). {cfg['repeats']} repeats of {cfg['steps']} timed "
        f"steps after {cfg['warmup_steps']} untimed warm-up steps; samples/s on rank 0 between barriers, median (min..max).",
        "",
        "The single process is timed with 1 torch thread and with 2 (the whole 2-core machine); each sharded process runs "
        "1 thread, so the 2-process arms use both cores.",
        "",
        "| arm | processes x threads | samples/s (median) | min..max | "
        + " | ".join(f"vs single ({t})" for t in threads)
        + " | embedding MB / process (max) | per rank | optimizer-state MB / process (max) | RSS added MB (max) "
        "| RSS at end MB (max) | peak RSS MB (max) |",
        "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in threads) + " | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["table"]:
        lines.append(
            f"| {row['arm']} | {row['processes']} x {row['threads']} | {row['samples_per_s']:,.0f} | "
            f"{row['samples_per_s_min']:,.0f}..{row['samples_per_s_max']:,.0f} | "
            + " | ".join(f"{v:.2f}x" for v in row["vs_single"].values())
            + f" | {row['embedding_mb_max']:,.1f} | {' / '.join(f'{x:,.1f}' for x in row['embedding_mb_per_rank'])} | "
            f"{row['optimizer_state_mb_max']:,.2f} | {row['rss_added_mb_max']:,.0f} | {row['rss_end_mb_max']:,.0f} | "
            f"{row['rss_peak_mb_max']:,.0f} |"
        )
    ratios, checks = result["ratios"], result["checks"]
    split = ratios["embedding_weight_bytes_per_rank_vs_single"]
    lines += [
        "",
        "**Memory split** (embedding weights per process / the single process's): "
        + "; ".join(f"{arm} {' / '.join(f'{s:.3f}' for s in shares)} (max {max(shares):.3f})" for arm, shares in split.items())
        + ". Summed over the processes the weights equal the single process's exactly: "
        + ", ".join(f"{arm} {'yes' if ok else 'NO'}" for arm, ok in checks["sharded_weight_bytes_sum_to_single"].items())
        + ".",
        "",
        "Table placement (rows per process):",
        "",
    ]
    for arm, a in result["arms"].items():
        if arm == "single":
            continue
        per = "; ".join(
            f"rank {p['rank']}: {len(p['tables'])} tables, {p['embedding_rows']:,} rows" for p in a["memory"]["per_rank"]
        )
        lines.append(f"- {arm}: {per}; set-up {a['setup_seconds']:.1f} s.")
    lines += [
        "",
        "Byte model: embedding weights = rows x dim x 4 B summed over the local shards a process holds "
        "(`ShardedTensor.local_shards()` of the sharded model's state dict; the full tables for single); optimizer "
        "state = the fused row-wise Adagrad state held locally (one fp32 per row); RSS at end = VmRSS after training "
        "(after `malloc_trim`); RSS added = RSS at end minus VmRSS at the start of the arm (after importing torch, "
        "TorchRec and Lightning); peak RSS = `VmHWM` (includes the set-up and the libraries).",
        "",
        *_rss_note(result),
        "",
        "Caveats: the 2 processes share the 2 cores with each other and with gloo's communication threads, so the "
        "2-process throughput shows the cost of sharding (id and embedding all-to-all, DDP all-reduce), not a speed-up: "
        "on one host, sharding buys memory per process. The peak RSS of a sharded process includes the set-up, where "
        "`shard_model` builds the full model on every process before copying it into the shards. Table-wise balance "
        "is the planner's placement of whole tables (one table holds "
        f"{max(model['cardinalities']) / model['embedding_rows']:.0%} of the rows). Each arm runs in its own freshly "
        "spawned processes; the arms are not interleaved with each other (the single arm's two thread counts are).",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------


def run(cfg: ShardingBenchConfig, output_dir: Path, argv: Sequence[str], quick: bool) -> dict[str, Any]:
    """Run the three arms, write ``sharding.{json,md}`` into ``output_dir``, return the result."""
    from experiments.benchmarks._common import result_header

    if cfg.batch_size % WORLD:
        raise ValueError(f"--batch-size must be divisible by {WORLD} (each process takes half of every batch)")
    cards = cardinalities(cfg)
    result: dict[str, Any] = {
        **result_header(NAME, argv, quick, TARGETS),
        "config": asdict(cfg),
        "load_average": {"start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "model": {
            "name": "DCNv2(" + ", ".join(f"{k}={v}" for k, v in ARCH_ARGS.items()) + ")",
            "arch_args": ARCH_ARGS,
            "embedding_optimizer": f"row-wise Adagrad fused into backward (lr={cfg.emb_lr})",
            "dense_optimizer": f"Adam (lr={cfg.dense_lr})",
            "cardinalities": cards,
            "embedding_rows": sum(cards),
            # the byte model: fp32 weights, one fp32 of row-wise Adagrad state per row
            "embedding_weight_bytes": sum(cards) * cfg.embedding_dim * 4,
            "optimizer_state_bytes": sum(cards) * 4,
        },
    }
    t0 = time.perf_counter()
    per_rank: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="salience-sharding-") as tmp:
        for arm in ARMS:
            log.info("arm %s", arm)
            per_rank[arm] = run_arm(arm, cfg, Path(tmp))
    result.update(summarise(per_rank, cfg))
    single_bytes = result["arms"]["single"]["memory"]["embedding_weight_bytes_max"]
    result["checks"]["single_weight_bytes_match_byte_model"] = single_bytes == result["model"]["embedding_weight_bytes"]
    result["table"] = table_rows(result)
    result["load_average"]["end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result["wall_seconds"] = time.perf_counter() - t0

    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / f"{NAME}.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(output_dir / f"{NAME}.md", to_markdown(result))
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    default = ShardingBenchConfig()
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test; numbers are meaningless)")
    parser.add_argument("--output-dir", type=Path, default=Path("experiments/results"), help="where the JSON/markdown go")
    parser.add_argument("--steps", type=int, default=None, help=f"timed steps per repeat (default {default.steps})")
    parser.add_argument("--repeats", type=int, default=None, help=f"repeats (default {default.repeats})")
    parser.add_argument("--batch-size", type=int, default=None, help=f"global batch size (default {default.batch_size})")
    parser.add_argument("--warmup-steps", type=int, default=None, help=f"untimed steps per repeat (default {default.warmup_steps})")
    parser.add_argument(
        "--max-cardinality", type=int, default=None, help=f"rows of the largest table (default {default.max_cardinality:,})"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cfg = ShardingBenchConfig.quick() if args.quick else ShardingBenchConfig()
    names = {f.name for f in fields(ShardingBenchConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if overrides:
        cfg = ShardingBenchConfig(**{**asdict(cfg), **overrides, "single_threads": cfg.single_threads})
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    log.setLevel(logging.INFO)  # our progress lines, not fbgemm's library-loading chatter
    result = run(cfg, args.output_dir, argv, args.quick)
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
