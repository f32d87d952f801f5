"""Cost and memory against rows: preparation, ``quality``, OutRank and training on Criteo-shaped logs.

A benchmark, not a test. For each size (default 1M, 5M and 45M rows) it writes a synthetic
Criteo TSV (``experiments/benchmarks/_criteo_synth.py``: 26 categorical fields with
cardinalities log-spaced up to 10^7, Zipf-skewed ids, a planted label; the data is not
committed and is deleted after its size unless ``--keep-data``), then measures, each step in a
fresh process of its own so that its peak RSS is its own:

* ``prepare``: ``data.streaming`` preparation of the file into a shard set, as ``salience fit``
  runs it (``CTRDataModule.prepare_data``: two streaming passes, random 8:1:1 split,
  ``min_count: 2``);
* ``quality``: ``salience quality FILE`` (per-feature report and OutRank relevance, read in
  chunks; fields past 100k distinct values counted by sketches);
* ``outrank``: ``salience rank --method outrank --option ranking=relevance FILE`` (OutRank
  relevance from the raw text, in chunks);
* ``pipeline``: ``salience pipeline`` on the file (quality gates on a 1M-row sample, OutRank
  screening, the LeAP selection curve, DNIS dims, GIF tuning, final fit, export and parity),
  every fit (the DNIS phases and the tuning trials too) capped at ``--pipeline-steps`` training
  batches, 50 validation batches (DNIS: a sample of as many rows) and 200 test batches (410k rows; the whole test split at 45M
  rows is 4.5M), so that the step shows that the whole path runs on the file in bounded memory, not model quality;
* ``prepare_dask`` (only with ``--only``): ``prepare`` with the Dask engine, one worker process per
  core, the file cut into byte spans of whole lines (one partition each);
* ``train``: DCNv2 on the shard set (fused EBC, batch 2048, embedding dim 16), ``--steps``
  timed steps after ``--warmup`` steps, batches drawn by the streaming loader from the whole
  shuffled file.

Also, once on the smallest size: reading the file with each installed columnar engine
(``engines``: our block reader, ``pyarrow.csv.open_csv``, ``pyarrow.dataset``, and polars and
DuckDB when installed: ``pip install -e .[bench]``; the parse-only floor), and the ``outrank``
package beside ours (``package``, ``experiments/benchmarks/_outrank_package.py``, in a venv of
its own: its CLI on the same rows, relevance only, and its scoring kernel against ours on the
same codes; ``--no-package`` skips it). ``--cores 1,2,all`` reruns ``prepare``, ``prepare_dask``,
``quality`` and ``outrank`` pinned to the first N cores (the cores axis).

Committed command (writes ``scale.{json,md,png}`` to ``--output-dir``)::

    python -m experiments.benchmarks.scale                      # 1M, 5M, 45M rows
    python -m experiments.benchmarks.scale --rows 1000000,5000000 --steps 200
    python -m experiments.benchmarks.scale generate --rows 1000000 --out criteo-1m.txt
    python -m experiments.benchmarks.scale --quick              # 20k rows, smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from experiments.benchmarks._common import hardware_text, result_header
from experiments.benchmarks._criteo_synth import write_criteo_tsv
from experiments.benchmarks._outrank_package import package_lines, package_rows
from experiments.benchmarks._scale_dask import step_prepare_dask
from recsys.io import atomic_savefig, atomic_write_json, atomic_write_text
from recsys.runtime import process_peak_rss_mb

__all__ = ["STEPS", "TARGETS", "main", "measure_step"]

log = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parents[1] / "results"
STEPS = ("prepare", "quality", "outrank", "train", "pipeline")
#: the steps that build a model, so hold its embedding tables (the memory target allows their size there only)
HOLDS_TABLES = ("train", "pipeline")
#: steps run only when ``--only`` names them: the training DataLoader alone, and training on a GPU
EXTRA_STEPS = ("prepare_dask", "loader", "train_cuda")
#: steps whose rate is samples/s of training batches (the others: rows/s of the raw file)
SAMPLE_STEPS = ("train", "loader", "train_cuda")
_EXTRA_TEXT = {
    "prepare_dask": "`prepare` with the Dask engine on a local cluster of one worker process per core, the file cut "
                    "into byte spans of whole lines (128 MiB, one partition each); wall s includes starting the "
                    "cluster; peak RSS is the client's, the largest worker's is in the JSON (`workers_peak_rss_mb`).",
    "loader": "the training DataLoader alone, shards to batches without a model (samples/s over the timed batches; "
              "wall s is that timing only).",
    "train_cuda": "`train` on one CUDA device with the plain kernel (no CUDA build of fbgemm-gpu needed), samples/s "
                  "of the timed steps.",
}
ENGINES = ("blocks", "open_csv", "dataset", "polars", "duckdb")
#: the steps of the cores axis (``--cores``)
CORE_STEPS = ("prepare", "prepare_dask", "quality", "outrank")
#: thread-pool sizes a child on ``--cores K`` sets to K (numba, OpenMP/BLAS, polars)
_THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                     "POLARS_MAX_THREADS")
TARGETS = {
    "completes_at_rows": 45_000_000,
    "peak_rss_ratio_vs_1m": 1.5,
    "prepare_rows_per_s": 300_000,
    "outrank_rows_per_s": 500_000,
    "train_samples_per_s_within": 0.10,
    "package_ratio": 5.0,  # OutRank relevance against the `outrank` package's CLI, same file
    "cores_ratio": 6.0,  # preparation and OutRank on 16+ cores against 2
}
QUICK_ROWS, QUICK_STEPS, QUICK_WARMUP = (20_000,), 5, 2


# ---------------------------------------------------------------------------------------------
# one step, in a process of its own
# ---------------------------------------------------------------------------------------------


def _config(path: Path, work: Path, batch_size: int, cuda: bool = False) -> dict[str, Any]:
    """The ``salience fit`` config every step reads the file through (``cuda``: on one GPU, with
    the plain kernel, which needs no CUDA build of fbgemm-gpu)."""
    return {
        "seed_everything": 0,
        "trainer": {"max_epochs": 10_000, "default_root_dir": str(work / "runs"),
                    **({"accelerator": "cuda", "devices": 1} if cuda else {})},
        "model": {
            "backbone": {"class_path": "recsys.models.DCNv2", "init_args": {}},
            "embedding_kernel": "plain" if cuda else "fused",
            "early_stopping_patience": 0,
        },
        "data": {
            "reader": {
                "class_path": "recsys.data.readers.CriteoReader",
                "init_args": {"path": str(path), "embedding_dim": 16, "min_count": 2},
            },
            "batch_size": batch_size,
            "split": {"train": 0.8, "val": 0.1, "test": 0.1, "seed": 0},
            "streaming": True,
            "cache_dir": str(work / "cache"),
        },
    }


class _Clock:
    """The timed part of a step: from ``start()`` (default: the step's first line) to ``stop()``
    (default: its return), so building a config or a trainer is not counted."""

    def __init__(self) -> None:
        self.begin: float | None = None
        self.end: float | None = None
        self.cpu: float | None = None
        self.cpu_end: float | None = None

    def start(self) -> None:
        self.begin, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.end, self.cpu_end = time.perf_counter(), time.process_time()


_CLOCK = _Clock()


def _step_prepare(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from recsys.data.readers import CriteoReader
    from recsys.data.splits import SplitConfig
    from recsys.train.datamodule import CTRDataModule

    data = _config(path, work, args.batch_size)["data"]
    shutil.rmtree(data["cache_dir"], ignore_errors=True)  # a kept work dir's shards: prepared again, not loaded
    dm = CTRDataModule(
        CriteoReader(**data["reader"]["init_args"]), batch_size=data["batch_size"], split=SplitConfig(**data["split"]),
        streaming=True, cache_dir=data["cache_dir"],
    )
    _CLOCK.start()
    dm.prepare_data()  # what `salience fit` runs first: the shard set, in two streaming passes
    _CLOCK.stop()
    parts = dm.shard_set.splits.values()
    return {"rows": sum(p.rows for p in parts), "shards": sum(len(p.shards) for p in parts)}


def _step_prepare_dask(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    return step_prepare_dask(_config(path, work, args.batch_size)["data"], _CLOCK.stop)


#: fields past this many distinct values are counted by sketches in ``quality`` (bounded memory)
SKETCH_THRESHOLD = 100_000


def _step_quality(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from selection.cli import quality_main

    out = work / "quality.json"
    code = quality_main([str(path), "--format", "criteo", "--no-progress", "--sketch-threshold", str(SKETCH_THRESHOLD),
                         "--output", str(out)])
    if code != 0:
        raise RuntimeError(f"salience quality exited {code}")
    return {"rows": int(json.loads(out.read_text()).get("rows") or 0)}


def _step_outrank(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from selection.cli import rank_main

    out = work / "outrank.json"
    code = rank_main([str(path), "--method", "outrank", "--option", "ranking=relevance", "--format", "criteo", "--no-progress",
                      "--output", str(out)])
    if code != 0:
        raise RuntimeError(f"salience rank exited {code}")
    return {"rows": args.rows}


class _StepTimer:
    """Lightning callback: wall time of the training steps after ``warmup`` steps."""

    def __new__(cls, warmup: int) -> Any:
        from lightning.pytorch.callbacks import Callback

        class StepTimer(Callback):
            def __init__(self) -> None:
                self.steps, self.start, self.seconds = 0, 0.0, 0.0

            def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
                if self.steps == warmup:
                    self.start = time.perf_counter()

            def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, idx: int) -> None:
                self.steps += 1
                if self.steps > warmup:
                    self.seconds = time.perf_counter() - self.start

        return StepTimer()


def _step_train(path: Path, work: Path, args: argparse.Namespace, cuda: bool = False) -> dict[str, Any]:
    from recsys.train.recipe import Recipe

    timer = _StepTimer(args.warmup)
    recipe = Recipe(_config(path, work, args.batch_size, cuda))
    fit = recipe.fit(
        tracking=False,
        callbacks=[timer],
        extra_args=[
            f"--trainer.max_steps={args.warmup + args.steps}",
            "--trainer.limit_val_batches=0",
            "--trainer.limit_test_batches=0",
            "--trainer.enable_checkpointing=false",
        ],
    )
    timed = max(timer.steps - args.warmup, 0)
    sparse = fit.datamodule.preprocessor.fitted_schema.sparse
    rows = sum(int(f.num_embeddings or 0) for f in sparse)
    return {
        "rows": timed * args.batch_size,
        "steps": timed,
        "samples_per_s": round(timed * args.batch_size / timer.seconds, 1) if timer.seconds > 0 else None,
        "embedding_rows": rows,
        # fp32 weights plus the fused optimizer's per-row state (at most one float per weight)
        "table_mb": round(sum(int(f.num_embeddings or 0) * f.embedding_dim for f in sparse) * 8 / 2**20, 1),
    }


def _step_train_cuda(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``train`` on one CUDA device (plain kernel): is the data path fast enough for a GPU?"""
    import torch

    if not torch.cuda.is_available():
        return {"error": "train_cuda needs a CUDA device; none is visible"}
    return {**_step_train(path, work, args, cuda=True), "device": torch.cuda.get_device_name(0)}


def _step_loader(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The training DataLoader alone (shards decoded into batches, no model): the samples/s the
    data path can feed a trainer, timed over ``steps`` batches after ``warmup``."""
    from recsys.train.recipe import Recipe

    dm = Recipe(_config(path, work, args.batch_size)).datamodule
    dm.prepare_data()
    dm.setup("fit")

    def epochs() -> Iterator[Any]:  # more steps than one epoch has: the next epoch, as a trainer would
        while True:
            yield from dm.train_dataloader()

    batches = epochs()
    for _ in range(args.warmup):
        next(batches)
    _CLOCK.start()  # the preparation above (or the cache load) is not the loader's cost
    seen = sum(len(next(batches).labels) for _ in range(args.steps))
    _CLOCK.stop()
    assert _CLOCK.begin is not None and _CLOCK.end is not None
    return {"rows": seen, "steps": args.steps, "samples_per_s": round(seen / (_CLOCK.end - _CLOCK.begin), 1)}


def _step_pipeline(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``salience pipeline`` on the file, every fit capped (see the module docstring)."""
    import yaml

    from experiments.pipeline.cli import pipeline_main

    model = _config(path, work, args.batch_size)
    model["trainer"].update(max_epochs=1, default_root_dir=str(work / "pipeline-runs"))
    model_path = work / "pipeline-model.yaml"
    atomic_write_text(model_path, yaml.safe_dump(model))
    caps = ["--trainer.max_epochs=1", f"--trainer.limit_train_batches={args.pipeline_steps}",
            "--trainer.limit_val_batches=50", "--trainer.limit_test_batches=200"]
    pipeline = {
        "name": "scale", "model_config": str(model_path), "output": str(work / "pipeline"), "seed": 0,
        "search_overrides": caps, "final_overrides": caps,
        "quality": {"drop_flags": ["constant", "leakage"]},
        "screening": {"enabled": True, "drop_below_noise": True},
        "selection": {"method": "leap", "ks": [8, 16, 24, 32], "random_seeds": [0], "tolerance": 0.002},
        "dims": {"method": "dnis", "budget": 0.5, "uniform_dim": 16,
                 "options": {"blocks": [1.0], "warm_start_epochs": 1, "search_epochs": 1, "max_steps": args.pipeline_steps,
                             "eval_rows": 50 * args.batch_size}},
        "tuning": {"sampler": "gif", "n_trials": 4, "max_epochs": 1, "limit_train_batches": args.pipeline_steps,
                   "overrides": caps[2:]},
        "compare": {"auc_tolerance": 0.002, "latency_batches": [1, 1024], "latency_repeats": 10},
    }
    config_path = work / "pipeline.yaml"
    atomic_write_text(config_path, yaml.safe_dump(pipeline))
    state_path = work / "pipeline" / "pipeline_state.json"
    earlier: dict[str, float] = {}
    if args.resume_pipeline and state_path.is_file():  # the stages an earlier invocation finished
        earlier = {k: float(v["seconds"]) for k, v in json.loads(state_path.read_text()).get("stages", {}).items()}
    if pipeline_main(["--config", str(config_path), *([] if args.resume_pipeline else ["--restart"])]) != 0:
        raise RuntimeError("salience pipeline failed")
    state = json.loads(state_path.read_text()).get("stages", {})
    out: dict[str, Any] = {"rows": args.rows, "fit_steps": args.pipeline_steps,
                           "stage_seconds": {k: float(v["seconds"]) for k, v in state.items()},
                           "stage_peak_rss_mb": {k: v.get("peak_rss_mb") for k, v in state.items()}}
    if earlier:
        out["resumed_after"] = earlier  # wall time and peak RSS below cover only the stages run here
    return out


def _step_engine(path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Read every row of ``path`` with one engine (``args.engine``): rows read."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from recsys.data.readers import CriteoReader
    from recsys.data.readers.criteo import COLUMNS, CRITEO_DENSE

    engine = args.engine
    types = {c: pa.string() for c in COLUMNS} | {c: pa.int64() for c in CRITEO_DENSE}
    read = pacsv.ReadOptions(column_names=COLUMNS, block_size=1 << 26)
    parse = pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=True)
    convert = pacsv.ConvertOptions(column_types=types, strings_can_be_null=False, null_values=[""])
    n = 0
    if engine == "blocks":
        n = sum(len(chunk) for chunk in CriteoReader(str(path)).iter_chunks(262_144))
    elif engine == "open_csv":
        n = sum(b.num_rows for b in pacsv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert))
    elif engine == "dataset":
        import pyarrow.dataset as ds

        fmt = ds.CsvFileFormat(parse_options=parse, convert_options=convert, read_options=read)
        n = sum(b.num_rows for b in ds.dataset(str(path), format=fmt).to_batches(batch_size=262_144))
    elif engine == "polars":
        import polars as pl

        frame = pl.scan_csv(path, separator="\t", has_header=False, new_columns=list(COLUMNS), quote_char=None,
                            schema_overrides={c: pl.String for c in COLUMNS if c not in CRITEO_DENSE})
        n = int(frame.select(pl.len()).collect(engine="streaming").item()) if args.count_only else sum(
            len(b) for b in frame.collect_batches(chunk_size=262_144))
    elif engine == "duckdb":
        import duckdb

        names = ", ".join(f"'{c}': '{'BIGINT' if c in CRITEO_DENSE else 'VARCHAR'}'" for c in COLUMNS)
        con = duckdb.connect()
        con.execute(f"SET threads TO {os.cpu_count() or 1}")
        query = con.execute(f"SELECT * FROM read_csv('{path}', delim='\\t', header=false, quote='', columns={{{names}}})")
        batches: Any = query.to_arrow_reader(262_144)
        n = sum(b.num_rows for b in batches)
    else:
        raise ValueError(f"unknown engine {engine!r}; one of {ENGINES}")
    return {"rows": n}


_STEP_FUNCS = {"prepare": _step_prepare, "prepare_dask": _step_prepare_dask, "quality": _step_quality, "outrank": _step_outrank, "train": _step_train,
               "pipeline": _step_pipeline, "engine": _step_engine, "loader": _step_loader,
               "train_cuda": _step_train_cuda}


#: modules each step imports, loaded before its clock starts (import time is not the step's cost)
_IMPORTS: dict[str, tuple[str, ...]] = {
    "prepare": ("recsys.train.recipe", "recsys.train.datamodule", "recsys.data.streaming.prepare"),
    "quality": ("selection.cli", "selection.model_free.data_quality", "selection.model_free.data_quality_stream", "selection.model_free.outrank_stream"),
    "outrank": ("selection.cli", "selection", "selection.model_free.outrank_stream"),
    "train": ("recsys.train.recipe", "recsys.train.cli", "recsys.train.datamodule", "recsys.data.streaming.prepare"),
    "loader": ("recsys.train.recipe", "recsys.train.datamodule", "recsys.data.streaming.prepare"),
    "pipeline": ("experiments.pipeline.cli", "experiments.pipeline.runner", "recsys.train.recipe"),
    "engine": ("recsys.data.readers", "pyarrow.csv", "pyarrow.dataset"),
}
_IMPORTS["train_cuda"] = _IMPORTS["train"]
_IMPORTS["prepare_dask"] = ("distributed", "recsys.data.streaming.dask_cluster", "recsys.data.readers")


def measure_step(step: str, path: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one step in this process: its result plus wall seconds, CPU seconds and peak RSS."""
    import importlib

    for module in _IMPORTS[step] + ((args.engine,) if step == "engine" and args.engine in ("polars", "duckdb") else ()):
        try:
            importlib.import_module(module)
        except ImportError:
            return {"error": f"{module} is not installed (pip install -e .[bench])"}
    _CLOCK.start()
    out = _STEP_FUNCS[step](path, work, args)
    if _CLOCK.end is None:
        _CLOCK.stop()
    assert _CLOCK.begin is not None and _CLOCK.end is not None and _CLOCK.cpu is not None and _CLOCK.cpu_end is not None
    wall = _CLOCK.end - _CLOCK.begin
    out.update(seconds=round(wall, 2), cpu_seconds=round(_CLOCK.cpu_end - _CLOCK.cpu, 2),
               peak_rss_mb=round(process_peak_rss_mb(), 1))  # across the pipeline's per-stage resets
    if step not in SAMPLE_STEPS and out.get("rows") and not out.get("resumed_after"):
        out["rows_per_s"] = round(out["rows"] / wall, 1)
    return out


def _run_child(step: str, path: Path, work: Path, args: argparse.Namespace, engine: str | None = None,
               cores: int | None = None) -> dict[str, Any]:
    """``measure_step`` in a fresh Python process (its own peak RSS), on the first ``cores`` cores
    when given; a failure is recorded, not raised."""
    cmd = [sys.executable, "-m", "experiments.benchmarks.scale", "_step", step, "--file", str(path), "--work", str(work),
           "--rows", str(args.size_rows),
           "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--pipeline-steps", str(args.pipeline_steps), *(["--resume-pipeline"] if args.resume_pipeline else [])]
    if engine is not None:
        cmd += ["--engine", engine]
    env = dict(os.environ)
    if cores is not None:
        cmd += ["--cores", str(cores)]
        env.update({v: str(cores) for v in _THREAD_VARIABLES})
    log.info("%s%s on %s%s", step, f" ({engine})" if engine else "", path.name, f", {cores} core(s)" if cores else "")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return dict(json.loads(lines[-1]))


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------


def _size_label(rows: int) -> str:
    return f"{rows // 1_000_000}M" if rows % 1_000_000 == 0 else f"{rows // 1000}k"


def run_size(rows: int, work: Path, args: argparse.Namespace, engines: bool,
             publish: Callable[[dict[str, Any]], None] = lambda entry: None) -> dict[str, Any]:
    """Every step on one generated file of ``rows`` rows; ``publish(entry)`` after each step."""
    path = work / f"criteo-{_size_label(rows)}-seed{args.seed}.txt"
    start = time.perf_counter()
    if not path.exists():
        write_criteo_tsv(path, rows, seed=args.seed)
    entry: dict[str, Any] = {"rows": rows, "file_mb": round(path.stat().st_size / 2**20, 1),
                             "generate_seconds": round(time.perf_counter() - start, 1), "steps": {}}
    step_work = work / f"work-{_size_label(rows)}"
    step_work.mkdir(exist_ok=True)
    args.size_rows = rows
    for step in args.steps_list:
        entry["steps"][step] = _run_child(step, path, step_work, args)
        log.info("  %s: %s", step, entry["steps"][step])
        publish(entry)
    if engines:
        entry["engines"] = {e: _run_child("engine", path, step_work, args, engine=e) for e in ENGINES}
        publish(entry)
    if engines and not args.no_package:
        entry["package"] = package_rows(path, step_work, rows)
        publish(entry)
    for cores in args.cores_list:
        entry.setdefault("cores", {})[str(cores)] = {
            step: _run_child(step, path, step_work, args, cores=cores) for step in CORE_STEPS if step in args.steps_list}
        publish(entry)
    if not args.keep_data:
        path.unlink(missing_ok=True)
        shutil.rmtree(step_work, ignore_errors=True)
    return entry


def verdicts(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target against the measurements (``met`` / ``NOT met`` / ``not measured``)."""
    out: dict[str, Any] = {}
    by_rows = {s["rows"]: s for s in sizes}
    small, large = (by_rows[min(by_rows)], by_rows[max(by_rows)]) if by_rows else ({}, {})

    def step(size: dict[str, Any], name: str) -> dict[str, Any]:
        return dict(size.get("steps", {}).get(name) or {})

    done = [s for s in sizes if all("error" not in v for k, v in s["steps"].items() if k in STEPS)]
    largest = max(done, key=lambda s: s["rows"]) if done else None
    out["completes"] = {"largest_completed_rows": largest["rows"] if largest else None,
                        "steps": sorted(largest["steps"]) if largest else [],
                        "verdict": "met" if largest and largest["rows"] >= TARGETS["completes_at_rows"] else "NOT met"}
    rss = {}
    for name in STEPS:  # the smallest and the largest size that measured this step
        have = [s for s in sorted(sizes, key=lambda s: s["rows"])
                if "peak_rss_mb" in step(s, name) and not step(s, name).get("resumed_after")]  # a resumed run's peak is partial
        if len(have) >= 2:
            a, b = step(have[0], name), step(have[-1], name)
            # "plus the embedding tables' own size": the tables of that size's model (its train step),
            # for the steps that hold them only (prepare, quality and OutRank build no model)
            tables = float(step(have[-1], "train").get("table_mb") or 0.0) if name in HOLDS_TABLES else 0.0
            allowed = TARGETS["peak_rss_ratio_vs_1m"] * a["peak_rss_mb"] + tables
            rss[name] = {"small_rows": have[0]["rows"], "large_rows": have[-1]["rows"], "small_mb": a["peak_rss_mb"],
                         "large_mb": b["peak_rss_mb"], "table_mb": tables, "allowed_mb": round(allowed, 1),
                         "verdict": "met" if b["peak_rss_mb"] <= allowed else "NOT met"}
    out["peak_rss"] = rss
    for name, key in (("prepare", "prepare_rows_per_s"), ("prepare_dask", "prepare_rows_per_s"),
                      ("outrank", "outrank_rows_per_s"), ("quality", "outrank_rows_per_s")):
        rates = [float(r) for r in (step(s, name).get("rows_per_s") for s in sizes) if r]
        if rates:
            out[f"{name}_rows_per_s"] = {"min": min(rates), "target": TARGETS[key],
                                         "verdict": "met" if min(rates) >= TARGETS[key] else "NOT met"}
    with_package = next((s for s in sizes if (s.get("package") or {}).get("cli", {}).get("rows_per_s")), None)
    if with_package and step(with_package, "outrank").get("rows_per_s"):
        ours, theirs = float(step(with_package, "outrank")["rows_per_s"]), float(with_package["package"]["cli"]["rows_per_s"])
        out["package_ratio"] = {"ours": ours, "package": theirs, "ratio": round(ours / theirs, 2),
                                "verdict": "met" if ours >= TARGETS["package_ratio"] * theirs else "NOT met"}
    ratios = {}
    for size in sizes:
        by_cores = {int(k): v for k, v in (size.get("cores") or {}).items()}
        many = max(by_cores, default=0)
        if 2 in by_cores and many >= 16:
            for name in ("prepare", "prepare_dask", "outrank"):
                base, fast = by_cores[2].get(name, {}).get("rows_per_s"), by_cores[many].get(name, {}).get("rows_per_s")
                if base and fast:
                    ratio = float(fast) / float(base)
                    ratios[f"{name} ({size['rows']:,} rows)"] = {
                        "many": many, "base": base, "fast": fast, "ratio": round(ratio, 2),
                        "verdict": "met" if ratio >= TARGETS["cores_ratio"] else "NOT met"}
    if ratios:
        out["cores_ratio"] = ratios
    first, last = step(small, "train").get("samples_per_s"), step(large, "train").get("samples_per_s")
    if first and last and large is not small:
        ratio = float(last) / float(first)
        bound = 1 - TARGETS["train_samples_per_s_within"]
        # one timed run per size: no interval, so a pass is only "inconclusive" (the 95% rule of recsys.stats)
        out["train_samples_per_s"] = {"small": first, "large": last, "ratio": round(ratio, 3),
                                      "verdict": (f"inconclusive (one run each, no interval; x{ratio:.3f} >= {bound:.2f})"
                                                  if ratio >= bound else "NOT met")}
    return out


def to_markdown(result: dict[str, Any]) -> str:
    commands = [*result.get("earlier_commands", []), result["command"]]
    lines = [
        "# Scale: cost and memory against rows (Criteo-shaped synthetic TSV)",
        "",
        *[f"Command: `{c}`  " for c in commands],
        f"Date: {result['date']}; hardware: {hardware_text(result['hardware'])}",
        "",
        "| rows | file MB | step | wall s | rows/s (samples/s) | peak RSS MB |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for size in result["sizes"]:
        for name, m in size["steps"].items():
            if "error" in m:
                lines.append(f"| {size['rows']:,} | {size['file_mb']} | {name} | - | failed: {m['error'][:80]} | - |")
                continue
            if m.get("resumed_after"):
                earlier = m["resumed_after"]
                name = (f"{name} (resumed after {', '.join(earlier)}: {sum(earlier.values()):.0f} s in an earlier "
                        "invocation, not in this row's wall time and peak)")
            rate = m.get("samples_per_s") if name in SAMPLE_STEPS else m.get("rows_per_s")
            lines.append(f"| {size['rows']:,} | {size['file_mb']} | {name} | {m['seconds']} | "
                         f"{rate:,.0f} | {m['peak_rss_mb']:,.0f} |" if rate else
                         f"| {size['rows']:,} | {size['file_mb']} | {name} | {m['seconds']} | - | {m['peak_rss_mb']:,.0f} |")
    extra = {name for size in result["sizes"] for name in size["steps"] if name in EXTRA_STEPS}
    if extra:
        lines += ["", *[f"`{name}`: {_EXTRA_TEXT[name]}  " for name in EXTRA_STEPS if name in extra]]
    staged = [(size["rows"], size["steps"]["pipeline"]) for size in result["sizes"]
              if any((size["steps"].get("pipeline") or {}).get("stage_peak_rss_mb", {}).values())]
    if staged:
        lines += ["", "The pipeline by stage (each stage's own peak RSS, `pipeline_state.json`):", "",
                  "| rows | stage | wall s | peak RSS MB |", "|---:|---|---:|---:|"]
        for rows, m in staged:
            for stage, secs in m["stage_seconds"].items():
                peak = m["stage_peak_rss_mb"].get(stage)
                lines.append(f"| {rows:,} | {stage} | {secs:.1f} | {'-' if peak is None else f'{peak:,.0f}'} |")
    engines = next((s["engines"] for s in result["sizes"] if s.get("engines")), None)
    if engines:
        lines += ["", f"Reading the {result['sizes'][0]['rows']:,}-row file, every row and column (no encoding):", "",
                  "| engine | wall s | rows/s | peak RSS MB |", "|---|---:|---:|---:|"]
        for name, m in engines.items():
            if "error" in m:
                lines.append(f"| {name} | - | {m['error'][:70]} | - |")
            else:
                lines.append(f"| {name} | {m['seconds']} | {m.get('rows_per_s', 0):,.0f} | {m['peak_rss_mb']:,.0f} |")
    lines += package_lines(result) + _cores_lines(result)
    lines += ["", "## Targets", "", "| target | result | verdict |", "|---|---|---|"]
    v = result["verdicts"]
    c = v["completes"]
    lines.append(f"| completes at {TARGETS['completes_at_rows']:,} rows | largest run without a failure: "
                 f"{c['largest_completed_rows'] or 0:,} rows ({', '.join(c.get('steps', []))}) | {c['verdict']} |")
    for name, r in v.get("peak_rss", {}).items():
        tables = f"+ the tables it holds ({r['table_mb']:,.0f} MB)" if r.get("table_mb") else "(it holds no tables)"
        lines.append(f"| {name} peak RSS at {r.get('large_rows', 0):,} rows <= 1.5x that at {r.get('small_rows', 0):,} "
                     f"{tables} | {r['large_mb']:,.0f} MB vs allowed "
                     f"{r['allowed_mb']:,.0f} MB | {r['verdict']} |")
    for name in ("prepare", "prepare_dask", "quality", "outrank"):
        r = v.get(f"{name}_rows_per_s")
        if r:
            lines.append(f"| {name} >= {r['target']:,} rows/s | slowest size {r['min']:,.0f} rows/s | {r['verdict']} |")
    r = v.get("package_ratio")
    if r:
        lines.append(f"| OutRank relevance >= {TARGETS['package_ratio']}x the `outrank` package on the same file | "
                     f"{r['ours']:,.0f} vs {r['package']:,.0f} rows/s (x{r['ratio']}, one run each) | {r['verdict']} |")
    for name, r in v.get("cores_ratio", {}).items():
        lines.append(f"| {name} on {r['many']} cores >= {TARGETS['cores_ratio']}x its 2-core speed | "
                     f"{r['fast']:,.0f} vs {r['base']:,.0f} rows/s (x{r['ratio']}) | {r['verdict']} |")
    r = v.get("train_samples_per_s")
    if r:
        lines.append(f"| train samples/s at largest within 10% of smallest | {r['large']:,.0f} vs {r['small']:,.0f} "
                     f"(x{r['ratio']}) | {r['verdict']} |")
    lines += ["", "![cost and memory against rows](scale.png)", ""]
    return "\n".join(lines)


def _cores_lines(result: dict[str, Any]) -> list[str]:
    rows = [(s["rows"], int(k), step, m) for s in result["sizes"] for k, steps in (s.get("cores") or {}).items()
            for step, m in steps.items()]
    if not rows:
        return []
    lines = ["", "By cores (each run pinned to the first N cores, its thread pools sized N):", "",
             "| rows | cores | step | wall s | rows/s | peak RSS MB |", "|---:|---:|---|---:|---:|---:|"]
    for n, k, step, m in sorted(rows, key=lambda r: (r[0], r[2], r[1])):
        lines.append(f"| {n:,} | {k} | {step} | - | failed: {m['error'][:60]} | - |" if "error" in m else
                     f"| {n:,} | {k} | {step} | {m['seconds']} | {m.get('rows_per_s', 0):,.0f} | {m['peak_rss_mb']:,.0f} |")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for name in STEPS + EXTRA_STEPS:
        pts = [(s["rows"], s["steps"][name]) for s in result["sizes"] if "error" not in s["steps"].get(name, {"error": 1})]
        if not pts:
            continue
        rows = [p[0] for p in pts]
        ax_t.plot(rows, [p[1]["seconds"] for p in pts], marker="o", label=name)
        ax_m.plot(rows, [p[1]["peak_rss_mb"] for p in pts], marker="o", label=name)
    for ax, title in ((ax_t, "wall seconds"), (ax_m, "peak RSS (MB)")):
        ax.set_xscale("log")
        ax.set_xlabel("rows")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="write one synthetic Criteo TSV (the benchmark's data)")
    gen.add_argument("--rows", type=int, required=True)
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--seed", type=int, default=0)
    child = sub.add_parser("_step", help=argparse.SUPPRESS)
    child.add_argument("step", choices=list(_STEP_FUNCS))
    child.add_argument("--file", type=Path, required=True)
    child.add_argument("--work", type=Path, required=True)
    child.add_argument("--engine", default=None)
    child.add_argument("--count-only", action="store_true")
    child.add_argument("--rows", type=int, default=0, help="rows of --file")
    child.add_argument("--cores", type=int, default=None, help="run on the first N cores")
    for p in (parser, child):
        p.add_argument("--batch-size", type=int, default=2048)
        p.add_argument("--steps", type=int, default=200, help="timed training steps")
        p.add_argument("--warmup", type=int, default=20, help="training steps before the timing starts")
        p.add_argument("--pipeline-steps", type=int, default=100, help="training batches per fit of the pipeline step")
        p.add_argument("--resume-pipeline", action="store_true",
                       help="pipeline step: resume the work dir's stopped pipeline instead of restarting it (the "
                            "result names the stages an earlier invocation ran; its time and peak RSS are not included)")
    parser.add_argument("--rows", default="1000000,5000000,45000000", help="comma-separated sizes")
    parser.add_argument("--only", default=",".join(STEPS),
                        help=f"comma-separated steps, of: {', '.join(STEPS)} (the default) and {', '.join(EXTRA_STEPS)}")
    parser.add_argument("--name", default="scale", help="result files NAME.{json,md,png} (another machine's run: "
                                                       "another name, so its rows are not mixed with these)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-engines", action="store_true", help="skip the engine comparison")
    parser.add_argument("--no-package", action="store_true",
                        help="skip the `outrank` package beside ours (its CLI and kernels; installed in .cache/outrank/venv)")
    parser.add_argument("--cores", default="",
                        help=f"comma-separated core counts (or `all`) to rerun {', '.join(CORE_STEPS)} on, each pinned "
                             "to the first N cores (default: none; the steps above use every core)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the data and shards go (default: a temp dir; with --keep-data, files there are reused)")
    parser.add_argument("--keep-data", action="store_true", help="keep each size's file and shards")
    parser.add_argument("--merge", action="store_true",
                        help="add these sizes to the existing results (other sizes keep their numbers and command)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="smoke run: 20k rows, 5 steps (not a result)")
    parser.add_argument("--render", type=Path, default=None,
                        help="only recompute the verdicts of this results JSON and rewrite its markdown and plot")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.command == "generate":
        write_criteo_tsv(args.out, args.rows, seed=args.seed)
        print(args.out)
        return 0
    if args.command == "_step":
        if args.cores is not None:
            os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:args.cores]))
        print(json.dumps(measure_step(args.step, args.file.resolve(), args.work.resolve(), args)))
        return 0
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        saved["verdicts"] = verdicts(saved["sizes"])
        if not saved["hardware"].get("gpu"):  # written before the header looked for a GPU: the steps' own record
            gpus = {m["device"] for size in saved["sizes"] for m in size["steps"].values() if m.get("device")}
            saved["hardware"]["gpu"] = ", ".join(sorted(gpus)) or None
        _write(saved, args.render.parent, args.render.stem)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sizes: list[int] = list(QUICK_ROWS) if args.quick else [int(r) for r in args.rows.split(",") if r.strip()]
    if args.quick:
        args.steps, args.warmup, args.pipeline_steps = QUICK_STEPS, QUICK_WARMUP, QUICK_STEPS
    args.steps_list = [s.strip() for s in args.only.split(",") if s.strip()]
    args.cores_list = _core_counts(args.cores)
    unknown = sorted(set(args.steps_list) - set(STEPS + EXTRA_STEPS))
    if unknown:
        raise SystemExit(f"--only: unknown step(s) {unknown}; of: {', '.join(STEPS + EXTRA_STEPS)}")
    shown = list(argv) if argv is not None else sys.argv[1:]
    if "--work-dir" in shown:  # a scratch folder of this machine: not part of the result's identity
        i = shown.index("--work-dir")
        del shown[i:i + 2]
    result: dict[str, Any] = {**result_header("scale", shown, args.quick, TARGETS), "sizes": []}
    name = f"{args.name}_quick" if args.quick else args.name
    earlier: dict[int, dict[str, Any]] = {}
    if args.merge and (args.output_dir / f"{name}.json").is_file():
        previous = json.loads((args.output_dir / f"{name}.json").read_text())
        result["earlier_commands"] = [c for c in [*previous.get("earlier_commands", []), previous.get("command")] if c]
        for size in previous.get("sizes", []):  # each earlier step keeps its numbers and the command that made them
            for measured_step in size["steps"].values():
                measured_step.setdefault("command", size.get("command", result["earlier_commands"][-1]))
            size.pop("command", None)
            earlier[size["rows"]] = size
    current: dict[int, dict[str, Any]] = {}

    def publish(entry: dict[str, Any]) -> None:
        """Merge ``entry`` (this run's steps of one size) over the earlier ones and write the results."""
        old = earlier.get(entry["rows"], {})
        for measured_step in entry["steps"].values():
            measured_step.setdefault("command", result["command"])
        merged = {**old, **entry, "steps": {**old.get("steps", {}), **entry["steps"]}}
        if "engines" not in entry and "engines" in old:
            merged["engines"] = old["engines"]
        current[entry["rows"]] = merged
        result["sizes"] = sorted({**earlier, **current}.values(), key=lambda s: s["rows"])
        result["verdicts"] = verdicts(result["sizes"])
        _write(result, args.output_dir, name)  # after every step: a long run keeps what it measured

    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        # --work-dir with --keep-data: the generated files stay there and a later run reuses them
        work = (args.work_dir if args.work_dir is not None and args.keep_data
                else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="salience-scale-", dir=args.work_dir))))
        for i, rows in enumerate(sorted(sizes)):
            publish(run_size(rows, work, args, engines=(i == 0 and not args.no_engines), publish=publish))
    result["seconds"] = round(time.perf_counter() - start, 1)
    _write(result, args.output_dir, name)
    print(to_markdown(result))
    return 0


def _core_counts(text: str) -> list[int]:
    """``--cores``: distinct counts up to this machine's cores (``all``: every core)."""
    have = len(os.sched_getaffinity(0))
    counts: list[int] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        n = have if item == "all" else int(item) if item.isdigit() else 0
        if not 1 <= n:
            raise SystemExit(f"--cores: {item!r} is not a positive core count or `all`")
        if n > have:
            log.warning("--cores %d: this machine has %d; skipped", n, have)
        elif n not in counts:
            counts.append(n)
    return counts


def _write(result: dict[str, Any], out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"{name}.json", result)
    atomic_write_text(out / f"{name}.md", to_markdown(result).replace("(scale.png)", f"({name}.png)"))
    plot(result, out / f"{name}.png")


if __name__ == "__main__":
    sys.exit(main())
