"""The four timed sections of :mod:`experiments.benchmarks.gpu_suite` (copy bandwidth, embedding
lookup, DCNv2 training + host-to-device transfer, exported-model latency), their sizes
(:class:`SuiteConfig`) and the device timer; the module docstring there gives the method."""

from __future__ import annotations

import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from experiments.benchmarks.train_throughput import NUM_DENSE, NUM_SPARSE, cardinalities, synthetic_batches
from experiments.benchmarks.train_throughput import BenchConfig as _BatchConfig
from recsys.data.encoders import Preprocessor
from recsys.data.schema import DenseTransform, FeatureKind, FeatureSpec, Schema
from recsys.devices import fbgemm_skip_reason

__all__ = ["NAME", "SuiteConfig", "bench_copy", "bench_inference", "bench_lookup", "bench_training", "criteo_schema"]

#: the benchmark's name (its result files, the export metadata)
NAME = "gpu_suite"


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


class Clock:
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


def free_cuda_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def seconds_since_process_start() -> float | None:
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


def bench_copy(device: torch.device, cfg: SuiteConfig, clock: Clock) -> dict[str, Any]:
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
    clock: Clock,
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
            lambda fn=fn: clock.seconds(fn, cfg.lookup_steps) / cfg.lookup_steps, cfg.lookup_repeats, deadline  # type: ignore[misc]
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


def bench_lookup(device: torch.device, cfg: SuiteConfig, clock: Clock, copy_gbps: float) -> dict[str, Any]:
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
    free_cuda_cache(device)
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
    free_cuda_cache(device)
    return result


def _h2d(device: torch.device, host: Batch, cfg: SuiteConfig, clock: Clock, step_ms: float) -> dict[str, Any]:
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
        secs = _repeat(lambda transfer=transfer: clock.seconds(transfer), cfg.h2d_repeats, deadline)  # type: ignore[misc]
        ms = statistics.median(secs) * 1e3
        out[label] = {"ms_per_batch": _summary([1e3 * s for s in secs]), "gb_per_s": nbytes / (ms / 1e3) / 1e9}
    out["pinned"]["share_of_train_step"] = out["pinned"]["ms_per_batch"]["median"] / step_ms
    return out


def bench_training(
    device: torch.device, cfg: SuiteConfig, clock: Clock, schema: Schema, cards: Sequence[int]
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
        "model": "DCNv2 (recsys.models.DCNv2: cross_layers=3 full rank, deep_mlp=[256, 128], parallel)",
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
        free_cuda_cache(device)
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
    clock: Clock,
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
    clock = clock if run_device == device else Clock(run_device)
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
            lat = _repeat(lambda f=exported_call: clock.latency(f), cfg.infer_repeats, deadline)  # type: ignore[misc]
            eager = _repeat(lambda f=eager_call: eager_clock.latency(f), max(1, cfg.infer_repeats // 2), deadline)  # type: ignore[misc]
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
