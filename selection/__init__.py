"""Feature importance and selection: which features matter, which are redundant or broken,
and how many can be dropped without losing AUC.

Methods (each an :class:`ImportanceMethod` returning an :class:`ImportanceReport`):

* :class:`OutRank`: model-free, cardinality-corrected mutual information on the raw training
  rows, with redundancy, the greedy "combined relevance" ranking, noise controls and a
  label-copy leakage check (``selection.quality.data_quality`` for the data-quality report);
* :class:`PermutationImportance`: the classic baseline, one field shuffled at the seam;
* :class:`LeAP`: learnable adaptive permutation, one training run with a gate per field.

:func:`selection_curve` retrains on the top-k features for each k against random rankings.
"""

from selection.base import ImportanceMethod, RandomRanking, feature_widths, get_method, method_names
from selection.curve import CurvePoint, FitCache, SelectionCurve, aukc, selection_curve
from selection.leap import LeAP, LeAPRegularizer, LeAPSeam
from selection.outrank import OutRank
from selection.permutation import FieldShuffle, PermutationImportance, permutation_importance
from selection.quality import QualityReport, data_quality
from selection.report import FeatureImportance, ImportanceReport

__all__ = [
    "CurvePoint",
    "FeatureImportance",
    "FieldShuffle",
    "FitCache",
    "ImportanceMethod",
    "ImportanceReport",
    "LeAP",
    "LeAPRegularizer",
    "LeAPSeam",
    "OutRank",
    "PermutationImportance",
    "QualityReport",
    "RandomRanking",
    "SelectionCurve",
    "aukc",
    "data_quality",
    "feature_widths",
    "get_method",
    "method_names",
    "permutation_importance",
    "selection_curve",
]
