"""The wide benchmark's in-process parts: training samples/s against F, the profile of one step at
F = 1,000, and the pipeline run (see :mod:`experiments.benchmarks.wide`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["dense_flops", "pipeline_run", "profile_shares", "samples_per_second", "wide_model"]

#: the wide DCNv2 (the benchmark's recipe)
BACKBONE: dict[str, Any] = {"cross_layers": 2, "low_rank": 64, "deep_mlp": [256, 128], "structure": "parallel"}


def fitted_schema(features: int) -> Any:
    """The wide layout's schema with table sizes (values + the OOV row), no data needed."""
    from dataclasses import replace

    from recsys.data.synthetic.wide import WideConfig, wide_plan

    plan = wide_plan(WideConfig(n_features=features, n_rows=1000, seed=0))
    cards = {f.name: f.cardinality for f in plan.features}
    schema = plan.schema()
    return replace(schema, features=tuple(replace(s, num_embeddings=cards[s.name] + 1) if s.is_sparse else s
                                          for s in schema.features))


def wide_model(schema: Any, kernel: str) -> Any:
    import torch

    from recsys.models import DCNv2
    from recsys.models.base import EmbeddingKernel, SparseArchConfig

    torch.manual_seed(0)
    return DCNv2(schema, SparseArchConfig(kernel=EmbeddingKernel(kernel)), **BACKBONE)


def dense_flops(schema: Any) -> dict[str, float]:
    """FLOPs per sample of the wide DCNv2's dense arch (2 per multiply-add), forward and
    forward + backward (3x)."""
    c = sum(f.width for f in schema.features)
    r, deep = BACKBONE["low_rank"], BACKBONE["deep_mlp"]
    cross = BACKBONE["cross_layers"] * (2 * c * r + c)
    mlp, width = 0, c
    for size in deep:
        mlp, width = mlp + width * size, size
    head = c + deep[-1]
    forward = 2.0 * (cross + mlp + head)
    return {"input_dims": c, "forward_flops": forward, "train_flops": 3 * forward}


def _step(model: Any, batch: Any, opt: Any) -> None:
    import torch

    opt.zero_grad()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch.dense_features, batch.sparse_features), batch.labels)
    loss.backward()
    opt.step()


#: the kernels timed side by side: FBGEMM's fused TBE, torchrec's per-table EBC, the grouped lookup
KERNELS = ("fused", "grouped", "plain")


def samples_per_second(features: int, steps: int, repeats: int, batch: int) -> dict[str, Any]:
    """Training samples/s of the wide DCNv2 step at F features on each of :data:`KERNELS` from the
    same initial weights, interleaved (fused, grouped, plain, fused, ...) over ``repeats`` blocks."""
    import torch

    from recsys.data.batching import random_batch

    schema = fitted_schema(features)
    batches = [random_batch(schema, batch, seed=s) for s in range(4)]
    models = {k: wide_model(schema, k) for k in KERNELS}
    opts = {k: torch.optim.Adam(m.dense_parameters(), 1e-3) for k, m in models.items()}
    for k, m in models.items():  # warm-up
        for b in batches[:2]:
            _step(m, b, opts[k])
    rates: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(repeats):
        for k, m in models.items():
            t0 = time.perf_counter()
            for i in range(steps):
                _step(m, batches[i % len(batches)], opts[k])
            rates[k].append(steps * batch / (time.perf_counter() - t0))
    return {"features": features, "tables": len(schema.sparse), "dense_columns": schema.dense_width,
            **dense_flops(schema), "samples_per_s": rates, "median": {k: float(np.median(v)) for k, v in rates.items()},
            "fused_vs_plain": float(np.median(rates["fused"]) / np.median(rates["plain"])),
            "grouped_vs_plain": float(np.median(rates["grouped"]) / np.median(rates["plain"]))}


#: ops of the dense arch's arithmetic (matrix products, elementwise maths, the loss, Adam)
_DENSE_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::mul", "aten::add", "aten::sub", "aten::div", "aten::relu",
              "aten::threshold_backward", "aten::sigmoid", "aten::binary_cross_entropy", "aten::sum", "aten::mean",
              "aten::addcdiv_", "aten::addcmul_", "aten::lerp_", "aten::sqrt", "aten::add_", "aten::mul_", "aten::div_",
              "aten::neg", "aten::exp", "aten::log", "aten::clamp", "aten::_foreach")
_LOOKUP_OPS = ("fbgemm::", "embedding_bag", "bounds_check")
#: the profiler label of the plain kernel's table update
_TABLE_UPDATE = "table_update"
#: ranges whose ops are all the lookup's: that label and the grouped kernel's lookup-and-update function
_LOOKUP_RANGES = (_TABLE_UPDATE, "_LookupAndUpdate")


def profile_shares(features: int, batch: int, steps: int = 6, kernel: str = "fused") -> dict[str, Any]:
    """Where a training step's time goes at F features on ``kernel``: the dense arch's arithmetic
    against the per-feature overhead (the lookups and their optimizer, the batch's assembly,
    the seam and every other op, and the Python between ops), from a profile of ``steps`` steps
    plus the time to build each batch from encoded rows."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from recsys.data.batching import make_batch, random_batch

    schema = fitted_schema(features)
    model = wide_model(schema, kernel)
    # the plain kernel's tables take their own Adam, profiled under one label,
    # so that their update counts with the lookup (as FBGEMM's fused Adagrad does) and not as dense arithmetic
    embedding_ids = {id(p) for p in model.sparse_arch.parameters()} if kernel == "plain" else set()
    opt = torch.optim.Adam([p for p in model.dense_parameters() if id(p) not in embedding_ids], 1e-3)
    table_opt = torch.optim.Adam(list(model.sparse_arch.parameters()), 1e-3) if embedding_ids else None

    def step(b: Any) -> None:
        opt.zero_grad()
        if table_opt is not None:
            table_opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(b.dense_features, b.sparse_features), b.labels)
        loss.backward()
        opt.step()
        if table_opt is not None:
            with record_function(_TABLE_UPDATE):
                table_opt.step()

    batches = [random_batch(schema, batch, seed=s) for s in range(2)]
    for b in batches:
        step(b)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            step(batches[i % 2])
    wall = time.perf_counter() - t0
    shares = {"dense_arith": 0.0, "lookup": 0.0, "other_ops": 0.0}
    for e in prof.events():
        seconds = e.self_cpu_time_total / 1e6
        if _under(e, _LOOKUP_RANGES):  # the tables' lookup and update, whatever their ops
            shares["lookup"] += seconds
        elif any(e.name.startswith(p) or p in e.name for p in _LOOKUP_OPS):
            shares["lookup"] += seconds
        elif e.name.startswith(_DENSE_OPS) or e.name.startswith("Optimizer.step"):
            shares["dense_arith"] += seconds
        else:
            shares["other_ops"] += seconds
    ops = sum(shares.values())
    # profiled op time runs on 2 threads: scale the shares of the wall time, keep Python's gap apart
    per_step = wall / steps
    data = _encoded_rows(schema, 20 * batch)
    offsets = {n: data.offsets(n) for n in data.sparse_names}
    t1 = time.perf_counter()
    for i in range(steps):
        make_batch(data, np.arange(i * batch, (i + 1) * batch), offsets)
    batching = (time.perf_counter() - t1) / steps
    dense_share = shares["dense_arith"] / ops * per_step / (per_step + batching)
    return {"features": features, "step_seconds": per_step, "batching_seconds": batching,
            "op_seconds": {k: v / steps for k, v in shares.items()}, "dense_arith_share": dense_share,
            "per_feature_overhead_share": 1.0 - dense_share, **dense_flops(schema),
            "backbone": f"DCNv2 {BACKBONE}", "kernel": kernel,
            "note": "the tables' Adam update counts with the lookup" if embedding_ids else ""}


def _under(event: Any, labels: tuple[str, ...]) -> bool:
    """``event`` is a profiler range named by one of ``labels`` (or containing it) or runs inside one."""
    while event is not None:
        if any(label in event.name for label in labels):
            return True
        event = event.cpu_parent
    return False


def _encoded_rows(schema: Any, rows: int) -> Any:
    """Random encoded rows of ``schema`` (ids in range, one per row; dense standard normal)."""
    from recsys.data.encoders import EncodedData

    g = np.random.default_rng(0)
    values = {f.name: g.integers(0, int(f.num_embeddings), rows).astype(np.int32) for f in schema.sparse}
    lengths = {f.name: np.ones(rows, dtype=np.int32) for f in schema.sparse}
    dense = g.standard_normal((rows, schema.dense_width)).astype(np.float32)
    return EncodedData(schema.sparse_names, schema.dense_names, values, lengths, dense, np.zeros(rows, np.float32),
                       dense_widths=schema.dense_widths)


def pipeline_run(root: Path, data: Path, model_config: dict[str, Any], timeout: int) -> dict[str, Any]:
    """``salience pipeline`` on the wide data: quality, OutRank screening, LeAP + curve, DNIS,
    GIF tuning (a few trials), final and original fits, compare; whether screening kept the
    planted pair."""
    import yaml

    from recsys.data.synthetic.wide import WideTruth
    from recsys.io import atomic_write_text

    folder = root / "pipeline"
    folder.mkdir(parents=True, exist_ok=True)
    model_path = folder / "model.yaml"
    atomic_write_text(model_path, yaml.safe_dump(model_config))
    config = {
        "name": data.stem, "model_config": str(model_path), "output": str(folder / "run"), "seed": 0,
        "search_overrides": ["--trainer.max_epochs=3"], "final_overrides": ["--trainer.max_epochs=4"],
        "quality": {"drop_flags": ["constant", "leakage"]},
        "screening": {"enabled": True, "drop_below_noise": True},
        "selection": {"method": "leap", "ks": [25, 50, 100, 200, 400], "random_seeds": [0], "tolerance": 0.002},
        "dims": {"method": "dnis", "budget": 0.5, "uniform_dim": 8, "options": {"warm_start_epochs": 1, "search_epochs": 2}},
        "tuning": {"sampler": "gif", "n_trials": 4, "max_epochs": 1},
        "compare": {"auc_tolerance": 0.002, "latency_batches": [1, 1024], "latency_repeats": 10},
    }
    config_path = folder / "pipeline.yaml"
    atomic_write_text(config_path, yaml.safe_dump(config))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "pipeline", "--config", str(config_path), "--restart"],
                          capture_output=True, text=True, timeout=timeout, cwd=folder)
    out: dict[str, Any] = {"seconds": time.perf_counter() - t0, "exit": proc.returncode, "config": config}
    if proc.returncode != 0:
        out["error"] = proc.stderr.strip()[-1500:]
        return out
    run = folder / "run"
    truth = WideTruth.load(data.with_name(f"{data.name.split('.')[0]}.truth.json"))
    pair = truth.names("interaction")
    screening = json.loads((run / "screening" / "result.json").read_text())
    selection = json.loads((run / "selection" / "result.json").read_text())
    compare = json.loads((run / "compare" / "result.json").read_text())
    out.update(pair=pair, screening_kept_pair=all(f in screening["kept"] for f in pair),
               screening_kept=len(screening["kept"]), screening_dropped=len(screening["dropped"]),
               selection={k: v for k, v in selection.items() if k in ("k", "kept", "smallest_k", "test_auc", "val_auc")},
               compare=compare)
    return out
