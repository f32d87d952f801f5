"""Feature importance and selection: which features matter, which are redundant or broken,
and how many can be dropped without losing AUC.

Methods (each an :class:`ImportanceMethod` returning an :class:`ImportanceReport`):

* :class:`OutRank`: model-free, cardinality-corrected mutual information on the raw training
  rows, with redundancy, the greedy "combined relevance" ranking, noise controls and a
  label-copy leakage check (``selection.model_free.data_quality.data_quality`` for the data-quality report);
* :class:`PermutationImportance`: the classic baseline, one field shuffled at the seam;
* :class:`LeAP`: learnable adaptive permutation, one training run with a gate per field;
* the shallow baselines of ERASE on the encoded training rows (:mod:`selection.shallow.tabular`):
  :class:`LassoImportance`, :class:`GBDTImportance`, :class:`RandomForestImportance`,
  :class:`LightGBMImportance`;
* the gate-based baselines of ERASE, one fit each (:mod:`selection.model_based.seam_selector`): :class:`AutoField`
  (keep/drop logits learned on validation batches), :class:`AdaFS` (instance-wise softmax
  controller), :class:`LPFS` (LPFS++ smoothed-L0 gates) and :class:`OptFS` (a mask per
  feature value, rolled up to fields);
* the sensitivity baselines of ERASE at the seam (:mod:`selection.model_based.sensitivity`): :class:`SHARK`
  (first-order Taylor score on a trained model) and :class:`SFS` (mask gradients at
  initialisation).

:func:`selection_curve` retrains on the top-k features for each k against random rankings.
"""

from selection.base import ImportanceMethod, RandomRanking, feature_widths, get_method, method_names
from selection.curve import CurvePoint, FitCache, SelectionCurve, aukc, selection_curve
from selection.model_based.adafs import AdaFS, AdaFSSeam
from selection.model_based.autofield import AutoField, AutoFieldSeam
from selection.model_based.leap import LeAP, LeAPFusion, LeAPGateData, LeAPRegularizer, LeAPSeam
from selection.model_based.lpfs import LPFS, LPFSSeam
from selection.model_based.optfs import OptFS, OptFSSeam
from selection.model_based.permutation import FieldShuffle, PermutationImportance, permutation_importance
from selection.model_based.sensitivity import SFS, SHARK
from selection.model_free.data_quality import QualityReport, data_quality
from selection.model_free.outrank import OutRank
from selection.report import FeatureImportance, ImportanceReport
from selection.shallow.gbdt import GBDTImportance
from selection.shallow.lasso import LassoImportance
from selection.shallow.lightgbm_importance import LightGBMImportance
from selection.shallow.random_forest import RandomForestImportance

__all__ = [
    "AdaFS",
    "AdaFSSeam",
    "AutoField",
    "AutoFieldSeam",
    "CurvePoint",
    "FeatureImportance",
    "FieldShuffle",
    "FitCache",
    "GBDTImportance",
    "ImportanceMethod",
    "ImportanceReport",
    "LPFS",
    "LPFSSeam",
    "LassoImportance",
    "LeAP",
    "LeAPFusion",
    "LeAPGateData",
    "LeAPRegularizer",
    "LeAPSeam",
    "LightGBMImportance",
    "OptFS",
    "OptFSSeam",
    "OutRank",
    "PermutationImportance",
    "QualityReport",
    "RandomForestImportance",
    "RandomRanking",
    "SFS",
    "SHARK",
    "SelectionCurve",
    "aukc",
    "data_quality",
    "feature_widths",
    "get_method",
    "method_names",
    "permutation_importance",
    "selection_curve",
]
