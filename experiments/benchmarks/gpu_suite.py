"""GPU suite: copy bandwidth, embedding lookups, DCNv2 training, exported-model latency.

A benchmark, not a test: it writes ``gpu_suite.json`` and ``gpu_suite.md`` to
``--output-dir`` (default ``experiments/results``) and prints one markdown table. Committed
command (one H200, well under 8 minutes including the start, most of it imports and the
TorchScript export)::

    python -m experiments.benchmarks.gpu_suite --device cuda

It needs only torch (CUDA build), torchrec and ``fbgemm-gpu-cpu``: the plain torchrec
``EmbeddingBagCollection`` runs on torch's own CUDA ``nn.EmbeddingBag`` kernels and calls no
``fbgemm::`` op. When the CUDA build of fbgemm-gpu is loaded
(:func:`recsys.devices.fbgemm_cuda_available`) the FBGEMM fused kernel is timed too; on the
CPU it is always timed (fbgemm-gpu-cpu has it). ``--device cpu`` runs everything on the CPU,
with sizes scaled down automatically (the output says so); ``--quick`` uses tiny sizes (a
smoke test; the numbers mean nothing).

Sections, all on the chosen device:

a. **Copy bandwidth**: ``dst.copy_(src)`` of a large float32 buffer; GB/s counts the bytes
   read plus the bytes written (2 x buffer size); median over repeats. GPU times come from
   CUDA events, CPU times from the wall clock.
b. **Embedding lookup** (torchrec ``EmbeddingBagCollection``): 26 one-hot fields
   (cardinalities log-spaced 4..``--max-cardinality``, dim ``--lookup-dim``, sum pooling),
   ids drawn uniformly per table (no hot rows: caches help little, close to a worst case);
   forward plus backward with a ones upstream gradient (no optimizer step), and forward alone.
   Byte model, with L = batch x 26 lookups of D float32 values: *useful bytes* =
   ``L*D*4`` rows read in the forward + ``L*D*4`` gradient rows written in the backward
   (ids, offsets and pooled outputs not counted); the plain kernel's backward also fills a
   dense gradient the size of every table (``rows*D*4`` bytes), reported as a second figure.
   Effective bandwidth = bytes / step time, and its ratio to the copy bandwidth of (a).
   The FBGEMM fused kernel (SGD fused into the backward, so it also updates rows) is timed
   with the same byte model when available.
c. **DCNv2 training** (``recsys.train.module.build_model("dcnv2", ...)``, default
   hyper-parameters, embedding dim ``--embedding-dim``) on Criteo-shaped synthetic batches
   (skewed ids, 13 dense) at batch 8192 and 65536: ``torch.optim.Adagrad(lr=0.05)`` over the
   plain EBC's (dense) embedding gradients + ``torch.optim.Adam(lr=1e-3)`` on the other
   parameters; warm-up steps excluded; batches already on the device (each step wraps them in
   a new KJT, so nothing cached from an earlier step is reused). The host-to-device
   transfer of one batch is timed separately: pinned (``Batch.pin_memory()`` then
   ``.to(device, non_blocking=True)``) and pageable, ms per batch and its share of a step.
d. **Exported model latency**: the trained model through ``recsys.export.export_model`` ->
   ``load_exported`` (TorchScript), moved with ``ScriptModule.to(device)``; median and p90 ms
   per call at batch 1, 64 and 4096 (inputs on the device, synchronised per call), the eager
   model's median beside it, and the max |exported - eager| probability. If the scripted
   module cannot be moved, the JSON says why and the latency is measured on the CPU. On a
   GPU a call includes the device-to-host syncs of the input checks and of the KJT's
   per-key lengths (one small sync per feature), which bound the batch-1 latency.

A timed loop stops repeating once its section has run ``section_budget_s`` (90 s on a GPU; at least one
repeat is always kept), so a slow machine cannot blow the time budget; the JSON records how
many repeats ran.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from experiments.benchmarks._common import result_header
from experiments.benchmarks.train_throughput import NUM_DENSE, NUM_SPARSE, cardinalities, synthetic_batches
from experiments.benchmarks.train_throughput import BenchConfig as _BatchConfig
from recsys.data.encoders import Preprocessor
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema
from recsys.devices import DeviceError, describe_device, fbgemm_skip_reason, resolve_device
from recsys.io import atomic_write_text

__all__ = ["SuiteConfig", "main", "run", "to_markdown"]

NAME = "gpu_suite"
RESULTS = Path("experiments/results")
TARGETS: dict[str, Any] = {
    "full_gpu_run_seconds": "< 480 on one H200 (python 3.12, torch 2.11 CUDA, torchrec + fbgemm-gpu-cpu)",
    "export_parity_max_abs_diff": 1e-4,
}


@dataclass(frozen=True)
class SuiteConfig:
    """Sizes of one run: :meth:`gpu` (default on CUDA), :meth:`cpu` (scaled down), :meth:`quick`."""

    copy_mib: int = 1024  # size of the copied buffer (read it, write another as large)
    copy_inner: int = 10  # copies per timed repeat
    copy_repeats: int = 20
    max_cardinality: int = 1_000_000  # largest of the 26 tables (log-spaced from 4)
    lookup_dim: int = 64
    lookup_batch_size: int = 131_072
    lookup_steps: int = 10  # timed steps per repeat
    lookup_repeats: int = 5
    embedding_dim: int = 16  # DCNv2 embedding dim (Criteo-typical)
    train_batch_sizes: tuple[int, ...] = (8192, 65536)
    train_pool: int = 2  # distinct device-resident batches cycled through
    steps: int = 20  # timed training steps per repeat
    warmup_steps: int = 5  # untimed, before the timed repeats of each batch size
    repeats: int = 3
    h2d_repeats: int = 20
    infer_batch_sizes: tuple[int, ...] = (1, 64, 4096)
    infer_repeats: int = 200  # calls timed one by one
    infer_warmup: int = 10  # TorchScript's profiling executor optimises during the first calls
    emb_lr: float = 0.05
    dense_lr: float = 1e-3
    seed: int = 0
    section_budget_s: float = 90.0  # a section stops repeating past this (keeps >= 1 repeat)

    @classmethod
    def gpu(cls) -> SuiteConfig:
        return cls()

    @classmethod
    def cpu(cls) -> SuiteConfig:
        """Scaled down for a few CPU cores (minutes, not hours)."""
        return cls(
            copy_mib=256,
            copy_inner=1,
            copy_repeats=5,
            max_cardinality=100_000,
            lookup_batch_size=8192,
            lookup_steps=3,
            lookup_repeats=3,
            train_batch_sizes=(1024, 8192),
            steps=3,
            warmup_steps=1,
            repeats=2,
            h2d_repeats=5,
            infer_batch_sizes=(1, 64, 1024),
            infer_repeats=30,
            infer_warmup=3,
            section_budget_s=60.0,
        )

    @classmethod
    def quick(cls) -> SuiteConfig:
        """Tiny sizes: seconds on CPU (smoke test)."""
        return cls(
            copy_mib=4,
            copy_inner=1,
            copy_repeats=3,
            max_cardinality=1_000,
            lookup_dim=8,
            lookup_batch_size=256,
            lookup_steps=2,
            lookup_repeats=2,
            embedding_dim=8,
            train_batch_sizes=(64, 256),
            steps=2,
            warmup_steps=1,
            repeats=2,
            h2d_repeats=2,
            infer_batch_sizes=(1, 64, 256),
            infer_repeats=5,
            infer_warmup=2,
            section_budget_s=20.0,
        )


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------


class _Clock:
    """Times device work: CUDA events on a GPU (after the queued work), the wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, fn: Callable[[], object], n: int = 1) -> float:
        """Seconds for ``n`` calls of ``fn`` (the device finished all of them)."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    def latency(self, fn: Callable[[], object]) -> float:
        """Wall seconds of one call, synchronised before and after (what a caller waits)."""
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0


def _repeat(measure: Callable[[], float], repeats: int, deadline: float) -> list[float]:
    """``measure()`` up to ``repeats`` times, stopping early past ``deadline`` (perf_counter)."""
    out: list[float] = []
    for _ in range(repeats):
        out.append(measure())
        if time.perf_counter() > deadline:
            break
    return out


def _summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]  # nearest rank
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1], "p90": p90, "n": len(ordered)}


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _seconds_since_process_start() -> float | None:
    """Age of this process from ``/proc`` (Linux), else None: the start-up cost of a run."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in clock ticks since boot
        return float(Path("/proc/uptime").read_text().split()[0]) - start
    except (OSError, ValueError, IndexError):
        return None


# ---------------------------------------------------------------------------------------------
# data and schemas
# ---------------------------------------------------------------------------------------------


def criteo_schema(cards: Sequence[int], dim: int) -> tuple[Schema, Preprocessor]:
    """Fitted Criteo-shaped schema (``I1..I13`` log1p, ``C1..C26``) and its preprocessor.

    The categorical fields are hashed into ``card - 1`` buckets, so the fitted tables have
    exactly ``card`` rows (bucket ids 1..card-1 plus the OOV row 0) without a vocabulary; the
    preprocessor is what :func:`recsys.export.export_model` stores beside the model.
    """
    features = [
        FeatureSpec(f"I{i}", FeatureKind.DENSE, transform=DenseTransform.LOG1P) for i in range(1, NUM_DENSE + 1)
    ]
    features += [FeatureSpec(f"C{i}", embedding_dim=dim, hash_size=c - 1) for i, c in enumerate(cards, start=1)]
    schema = Schema(features=tuple(features), name="criteo-synthetic")
    frame = pd.DataFrame(
        {
            **{f"I{i}": np.arange(8, dtype=np.float64) for i in range(1, NUM_DENSE + 1)},
            **{f"C{i}": [f"{j:08x}" for j in range(8)] for i in range(1, NUM_SPARSE + 1)},
        }
    )
    pre = Preprocessor(schema).fit(frame)
    return pre.fitted_schema, pre


def uniform_kjt(cards: Sequence[int], batch_size: int, seed: int) -> KeyedJaggedTensor:
    """One-hot KJT over ``C1..C26`` with ids uniform in each table (B x 26 lookups)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.cat([torch.randint(int(c), (batch_size,), generator=g) for c in cards])
    return KeyedJaggedTensor(
        keys=[f"C{i}" for i in range(1, len(cards) + 1)],
        values=values,
        lengths=torch.ones(len(cards) * batch_size, dtype=torch.int32),
    )


def _fresh(kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """A new KJT over the same (device) tensors: nothing cached, so every step recomputes the
    per-key lengths and offsets (with their device-to-host sync) as a newly loaded batch would."""
    return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths())


def _criteo_batches(cards: Sequence[int], batch_size: int, n: int, seed: int) -> list[Batch]:
    return synthetic_batches(list(cards), _BatchConfig(batch_size=batch_size, num_batches=n, seed=seed))


def _batch_bytes(batch: Batch) -> int:
    kjt = batch.sparse_features
    tensors = [batch.dense_features, batch.labels, kjt.values(), kjt.lengths()]
    return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------------------------


def bench_copy(device: torch.device, cfg: SuiteConfig, clock: _Clock) -> dict[str, Any]:
    """(a) Device-to-device copy bandwidth, read + write bytes counted."""
    n = cfg.copy_mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)

    def copy_once() -> None:
        dst.copy_(src)

    for _ in range(2):  # warm-up: page in both buffers
        copy_once()
    clock.sync()
    deadline = time.perf_counter() + cfg.section_budget_s
    seconds = _repeat(lambda: clock.seconds(copy_once, cfg.copy_inner), cfg.copy_repeats, deadline)
    moved = 2 * n * 4 * cfg.copy_inner
    gbps = [moved / s / 1e9 for s in seconds]
    return {
        "buffer_bytes": n * 4,
        "bytes_per_repeat": moved,
        "copies_per_repeat": cfg.copy_inner,
        "gb_per_s": _summary(gbps),
        "ms_per_copy_median": 1e3 * statistics.median(seconds) / cfg.copy_inner,
        "repeats": len(seconds),
        "timer": "cuda events" if clock.cuda else "wall clock",
    }


def _lookup_rates(
    name: str,
    ebc: torch.nn.Module,
    kjts: list[KeyedJaggedTensor],
    cfg: SuiteConfig,
    clock: _Clock,
    useful_bytes: int,
    copy_gbps: float,
    dense_grad_bytes: int | None,
    width: int,
) -> dict[str, Any]:
    """Forward+backward and forward-only rates of one embedding module on device-resident KJTs
    (``width``: the summed embedding dims, the width of the pooled output)."""
    params = list(ebc.parameters())
    lookups = kjts[0].values().numel()
    upstream = torch.ones(kjts[0].stride(), width, device=clock.device)
    state = {"i": 0}

    def fwd_bwd() -> None:
        kjt = _fresh(kjts[state["i"] % len(kjts)])
        state["i"] += 1
        ebc(kjt).values().backward(upstream)
        for p in params:  # a fresh gradient each step (accumulating would add a full-table add)
            p.grad = None

    def fwd() -> None:
        kjt = _fresh(kjts[state["i"] % len(kjts)])
        state["i"] += 1
        with torch.no_grad():
            ebc(kjt).values()

    out: dict[str, Any] = {"kernel": name}
    deadline = time.perf_counter() + cfg.section_budget_s
    for label, fn, traffic in (("fwd_bwd", fwd_bwd, useful_bytes), ("forward", fwd, useful_bytes // 2)):
        for _ in range(2):  # warm-up (allocator, kernel selection)
            fn()
        clock.sync()
        secs = _repeat(
            lambda fn=fn: clock.seconds(fn, cfg.lookup_steps) / cfg.lookup_steps, cfg.lookup_repeats, deadline
        )
        step = statistics.median(secs)
        block: dict[str, Any] = {
            "ms_per_step": _summary([1e3 * s for s in secs]),
            "lookups_per_s": lookups / step,
            "bytes_per_step": traffic,
            "effective_gb_per_s": traffic / step / 1e9,
            "ratio_to_copy": traffic / step / 1e9 / copy_gbps,
            "repeats": len(secs),
        }
        if label == "fwd_bwd" and dense_grad_bytes is not None:
            total = traffic + dense_grad_bytes
            block.update(
                bytes_per_step_with_dense_grad=total,
                gb_per_s_with_dense_grad=total / step / 1e9,
                ratio_to_copy_with_dense_grad=total / step / 1e9 / copy_gbps,
            )
        out[label] = block
    return out


def bench_lookup(device: torch.device, cfg: SuiteConfig, clock: _Clock, copy_gbps: float) -> dict[str, Any]:
    """(b) Plain EBC (and FBGEMM fused when usable) embedding lookups: lookups/s and GB/s."""
    from recsys.models.base import table_configs

    cards = cardinalities(cfg.max_cardinality)
    schema = Schema(
        features=tuple(
            FeatureSpec(f"C{i}", embedding_dim=cfg.lookup_dim, num_embeddings=c) for i, c in enumerate(cards, start=1)
        ),
        name="criteo-lookup",
    )
    tables = table_configs(schema)
    torch.manual_seed(cfg.seed)
    kjts = [uniform_kjt(cards, cfg.lookup_batch_size, cfg.seed + k).to(device) for k in range(2)]
    lookups = cfg.lookup_batch_size * len(cards)
    row_bytes = cfg.lookup_dim * 4
    useful = 2 * lookups * row_bytes
    dense_grad = sum(cards) * row_bytes
    result: dict[str, Any] = {
        "batch_size": cfg.lookup_batch_size,
        "fields": len(cards),
        "embedding_dim": cfg.lookup_dim,
        "cardinalities": cards,
        "table_rows": sum(cards),
        "table_bytes": dense_grad,
        "ids": "uniform per table, one id per field (one-hot), sum pooling",
        "lookups_per_step": lookups,
        "byte_model": (
            "useful bytes/step = lookups*D*4 rows read (forward) + lookups*D*4 gradient rows written (backward); "
            "forward-only = lookups*D*4; the plain kernel's backward also fills a dense table-sized gradient "
            "(rows*D*4 bytes), counted only in *_with_dense_grad"
        ),
        "copy_gb_per_s": copy_gbps,
    }
    plain = EmbeddingBagCollection(tables=tables, device=device)
    width = len(cards) * cfg.lookup_dim
    result["plain"] = _lookup_rates(
        "torchrec EmbeddingBagCollection (nn.EmbeddingBag)",
        plain,
        kjts,
        cfg,
        clock,
        useful,
        copy_gbps,
        dense_grad,
        width,
    )
    del plain
    _free(device)
    reason = fbgemm_skip_reason() if device.type == "cuda" else None
    if reason is not None:
        result["fused"] = {"skipped": reason}
    else:
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        fused = FusedEmbeddingBagCollection(
            tables=tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.01}, device=device
        )
        result["fused"] = _lookup_rates(
            "FBGEMM FusedEmbeddingBagCollection (SGD fused into backward)",
            fused,
            kjts,
            cfg,
            clock,
            useful,
            copy_gbps,
            None,
            width,
        )
        del fused
    del kjts
    _free(device)
    return result


def _h2d(device: torch.device, host: Batch, cfg: SuiteConfig, clock: _Clock, step_ms: float) -> dict[str, Any]:
    """Host-to-device time of one batch: pinned + non_blocking, and pageable."""
    pinned = host.pin_memory()
    nbytes = _batch_bytes(host)
    deadline = time.perf_counter() + cfg.section_budget_s
    out: dict[str, Any] = {"bytes_per_batch": nbytes}
    for label, src, non_blocking in (("pinned", pinned, True), ("pageable", host, False)):

        def transfer(src: Batch = src, non_blocking: bool = non_blocking) -> None:
            src.to(device, non_blocking=non_blocking)

        transfer()  # warm-up
        clock.sync()
        secs = _repeat(lambda transfer=transfer: clock.seconds(transfer), cfg.h2d_repeats, deadline)
        ms = statistics.median(secs) * 1e3
        out[label] = {"ms_per_batch": _summary([1e3 * s for s in secs]), "gb_per_s": nbytes / (ms / 1e3) / 1e9}
    out["pinned"]["share_of_train_step"] = out["pinned"]["ms_per_batch"]["median"] / step_ms
    return out


def bench_training(
    device: torch.device, cfg: SuiteConfig, clock: _Clock, schema: Schema, cards: Sequence[int]
) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """(c) DCNv2 samples/s per batch size, and the H2D transfer of one batch of each size."""
    from recsys.models import DCNv2  # not recsys.train: the GPU image need not have Lightning

    torch.manual_seed(cfg.seed)
    model = DCNv2(schema).to(device)
    emb_params = list(model.sparse_arch.parameters())
    emb_ids = {id(p) for p in emb_params}
    dense_params = [p for p in model.parameters() if id(p) not in emb_ids]
    optimizers: list[torch.optim.Optimizer] = [
        torch.optim.Adagrad(emb_params, lr=cfg.emb_lr, eps=1e-8),
        torch.optim.Adam(dense_params, lr=cfg.dense_lr),
    ]
    model.train()
    training: dict[str, Any] = {
        "model": "DCNv2 (build_model('dcnv2'): cross_layers=3 full rank, deep_mlp=[256, 128], parallel)",
        "embedding_dim": cfg.embedding_dim,
        "cardinalities": list(cards),
        "embedding_rows": sum(cards),
        "optimizers": (
            f"torch.optim.Adagrad(embeddings, lr={cfg.emb_lr}, eps=1e-8) over the plain EBC's dense gradients + "
            f"torch.optim.Adam(other parameters, lr={cfg.dense_lr})"
        ),
        "data": "Criteo-shaped synthetic batches (skewed ids, 13 dense), already on the device, a new KJT per step",
        "by_batch_size": {},
    }
    h2d: dict[str, Any] = (
        {"applicable": True, "by_batch_size": {}}
        if device.type == "cuda"
        else {"applicable": False, "reason": f"device is {device}: there is no host-to-device transfer to time"}
    )
    for batch_size in cfg.train_batch_sizes:
        host = _criteo_batches(cards, batch_size, cfg.train_pool, cfg.seed + batch_size)
        pool = [b.to(device) for b in host]
        losses: list[torch.Tensor] = []  # the last step's loss (read once, after the timing)

        def step(pool: list[Batch] = pool, losses: list[torch.Tensor] = losses) -> None:
            batch = pool[len(losses) % len(pool)]
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            logits = model(batch.dense_features, _fresh(batch.sparse_features))
            loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
            loss.backward()
            for opt in optimizers:
                opt.step()
            losses.append(loss.detach())

        for _ in range(cfg.warmup_steps):
            step()
        clock.sync()
        deadline = time.perf_counter() + cfg.section_budget_s
        secs = _repeat(lambda: clock.seconds(step, cfg.steps), cfg.repeats, deadline)
        rates = [cfg.steps * batch_size / s for s in secs]
        step_ms = 1e3 * statistics.median(secs) / cfg.steps
        training["by_batch_size"][str(batch_size)] = {
            "samples_per_s": _summary(rates),
            "ms_per_step": step_ms,
            "steps_per_repeat": cfg.steps,
            "warmup_steps": cfg.warmup_steps,
            "repeats": len(secs),
            "final_loss": float(losses[-1]),
        }
        if device.type == "cuda":
            h2d["by_batch_size"][str(batch_size)] = _h2d(device, host[0], cfg, clock, step_ms)
        del pool
        _free(device)
    return model, training, h2d


def _place_scripted(
    module: torch.jit.ScriptModule, export_dir: Path, device: torch.device
) -> tuple[torch.jit.ScriptModule, torch.device, dict[str, Any]]:
    """The scripted module on ``device`` (``.to(device)``, then ``map_location``), else on CPU."""
    if device.type == "cpu":
        return module, device, {"moved_to_device": True, "how": "loaded on the CPU"}
    errors: list[str] = []
    try:
        return module.to(device), device, {"moved_to_device": True, "how": "ScriptModule.to(device)"}
    except Exception as e:  # noqa: BLE001 - report why, then try the next way
        errors.append(f"ScriptModule.to({device}): {type(e).__name__}: {e}")
    try:
        moved = torch.jit.load(str(export_dir / "model.pt"), map_location=device)
        moved.eval()
        return moved, device, {"moved_to_device": True, "how": "torch.jit.load(map_location=device)", "errors": errors}
    except Exception as e:  # noqa: BLE001
        errors.append(f"torch.jit.load(map_location={device}): {type(e).__name__}: {e}")
    return module, torch.device("cpu"), {"moved_to_device": False, "errors": errors, "measured_on": "cpu"}


def bench_inference(
    device: torch.device,
    cfg: SuiteConfig,
    clock: _Clock,
    model: torch.nn.Module,
    pre: Preprocessor,
    cards: Sequence[int],
) -> dict[str, Any]:
    """(d) Exported TorchScript latency per batch size on the device, and parity with eager."""
    from recsys.export import export_model, kjt_to_lists, load_exported

    schema = pre.fitted_schema
    names = schema.sparse_names
    out: dict[str, Any] = {
        "format": "recsys.export TorchScript ServingModule (values, lengths, dense) -> probabilities"
    }
    with tempfile.TemporaryDirectory(prefix="gpu_suite_export_") as tmp:
        export_dir = Path(tmp) / "export"
        cpu_model = copy.deepcopy(model).cpu()  # export parity is checked on the CPU, in float32
        t0 = time.perf_counter()
        exported = export_model(cpu_model, pre, export_dir, metadata={"benchmark": NAME})
        out["export_seconds"] = time.perf_counter() - t0
        out["export_parity_cpu"] = exported.max_abs_diff
        del cpu_model
        scripted, run_device, placement = _place_scripted(load_exported(export_dir), export_dir, device)
    out["placement"] = placement
    out["device"] = str(run_device)
    eager_clock = clock
    clock = clock if run_device == device else _Clock(run_device)
    model.eval()
    deadline = time.perf_counter() + cfg.section_budget_s
    by_size: dict[str, Any] = {}
    max_diff = 0.0
    for batch_size in cfg.infer_batch_sizes:
        batch = _criteo_batches(cards, batch_size, 1, cfg.seed + 7 * batch_size)[0]
        values, lengths = kjt_to_lists(batch.sparse_features, names)
        values = [v.to(run_device) for v in values]
        lengths = [ln.to(run_device) for ln in lengths]
        dense = batch.dense_features.to(run_device)
        kjt, dense_eager = batch.sparse_features.to(device), batch.dense_features.to(device)

        def exported_call(
            values: list[torch.Tensor] = values, lengths: list[torch.Tensor] = lengths, dense: torch.Tensor = dense
        ) -> torch.Tensor:
            return scripted(values, lengths, dense)

        def eager_call(dense: torch.Tensor = dense_eager, kjt: KeyedJaggedTensor = kjt) -> torch.Tensor:
            return torch.sigmoid(model(dense, _fresh(kjt)))

        with torch.no_grad():
            diff = float((exported_call().cpu() - eager_call().cpu()).abs().max())
            max_diff = max(max_diff, diff)
            for _ in range(cfg.infer_warmup):
                exported_call()
                eager_call()
            lat = _repeat(lambda f=exported_call: clock.latency(f), cfg.infer_repeats, deadline)
            eager = _repeat(lambda f=eager_call: eager_clock.latency(f), max(1, cfg.infer_repeats // 2), deadline)
        by_size[str(batch_size)] = {
            "exported_ms": _summary([1e3 * s for s in lat]),
            "eager_ms": _summary([1e3 * s for s in eager]),
            "rows_per_s_median": batch_size / statistics.median(lat),
            "max_abs_diff": diff,
        }
    out["by_batch_size"] = by_size
    out["max_abs_diff"] = max_diff
    model.train()
    return out


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def _table_rows(result: dict[str, Any]) -> list[str]:
    s = result["sections"]
    rows: list[tuple[str, str, str, str]] = []
    c = s["copy_bandwidth"]
    rows.append(
        (
            "copy",
            "device-to-device copy, GB/s (read + write, median)",
            _n(c["gb_per_s"]["median"]),
            (
                f"{c['buffer_bytes'] / 2**20:,.0f} MiB buffer, {c['repeats']} repeats x {c['copies_per_repeat']} copies, "
                f"{c['timer']}"
            ),
        )
    )
    lk = s["embedding_lookup"]
    shape = (
        f"batch {lk['batch_size']:,} x {lk['fields']} one-hot fields, dim {lk['embedding_dim']}, "
        f"{lk['table_rows']:,} rows, uniform ids"
    )
    for kernel in ("plain", "fused"):
        block = lk[kernel]
        label = f"lookup ({kernel})"
        if "skipped" in block:
            rows.append((label, "skipped", "-", block["skipped"]))
            continue
        fb, fw = block["fwd_bwd"], block["forward"]
        rows.append(
            (
                label,
                "fwd+bwd lookups/s",
                _n(fb["lookups_per_s"]),
                f"{_n(fb['ms_per_step']['median'])} ms/step; {shape}",
            )
        )
        rows.append(
            (
                label,
                "fwd+bwd effective GB/s (rows read + grad rows written)",
                _n(fb["effective_gb_per_s"]),
                f"{fb['ratio_to_copy']:.3g} x copy bandwidth",
            )
        )
        if "gb_per_s_with_dense_grad" in fb:
            rows.append(
                (
                    label,
                    "fwd+bwd GB/s incl. the dense table-sized gradient fill",
                    _n(fb["gb_per_s_with_dense_grad"]),
                    f"{fb['ratio_to_copy_with_dense_grad']:.3g} x copy bandwidth",
                )
            )
        rows.append(
            (
                label,
                "forward-only lookups/s",
                _n(fw["lookups_per_s"]),
                f"{fw['effective_gb_per_s']:.3g} GB/s rows read, {fw['ratio_to_copy']:.3g} x copy",
            )
        )
    tr = s["training"]
    for bs, b in tr["by_batch_size"].items():
        rows.append(
            (
                "train DCNv2",
                f"samples/s at batch {int(bs):,} (median)",
                _n(b["samples_per_s"]["median"]),
                (
                    f"{b['ms_per_step']:.3g} ms/step, {b['repeats']} x {b['steps_per_repeat']} steps after "
                    f"{b['warmup_steps']} warm-up; loss {b['final_loss']:.3f}"
                ),
            )
        )
    h2d = s["h2d"]
    if not h2d["applicable"]:
        rows.append(("H2D", "batch transfer", "n/a", h2d["reason"]))
    else:
        for bs, b in h2d["by_batch_size"].items():
            p, q = b["pinned"], b["pageable"]
            rows.append(
                (
                    "H2D",
                    f"pinned batch {int(bs):,}, ms (median)",
                    f"{p['ms_per_batch']['median']:.3g}",
                    (
                        f"{p['gb_per_s']:.3g} GB/s, {100 * p['share_of_train_step']:.1f}% of a step; "
                        f"pageable {q['ms_per_batch']['median']:.3g} ms"
                    ),
                )
            )
    inf = s["inference"]
    where = inf["device"] + ("" if inf["placement"]["moved_to_device"] or inf["device"] == "cpu" else " (fallback)")
    for bs, b in inf["by_batch_size"].items():
        e = b["exported_ms"]
        rows.append(
            (
                "exported latency",
                f"batch {int(bs):,}: median / p90 ms",
                f"{e['median']:.3g} / {e['p90']:.3g}",
                f"on {where}; eager median {b['eager_ms']['median']:.3g} ms; {e['n']} calls",
            )
        )
    rows.append(
        (
            "exported parity",
            "max abs diff vs eager (probabilities)",
            f"{inf['max_abs_diff']:.2g}",
            f"export-time CPU check {inf['export_parity_cpu']:.2g}",
        )
    )
    for name, secs in result["elapsed_s"].items():
        rows.append(("elapsed", name, f"{secs:.1f} s", ""))
    lines = ["| section | metric | value | notes |", "| --- | --- | ---: | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return lines


def to_markdown(result: dict[str, Any]) -> str:
    dev, v = result["device"], result["versions"]
    cuda = f"CUDA {dev['torch_cuda']}" if dev.get("torch_cuda") else "CPU build"
    startup = (
        "" if result["startup_seconds"] is None else f", after {result['startup_seconds']:.1f} s of process start-up"
    )
    lines = [
        "# GPU suite: copy bandwidth, embedding lookups, DCNv2 training, exported-model latency",
        "",
        f"Generated {result['date']} by `{result['command']}` ({result['wall_seconds']:.0f} s{startup}).  ",
        (
            f"Device: **{dev['name']}** (`{dev['device']}`); torch {dev['torch']} ({cuda}), torchrec {v['torchrec']}, "
            f"fbgemm_gpu {v['fbgemm_gpu']}; "
            f"FBGEMM CUDA kernels usable: **{'yes' if dev['fbgemm_cuda_available'] else 'no'}**."
        ),
    ]
    if result["size_note"]:
        lines += ["", f"**{result['size_note']}**"]
    lines += [
        "",
        *_table_rows(result),
        "",
        "Byte model of the lookup rows: " + result["sections"]["embedding_lookup"]["byte_model"] + ".",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------


@contextmanager
def _section(name: str, elapsed: dict[str, float]) -> Iterator[None]:
    print(f"[{NAME}] {name} ...", flush=True)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        elapsed[name] = time.perf_counter() - t0
        print(f"[{NAME}] {name}: {elapsed[name]:.1f} s", flush=True)


def run(
    device: torch.device, cfg: SuiteConfig, output_dir: Path, header: dict[str, Any], size_note: str = ""
) -> dict[str, Any]:
    """Run the four sections on ``device``; write ``gpu_suite.{json,md}`` into ``output_dir``."""
    t_start = time.perf_counter()
    startup = _seconds_since_process_start()
    if startup is not None:
        print(f"[{NAME}] start-up (interpreter, imports): {startup:.1f} s; device {device}", flush=True)
    clock = _Clock(device)
    elapsed: dict[str, float] = {}
    sections: dict[str, Any] = {}
    result: dict[str, Any] = {**header, "config": asdict(cfg), "size_note": size_note}
    with _section("device init", elapsed):
        result["device"] = describe_device(device)
        if device.type == "cuda":
            torch.ones(1, device=device).sum().item()  # creates the CUDA context
            result["hardware"] = {**result.get("hardware", {}), "gpu": result["device"]["name"]}
    with _section("copy bandwidth", elapsed):
        sections["copy_bandwidth"] = bench_copy(device, cfg, clock)
        _free(device)
    copy_gbps = sections["copy_bandwidth"]["gb_per_s"]["median"]
    with _section("embedding lookup", elapsed):
        sections["embedding_lookup"] = bench_lookup(device, cfg, clock, copy_gbps)
    cards = cardinalities(cfg.max_cardinality)
    schema, pre = criteo_schema(cards, cfg.embedding_dim)
    with _section("DCNv2 training + H2D", elapsed):
        model, sections["training"], sections["h2d"] = bench_training(device, cfg, clock, schema, cards)
    with _section("exported inference", elapsed):
        sections["inference"] = bench_inference(device, cfg, clock, model, pre, cards)
    del model
    _free(device)
    result["sections"] = sections
    result["elapsed_s"] = elapsed
    result["startup_seconds"] = None if startup is None else round(startup, 1)
    result["wall_seconds"] = time.perf_counter() - t_start
    end = _seconds_since_process_start()
    result["process_seconds"] = None if end is None else round(end, 1)  # start-up included
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / f"{NAME}.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(output_dir / f"{NAME}.md", to_markdown(result))
    total = (
        "" if result["process_seconds"] is None else f", {result['process_seconds']:.1f} s since the process started"
    )
    print(f"[{NAME}] done: {result['wall_seconds']:.1f} s in the suite{total}", flush=True)
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m experiments.benchmarks.{NAME}", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test; numbers are meaningless)")
    parser.add_argument(
        "--output-dir", type=Path, default=RESULTS, help=f"where the JSON/markdown go (default {RESULTS})"
    )
    parser.add_argument(
        "--max-cardinality", type=int, default=None, help="largest of the 26 tables (log-spaced from 4)"
    )
    parser.add_argument("--embedding-dim", type=int, default=None, help="DCNv2 embedding dim (default 16)")
    parser.add_argument(
        "--lookup-dim", type=int, default=None, help="embedding dim of the lookup section (default 64)"
    )
    parser.add_argument("--lookup-batch-size", type=int, default=None, help="batch of the lookup section")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="DCNv2 training batch sizes")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats of the training blocks")
    return parser.parse_args(argv)


def config_for(device: torch.device, args: argparse.Namespace) -> tuple[SuiteConfig, str]:
    """The sizes for ``device`` with the command-line overrides, and a note when scaled for the CPU."""
    note = ""
    if args.quick:
        cfg = SuiteConfig.quick()
        note = "--quick: tiny sizes, a smoke test; the numbers mean nothing."
    elif device.type == "cuda":
        cfg = SuiteConfig.gpu()
    else:
        cfg = SuiteConfig.cpu()
        note = (
            f"Sizes scaled down for the CPU (largest table {cfg.max_cardinality:,} rows, lookup batch "
            f"{cfg.lookup_batch_size:,}, training batches {', '.join(map(str, cfg.train_batch_sizes))}); "
            "the GPU defaults are 1,000,000 / 131,072 / 8192, 65536."
        )
    overrides = {
        "max_cardinality": args.max_cardinality,
        "embedding_dim": args.embedding_dim,
        "lookup_dim": args.lookup_dim,
        "lookup_batch_size": args.lookup_batch_size,
        "train_batch_sizes": tuple(args.batch_sizes) if args.batch_sizes else None,
        "repeats": args.repeats,
    }
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None}), note


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as e:
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    cfg, note = config_for(device, args)
    header = result_header(NAME, argv, args.quick, TARGETS)
    result = run(device, cfg, args.output_dir, header, note)
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
