"""Experiments: CLI, demo, HPO, pipeline, configs, benchmarks and results."""

import recsys  # noqa: F401  (old module names of experiments.* resolve through recsys.moved)
