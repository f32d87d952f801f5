"""Synthetic CTR data with planted ground truth: the embedded default dataset
(:mod:`~recsys.data.synthetic.planted`, its plan in :mod:`~recsys.data.synthetic.plan`) and the
industrial-shaped wide data (:mod:`~recsys.data.synthetic.wide`).

The default dataset's public names are importable from here, as configs name them
(``class_path: recsys.data.synthetic.SyntheticReader``).
"""

from recsys.data.synthetic.planted import (
    BY_CARDINALITY,
    LEARNABLE_MIN_COUNT,
    FeatureRole,
    FeatureTruth,
    GroundTruth,
    SyntheticConfig,
    SyntheticReader,
    dim_for_cardinality,
    generate,
    heterogeneous_dims,
    oracle_auc,
    roc_auc,
    selection_benchmark_config,
)

__all__ = [
    "BY_CARDINALITY",
    "LEARNABLE_MIN_COUNT",
    "FeatureRole",
    "FeatureTruth",
    "GroundTruth",
    "SyntheticConfig",
    "SyntheticReader",
    "dim_for_cardinality",
    "generate",
    "heterogeneous_dims",
    "oracle_auc",
    "roc_auc",
    "selection_benchmark_config",
]
