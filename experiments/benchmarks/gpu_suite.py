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
c. **DCNv2 training** (``recsys.models.DCNv2(...)``, default
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
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from experiments.benchmarks._common import result_header
from experiments.benchmarks._gpu_report import to_markdown
from experiments.benchmarks._gpu_sections import (
    NAME,
    Clock,
    SuiteConfig,
    bench_copy,
    bench_inference,
    bench_lookup,
    bench_training,
    criteo_schema,
    free_cuda_cache,
    seconds_since_process_start,
)
from experiments.benchmarks.train_throughput import cardinalities
from recsys.devices import DeviceError, describe_device, resolve_device
from recsys.io import atomic_write_text

__all__ = ["SuiteConfig", "main", "run", "to_markdown"]

RESULTS = Path("experiments/results")
TARGETS: dict[str, Any] = {
    "full_gpu_run_seconds": "< 480 on one H200 (python 3.12, torch 2.11 CUDA, torchrec + fbgemm-gpu-cpu)",
    "export_parity_max_abs_diff": 1e-4,
}


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
    startup = seconds_since_process_start()
    if startup is not None:
        print(f"[{NAME}] start-up (interpreter, imports): {startup:.1f} s; device {device}", flush=True)
    clock = Clock(device)
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
        free_cuda_cache(device)
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
    free_cuda_cache(device)
    result["sections"] = sections
    result["elapsed_s"] = elapsed
    result["startup_seconds"] = None if startup is None else round(startup, 1)
    result["wall_seconds"] = time.perf_counter() - t_start
    end = seconds_since_process_start()
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
