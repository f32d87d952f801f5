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

# ruff: noqa: F401
from __future__ import annotations

from typing import TYPE_CHECKING

from recsys.lazy import lazy_exports

#: public name -> the module that defines it (imported on first use: importing one light module
#: of this package, such as OutRank's, does not import torch and Lightning with the others)
_EXPORTS = {
    **dict.fromkeys(["ImportanceMethod", "RandomRanking", "feature_widths", "get_method", "method_names"], "selection.base"),
    **dict.fromkeys(["CurvePoint", "FitCache", "SelectionCurve", "aukc", "selection_curve"], "selection.curve"),
    **dict.fromkeys(["AdaFS", "AdaFSSeam"], "selection.model_based.adafs"),
    **dict.fromkeys(["AutoField", "AutoFieldSeam"], "selection.model_based.autofield"),
    **dict.fromkeys(["LeAP", "LeAPFusion", "LeAPGateData", "LeAPRegularizer", "LeAPSeam"], "selection.model_based.leap"),
    **dict.fromkeys(["LPFS", "LPFSSeam"], "selection.model_based.lpfs"),
    **dict.fromkeys(["OptFS", "OptFSSeam"], "selection.model_based.optfs"),
    **dict.fromkeys(["FieldShuffle", "PermutationImportance", "permutation_importance"], "selection.model_based.permutation"),
    **dict.fromkeys(["SFS", "SHARK"], "selection.model_based.sensitivity"),
    **dict.fromkeys(["QualityReport", "data_quality"], "selection.model_free.data_quality"),
    **dict.fromkeys(["OutRank"], "selection.model_free.outrank"),
    **dict.fromkeys(["FeatureImportance", "ImportanceReport"], "selection.report"),
    **dict.fromkeys(["GBDTImportance"], "selection.shallow.gbdt"),
    **dict.fromkeys(["LassoImportance"], "selection.shallow.lasso"),
    **dict.fromkeys(["LightGBMImportance"], "selection.shallow.lightgbm_importance"),
    **dict.fromkeys(["RandomForestImportance"], "selection.shallow.random_forest"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the names for type checkers (ruff cannot read the computed __all__)
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
