"""Committed benchmarks (see ``experiments/benchmarks/README.md``).

Each benchmark is a module of this package with ``main(argv) -> int``, run either as
``python -m experiments.benchmarks.<module> [ARGS]`` or as ``salience bench <name> [ARGS]``.
:data:`BENCHMARKS` is the one list of names, each a module's name: adding a benchmark is its
module plus one entry here. Modules whose name starts with ``_`` hold shared pieces and are not
benchmarks.
"""

from __future__ import annotations

__all__ = ["BENCHMARKS"]

#: ``salience bench`` names, each the module of this package it runs (in the order ``--help`` lists them)
BENCHMARKS: tuple[str, ...] = (
    "train_throughput", "quality", "selection", "dims", "generative", "hpo", "sharding", "gpu_suite", "pipeline",
    "scale", "compress", "wide", "peers",
)
