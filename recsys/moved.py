"""Modules that moved when the packages were grouped into sub-packages (December 2026), still
importable under their old names so that configs, checkpoints and code that name them keep
working; each import under an old name warns (``DeprecationWarning``) with the new one.

    import selection.leap            # warns, and is selection.model_based.leap itself
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

#: old module name -> new module name
MOVED: dict[str, str] = {
    "embeddings.base": "embeddings.dims.base",
    "embeddings.baselines": "embeddings.dims.baselines",
    "embeddings.cli": "embeddings.dims.cli",
    "embeddings.compress": "embeddings.compression.precision",
    "embeddings.compress_cli": "embeddings.compression.cli",
    "embeddings.dnis": "embeddings.dims.dnis",
    "embeddings.ihas": "embeddings.dims.ihas",
    "embeddings.layouts": "embeddings.compression.layouts",
    "embeddings.searches": "embeddings.dims.searches",
    "experiments.hpo.tracking": "experiments.hpo.study_tracking",
    "experiments.pipeline.report": "experiments.pipeline.html_report",
    "generative.metrics": "generative.ranking_metrics",
    "generative.tracking": "generative.mlflow_logging",
    "recsys.data.chunking": "recsys.data.streaming.chunking",
    "recsys.data.distributed": "recsys.data.streaming.dask_cluster",
    "recsys.data.prepare_stream": "recsys.data.streaming.prepare",
    "recsys.data.raw_sample": "recsys.data.streaming.raw_sample",
    "recsys.data.shard_batching": "recsys.data.streaming.batching",
    "recsys.data.shards": "recsys.data.streaming.shards",
    "recsys.data.spill": "recsys.data.streaming.spill",
    "recsys.data.split_stream": "recsys.data.streaming.split_view",
    "recsys.data.stream": "recsys.data.streaming.encoders",
    "recsys.data.synthetic_plan": "recsys.data.synthetic.plan",
    "recsys.data.wide": "recsys.data.synthetic.wide",
    "recsys.train.distributed": "recsys.train.sharded",
    "selection.adafs": "selection.model_based.adafs",
    "selection.autofield": "selection.model_based.autofield",
    "selection.column_codes": "selection.model_free.column_codes",
    "selection.gbdt": "selection.shallow.gbdt",
    "selection.lasso": "selection.shallow.lasso",
    "selection.leap": "selection.model_based.leap",
    "selection.leap_fusion": "selection.model_based.leap_fusion",
    "selection.lightgbm_importance": "selection.shallow.lightgbm_importance",
    "selection.lpfs": "selection.model_based.lpfs",
    "selection.mutual_info": "selection.model_free.mutual_info",
    "selection.optfs": "selection.model_based.optfs",
    "selection.outrank": "selection.model_free.outrank",
    "selection.outrank_scoring": "selection.model_free.outrank_scoring",
    "selection.outrank_stream": "selection.model_free.outrank_stream",
    "selection.permutation": "selection.model_based.permutation",
    "selection.quality": "selection.model_free.data_quality",
    "selection.quality_stream": "selection.model_free.data_quality_stream",
    "selection.random_forest": "selection.shallow.random_forest",
    "selection.rawfiles": "selection.model_free.rawfiles",
    "selection.seam_selector": "selection.model_based.seam_selector",
    "selection.sensitivity": "selection.model_based.sensitivity",
    "selection.sketch": "selection.model_free.sketch",
    "selection.tabular": "selection.shallow.tabular",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new name (one module object, two names)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new name is already executed."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"module {fullname} moved to {new}: import it from there", DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder of old names on ``sys.meta_path`` (once; the packages' ``__init__`` calls it)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())  # before path finders: an old file left behind is not imported
