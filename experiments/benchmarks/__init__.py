"""Committed benchmarks (see ``experiments/benchmarks/README.md``).

Each benchmark is a module of this package with ``main(argv) -> int``, run either as
``python -m experiments.benchmarks.<module> [ARGS]`` or as ``salience bench <name> [ARGS]``.
:data:`BENCHMARKS` is the one table of names: adding a benchmark is its module plus one entry
here. Modules whose name starts with ``_`` hold shared pieces and are not benchmarks.
"""

from __future__ import annotations

__all__ = ["BENCHMARKS"]

#: ``salience bench`` name -> module of this package (in the order ``--help`` lists them)
BENCHMARKS: dict[str, str] = {
    "throughput": "train_throughput",
    "quality": "quality",
    "selection": "selection",
    "dims": "dims",
    "generative": "generative",
    "hpo": "hpo",
    "sharding": "sharding",
    "gpu": "gpu_suite",
    "pipeline": "pipeline",
    "scale": "scale",
    "compress": "compress",
    "wide": "wide",
    "peers": "peers",
}
