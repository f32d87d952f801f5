"""Experiments: CLI, demo, HPO, pipeline, configs, benchmarks and results."""
