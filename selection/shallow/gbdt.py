"""GBDT importance: gradient-boosted trees on the encoded training rows, ranked by impurity
(ERASE's GBDT baseline; Friedman 2001; methods.md §7.4).

scikit-learn's ``GradientBoostingClassifier`` on one column per field (a sparse field's id,
ordered by training frequency; a dense field's value); a field's score is its mean decrease
in impurity over the trees (``feature_importances_``). The number of trees is chosen by early
stopping on a held-out tenth of the sampled training rows.

    report = GBDTImportance().rank(recipe)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from selection.shallow.tabular import FieldTable, ShallowMethod

__all__ = ["GBDTImportance"]


@dataclass
class GBDTImportance(ShallowMethod):
    """Gradient-boosted trees (scikit-learn).

    Args:
        n_estimators: the most trees (early stopping may keep fewer).
        max_depth: depth of each tree.
        learning_rate: shrinkage.
        max_rows: training rows (default 50k: exact-split boosting is the slowest of the
            shallow models); seed, leakage_threshold: see :class:`~selection.shallow.tabular.ShallowMethod`.
    """

    name: ClassVar[str] = "gbdt"
    max_rows: int = 50_000
    n_estimators: int = 100
    max_depth: int = 3
    learning_rate: float = 0.1

    #: seconds per tree per (row x column) of scikit-learn's exact splits at depth 3 (measured on
    #: the 2-core benchmark machine: 22 s a tree at 40,000 rows x 2,000 columns)
    SECONDS_PER_CELL_TREE = 2.75e-7

    def estimated_seconds(self, rows: int, columns: int) -> float:
        return self.SECONDS_PER_CELL_TREE * rows * columns * self.n_estimators

    def fit_scores(self, train: FieldTable, val: FieldTable | None) -> tuple[dict[str, float], Any]:
        from sklearn.ensemble import GradientBoostingClassifier

        model = GradientBoostingClassifier(
            n_estimators=self.n_estimators, max_depth=self.max_depth, learning_rate=self.learning_rate,
            subsample=0.8, validation_fraction=0.1, n_iter_no_change=10, random_state=self.seed,
        )
        model.fit(train.codes, train.labels)
        return train.per_feature(model.feature_importances_), model

    def predict(self, model: Any, table: FieldTable) -> np.ndarray:
        return np.asarray(model.decision_function(table.codes)).ravel()
